#include "retrace/models/dit.hpp"

#include "dit_layers.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

namespace retrace::models {

using layers::block_name;

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
  RETRACE_CHECK(dtype_info(c.dtype).is_floating, invalid_argument,
                "DiT: dtype must be float32, bfloat16 or float16, got {}", c.dtype);
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
  const auto [grid_h, grid_w] = layers::patch_grid(config_, height, width);
  (void)positions(grid_h, grid_w);
}

Tensor DiT::positions(std::int64_t grid_h, std::int64_t grid_w) const {
  if (grid_h == config_.grid() && grid_w == config_.grid()) return weight("pos_embed");
  const std::lock_guard lock(positions_mutex_);
  auto it = positions_.find({grid_h, grid_w});
  if (it != positions_.end()) return it->second;
  const Tensor table =
      layers::position_table(config_, file_positions_, grid_h, grid_w).to_device(*device_);
  return positions_.emplace(std::pair{grid_h, grid_w}, table).first->second;
}

Tensor DiT::block(const Tensor& x, const Tensor& c, std::int64_t i) const {
  const std::int64_t h = config_.hidden, heads = config_.heads;
  const layers::WeightOf w = [this](const std::string& name) -> const Tensor& {
    return weight(name);
  };
  auto bw = [&](const char* rest) -> const Tensor& { return weight(block_name(i, rest)); };
  const std::vector<Tensor> mod = layers::block_modulation(w, i, c);
  // Attention.
  Tensor y = layers::modulate(ops::layer_norm(x, {}, {}, 1e-6), mod[0], mod[1]);
  Tensor attn = layers::self_attention(y, bw("attn.qkv.weight"), bw("attn.qkv.bias"), heads,
                                       h / heads);
  attn = ops::linear(attn, bw("attn.proj.weight"), bw("attn.proj.bias"));
  Tensor out = ops::add(x, ops::mul(attn, mod[2]));
  // MLP.
  y = layers::modulate(ops::layer_norm(out, {}, {}, 1e-6), mod[3], mod[4]);
  y = ops::gelu_tanh(ops::linear(y, bw("mlp.fc1.weight"), bw("mlp.fc1.bias")));
  y = ops::linear(y, bw("mlp.fc2.weight"), bw("mlp.fc2.bias"));
  return ops::add(out, ops::mul(y, mod[5]));
}

Tensor DiT::forward(const Tensor& latents, const Tensor& t_frequencies,
                    const Tensor& labels) const {
  const DiTConfig& c = config_;
  const std::int64_t batch =
      layers::check_inputs(c, latents.shape(), t_frequencies.shape(), labels.shape());
  const std::int64_t grid_h = latents.shape()[2] / c.patch_size;
  const std::int64_t grid_w = latents.shape()[3] / c.patch_size;
  const layers::WeightOf w = [this](const std::string& name) -> const Tensor& {
    return weight(name);
  };
  Tensor x = layers::embed_patches(c, w, latents, positions(grid_h, grid_w));
  const Tensor cond = layers::conditioning(c, w, t_frequencies, labels, batch);
  for (std::int64_t i = 0; i < c.depth; ++i) x = block(x, cond, i);
  return layers::final_layer(c, w, x, cond, grid_h, grid_w);
}

Tensor DiT::guided_noise(const Tensor& latents, const Tensor& t_frequencies,
                         const Tensor& labels, double cfg_scale) const {
  layers::check_guidance(config_, latents.shape(), labels.shape(), cfg_scale);
  const Tensor out = forward(layers::guidance_batch(latents, cfg_scale), t_frequencies, labels);
  return layers::guided_from_output(config_, out, latents.shape()[0], cfg_scale);
}

Tensor DiT::sample_step(const Tensor& latents, const Tensor& t_frequencies, const Tensor& labels,
                        const Tensor& coefficients, double cfg_scale) const {
  layers::check_coefficients(coefficients.shape());
  const Tensor eps = guided_noise(latents, t_frequencies, labels, cfg_scale);
  return layers::ddim_update(latents, eps, coefficients);
}

