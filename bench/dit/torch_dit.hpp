// The libtorch mode of the benchmark: the DiT's sampler step written with libtorch's C++
// API (Debian's libtorch-dev) and the same weights, an outside check of retrace's ops and a
// reference point for their speed. Built when CMake finds libtorch; otherwise make_torch_step
// says why it is missing.
#pragma once

#include <retrace/models/dit.hpp>

#include <memory>
#include <string>

namespace retrace::bench {

class TorchStep {
 public:
  virtual ~TorchStep() = default;
  // As FloorStep::step: x <- a x + b eps(x, t, label), x [in_channels, H, W] float32.
  virtual void step(float* x, const float* t_frequencies, std::int64_t label, float a,
                    float b) = 0;
  virtual void set_threads(int threads) = 0;
};

// Null (with `why` set) when this build has no libtorch.
[[nodiscard]] std::unique_ptr<TorchStep> make_torch_step(const models::DiT& model,
                                                         std::string& why);

}  // namespace retrace::bench
