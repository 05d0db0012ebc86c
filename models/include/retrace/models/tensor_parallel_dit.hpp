// The DiT split over a 1-D mesh (Megatron-style tensor parallelism): every member holds the
// attention heads and the slice of the MLP's hidden width that are its own, and a copy of the
// rest (embeddings, adaLN, norms, final layer). Per block:
//
//   attention: qkv for the member's heads (column-parallel), attention over them, the output
//              projection's columns for them (row-parallel: a partial sum) -> all_reduce -> bias
//   MLP:       fc1 rows for the member's hidden slice (column-parallel), GELU, fc2 columns
//              (row-parallel: a partial sum) -> all_reduce -> bias
//
// so two all-reduces of [B, T, C] per block, and activations are replicated between them.
// Each member's result is the same bit for bit (the all-reduce sums in member order on every
// member); against the single-device DiT it differs only by the changed order of the sums in
// the two projections (float32: relative differences of a few 1e-6 per step, see the tests).
//
//   auto mesh = retrace::MeshDevice::open("cpu", {2});
//   retrace::models::DiT model(config, device);                   // weights on any device
//   retrace::models::TensorParallelDiT split(model, *mesh);       // heads / MLP split in two
//   MeshTensor x = distribute(latents, *mesh, {Placement::replicate()});
//   MeshTensor next = split.sample_step(x, t, labels, coefficients, 4.0);   // replicated
//
// Inputs and outputs are replicated mesh tensors (distribute(..., {Placement::replicate()})).
// A Tracer over mesh->devices() captures the step on every member, all-reduces included.
#pragma once

#include "retrace/models/dit.hpp"

#include <retrace/mesh.hpp>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace retrace::models {

class TensorParallelDiT {
 public:
  // Splits `model`'s weights over the members of a 1-D mesh; heads and the MLP width must
  // divide by the number of members (invalid_argument otherwise). The model is not needed
  // afterwards. Once the mesh is closed (or destroyed), every call is a failed_precondition.
  TensorParallelDiT(const DiT& model, const MeshDevice& mesh);

  [[nodiscard]] const DiTConfig& config() const noexcept { return config_; }
  [[nodiscard]] std::size_t members() const noexcept { return members_; }
  // Member `member`'s tensor of weight `name` (its slice for the split weights); on a mesh over
  // several processes, `member` counts this process' members (MeshDevice::local_member).
  [[nodiscard]] const Tensor& weight(const std::string& name, std::size_t member) const;

  // As DiT's, with replicated mesh tensors in and out.
  [[nodiscard]] MeshTensor forward(const MeshTensor& latents, const MeshTensor& t_frequencies,
                                   const MeshTensor& labels) const;
  [[nodiscard]] MeshTensor guided_noise(const MeshTensor& latents,
                                        const MeshTensor& t_frequencies,
                                        const MeshTensor& labels, double cfg_scale) const;
  [[nodiscard]] MeshTensor sample_step(const MeshTensor& latents,
                                       const MeshTensor& t_frequencies, const MeshTensor& labels,
                                       const MeshTensor& coefficients, double cfg_scale) const;
  // Uploads the position table of another resolution to every member (before capturing it).
  void prepare_resolution(std::int64_t height, std::int64_t width) const;

 private:
  [[nodiscard]] const MeshTensor& positions(std::int64_t grid_h, std::int64_t grid_w) const;
  [[nodiscard]] MeshTensor block(const MeshTensor& x, const MeshTensor& cond,
                                 std::int64_t index) const;
  void check_replicated(const MeshTensor& t, const char* what) const;
  void require_open() const;

  DiTConfig config_;
  const MeshDevice* mesh_;  // used only while state_ says it is open
  std::shared_ptr<detail::MeshState> state_;
  std::size_t members_;  // in the mesh
  std::size_t local_;    // in this process
  std::string mesh_name_;
  bool file_positions_;
  std::map<std::string, std::vector<Tensor>> weights_;  // name -> one tensor per member
  mutable std::mutex positions_mutex_;
  mutable std::map<std::pair<std::int64_t, std::int64_t>, MeshTensor> positions_;
};

}  // namespace retrace::models
