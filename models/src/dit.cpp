#include "retrace/models/dit.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

namespace retrace::models {

namespace {

std::string block_name(std::int64_t i, const char* rest) {
  return fmt::format("blocks.{}.{}", i, rest);
}

// x * (1 + scale) + shift, shift and scale [B, 1, C] against x [B, T, C].
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return ops::add(ops::mul(x, ops::add(scale, 1.0)), shift);
}

}  // namespace

const std::vector<NamedDiTConfig>& benchmark_sizes() {
  static const std::vector<NamedDiTConfig> sizes = {
      {"S", {.input_size = 8, .hidden = 64, .depth = 2, .heads = 2}},
      {"M", {.input_size = 32, .hidden = 256, .depth = 4, .heads = 4}},
      {"L", {.input_size = 64, .hidden = 512, .depth = 4, .heads = 8}}};
  return sizes;
}

std::vector<std::pair<std::string, Shape>> DiT::weight_shapes(const DiTConfig& c) {
  const std::int64_t h = c.hidden, p = c.patch_size, m = c.mlp_width();
  std::vector<std::pair<std::string, Shape>> shapes = {
      {"pos_embed", {1, c.tokens(), h}},
      {"x_embedder.proj.weight", {h, c.in_channels, p, p}},
      {"x_embedder.proj.bias", {h}},
      {"t_embedder.mlp.0.weight", {h, c.frequency_size}},
      {"t_embedder.mlp.0.bias", {h}},
      {"t_embedder.mlp.2.weight", {h, h}},
      {"t_embedder.mlp.2.bias", {h}},
      {"y_embedder.embedding_table.weight", {c.num_classes + 1, h}}};
  for (std::int64_t i = 0; i < c.depth; ++i) {
    shapes.emplace_back(block_name(i, "attn.qkv.weight"), Shape{3 * h, h});
    shapes.emplace_back(block_name(i, "attn.qkv.bias"), Shape{3 * h});
    shapes.emplace_back(block_name(i, "attn.proj.weight"), Shape{h, h});
    shapes.emplace_back(block_name(i, "attn.proj.bias"), Shape{h});
    shapes.emplace_back(block_name(i, "mlp.fc1.weight"), Shape{m, h});
    shapes.emplace_back(block_name(i, "mlp.fc1.bias"), Shape{m});
    shapes.emplace_back(block_name(i, "mlp.fc2.weight"), Shape{h, m});
    shapes.emplace_back(block_name(i, "mlp.fc2.bias"), Shape{h});
    shapes.emplace_back(block_name(i, "adaLN_modulation.1.weight"), Shape{6 * h, h});
    shapes.emplace_back(block_name(i, "adaLN_modulation.1.bias"), Shape{6 * h});
  }
  shapes.emplace_back("final_layer.linear.weight", Shape{p * p * c.out_channels(), h});
  shapes.emplace_back("final_layer.linear.bias", Shape{p * p * c.out_channels()});
  shapes.emplace_back("final_layer.adaLN_modulation.1.weight", Shape{2 * h, h});
  shapes.emplace_back("final_layer.adaLN_modulation.1.bias", Shape{2 * h});
  return shapes;
}