namespace {

constexpr std::int64_t kTrainSteps = 1000;

// The reference's cumulative alphas, linear betas from 1e-4 to 0.02 over 1000 steps.
std::vector<double> alphas_cumprod() {
  std::vector<double> abar(kTrainSteps);
  double product = 1.0;
  for (std::int64_t t = 0; t < kTrainSteps; ++t) {
    const double beta = 1e-4 + (0.02 - 1e-4) * static_cast<double>(t) / (kTrainSteps - 1);
    product *= 1.0 - beta;
    abar[static_cast<std::size_t>(t)] = product;
  }
  return abar;
}

// The reference's "ddimN" spacing: the smallest stride giving N timesteps from 0, else even;
// last first.
std::vector<std::int64_t> spaced_timesteps(std::int64_t steps, std::string_view sampler) {
  RETRACE_CHECK(steps >= 1 && steps <= kTrainSteps, invalid_argument,
                "{}: steps must be from 1 to {}, got {}", sampler, kTrainSteps, steps);
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
  return kept;
}

}  // namespace

Tensor DiT::sampler_step(const Tensor& latents, const Tensor& t_frequencies, const Tensor& labels,
                         const Tensor& coefficients, double cfg_scale, Generator* noise) const {
  RETRACE_CHECK(coefficients.shape() == Shape({4}), invalid_argument,
                "DiT: the sampler step's coefficients must be [4] (see SamplerSchedule), got {}",
                coefficients.shape());
  const std::vector<Tensor> k = ops::chunk(coefficients, 4, 0);  // a, b, c, s
  const Tensor eps = guided_noise(ops::mul(latents, k[2]), t_frequencies, labels, cfg_scale);
  Tensor next = ops::add(ops::mul(latents, k[0]), ops::mul(eps, k[1]));
  if (noise != nullptr) {
    ops::add(next, ops::mul(ops::randn(latents.shape(), *noise, latents.dtype()), k[3]), next);
  }
  return next;
}

DdimSchedule::DdimSchedule(std::int64_t steps) {
  const std::vector<double> abar = alphas_cumprod();
  const std::vector<std::int64_t> kept = spaced_timesteps(steps, "DDIM");
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const double now = abar[static_cast<std::size_t>(kept[i])];
    const double next = i + 1 < kept.size() ? abar[static_cast<std::size_t>(kept[i + 1])] : 1.0;
    timesteps.push_back(static_cast<float>(kept[i]));
    a.push_back(static_cast<float>(std::sqrt(next / now)));
    b.push_back(static_cast<float>(std::sqrt(1.0 - next) - std::sqrt(next * (1.0 - now) / now)));
  }
}

std::string_view sampler_name(Sampler sampler) noexcept {
  switch (sampler) {
    case Sampler::ddim: return "ddim";
    case Sampler::euler: return "euler";
    case Sampler::euler_ancestral: return "euler-ancestral";
  }
  return "unknown";
}

Sampler parse_sampler(std::string_view name) {
  for (Sampler s : {Sampler::ddim, Sampler::euler, Sampler::euler_ancestral}) {
    if (name == sampler_name(s)) return s;
  }
  RETRACE_FAIL(invalid_argument, "unknown sampler \"{}\" (ddim, euler or euler-ancestral)", name);
}

SamplerSchedule::SamplerSchedule(Sampler kind, std::int64_t count) : sampler(kind) {
  if (kind == Sampler::ddim) {
    const DdimSchedule ddim(count);
    timesteps = ddim.timesteps;
    for (std::size_t i = 0; i < ddim.a.size(); ++i) steps.push_back({ddim.a[i], ddim.b[i], 1.0f, 0.0f});
    return;
  }
  const std::vector<double> abar = alphas_cumprod();
  const std::vector<std::int64_t> kept = spaced_timesteps(count, sampler_name(kind));
  auto sigma_of = [&](std::size_t i) {
    if (i >= kept.size()) return 0.0;
    const double ab = abar[static_cast<std::size_t>(kept[i])];
    return std::sqrt((1.0 - ab) / ab);
  };
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const double sigma = sigma_of(i), next = sigma_of(i + 1);
    double up = 0.0, down = next;
    if (kind == Sampler::euler_ancestral) {
      up = std::min(next, next * std::sqrt(std::max(0.0, 1.0 - (next * next) / (sigma * sigma))));
      down = std::sqrt(std::max(0.0, next * next - up * up));
    }
    timesteps.push_back(static_cast<float>(kept[i]));
    steps.push_back({1.0f, static_cast<float>(down - sigma),
                     static_cast<float>(1.0 / std::sqrt(sigma * sigma + 1.0)),
                     static_cast<float>(up)});
  }
  initial_scale = static_cast<float>(std::sqrt(sigma_of(0) * sigma_of(0) + 1.0));
}

}  // namespace retrace::models
