#include "retrace/models/dit.hpp"

#include <cmath>
#include <random>

namespace retrace::models {

namespace {

std::string block_name(std::int64_t i, const char* rest) {
  return fmt::format("blocks.{}.{}", i, rest);
}

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return ops::add(ops::mul(x, ops::add(scale, 1.0)), shift);
}

}  // namespace

const std::vector<NamedDiTConfig>& benchmark_sizes() {
  static const std::vector<NamedDiTConfig> sizes = {
      {"S", {.tokens = 16, .hidden = 64, .depth = 2, .heads = 2}},
      {"M", {.tokens = 256, .hidden = 256, .depth = 4, .heads = 4}},
      {"L", {.tokens = 1024, .hidden = 512, .depth = 4, .heads = 8}}};
  return sizes;
}

std::vector<std::pair<std::string, Shape>> DiT::weight_shapes(const DiTConfig& c) {
  const std::int64_t h = c.hidden;
  std::vector<std::pair<std::string, Shape>> shapes = {{"t_embedder.mlp.0.weight", {h, h}},
                                                       {"t_embedder.mlp.0.bias", {h}},
                                                       {"t_embedder.mlp.2.weight", {h, h}},
                                                       {"t_embedder.mlp.2.bias", {h}}};
  for (std::int64_t i = 0; i < c.depth; ++i) {
    shapes.emplace_back(block_name(i, "adaLN_modulation.1.weight"), Shape{6 * h, h});
    shapes.emplace_back(block_name(i, "adaLN_modulation.1.bias"), Shape{6 * h});
    shapes.emplace_back(block_name(i, "attn.qkv.weight"), Shape{3 * h, h});
    shapes.emplace_back(block_name(i, "attn.qkv.bias"), Shape{3 * h});
    shapes.emplace_back(block_name(i, "attn.proj.weight"), Shape{h, h});
    shapes.emplace_back(block_name(i, "attn.proj.bias"), Shape{h});
    shapes.emplace_back(block_name(i, "mlp.fc1.weight"), Shape{4 * h, h});
    shapes.emplace_back(block_name(i, "mlp.fc1.bias"), Shape{4 * h});
    shapes.emplace_back(block_name(i, "mlp.fc2.weight"), Shape{h, 4 * h});
    shapes.emplace_back(block_name(i, "mlp.fc2.bias"), Shape{h});
  }
  shapes.emplace_back("final_layer.adaLN_modulation.1.weight", Shape{2 * h, h});
  shapes.emplace_back("final_layer.adaLN_modulation.1.bias", Shape{2 * h});
  shapes.emplace_back("final_layer.linear.weight", Shape{h, h});
  shapes.emplace_back("final_layer.linear.bias", Shape{h});
  return shapes;
}

void DiT::check_config() const {
  RETRACE_CHECK(config_.tokens > 0 && config_.hidden > 0 && config_.depth > 0 && config_.heads > 0,
                invalid_argument, "DiT: tokens, hidden, depth and heads must be positive");
  // Bounds that keep every size the model computes (6 * hidden, tokens * hidden, ...) far from
  // overflowing; a model near them would not fit in any memory anyway.
  constexpr std::int64_t kLimit = std::int64_t{1} << 24;
  for (const auto& [name, value] : {std::pair{"tokens", config_.tokens},
                                    std::pair{"hidden", config_.hidden},
                                    std::pair{"depth", config_.depth},
                                    std::pair{"heads", config_.heads}}) {
    RETRACE_CHECK(value <= kLimit, invalid_argument, "DiT: {} = {} is too large (at most {})",
                  name, value, kLimit);
  }
  RETRACE_CHECK(config_.hidden % config_.heads == 0 && config_.hidden % 2 == 0, invalid_argument,
                "DiT: hidden ({}) must be even and divisible by heads ({})", config_.hidden,
                config_.heads);
  RETRACE_CHECK(config_.dtype == DType::float32 || config_.dtype == DType::bfloat16,
                invalid_argument, "DiT: dtype must be float32 or bfloat16, got {}", config_.dtype);
}

DiT::DiT(const DiTConfig& config, Device& device) : config_(config), device_(&device) {
  check_config();
  std::mt19937_64 rng(config.seed);
  for (const auto& [name, shape] : weight_shapes(config)) {
    // Weights ~ N(0, 1/fan_in); biases small; adaLN and the final layer scaled down as in DiT's
    // zero-ish initialisation, so the sampler stays stable.
    const bool bias = name.ends_with(".bias");
    const double fan_in = static_cast<double>(shape[-1]);
    double stddev = bias ? 0.02 : 1.0 / std::sqrt(fan_in);
    if (name.find("adaLN") != std::string::npos || name.starts_with("final_layer")) stddev *= 0.1;
    std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
    std::vector<float> values(static_cast<std::size_t>(shape.numel()));
    for (float& v : values) v = dist(rng);
    weights_[name] = Tensor::from_vector<float>(values, shape, config.dtype).to_device(device);
  }
}