void DiT::check_config() const {
  const DiTConfig& c = config_;
  // Bounds that keep every size the model computes (6 * hidden, tokens * hidden, ...) far from
  // overflowing; a model near them would not fit in any memory anyway.
  constexpr std::int64_t kLimit = std::int64_t{1} << 24;
  for (const auto& [name, value] :
       {std::pair{"input_size", c.input_size}, std::pair{"patch_size", c.patch_size},
        std::pair{"in_channels", c.in_channels}, std::pair{"hidden", c.hidden},
        std::pair{"depth", c.depth}, std::pair{"heads", c.heads},
        std::pair{"mlp width", c.mlp_width()}, std::pair{"frequency_size", c.frequency_size}}) {
    RETRACE_CHECK(value > 0, invalid_argument, "DiT: {} must be positive, got {}", name, value);
    RETRACE_CHECK(value <= kLimit, invalid_argument, "DiT: {} = {} is too large (at most {})",
                  name, value, kLimit);
  }
  RETRACE_CHECK(c.num_classes >= 1 && c.num_classes <= kLimit, invalid_argument,
                "DiT: num_classes must be from 1 to {}, got {}", kLimit, c.num_classes);
  RETRACE_CHECK(c.input_size % c.patch_size == 0, invalid_argument,
                "DiT: input_size ({}) must be a multiple of patch_size ({})", c.input_size,
                c.patch_size);
  RETRACE_CHECK(c.tokens() <= kLimit, invalid_argument,
                "DiT: {} tokens ({}x{} patches) is too many (at most {})", c.tokens(), c.grid(),
                c.grid(), kLimit);
  RETRACE_CHECK(c.hidden % c.heads == 0, invalid_argument,
                "DiT: hidden ({}) must be divisible by heads ({})", c.hidden, c.heads);
  RETRACE_CHECK(c.hidden % 4 == 0, invalid_argument,
                "DiT: hidden ({}) must be a multiple of 4 (the 2-D sin-cos position embedding)",
                c.hidden);
  RETRACE_CHECK(c.frequency_size % 2 == 0, invalid_argument,
                "DiT: frequency_size ({}) must be even", c.frequency_size);
  RETRACE_CHECK(c.dtype == DType::float32 || c.dtype == DType::bfloat16, invalid_argument,
                "DiT: dtype must be float32 or bfloat16, got {}", c.dtype);
}

std::vector<float> sincos_positions(std::int64_t hidden, std::int64_t grid_h,
                                    std::int64_t grid_w) {
  RETRACE_CHECK(hidden > 0 && hidden % 4 == 0 && grid_h >= 0 && grid_w >= 0, invalid_argument,
                "sincos_positions: hidden ({}) must be a positive multiple of 4 and the grid "
                "({}x{}) not negative",
                hidden, grid_h, grid_w);
  const std::int64_t quarter = hidden / 4, half = hidden / 2;
  std::vector<float> out(static_cast<std::size_t>(grid_h * grid_w * hidden));
  // One axis: sin(pos * omega_k) for k < quarter, then cos(...).
  auto encode = [&](double pos, float* dst) {
    for (std::int64_t k = 0; k < quarter; ++k) {
      const double omega =
          1.0 / std::pow(10000.0, static_cast<double>(k) / static_cast<double>(quarter));
      dst[k] = static_cast<float>(std::sin(pos * omega));
      dst[quarter + k] = static_cast<float>(std::cos(pos * omega));
    }
  };
  for (std::int64_t i = 0; i < grid_h; ++i) {
    for (std::int64_t j = 0; j < grid_w; ++j) {
      float* row = out.data() + (i * grid_w + j) * hidden;
      encode(static_cast<double>(j), row);  // the reference's meshgrid puts the column first
      encode(static_cast<double>(i), row + half);
    }
  }
  return out;
}

DiT::DiT(const DiTConfig& config, Device& device) : config_(config), device_(&device) {
  check_config();
  std::mt19937_64 rng(config.seed);
  for (const auto& [name, shape] : weight_shapes(config)) {
    std::vector<float> values;
    if (name == "pos_embed") {
      values = sincos_positions(config.hidden, config.grid(), config.grid());
    } else {
      // Weights ~ N(0, 1/fan_in); biases small; the label table N(0, 0.02) as the reference
      // initialises it; adaLN and the final layer scaled down (the reference zeroes them,
      // which would make every random model output zero).
      const bool bias = name.ends_with(".bias");
      const double fan_in = static_cast<double>(shape.numel() / shape[0]);
      double stddev = bias ? 0.02 : 1.0 / std::sqrt(fan_in);
      if (name.starts_with("y_embedder")) stddev = 0.02;
      if (name.find("adaLN") != std::string::npos || name.starts_with("final_layer")) stddev *= 0.1;
      std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
      values.resize(static_cast<std::size_t>(shape.numel()));
      for (float& v : values) v = dist(rng);
    }
    weights_[name] = Tensor::from_vector<float>(values, shape, config.dtype).to_device(device);
  }
}

