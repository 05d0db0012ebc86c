// The floor of the benchmark: one DiT Euler step written directly against the kernel library
// (sgemm through Eigen/OpenBLAS, the CPU device's vectorised loops) on preallocated float32
// buffers: no ops, no device, no allocation. The best a replay could do. Built once per CPU
// kernel variant, like the device's kernels, so each is compared with the same instruction set.
#pragma once

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
  // x <- x + dt * v(x, t_features); x is [tokens, hidden].
  virtual void step(float* x, const float* t_features, float dt) = 0;
};

using MakeFloor = std::unique_ptr<FloorStep> (*)(const models::DiT& model, std::int64_t tokens);

// The floor for the CPU kernel variant `isa` ("avx2", as retrace::cpu_kernel_isa names it):
// copies the model's weights (float32) and allocates every buffer for `tokens` tokens.
[[nodiscard]] std::unique_ptr<FloorStep> make_floor(const models::DiT& model, std::int64_t tokens,
                                                    std::string_view isa);

}  // namespace retrace::bench
