#include "retrace/models/vae.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string_view>

namespace retrace::models {

namespace {

std::string up_block(std::size_t i) { return fmt::format("decoder.up_blocks.{}", i); }
std::string resnet_name(const std::string& block, std::int64_t j) {
  return fmt::format("{}.resnets.{}", block, j);
}
constexpr std::string_view kMid = "decoder.mid_block";
constexpr std::string_view kAttention = "decoder.mid_block.attentions.0";

// The attention's projections under diffusers' older names (AttentionBlock, still in the
// published sd-vae-ft-ema and -mse files), which diffusers renames when it loads them.
constexpr std::pair<std::string_view, std::string_view> kLegacyProjections[] = {
    {"to_q", "query"}, {"to_k", "key"}, {"to_v", "value"}, {"to_out.0", "proj_attn"}};

// A name of weight_shapes as an older file may spell it ("" when it has no other spelling).
std::string legacy_name(const std::string& name) {
  for (const auto& [current, legacy] : kLegacyProjections) {
    const std::string prefix = fmt::format("{}.{}.", kAttention, current);
    if (name.starts_with(prefix)) {
      return fmt::format("{}.{}.{}", kAttention, legacy, name.substr(prefix.size()));
    }
  }
  return {};
}

// A tensor of the encoder half of an AutoencoderKL file: not the decoder's, skipped.
bool encoder_tensor(const std::string& name) {
  return name.starts_with("encoder.") || name.starts_with("quant_conv.");
}

// The indices N of the tensors named <prefix>.N.<...>, each checked to be a whole number.
std::set<std::int64_t> indices_under(const std::map<std::string, Tensor>& weights,
                                     const std::string& prefix) {
  std::set<std::int64_t> found;
  const std::string head = prefix + ".";
  for (const auto& [name, tensor] : weights) {
    if (!name.starts_with(head)) continue;
    const std::size_t dot = name.find('.', head.size());
    const std::string digits = name.substr(head.size(), dot - head.size());
    const bool whole = !digits.empty() && digits.size() <= 6 &&
                       std::all_of(digits.begin(), digits.end(),
                                   [](char ch) { return ch >= '0' && ch <= '9'; });
    RETRACE_CHECK(whole && dot != std::string::npos, invalid_argument,
                  "VAE decoder: tensor \"{}\" is not named {}.<index>.<...>", name, prefix);
    found.insert(std::stoll(digits));
  }
  return found;
}

// 0 .. count-1 from a set of indices, or an error naming the first gap.
std::int64_t count_without_gaps(const std::set<std::int64_t>& found, const std::string& prefix) {
  if (found.empty()) return 0;
  const std::int64_t count = *found.rbegin() + 1;
  for (std::int64_t i = 0; i < count; ++i) {
    RETRACE_CHECK(found.contains(i), invalid_argument,
                  "VAE decoder: the weights have {}.{} but no tensor of {}.{}", prefix, count - 1,
                  prefix, i);
  }
  return count;
}

}  // namespace

std::int64_t VaeDecoderConfig::upscale() const noexcept {
  const auto blocks = static_cast<std::int64_t>(block_out_channels.size());
  return blocks <= 1 || blocks > 31 ? 1 : std::int64_t{1} << (blocks - 1);
}

std::vector<std::pair<std::string, Shape>> VaeDecoder::weight_shapes(const VaeDecoderConfig& c) {
  std::vector<std::pair<std::string, Shape>> shapes;
  const auto conv = [&](const std::string& name, std::int64_t out, std::int64_t in,
                        std::int64_t k) {
    shapes.emplace_back(name + ".weight", Shape{out, in, k, k});
    shapes.emplace_back(name + ".bias", Shape{out});
  };
  const auto norm = [&](const std::string& name, std::int64_t channels) {
    shapes.emplace_back(name + ".weight", Shape{channels});
    shapes.emplace_back(name + ".bias", Shape{channels});
  };
  const auto resnet = [&](const std::string& name, std::int64_t in, std::int64_t out) {
    norm(name + ".norm1", in);
    conv(name + ".conv1", out, in, 3);
    norm(name + ".norm2", out);
    conv(name + ".conv2", out, out, 3);
    if (in != out) conv(name + ".conv_shortcut", out, in, 1);
  };
  const std::int64_t lc = c.latent_channels;
  if (c.block_out_channels.empty()) return shapes;
  const std::int64_t top = c.block_out_channels.back();
  if (c.post_quant_conv) conv("post_quant_conv", lc, lc, 1);
  conv("decoder.conv_in", top, lc, 3);
  resnet(fmt::format("{}.resnets.0", kMid), top, top);
  if (c.mid_attention) {
    norm(fmt::format("{}.group_norm", kAttention), top);
    for (const auto& [current, legacy] : kLegacyProjections) {
      shapes.emplace_back(fmt::format("{}.{}.weight", kAttention, current), Shape{top, top});
      shapes.emplace_back(fmt::format("{}.{}.bias", kAttention, current), Shape{top});
    }
  }
  resnet(fmt::format("{}.resnets.1", kMid), top, top);
  const std::size_t blocks = c.block_out_channels.size();
  std::int64_t in = top;
  for (std::size_t i = 0; i < blocks; ++i) {
    const std::int64_t out = c.block_out_channels[blocks - 1 - i];
    for (std::int64_t j = 0; j <= c.layers_per_block; ++j) {
      resnet(resnet_name(up_block(i), j), j == 0 ? in : out, out);
    }
    if (i + 1 < blocks) conv(up_block(i) + ".upsamplers.0.conv", out, out, 3);
    in = out;
  }
  norm("decoder.conv_norm_out", c.block_out_channels.front());
  conv("decoder.conv_out", c.out_channels, c.block_out_channels.front(), 3);
  return shapes;
}

void VaeDecoder::check_config() const {
  const VaeDecoderConfig& c = config_;
  constexpr std::int64_t kLimit = std::int64_t{1} << 20;
  RETRACE_CHECK(!c.block_out_channels.empty() && c.block_out_channels.size() <= 16,
                invalid_argument, "VAE decoder: block_out_channels has {} entries; expected 1 to 16",
                c.block_out_channels.size());
  for (const auto& [name, value] :
       {std::pair{"latent_channels", c.latent_channels}, std::pair{"out_channels", c.out_channels},
        std::pair{"norm_groups", c.norm_groups}}) {
    RETRACE_CHECK(value >= 1 && value <= kLimit, invalid_argument,
                  "VAE decoder: {} is {}; expected 1 to {}", name, value, kLimit);
  }
  RETRACE_CHECK(c.layers_per_block >= 0 && c.layers_per_block <= 64, invalid_argument,
                "VAE decoder: layers_per_block is {}; expected 0 to 64", c.layers_per_block);
  for (std::size_t i = 0; i < c.block_out_channels.size(); ++i) {
    const std::int64_t width = c.block_out_channels[i];
    RETRACE_CHECK(width >= 1 && width <= kLimit && width % c.norm_groups == 0, invalid_argument,
                  "VAE decoder: block_out_channels[{}] is {}; expected a positive multiple of the "
                  "{} norm groups, at most {}",
                  i, width, c.norm_groups, kLimit);
  }
  RETRACE_CHECK(std::isfinite(c.norm_eps) && c.norm_eps >= 0, invalid_argument,
                "VAE decoder: norm_eps is {}; expected a finite value >= 0", c.norm_eps);
  RETRACE_CHECK(std::isfinite(c.scaling_factor) && c.scaling_factor != 0.0, invalid_argument,
                "VAE decoder: scaling_factor is {}; expected a finite nonzero value",
                c.scaling_factor);
  RETRACE_CHECK(dtype_info(c.dtype).is_floating, invalid_argument,
                "VAE decoder: dtype {} is not a floating-point dtype", c.dtype);
}

VaeDecoder::VaeDecoder(const VaeDecoderConfig& config, Device& device)
    : config_(config), device_(&device) {
  check_config();
  std::mt19937_64 rng(config.seed);
  for (const auto& [name, shape] : weight_shapes(config)) {
    const bool bias = name.ends_with(".bias");
    const bool norm = shape.rank() == 1 && !bias;
    const double fan_in = static_cast<double>(shape.numel() / std::max<std::int64_t>(shape[0], 1));
    const double stddev = bias ? 0.02 : norm ? 0.1 : 1.0 / std::sqrt(fan_in);
    std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
    std::vector<float> values(static_cast<std::size_t>(shape.numel()));
    for (float& v : values) v = (norm ? 1.0f : 0.0f) + dist(rng);
    weights_[name] = Tensor::from_vector<float>(values, shape, config.dtype).to_device(device);
  }
}

VaeDecoder::VaeDecoder(const VaeDecoderConfig& config, Device& device,
                       const std::map<std::string, Tensor>& weights, UnusedWeights unused)
    : config_(config), device_(&device) {
  check_config();
  const auto shapes = weight_shapes(config);
  // Each expected tensor and where it is in `weights` (its current or its older name).
  std::vector<std::pair<const Tensor*, std::string>> found;
  std::set<std::string> used;
  for (const auto& [name, shape] : shapes) {
    auto it = weights.find(name);
    const std::string legacy = legacy_name(name);
    if (it == weights.end() && !legacy.empty()) it = weights.find(legacy);
    RETRACE_CHECK(it != weights.end(), invalid_argument,
                  "VAE decoder: the weights have no tensor \"{}\"{} (expected shape {})", name,
                  legacy.empty() ? "" : fmt::format(" (nor \"{}\")", legacy), shape);
    // The attention's projections may be stored as 1x1 convolutions.
    const Shape& given = it->second.shape();
    const bool as_conv = shape.rank() == 2 && given == Shape{shape[0], shape[1], 1, 1};
    RETRACE_CHECK(given == shape || as_conv, invalid_argument,
                  "VAE decoder: weight \"{}\" has shape {}, expected {} (latent channels {}, "
                  "block widths [{}], {} layers per block, {} output channels)",
                  it->first, given, shape, config.latent_channels,
                  fmt::join(config.block_out_channels, ", "), config.layers_per_block,
                  config.out_channels);
    RETRACE_CHECK(dtype_info(it->second.dtype()).is_floating, invalid_argument,
                  "VAE decoder: weight \"{}\" has dtype {}; expected a floating-point dtype",
                  it->first, it->second.dtype());
    found.emplace_back(&it->second, name);
    used.insert(it->first);
  }
  std::vector<std::string> extra;
  for (const auto& [name, tensor] : weights) {
    if (!used.contains(name) && !encoder_tensor(name)) extra.push_back(name);
  }
  if (!extra.empty()) {
    const std::string list = fmt::format("\"{}\"", fmt::join(extra, "\", \""));
    RETRACE_CHECK(unused == UnusedWeights::warn, invalid_argument,
                  "VAE decoder: the weights have {} tensor{} this decoder does not use: {}",
                  extra.size(), extra.size() == 1 ? "" : "s", list);
    log(LogLevel::warning, "VAE decoder: ignoring {} tensor{} this decoder does not use: {}",
        extra.size(), extra.size() == 1 ? "" : "s", list);
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape& shape = shapes[i].second;
    Tensor t = *found[i].first;
    if (t.shape() != shape || t.dtype() != config.dtype) {
      t = Tensor::from_vector<float>(t.to_vector<float>(), shape, config.dtype);
    }
    weights_[found[i].second] = t.to_device(device);
  }
}

VaeDecoderConfig infer_vae_decoder_config(const std::map<std::string, Tensor>& weights,
                                          const VaeInference& inference) {
  auto shape_of = [&](const std::string& name, std::size_t rank) -> const Shape& {
    auto it = weights.find(name);
    RETRACE_CHECK(it != weights.end(), invalid_argument,
                  "VAE decoder: the weights have no tensor \"{}\", so they are not a VAE (diffusers' "
                  "AutoencoderKL) in diffusers' layout",
                  name);
    RETRACE_CHECK(it->second.shape().rank() == rank, invalid_argument,
                  "VAE decoder: weight \"{}\" has shape {}; expected rank {}", name,
                  it->second.shape(), rank);
    return it->second.shape();
  };
  VaeDecoderConfig c;
  c.dtype = inference.dtype;
  c.norm_groups = inference.norm_groups;
  c.scaling_factor = inference.scaling_factor;
  const Shape& conv_in = shape_of("decoder.conv_in.weight", 4);
  c.latent_channels = conv_in[1];
  c.out_channels = shape_of("decoder.conv_out.weight", 4)[0];
  const std::int64_t blocks =
      count_without_gaps(indices_under(weights, "decoder.up_blocks"), "decoder.up_blocks");
  RETRACE_CHECK(blocks >= 1, invalid_argument,
                "VAE decoder: the weights have no decoder.up_blocks.N tensors");
  std::vector<std::int64_t> widths;
  std::int64_t layers = -1;
  for (std::int64_t i = 0; i < blocks; ++i) {
    const std::string block = up_block(static_cast<std::size_t>(i));
    const std::int64_t resnets =
        count_without_gaps(indices_under(weights, block + ".resnets"), block + ".resnets");
    RETRACE_CHECK(resnets >= 1, invalid_argument,
                  "VAE decoder: the weights have no {}.resnets.N tensors", block);
    RETRACE_CHECK(layers < 0 || resnets == layers + 1, invalid_argument,
                  "VAE decoder: {} has {} ResNet blocks, but decoder.up_blocks.0 has {}; every up "
                  "block has layers_per_block + 1",
                  block, resnets, layers + 1);
    layers = resnets - 1;
    widths.push_back(shape_of(resnet_name(block, 0) + ".conv1.weight", 4)[0]);
  }
  c.block_out_channels.assign(widths.rbegin(), widths.rend());
  c.layers_per_block = layers;
  c.mid_attention = !indices_under(weights, std::string(kMid) + ".attentions").empty();
  c.post_quant_conv = weights.contains("post_quant_conv.weight");
  return c;
}

std::size_t VaeDecoder::decode_bytes(const VaeDecoderConfig& c, const Shape& latents) {
  if (latents.rank() != 4 || c.block_out_channels.empty()) return 0;
  const auto element = static_cast<double>(dtype_info(c.dtype).size);
  double weights = 0;
  for (const auto& entry : weight_shapes(c)) weights += static_cast<double>(entry.second.numel());
  // The widest activation and the largest convolution (its padded input, the columns of at
  // most one chunk, its transformed weights, its result rows and output), stage by stage.
  const auto batch = static_cast<double>(latents[0]);
  double pixels = static_cast<double>(latents[2]) * static_cast<double>(latents[3]);
  double widest = 0, conv = 0;
  const std::size_t blocks = c.block_out_channels.size();
  for (std::size_t i = 0; i < blocks; ++i) {
    const double out = static_cast<double>(c.block_out_channels[blocks - 1 - i]);
    const double in = i == 0 ? out : static_cast<double>(c.block_out_channels[blocks - i]);
    const double wider = std::max(in, out);
    widest = std::max(widest, batch * pixels * wider);
    const double columns =
        std::min(batch * pixels * wider * 9, static_cast<double>(ops::conv2d_column_bytes()) / element);
    // float32 3x3 convolutions by Winograd (ops::conv2d_winograd) also hold their weights
    // transformed: 36 values per input and output channel pair.
    const double transformed = c.dtype == DType::float32 ? 36 * wider * out : 0;
    conv = std::max(conv, columns + transformed + batch * pixels * (wider + 3 * out));
    if (i + 1 < blocks) pixels *= 4;
  }
  return static_cast<std::size_t>((weights + conv + 6 * widest) * element) + (std::size_t{64} << 20);
}

const Tensor& VaeDecoder::weight(const std::string& name) const {
  auto it = weights_.find(name);
  RETRACE_CHECK(it != weights_.end(), invalid_argument, "VAE decoder: no weight named \"{}\"",
                name);
  return it->second;
}

Tensor VaeDecoder::conv(const Tensor& x, const std::string& prefix, std::int64_t padding) const {
  return ops::conv2d(x, w(prefix + ".weight"), w(prefix + ".bias"),
                     ops::Conv2dOptions{.padding = {padding, padding}});
}

Tensor VaeDecoder::norm(const Tensor& x, const std::string& prefix) const {
  return ops::group_norm(x, config_.norm_groups, w(prefix + ".weight"), w(prefix + ".bias"),
                         config_.norm_eps);
}

Tensor VaeDecoder::resnet(const Tensor& x, const std::string& prefix) const {
  Tensor h = conv(ops::silu(norm(x, prefix + ".norm1")), prefix + ".conv1", 1);
  h = conv(ops::silu(norm(h, prefix + ".norm2")), prefix + ".conv2", 1);
  const Tensor shortcut =
      weights_.contains(prefix + ".conv_shortcut.weight") ? conv(x, prefix + ".conv_shortcut", 0) : x;
  return ops::add(shortcut, h);
}

// Single-head self-attention over the h*w positions (diffusers' Attention with one head of
// width C): group norm, q/k/v projections of each position's C values, softmax(q k^T / sqrt(C))
// v, the output projection, plus the input.
Tensor VaeDecoder::attention(const Tensor& x, const std::string& prefix) const {
  const Shape& s = x.shape();
  const std::int64_t batch = s[0], channels = s[1], positions = s[2] * s[3];
  const Tensor tokens = ops::transpose(
      ops::reshape(norm(x, prefix + ".group_norm"), {batch, channels, positions}), 1, 2);
  const auto project = [&](const char* name) {
    return ops::reshape(ops::linear(tokens, w(fmt::format("{}.{}.weight", prefix, name)),
                                    w(fmt::format("{}.{}.bias", prefix, name))),
                        {batch, 1, positions, channels});
  };
  Tensor out = ops::scaled_dot_product_attention(project("to_q"), project("to_k"), project("to_v"));
  out = ops::linear(ops::reshape(out, {batch, positions, channels}),
                    w(prefix + ".to_out.0.weight"), w(prefix + ".to_out.0.bias"));
  return ops::add(ops::reshape(ops::transpose(out, 1, 2), {s[0], s[1], s[2], s[3]}), x);
}

Tensor VaeDecoder::decode(const Tensor& latents) const {
  const VaeDecoderConfig& c = config_;
  const Shape& s = latents.shape();
  RETRACE_CHECK(s.rank() == 4 && s[0] > 0 && s[1] == c.latent_channels && s[2] > 0 && s[3] > 0,
                invalid_argument,
                "VAE decoder: latents must be [batch, {}, h, w] with every size positive, got {}",
                c.latent_channels, s);
  RETRACE_CHECK(dtype_info(latents.dtype()).is_floating, invalid_argument,
                "VAE decoder: latents have dtype {}; expected a floating-point dtype",
                latents.dtype());
  const std::int64_t up = c.upscale();
  RETRACE_CHECK(s[2] <= (std::int64_t{1} << 20) / up && s[3] <= (std::int64_t{1} << 20) / up,
                invalid_argument, "VAE decoder: latents of {}x{} give an image over 2^20 pixels a side",
                s[2], s[3]);
  Tensor x = latents.dtype() == c.dtype ? latents : ops::typecast(latents, c.dtype);
  x = ops::div(x, c.scaling_factor);
  if (c.post_quant_conv) x = conv(x, "post_quant_conv", 0);
  x = conv(x, "decoder.conv_in", 1);
  x = resnet(x, fmt::format("{}.resnets.0", kMid));
  if (c.mid_attention) x = attention(x, std::string(kAttention));
  x = resnet(x, fmt::format("{}.resnets.1", kMid));
  const std::size_t blocks = c.block_out_channels.size();
  for (std::size_t i = 0; i < blocks; ++i) {
    for (std::int64_t j = 0; j <= c.layers_per_block; ++j) x = resnet(x, resnet_name(up_block(i), j));
    if (i + 1 < blocks) {
      const Shape& xs = x.shape();
      x = conv(ops::interpolate_nearest(x, 2 * xs[2], 2 * xs[3]), up_block(i) + ".upsamplers.0.conv",
               1);
    }
  }
  x = ops::silu(norm(x, "decoder.conv_norm_out"));
  return conv(x, "decoder.conv_out", 1);
}

RgbImage vae_image(const Tensor& image, std::int64_t index) {
  const Shape& s = image.shape();
  RETRACE_CHECK(s.rank() == 4 && s[1] == 3 && s[2] > 0 && s[3] > 0, invalid_argument,
                "vae_image: expected an image batch [B, 3, H, W], got {}", s);
  RETRACE_CHECK(index >= 0 && index < s[0], invalid_argument,
                "vae_image: image {} of a batch of {}", index, s[0]);
  const std::int64_t h = s[2], w = s[3], plane = h * w;
  const std::vector<float> values =
      ops::slice(image, 0, index, index + 1).to_vector<float>();
  RgbImage out{.width = w, .height = h, .pixels = std::vector<std::uint8_t>(
                                            static_cast<std::size_t>(3 * plane))};
  for (std::int64_t p = 0; p < plane; ++p) {
    for (std::int64_t ch = 0; ch < 3; ++ch) {
      // torchvision: clamp(-1, 1), sub(-1), div(2), mul(255), add(0.5), clamp(0, 255), to uint8
      // (truncation), each in float32.
      const float x = values[static_cast<std::size_t>(ch * plane + p)];
      float v = std::isnan(x) ? -1.0f : std::clamp(x, -1.0f, 1.0f);
      v = (v + 1.0f) / 2.0f;
      v = std::clamp(v * 255.0f + 0.5f, 0.0f, 255.0f);
      out.pixels[static_cast<std::size_t>(3 * p + ch)] = static_cast<std::uint8_t>(v);
    }
  }
  return out;
}

}  // namespace retrace::models