DiT::DiT(const DiTConfig& config, Device& device, const std::map<std::string, Tensor>& weights,
         UnusedWeights unused)
    : config_(config), device_(&device) {
  check_config();
  const auto shapes = weight_shapes(config);
  std::set<std::string> expected;
  for (const auto& entry : shapes) expected.insert(entry.first);
  std::vector<std::string> extra;
  for (const auto& [name, tensor] : weights) {
    if (!expected.contains(name)) extra.push_back(name);
  }
  if (!extra.empty()) {
    const std::string list = fmt::format("\"{}\"", fmt::join(extra, "\", \""));
    RETRACE_CHECK(unused == UnusedWeights::warn, invalid_argument,
                  "DiT: the weights have {} tensor{} this model does not use: {}", extra.size(),
                  extra.size() == 1 ? "" : "s", list);
    log(LogLevel::warning, "DiT: ignoring {} tensor{} this model does not use: {}", extra.size(),
              extra.size() == 1 ? "" : "s", list);
  }
  // Check every tensor before uploading any (nothing half-done on a bad file).
  for (const auto& [name, shape] : shapes) {
    auto it = weights.find(name);
    if (it == weights.end() && name == "pos_embed") continue;  // the fixed table, computed
    RETRACE_CHECK(it != weights.end(), invalid_argument,
                  "DiT: the weights have no tensor \"{}\" (expected shape {})", name, shape);
    RETRACE_CHECK(it->second.shape() == shape, invalid_argument,
                  "DiT: weight \"{}\" has shape {}, expected {} (hidden {}, depth {}, patch {}, "
                  "{} latent channels, {} classes)",
                  name, it->second.shape(), shape, config.hidden, config.depth,
                  config.patch_size, config.in_channels, config.num_classes);
    RETRACE_CHECK(dtype_info(it->second.dtype()).is_floating, invalid_argument,
                  "DiT: weight \"{}\" has dtype {}; expected a floating-point dtype", name,
                  it->second.dtype());
  }
  for (const auto& [name, shape] : shapes) {
    auto it = weights.find(name);
    Tensor w;
    if (it == weights.end()) {
      w = Tensor::from_vector<float>(sincos_positions(config.hidden, config.grid(), config.grid()),
                                     shape, config.dtype);
    } else {
      w = it->second;
      if (name == "pos_embed") file_positions_ = true;
      if (w.dtype() != config.dtype)
        w = Tensor::from_vector<float>(w.to_vector<float>(), shape, config.dtype);
    }
    weights_[name] = w.to_device(device);
  }
}

