// The libtorch mode of the benchmark: the example DiT's Euler step written with libtorch's C++
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
  // x <- x + dt * v(x, t_features); x is [tokens, hidden] float32.
  virtual void step(float* x, const float* t_features, float dt) = 0;
  virtual void set_threads(int threads) = 0;
};

// Null (with `why` set) when this build has no libtorch.
[[nodiscard]] std::unique_ptr<TorchStep> make_torch_step(const models::DiT& model,
                                                         std::int64_t tokens, std::string& why);

}  // namespace retrace::bench
