// StateTensor: a persistent device buffer that keeps its address across traced updates.
//
// A trace bakes in the addresses of the buffers it reads. A value that changes between replays
// (the timestep of a denoising loop, a KV-cache position) must therefore be written into the
// same buffer, not rebound to a new one. update() does the right thing for both cases:
//
//   retrace::StateTensor timestep;
//   for (int step = 0; step < steps; ++step) {
//     timestep.update(std::vector<float>{t[step]}, {1}, retrace::Traced::yes, *device);
//     denoise(latents, timestep.data());   // a traced call reading the same buffer each time
//   }
//
// Untraced (or on the first update) the state rebinds to the new value; traced, the value is
// copied into the existing buffer, whose shape and dtype must then match.
#pragma once

#include "retrace/tensor.hpp"

#include <span>

namespace retrace {

enum class Traced : bool { no = false, yes = true };

class StateTensor {
 public:
  StateTensor() = default;

  // The current buffer; a null tensor before the first update.
  [[nodiscard]] const Tensor& data() const noexcept { return data_; }
  [[nodiscard]] const Tensor& value() const noexcept { return data_; }
  [[nodiscard]] bool has_value() const noexcept { return !data_.is_null(); }

  // A device tensor (copied on `queue` when traced) or a host tensor (uploaded to the state's
  // device; for the first update, to `device`, which is then required).
  void update(const Tensor& value, Traced traced, Device* device = nullptr,
              QueueId queue = kDefaultQueue);
  // Host values, converted to dtype and uploaded to `device`.
  void update(std::span<const float> values, const Shape& shape, Traced traced, Device& device,
              DType dtype = DType::bfloat16, QueueId queue = kDefaultQueue);

 private:
  Tensor data_;
};

}  // namespace retrace
