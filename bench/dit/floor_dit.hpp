// The floor of the benchmark: one DiT sampler step written directly against the kernel library
// (sgemm through Eigen/OpenBLAS/oneDNN, the CPU device's vectorised loops) on preallocated
// float32 buffers: no ops, no device, no allocation. The best a replay could do. Built once per
// CPU kernel variant, like the device's kernels, so each is compared with the same instruction
// set; its products call that variant's own sgemm (the one the device's kernels call).
#pragma once

#include "cpu/variant.hpp"

#include <retrace/models/dit.hpp>

#include <memory>
#include <string_view>

namespace retrace::bench {

class FloorStep {
 public:
  FloorStep() = default;
  FloorStep(const FloorStep&) = delete;
  FloorStep& operator=(const FloorStep&) = delete;
  virtual ~FloorStep() = default;
  // x <- a x + b eps(x, t, label): latents x [in_channels, H, W] (batch 1, no guidance),
  // t_frequencies [frequency_size], eps the first in_channels channels of the model's output.
  virtual void step(float* x, const float* t_frequencies, std::int64_t label, float a,
                    float b) = 0;
};

// The variant's sgemm (cpu::KernelVariant::sgemm).
using Sgemm = decltype(cpu::KernelVariant::sgemm);
using MakeFloor = std::unique_ptr<FloorStep> (*)(const models::DiT& model, Sgemm sgemm);

// The floor for the CPU kernel variant `isa` ("avx2", as retrace::cpu_kernel_isa names it):
// copies the model's weights (float32) and allocates every buffer for the configured size.
[[nodiscard]] std::unique_ptr<FloorStep> make_floor(const models::DiT& model, std::string_view isa);

}  // namespace retrace::bench