DiTConfig infer_dit_config(const std::map<std::string, Tensor>& weights,
                           const DiTInference& inference) {
  auto shape_of = [&](const std::string& name, std::size_t rank) -> const Shape& {
    auto it = weights.find(name);
    RETRACE_CHECK(it != weights.end(), invalid_argument,
                  "DiT: the weights have no tensor \"{}\", so they are not a DiT checkpoint in "
                  "the reference layout",
                  name);
    RETRACE_CHECK(it->second.shape().rank() == rank, invalid_argument,
                  "DiT: weight \"{}\" has shape {}; expected rank {}", name, it->second.shape(),
                  rank);
    return it->second.shape();
  };
  DiTConfig c;
  c.dtype = inference.dtype;
  const Shape& proj = shape_of("x_embedder.proj.weight", 4);
  RETRACE_CHECK(proj[2] == proj[3], invalid_argument,
                "DiT: weight \"x_embedder.proj.weight\" has shape {}; the patch must be square",
                proj);
  c.hidden = proj[0];
  c.in_channels = proj[1];
  c.patch_size = proj[2];
  c.frequency_size = shape_of("t_embedder.mlp.0.weight", 2)[1];
  c.num_classes = shape_of("y_embedder.embedding_table.weight", 2)[0] - 1;
  RETRACE_CHECK(c.num_classes >= 1, invalid_argument,
                "DiT: weight \"y_embedder.embedding_table.weight\" has shape {}; it needs a row "
                "per class and one for the null class",
                shape_of("y_embedder.embedding_table.weight", 2));
  // Blocks 0 .. depth-1, each present; a gap or a stray index is an error naming it.
  std::set<std::int64_t> blocks;
  for (const auto& [name, tensor] : weights) {
    if (!name.starts_with("blocks.")) continue;
    std::int64_t index = -1;
    const std::size_t dot = name.find('.', 7);
    try {
      std::size_t used = 0;
      index = std::stoll(name.substr(7, dot - 7), &used);
      if (used != dot - 7) index = -1;
    } catch (const std::exception&) {
      index = -1;
    }
    RETRACE_CHECK(index >= 0 && index < (std::int64_t{1} << 20), invalid_argument,
                  "DiT: tensor \"{}\" is not named blocks.<index>.<...>", name);
    blocks.insert(index);
  }
  RETRACE_CHECK(!blocks.empty(), invalid_argument, "DiT: the weights have no blocks.N tensors");
  c.depth = *blocks.rbegin() + 1;
  for (std::int64_t i = 0; i < c.depth; ++i) {
    RETRACE_CHECK(blocks.contains(i), invalid_argument,
                  "DiT: the weights have blocks up to blocks.{} but no tensor of blocks.{}",
                  c.depth - 1, i);
  }
  c.mlp_hidden = shape_of(block_name(0, "mlp.fc1.weight"), 2)[0];
  const std::int64_t final_rows = shape_of("final_layer.linear.weight", 2)[0];
  const std::int64_t per_patch = c.patch_size * c.patch_size;
  RETRACE_CHECK(final_rows == per_patch * c.in_channels || final_rows == 2 * per_patch * c.in_channels,
                invalid_argument,
                "DiT: weight \"final_layer.linear.weight\" has {} rows; expected patch^2 x "
                "channels = {} or, with learned sigma, {}",
                final_rows, per_patch * c.in_channels, 2 * per_patch * c.in_channels);
  c.learn_sigma = final_rows == 2 * per_patch * c.in_channels;
  if (auto it = weights.find("pos_embed"); it != weights.end()) {
    const Shape& pos = shape_of("pos_embed", 3);
    const auto grid = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(pos[1]))));
    RETRACE_CHECK(pos[0] == 1 && grid * grid == pos[1], invalid_argument,
                  "DiT: weight \"pos_embed\" has shape {}; expected [1, tokens, hidden] with a "
                  "square number of tokens",
                  pos);
    c.input_size = grid * c.patch_size;
    RETRACE_CHECK(!inference.input_size || *inference.input_size == c.input_size,
                  invalid_argument,
                  "DiT: input size {} was asked for, but the file's pos_embed ({}) is for {}x{} "
                  "latents (patch {})",
                  inference.input_size.value_or(0), pos, c.input_size, c.input_size, c.patch_size);
  } else {
    RETRACE_CHECK(inference.input_size.has_value(), invalid_argument,
                  "DiT: the weights have no \"pos_embed\", so the latent size must be given");
    c.input_size = *inference.input_size;
  }
  if (inference.heads) {
    c.heads = *inference.heads;
  } else {
    RETRACE_CHECK(c.hidden % 64 == 0, invalid_argument,
                  "DiT: the number of heads is not stored in the weights, and hidden ({}) is not "
                  "a multiple of 64 (the reference's head width); give the number of heads",
                  c.hidden);
    c.heads = c.hidden / 64;
  }
  return c;
}

const Tensor& DiT::weight(const std::string& name) const {
  auto it = weights_.find(name);
  RETRACE_CHECK(it != weights_.end(), invalid_argument, "DiT: no weight named \"{}\"", name);
  return it->second;
}

