// The floor of the benchmark: one DiT Euler step written directly against the kernel library
// (sgemm through Eigen/OpenBLAS, the CPU device's vectorised loops) on preallocated float32
// buffers: no ops, no device, no allocation. The best a replay could do.
#pragma once

#include <retrace/models/dit.hpp>

#include <map>
#include <string>
#include <vector>

namespace retrace::bench {

class FloorDiT {
 public:
  // Copies the model's weights (float32) and allocates every buffer for `tokens` tokens.
  FloorDiT(const models::DiT& model, std::int64_t tokens);
  // x <- x + dt * v(x, t_features); x is [tokens, hidden].
  void step(float* x, const float* t_features, float dt);

 private:
  const std::vector<float>& w(const std::string& name) const { return weights_.at(name); }
  void linear(const float* x, std::int64_t rows, const std::string& prefix, std::int64_t out,
              std::int64_t in, float* y) const;
  void modulated_norm(const float* x, const float* shift, const float* scale, float* y) const;
  void attention(const float* qkv, float* out);

  models::DiTConfig config_;
  std::int64_t tokens_;
  std::map<std::string, std::vector<float>> weights_;
  std::vector<float> temb_, hidden_, c_, mod_, y_, qkv_, attn_, proj_, mlp_, v_;
  std::vector<float> q_, k_, vh_, scores_, head_out_;
};

}  // namespace retrace::bench
