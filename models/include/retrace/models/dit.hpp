// A small diffusion transformer (DiT) of the kind the ttnn pipelines trace, written with
// retrace ops, and the flow-matching Euler sampler around it.
//
// Tokens of width C; a timestep embedding (sinusoidal features of width C, then a two-layer MLP
// with SiLU); N blocks, each with adaptive layer-norm modulation from the timestep (shift, scale
// and gate for attention and for the MLP), multi-head self-attention through
// scaled_dot_product_attention and a GELU MLP of width 4C, with residuals; a final modulated
// norm and projection. Weight names follow the reference PyTorch DiT ("blocks.0.attn.qkv.weight",
// ...), so a .safetensors checkpoint with those names loads as is.
//
//   retrace::models::DiTConfig config{.tokens = 256, .hidden = 256, .depth = 4, .heads = 4};
//   retrace::models::DiT model(config, *device);          // weights from config.seed
//   Tensor v = model.forward(latents, model.timestep_features(0.5f));
#pragma once

#include <retrace/retrace.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace retrace::models {

struct DiTConfig {
  std::int64_t tokens = 64;
  std::int64_t hidden = 128;
  std::int64_t depth = 2;
  std::int64_t heads = 4;
  DType dtype = DType::float32;
  std::uint64_t seed = 0;
};

// The sizes the benchmarks use (retrace bench, retrace_bench_cuda): S (16 tokens, hidden 64,
// depth 2, 2 heads: dispatch-bound), M (256, 256, 4, 4) and L (1024, 512, 4, 8: compute-bound).
struct NamedDiTConfig {
  std::string name;
  DiTConfig config;
};
[[nodiscard]] const std::vector<NamedDiTConfig>& benchmark_sizes();

class DiT : public TraceOwner {
 public:
  // Weights drawn from config.seed (scaled so activations stay O(1)).
  DiT(const DiTConfig& config, Device& device);
  // Weights from named host tensors (e.g. read from a .safetensors file); every expected name
  // must be present with the expected shape.
  DiT(const DiTConfig& config, Device& device, const std::map<std::string, Tensor>& weights);

  [[nodiscard]] const DiTConfig& config() const noexcept { return config_; }
  [[nodiscard]] Device& device() const noexcept { return *device_; }
  // Every weight name with its shape, in a fixed order.
  [[nodiscard]] static std::vector<std::pair<std::string, Shape>> weight_shapes(
      const DiTConfig& config);

  // Sinusoidal features of a timestep t in [0, 1] ([1, hidden], host values).
  [[nodiscard]] std::vector<float> timestep_features(float t) const;

  // The velocity for latents [1, T, C] at the timestep whose features are `t_features` [1, C].
  [[nodiscard]] Tensor forward(const Tensor& latents, const Tensor& t_features) const;
  // One Euler step of the flow-matching sampler: latents + dt * forward(latents, t_features).
  [[nodiscard]] Tensor euler_step(const Tensor& latents, const Tensor& t_features, float dt) const;

  [[nodiscard]] const Tensor& weight(const std::string& name) const;

 private:
  void check_config() const;
  Tensor block(const Tensor& x, const Tensor& c, std::int64_t index) const;

  DiTConfig config_;
  Device* device_;
  std::map<std::string, Tensor> weights_;
};

// Timesteps of the Euler sampler: t_i = 1 - i / steps, i = 0 .. steps-1, with dt = -1 / steps.
[[nodiscard]] std::vector<float> euler_timesteps(std::int64_t steps);

}  // namespace retrace::models