std::vector<float> DiT::timestep_frequencies(std::span<const float> t) const {
  const std::int64_t f = config_.frequency_size, half = f / 2;
  std::vector<float> out(t.size() * static_cast<std::size_t>(f));
  for (std::size_t row = 0; row < t.size(); ++row) {
    float* dst = out.data() + row * static_cast<std::size_t>(f);
    for (std::int64_t i = 0; i < half; ++i) {
      const double freq =
          std::exp(-std::log(10000.0) * static_cast<double>(i) / static_cast<double>(half));
      const double arg = static_cast<double>(t[row]) * freq;
      dst[i] = static_cast<float>(std::cos(arg));
      dst[half + i] = static_cast<float>(std::sin(arg));
    }
  }
  return out;
}

std::vector<float> DiT::label_rows(std::span<const std::int64_t> labels) const {
  const std::int64_t rows = config_.num_classes + 1;
  std::vector<float> out(labels.size() * static_cast<std::size_t>(rows), 0.0f);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    RETRACE_CHECK(labels[i] >= 0 && labels[i] <= config_.num_classes, invalid_argument,
                  "DiT: class label {} (at {}) is outside [0, {}] ({} is the null class)",
                  labels[i], i, config_.num_classes, config_.num_classes);
    out[i * static_cast<std::size_t>(rows) + static_cast<std::size_t>(labels[i])] = 1.0f;
  }
  return out;
}

void DiT::prepare_resolution(std::int64_t height, std::int64_t width) const {
  const std::int64_t p = config_.patch_size;
  RETRACE_CHECK(height > 0 && width > 0 && height % p == 0 && width % p == 0, invalid_argument,
                "DiT: latents of {}x{} do not split into {}x{} patches", height, width, p, p);
  (void)positions(height / p, width / p);
}

Tensor DiT::positions(std::int64_t grid_h, std::int64_t grid_w) const {
  if (grid_h == config_.grid() && grid_w == config_.grid()) return weight("pos_embed");
  RETRACE_CHECK(!file_positions_, invalid_argument,
                "DiT: the checkpoint's pos_embed is for {}x{} latents ({}x{} patches); these "
                "latents have {}x{} patches",
                config_.input_size, config_.input_size, config_.grid(), config_.grid(), grid_h,
                grid_w);
  const std::lock_guard lock(positions_mutex_);
  auto it = positions_.find({grid_h, grid_w});
  if (it != positions_.end()) return it->second;
  Tensor table = Tensor::from_vector<float>(sincos_positions(config_.hidden, grid_h, grid_w),
                                            {1, grid_h * grid_w, config_.hidden}, config_.dtype)
                     .to_device(*device_);
  return positions_.emplace(std::pair{grid_h, grid_w}, table).first->second;
}

Tensor DiT::block(const Tensor& x, const Tensor& c, std::int64_t i) const {
  const std::int64_t h = config_.hidden, heads = config_.heads, d = h / heads;
  const std::int64_t batch = x.shape()[0], tokens = x.shape()[1];
  auto w = [&](const char* rest) -> const Tensor& { return weight(block_name(i, rest)); };
  const std::vector<Tensor> mod = ops::chunk(
      ops::linear(c, w("adaLN_modulation.1.weight"), w("adaLN_modulation.1.bias")), 6, -1);
  // Attention.
  Tensor y = modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  Tensor qkv = ops::linear(y, w("attn.qkv.weight"), w("attn.qkv.bias"));
  qkv = ops::permute(ops::reshape(qkv, {batch, tokens, 3, heads, d}), {2, 0, 3, 1, 4});
  const std::vector<Tensor> parts = ops::chunk(qkv, 3, 0);
  auto head_view = [&](const Tensor& t) { return ops::reshape(t, {batch, heads, tokens, d}); };
  Tensor attn = ops::scaled_dot_product_attention(head_view(parts[0]), head_view(parts[1]),
                                                  head_view(parts[2]));
  attn = ops::reshape(ops::permute(attn, {0, 2, 1, 3}), {batch, tokens, h});
  attn = ops::linear(attn, w("attn.proj.weight"), w("attn.proj.bias"));
  Tensor out = ops::add(x, ops::mul(attn, mod[2]));
  // MLP.
  y = modulate(ops::layer_norm(out, {}, {}, 1e-6), mod[3], mod[4]);
  y = ops::gelu_tanh(ops::linear(y, w("mlp.fc1.weight"), w("mlp.fc1.bias")));
  y = ops::linear(y, w("mlp.fc2.weight"), w("mlp.fc2.bias"));
  return ops::add(out, ops::mul(y, mod[5]));
}