DiT::DiT(const DiTConfig& config, Device& device, const std::map<std::string, Tensor>& weights)
    : config_(config), device_(&device) {
  check_config();
  for (const auto& [name, shape] : weight_shapes(config)) {
    auto it = weights.find(name);
    RETRACE_CHECK(it != weights.end(), invalid_argument,
                  "DiT: the weights have no tensor \"{}\" (expected shape {})", name, shape);
    RETRACE_CHECK(it->second.shape() == shape, invalid_argument,
                  "DiT: weight \"{}\" has shape {}, expected {} for hidden {}", name,
                  it->second.shape(), shape, config.hidden);
    Tensor w = it->second;
    if (w.dtype() != config.dtype)
      w = Tensor::from_vector<float>(w.to_vector<float>(), shape, config.dtype);
    weights_[name] = w.to_device(device);
  }
}

const Tensor& DiT::weight(const std::string& name) const {
  auto it = weights_.find(name);
  RETRACE_CHECK(it != weights_.end(), invalid_argument, "DiT: no weight named \"{}\"", name);
  return it->second;
}

std::vector<float> DiT::timestep_features(float t) const {
  const std::int64_t half = config_.hidden / 2;
  std::vector<float> features(static_cast<std::size_t>(config_.hidden));
  const double scaled = 1000.0 * t;  // DiT embeds timesteps in [0, 1000]
  for (std::int64_t i = 0; i < half; ++i) {
    const double freq =
        std::exp(-std::log(10000.0) * static_cast<double>(i) / static_cast<double>(half));
    features[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(scaled * freq));
    features[static_cast<std::size_t>(half + i)] = static_cast<float>(std::sin(scaled * freq));
  }
  return features;
}

Tensor DiT::block(const Tensor& x, const Tensor& c, std::int64_t i) const {
  const std::int64_t h = config_.hidden, heads = config_.heads, d = h / heads;
  const std::int64_t tokens = x.shape()[1];
  auto w = [&](const char* rest) -> const Tensor& { return weight(block_name(i, rest)); };
  const std::vector<Tensor> mod = ops::chunk(
      ops::linear(c, w("adaLN_modulation.1.weight"), w("adaLN_modulation.1.bias")), 6, -1);
  // Attention.
  Tensor y = modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  Tensor qkv = ops::linear(y, w("attn.qkv.weight"), w("attn.qkv.bias"));
  qkv = ops::permute(ops::reshape(qkv, {1, tokens, 3, heads, d}), {2, 0, 3, 1, 4});
  const std::vector<Tensor> parts = ops::chunk(qkv, 3, 0);
  auto head_view = [&](const Tensor& t) { return ops::reshape(t, {1, heads, tokens, d}); };
  Tensor attn = ops::scaled_dot_product_attention(head_view(parts[0]), head_view(parts[1]),
                                                  head_view(parts[2]));
  attn = ops::reshape(ops::permute(attn, {0, 2, 1, 3}), {1, tokens, h});
  attn = ops::linear(attn, w("attn.proj.weight"), w("attn.proj.bias"));
  Tensor out = ops::add(x, ops::mul(attn, mod[2]));
  // MLP.
  y = modulate(ops::layer_norm(out, {}, {}, 1e-6), mod[3], mod[4]);
  y = ops::gelu_tanh(ops::linear(y, w("mlp.fc1.weight"), w("mlp.fc1.bias")));
  y = ops::linear(y, w("mlp.fc2.weight"), w("mlp.fc2.bias"));
  return ops::add(out, ops::mul(y, mod[5]));
}

Tensor DiT::forward(const Tensor& latents, const Tensor& t_features) const {
  const std::int64_t h = config_.hidden;
  RETRACE_CHECK(latents.shape().rank() == 3 && latents.shape()[0] == 1 && latents.shape()[2] == h,
                invalid_argument, "DiT: latents must be [1, tokens, {}], got {}", h,
                latents.shape());
  RETRACE_CHECK(t_features.numel() == h, invalid_argument,
                "DiT: timestep features must hold {} values, got shape {}", h, t_features.shape());
  Tensor temb = ops::linear(ops::reshape(t_features, {1, h}), weight("t_embedder.mlp.0.weight"),
                            weight("t_embedder.mlp.0.bias"));
  temb = ops::linear(ops::silu(temb), weight("t_embedder.mlp.2.weight"),
                     weight("t_embedder.mlp.2.bias"));
  const Tensor c = ops::silu(temb);
  Tensor x = latents;
  for (std::int64_t i = 0; i < config_.depth; ++i) x = block(x, c, i);
  const std::vector<Tensor> mod =
      ops::chunk(ops::linear(c, weight("final_layer.adaLN_modulation.1.weight"),
                             weight("final_layer.adaLN_modulation.1.bias")),
                 2, -1);
  x = modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  return ops::linear(x, weight("final_layer.linear.weight"), weight("final_layer.linear.bias"));
}

Tensor DiT::euler_step(const Tensor& latents, const Tensor& t_features, float dt) const {
  return ops::add(latents, ops::mul(forward(latents, t_features), dt));
}

std::vector<float> euler_timesteps(std::int64_t steps) {
  std::vector<float> t(static_cast<std::size_t>(steps));
  for (std::int64_t i = 0; i < steps; ++i) {
    t[static_cast<std::size_t>(i)] = 1.0f - static_cast<float>(i) / static_cast<float>(steps);
  }
  return t;
}

}  // namespace retrace::models