Tensor DiT::forward(const Tensor& latents, const Tensor& t_frequencies,
                    const Tensor& labels) const {
  const DiTConfig& c = config_;
  const std::int64_t h = c.hidden, p = c.patch_size;
  const Shape& s = latents.shape();
  RETRACE_CHECK(s.rank() == 4 && s[1] == c.in_channels && s[0] > 0 && s[2] > 0 && s[3] > 0 &&
                    s[2] % p == 0 && s[3] % p == 0,
                invalid_argument,
                "DiT: latents must be [batch, {}, H, W] with H and W positive multiples of the "
                "patch size {}, got {}",
                c.in_channels, p, s);
  const std::int64_t batch = s[0], grid_h = s[2] / p, grid_w = s[3] / p;
  const std::int64_t tokens = grid_h * grid_w;
  RETRACE_CHECK(t_frequencies.shape().rank() == 2 &&
                    (t_frequencies.shape()[0] == 1 || t_frequencies.shape()[0] == batch) &&
                    t_frequencies.shape()[1] == c.frequency_size,
                invalid_argument, "DiT: timestep frequencies must be [1 or {}, {}], got {}", batch,
                c.frequency_size, t_frequencies.shape());
  RETRACE_CHECK(labels.shape() == Shape({batch, c.num_classes + 1}), invalid_argument,
                "DiT: labels must be one-hot rows [{}, {}] (see label_rows), got {}", batch,
                c.num_classes + 1, labels.shape());
  // Patch embedding: the p x p convolution of stride p is a linear layer over each patch's
  // C_in x p x p values, in the order of the convolution's weight.
  Tensor patches = ops::permute(ops::reshape(latents, {batch, c.in_channels, grid_h, p, grid_w, p}),
                                {0, 2, 4, 1, 3, 5});
  patches = ops::reshape(patches, {batch, tokens, c.in_channels * p * p});
  const Tensor& proj = weight("x_embedder.proj.weight");
  Tensor x = ops::linear(patches, ops::reshape(proj, {h, c.in_channels * p * p}),
                         weight("x_embedder.proj.bias"));
  x = ops::add(x, positions(grid_h, grid_w));
  // Conditioning: timestep MLP plus the label's row of the table (one-hot rows x table).
  Tensor temb = ops::linear(t_frequencies, weight("t_embedder.mlp.0.weight"),
                            weight("t_embedder.mlp.0.bias"));
  temb = ops::linear(ops::silu(temb), weight("t_embedder.mlp.2.weight"),
                     weight("t_embedder.mlp.2.bias"));
  const Tensor yemb = ops::matmul(labels, weight("y_embedder.embedding_table.weight"));
  // Every adaLN layer starts with SiLU(c); computed once. [B, 1, C] to broadcast over tokens.
  const Tensor cond = ops::reshape(ops::silu(ops::add(temb, yemb)), {batch, 1, h});
  for (std::int64_t i = 0; i < c.depth; ++i) x = block(x, cond, i);
  const std::vector<Tensor> mod =
      ops::chunk(ops::linear(cond, weight("final_layer.adaLN_modulation.1.weight"),
                             weight("final_layer.adaLN_modulation.1.bias")),
                 2, -1);
  x = modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  x = ops::linear(x, weight("final_layer.linear.weight"), weight("final_layer.linear.bias"));
  // Unpatchify: [B, gh, gw, p, p, C_out] -> [B, C_out, gh, p, gw, p].
  const std::int64_t out = c.out_channels();
  x = ops::permute(ops::reshape(x, {batch, grid_h, grid_w, p, p, out}), {0, 5, 1, 3, 2, 4});
  return ops::reshape(x, {batch, out, grid_h * p, grid_w * p});
}

Tensor DiT::guided_noise(const Tensor& latents, const Tensor& t_frequencies,
                         const Tensor& labels, double cfg_scale) const {
  const std::int64_t channels = config_.in_channels;
  RETRACE_CHECK(std::isfinite(cfg_scale), invalid_argument,
                "DiT: the guidance scale must be finite, got {}", cfg_scale);
  if (cfg_scale == 1.0) {
    return ops::slice(forward(latents, t_frequencies, labels), 1, 0, channels);
  }
  RETRACE_CHECK(latents.shape().rank() == 4, invalid_argument,
                "DiT: latents must be [batch, {}, H, W], got {}", channels, latents.shape());
  const std::int64_t batch = latents.shape()[0];
  RETRACE_CHECK(labels.shape().rank() == 2 && labels.shape()[0] == 2 * batch, invalid_argument,
                "DiT: with guidance, labels need {} rows (the conditional labels, then as many "
                "null ones) for {} latents, got {}",
                2 * batch, batch, labels.shape());
  const std::vector<Tensor> twice{latents, latents};
  const Tensor eps = ops::slice(forward(ops::concat(twice, 0), t_frequencies, labels), 1, 0,
                                channels);
  const Tensor cond = ops::slice(eps, 0, 0, batch);
  const Tensor uncond = ops::slice(eps, 0, batch, 2 * batch);
  return ops::add(uncond, ops::mul(ops::sub(cond, uncond), cfg_scale));
}

Tensor DiT::sample_step(const Tensor& latents, const Tensor& t_frequencies, const Tensor& labels,
                        const Tensor& coefficients, double cfg_scale) const {
  RETRACE_CHECK(coefficients.shape() == Shape({2}), invalid_argument,
                "DiT: the step's coefficients must be [2] (see DdimSchedule), got {}",
                coefficients.shape());
  const std::vector<Tensor> ab = ops::chunk(coefficients, 2, 0);
  const Tensor eps = guided_noise(latents, t_frequencies, labels, cfg_scale);
  return ops::add(ops::mul(latents, ab[0]), ops::mul(eps, ab[1]));
}

DdimSchedule::DdimSchedule(std::int64_t steps) {
  constexpr std::int64_t kTrainSteps = 1000;
  RETRACE_CHECK(steps >= 1 && steps <= kTrainSteps, invalid_argument,
                "DDIM: steps must be from 1 to {}, got {}", kTrainSteps, steps);
  // The reference's cumulative alphas, linear betas from 1e-4 to 0.02 over 1000 steps.
  std::vector<double> abar(kTrainSteps);
  double product = 1.0;
  for (std::int64_t t = 0; t < kTrainSteps; ++t) {
    const double beta = 1e-4 + (0.02 - 1e-4) * static_cast<double>(t) / (kTrainSteps - 1);
    product *= 1.0 - beta;
    abar[static_cast<std::size_t>(t)] = product;
  }
  // The reference's "ddimN" spacing: the smallest stride giving N timesteps from 0, else even.
  std::vector<std::int64_t> kept;
  for (std::int64_t stride = 1; stride <= kTrainSteps && kept.empty(); ++stride) {
    if ((kTrainSteps + stride - 1) / stride == steps) {
      for (std::int64_t t = 0; t < kTrainSteps; t += stride) kept.push_back(t);
    }
  }
  if (kept.empty()) {
    for (std::int64_t k = 0; k < steps; ++k) kept.push_back(k * kTrainSteps / steps);
  }
  std::reverse(kept.begin(), kept.end());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const double now = abar[static_cast<std::size_t>(kept[i])];
    const double next = i + 1 < kept.size() ? abar[static_cast<std::size_t>(kept[i + 1])] : 1.0;
    timesteps.push_back(static_cast<float>(kept[i]));
    a.push_back(static_cast<float>(std::sqrt(next / now)));
    b.push_back(static_cast<float>(std::sqrt(1.0 - next) - std::sqrt(next * (1.0 - now) / now)));
  }
}

}  // namespace retrace::models
