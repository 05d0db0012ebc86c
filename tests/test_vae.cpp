// The Stable Diffusion VAE decoder (diffusers' AutoencoderKL layout): a decode against a float64
// re-implementation written from diffusers' definition (float32 and bfloat16), traced == eager
// bit for bit, the configuration read from the tensors (current and older attention names, an
// AutoencoderKL file with its encoder), every bad file named, and the 8-bit image mapping.
#include "support.hpp"

#include <retrace/models/npy.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>

namespace retrace {
namespace {

using models::VaeDecoder;
using models::VaeDecoderConfig;

// Two blocks (one 2x upsampling), a width change (conv_shortcut), 8 groups.
VaeDecoderConfig small_config(DType dtype = DType::float32) {
  return VaeDecoderConfig{.latent_channels = 4, .block_out_channels = {16, 32},
                          .layers_per_block = 1, .norm_groups = 8, .dtype = dtype, .seed = 5};
}
// Three blocks (4x), the widest two equal, no post_quant_conv, no mid attention.
VaeDecoderConfig plain_config() {
  return VaeDecoderConfig{.latent_channels = 3, .block_out_channels = {8, 16, 16},
                          .layers_per_block = 0, .out_channels = 3, .norm_groups = 4,
                          .mid_attention = false, .post_quant_conv = false, .seed = 6};
}

// ---- float64 reference: diffusers' Decoder, written out loop by loop --------------------------

struct Image64 {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<double> v;
  double& at(std::int64_t i, std::int64_t ch, std::int64_t y, std::int64_t x) {
    return v[static_cast<std::size_t>(((i * c + ch) * h + y) * w + x)];
  }
  double at(std::int64_t i, std::int64_t ch, std::int64_t y, std::int64_t x) const {
    return v[static_cast<std::size_t>(((i * c + ch) * h + y) * w + x)];
  }
};
Image64 zeros(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return Image64{n, c, h, w, std::vector<double>(static_cast<std::size_t>(n * c * h * w))};
}

using Weights64 = std::map<std::string, std::vector<double>>;

class Reference {
 public:
  Reference(const VaeDecoderConfig& config, const VaeDecoder& model) : c_(config) {
    for (const auto& [name, tensor] : model.weights()) {
      const auto values = tensor.to_vector<float>();
      weights_[name].assign(values.begin(), values.end());
    }
  }

  Image64 decode(Image64 x) const {
    for (double& v : x.v) v /= c_.scaling_factor;
    if (c_.post_quant_conv) x = conv(x, "post_quant_conv", 1, 0);
    x = conv(x, "decoder.conv_in", 3, 1);
    x = resnet(x, "decoder.mid_block.resnets.0");
    if (c_.mid_attention) x = attention(x, "decoder.mid_block.attentions.0");
    x = resnet(x, "decoder.mid_block.resnets.1");
    const std::size_t blocks = c_.block_out_channels.size();
    for (std::size_t i = 0; i < blocks; ++i) {
      for (std::int64_t j = 0; j <= c_.layers_per_block; ++j) {
        x = resnet(x, "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j));
      }
      if (i + 1 < blocks) {
        x = conv(upsample(x), "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv", 3, 1);
      }
    }
    return conv(silu(norm(x, "decoder.conv_norm_out")), "decoder.conv_out", 3, 1);
  }

 private:
  const std::vector<double>& w(const std::string& name) const { return weights_.at(name); }

  Image64 conv(const Image64& x, const std::string& prefix, std::int64_t k,
               std::int64_t pad) const {
    const auto& weight = w(prefix + ".weight");
    const auto& bias = w(prefix + ".bias");
    const auto out_channels = static_cast<std::int64_t>(bias.size());
    Image64 y = zeros(x.n, out_channels, x.h, x.w);
    for (std::int64_t i = 0; i < x.n; ++i)
      for (std::int64_t o = 0; o < out_channels; ++o)
        for (std::int64_t yy = 0; yy < x.h; ++yy)
          for (std::int64_t xx = 0; xx < x.w; ++xx) {
            double acc = bias[static_cast<std::size_t>(o)];
            for (std::int64_t ch = 0; ch < x.c; ++ch)
              for (std::int64_t ky = 0; ky < k; ++ky)
                for (std::int64_t kx = 0; kx < k; ++kx) {
                  const std::int64_t sy = yy + ky - pad, sx = xx + kx - pad;
                  if (sy < 0 || sy >= x.h || sx < 0 || sx >= x.w) continue;
                  acc += weight[static_cast<std::size_t>(((o * x.c + ch) * k + ky) * k + kx)] *
                         x.at(i, ch, sy, sx);
                }
            y.at(i, o, yy, xx) = acc;
          }
    return y;
  }

  Image64 norm(const Image64& x, const std::string& prefix) const {
    const auto& gamma = w(prefix + ".weight");
    const auto& beta = w(prefix + ".bias");
    const std::int64_t per = x.c / c_.norm_groups;
    Image64 y = x;
    for (std::int64_t i = 0; i < x.n; ++i)
      for (std::int64_t g = 0; g < c_.norm_groups; ++g) {
        double sum = 0, sq = 0;
        const double count = static_cast<double>(per * x.h * x.w);
        for (std::int64_t ch = g * per; ch < (g + 1) * per; ++ch)
          for (std::int64_t p = 0; p < x.h * x.w; ++p) sum += x.at(i, ch, p / x.w, p % x.w);
        const double mean = sum / count;
        for (std::int64_t ch = g * per; ch < (g + 1) * per; ++ch)
          for (std::int64_t p = 0; p < x.h * x.w; ++p) {
            const double d = x.at(i, ch, p / x.w, p % x.w) - mean;
            sq += d * d;
          }
        const double inv = 1.0 / std::sqrt(sq / count + c_.norm_eps);
        for (std::int64_t ch = g * per; ch < (g + 1) * per; ++ch)
          for (std::int64_t p = 0; p < x.h * x.w; ++p) {
            double& v = y.at(i, ch, p / x.w, p % x.w);
            v = (v - mean) * inv * gamma[static_cast<std::size_t>(ch)] +
                beta[static_cast<std::size_t>(ch)];
          }
      }
    return y;
  }

  static Image64 silu(Image64 x) {
    for (double& v : x.v) v = v / (1.0 + std::exp(-v));
    return x;
  }

  static Image64 upsample(const Image64& x) {
    Image64 y = zeros(x.n, x.c, 2 * x.h, 2 * x.w);
    for (std::int64_t i = 0; i < x.n; ++i)
      for (std::int64_t ch = 0; ch < x.c; ++ch)
        for (std::int64_t yy = 0; yy < y.h; ++yy)
          for (std::int64_t xx = 0; xx < y.w; ++xx) y.at(i, ch, yy, xx) = x.at(i, ch, yy / 2, xx / 2);
    return y;
  }

  Image64 resnet(const Image64& x, const std::string& prefix) const {
    Image64 h = conv(silu(norm(x, prefix + ".norm1")), prefix + ".conv1", 3, 1);
    h = conv(silu(norm(h, prefix + ".norm2")), prefix + ".conv2", 3, 1);
    const Image64 shortcut =
        weights_.contains(prefix + ".conv_shortcut.weight") ? conv(x, prefix + ".conv_shortcut", 1, 0)
                                                            : x;
    for (std::size_t i = 0; i < h.v.size(); ++i) h.v[i] += shortcut.v[i];
    return h;
  }

  Image64 attention(const Image64& x, const std::string& prefix) const {
    const Image64 normed = norm(x, prefix + ".group_norm");
    const std::int64_t channels = x.c, positions = x.h * x.w;
    // [position][channel] rows of one image through a linear layer.
    const auto project = [&](std::int64_t i, const std::string& name) {
      const auto& weight = w(prefix + "." + name + ".weight");
      const auto& bias = w(prefix + "." + name + ".bias");
      std::vector<double> out(static_cast<std::size_t>(positions * channels));
      for (std::int64_t p = 0; p < positions; ++p)
        for (std::int64_t o = 0; o < channels; ++o) {
          double acc = bias[static_cast<std::size_t>(o)];
          for (std::int64_t ch = 0; ch < channels; ++ch)
            acc += weight[static_cast<std::size_t>(o * channels + ch)] *
                   normed.at(i, ch, p / x.w, p % x.w);
          out[static_cast<std::size_t>(p * channels + o)] = acc;
        }
      return out;
    };
    Image64 y = x;
    const auto& out_weight = w(prefix + ".to_out.0.weight");
    const auto& out_bias = w(prefix + ".to_out.0.bias");
    for (std::int64_t i = 0; i < x.n; ++i) {
      const auto q = project(i, "to_q"), k = project(i, "to_k"), v = project(i, "to_v");
      for (std::int64_t p = 0; p < positions; ++p) {
        std::vector<double> scores(static_cast<std::size_t>(positions));
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t s = 0; s < positions; ++s) {
          double dot = 0;
          for (std::int64_t ch = 0; ch < channels; ++ch)
            dot += q[static_cast<std::size_t>(p * channels + ch)] *
                   k[static_cast<std::size_t>(s * channels + ch)];
          scores[static_cast<std::size_t>(s)] = dot / std::sqrt(static_cast<double>(channels));
          top = std::max(top, scores[static_cast<std::size_t>(s)]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - top));
        std::vector<double> mixed(static_cast<std::size_t>(channels));
        for (std::int64_t s = 0; s < positions; ++s)
          for (std::int64_t ch = 0; ch < channels; ++ch)
            mixed[static_cast<std::size_t>(ch)] += scores[static_cast<std::size_t>(s)] / total *
                                                   v[static_cast<std::size_t>(s * channels + ch)];
        for (std::int64_t o = 0; o < channels; ++o) {
          double acc = out_bias[static_cast<std::size_t>(o)];
          for (std::int64_t ch = 0; ch < channels; ++ch)
            acc += out_weight[static_cast<std::size_t>(o * channels + ch)] *
                   mixed[static_cast<std::size_t>(ch)];
          y.at(i, o, p / x.w, p % x.w) += acc;
        }
      }
    }
    return y;
  }

  VaeDecoderConfig c_;
  Weights64 weights_;
};

// The largest |a - b| over the reference's largest |b| (the decoder's outputs are O(1)).
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / scale;
}

struct Decoded {
  std::vector<float> got;
  std::vector<double> want;
};
Decoded decode_both(Device& device, const VaeDecoderConfig& config, const Shape& latent_shape) {
  const VaeDecoder model(config, device);
  const auto start = testing::random_floats(static_cast<std::size_t>(latent_shape.numel()), 9);
  const Tensor latents =
      testing::device_tensor(device, start, latent_shape, config.dtype);
  Image64 x{latent_shape[0], latent_shape[1], latent_shape[2], latent_shape[3], {}};
  // The reference starts from the latents as the model holds them (rounded to its dtype).
  for (float v : latents.to_vector<float>()) x.v.push_back(v);
  const Image64 want = Reference(config, model).decode(x);
  const Tensor image = model.decode(latents);
  EXPECT_EQ(image.shape(), Shape({latent_shape[0], config.out_channels,
                                  latent_shape[2] * config.upscale(),
                                  latent_shape[3] * config.upscale()}));
  return {image.to_vector<float>(), want.v};
}

class VaeTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = open_cpu_device(CpuDeviceOptions{.guard_bytes = 64});
};

// The largest error over the output's largest magnitude: float32 within 5e-6 (measured 4e-7 to
// 9e-7); bfloat16 (every weight and activation rounded to 8 bits of mantissa, float32 arithmetic
// inside each op) within 3e-2 (measured 1.1e-2).
TEST_F(VaeTest, DecodeMatchesAFloat64ReferenceInFloat32AndBfloat16) {
  const Decoded f32 = decode_both(*device_, small_config(), {2, 4, 4, 5});
  EXPECT_LT(relative_error(f32.got, f32.want), 5e-6);
  const Decoded plain = decode_both(*device_, plain_config(), {1, 3, 3, 2});
  EXPECT_LT(relative_error(plain.got, plain.want), 5e-6);
  const Decoded bf16 = decode_both(*device_, small_config(DType::bfloat16), {2, 4, 4, 5});
  EXPECT_LT(relative_error(bf16.got, bf16.want), 3e-2);
  // A 1x1 latent (the smallest image), still through the attention over one position.
  const Decoded one = decode_both(*device_, small_config(), {1, 4, 1, 1});
  EXPECT_LT(relative_error(one.got, one.want), 5e-6);
}

TEST_F(VaeTest, TracedDecodeEqualsEagerBitForBitAtTwoResolutions) {
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    VaeDecoder model(small_config(dtype), *device_);
    auto decode = traced_method(&VaeDecoder::decode,
                                [](const VaeDecoder& m) -> Device& { return m.device(); });
    for (std::int64_t size : {4, 6, 4}) {  // the third call replays the first trace
      const Shape shape{1, 4, size, size};
      const Tensor latents = testing::device_tensor(
          *device_, testing::random_floats(static_cast<std::size_t>(shape.numel()), size), shape,
          dtype);
      const auto eager = testing::float_bits(model.decode(latents));
      // A trace per resolution, as the demo keys them.
      const CallOptions per_size{.key = std::to_string(size)};
      EXPECT_EQ(testing::float_bits(decode.call(per_size, model, latents)), eager) << size;
      EXPECT_EQ(testing::float_bits(decode.call(per_size, model, latents)), eager) << size;
    }
    EXPECT_EQ(decode.live_traces(model), 2u);
  }
}

// The tensors of a diffusers AutoencoderKL file: the decoder's, plus an encoder's (skipped).
std::map<std::string, Tensor> autoencoder_file(const VaeDecoder& model) {
  std::map<std::string, Tensor> file;
  for (const auto& [name, tensor] : model.weights()) file[name] = tensor.to_host();
  file["encoder.conv_in.weight"] = Tensor::from_vector<float>(std::vector<float>(16 * 3 * 9), {16, 3, 3, 3}, DType::float32);
  file["quant_conv.weight"] = Tensor::from_vector<float>(std::vector<float>(64), {8, 8, 1, 1}, DType::float32);
  return file;
}

TEST_F(VaeTest, AnAutoencoderFileLoadsWithItsConfigurationReadFromTheTensors) {
  const VaeDecoder model(small_config(), *device_);
  auto file = autoencoder_file(model);
  const VaeDecoderConfig inferred =
      models::infer_vae_decoder_config(file, models::VaeInference{.norm_groups = 8});
  EXPECT_EQ(inferred.latent_channels, 4);
  EXPECT_EQ(inferred.block_out_channels, (std::vector<std::int64_t>{16, 32}));
  EXPECT_EQ(inferred.layers_per_block, 1);
  EXPECT_EQ(inferred.out_channels, 3);
  EXPECT_TRUE(inferred.mid_attention);
  EXPECT_TRUE(inferred.post_quant_conv);
  const Shape shape{1, 4, 3, 3};
  const Tensor latents = testing::device_tensor(
      *device_, testing::random_floats(static_cast<std::size_t>(shape.numel()), 3), shape);
  const auto expected = testing::float_bits(model.decode(latents));
  EXPECT_EQ(testing::float_bits(VaeDecoder(inferred, *device_, file).decode(latents)), expected);

  // The attention under its older names, the projections as 1x1 convolutions: the same decoder.
  for (const auto& [current, legacy] : {std::pair{"to_q", "query"}, std::pair{"to_k", "key"},
                                        std::pair{"to_v", "value"}, std::pair{"to_out.0", "proj_attn"}}) {
    const std::string from = std::string("decoder.mid_block.attentions.0.") + current;
    const std::string to = std::string("decoder.mid_block.attentions.0.") + legacy;
    const Tensor weight = file.at(from + ".weight");
    file[to + ".weight"] = Tensor::from_vector<float>(weight.to_vector<float>(), {32, 32, 1, 1}, DType::float32);
    file[to + ".bias"] = file.at(from + ".bias");
    file.erase(from + ".weight");
    file.erase(from + ".bias");
  }
  EXPECT_EQ(testing::float_bits(VaeDecoder(models::infer_vae_decoder_config(
                                               file, models::VaeInference{.norm_groups = 8}),
                                           *device_, file)
                                    .decode(latents)),
            expected);

  // Through a .safetensors file, as a user loads one.
  const auto path = std::filesystem::temp_directory_path() / "retrace_test_vae.safetensors";
  models::write_safetensors(path.string(), file);
  const auto read = models::read_safetensors(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(testing::float_bits(
                VaeDecoder(models::infer_vae_decoder_config(read, {.norm_groups = 8}), *device_, read)
                    .decode(latents)),
            expected);
}

TEST_F(VaeTest, ABadFileIsAnErrorNamingTheTensor) {
  const VaeDecoder model(small_config(), *device_);
  const auto good = autoencoder_file(model);
  const VaeDecoderConfig config = small_config();
  {
    auto file = good;
    file.erase("decoder.up_blocks.1.resnets.0.conv1.weight");
    testing::expect_error([&] { VaeDecoder(config, *device_, file); },
                          ErrorCategory::invalid_argument,
                          "VAE decoder: the weights have no tensor "
                          "\"decoder.up_blocks.1.resnets.0.conv1.weight\" (expected shape [16, 32, 3, 3])");
  }
  {
    auto file = good;
    file.erase("decoder.mid_block.attentions.0.to_k.bias");
    testing::expect_error([&] { VaeDecoder(config, *device_, file); },
                          ErrorCategory::invalid_argument,
                          "no tensor \"decoder.mid_block.attentions.0.to_k.bias\" (nor "
                          "\"decoder.mid_block.attentions.0.key.bias\")");
  }
  {
    auto file = good;
    file["decoder.conv_out.bias"] = Tensor::from_vector<float>(std::vector<float>(4), {4}, DType::float32);
    testing::expect_error([&] { VaeDecoder(config, *device_, file); },
                          ErrorCategory::invalid_argument,
                          "weight \"decoder.conv_out.bias\" has shape [4], expected [3]");
  }
  {
    auto file = good;
    file["decoder.up_blocks.0.extra.weight"] = Tensor::from_vector<float>(std::vector<float>(2), {2}, DType::float32);
    testing::expect_error([&] { VaeDecoder(config, *device_, file); },
                          ErrorCategory::invalid_argument,
                          "the weights have 1 tensor this decoder does not use: "
                          "\"decoder.up_blocks.0.extra.weight\"");
    // A warning instead when asked.
    EXPECT_NO_THROW(VaeDecoder(config, *device_, file, models::UnusedWeights::warn));
  }
  {
    auto file = good;
    file["decoder.conv_in.weight"] = Tensor::from_vector<std::int32_t>(
        std::vector<std::int32_t>(32 * 4 * 9), {32, 4, 3, 3}, DType::int32);
    testing::expect_error([&] { VaeDecoder(config, *device_, file); },
                          ErrorCategory::invalid_argument,
                          "weight \"decoder.conv_in.weight\" has dtype int32");
  }
  {
    auto file = good;
    file.erase("decoder.up_blocks.0.resnets.0.norm1.weight");
    file.erase("decoder.up_blocks.0.resnets.0.norm1.bias");
    file.erase("decoder.up_blocks.0.resnets.0.conv1.weight");
    file.erase("decoder.up_blocks.0.resnets.0.conv1.bias");
    file.erase("decoder.up_blocks.0.resnets.0.norm2.weight");
    file.erase("decoder.up_blocks.0.resnets.0.norm2.bias");
    file.erase("decoder.up_blocks.0.resnets.0.conv2.weight");
    file.erase("decoder.up_blocks.0.resnets.0.conv2.bias");
    testing::expect_error([&] { (void)models::infer_vae_decoder_config(file, {.norm_groups = 8}); },
                          ErrorCategory::invalid_argument,
                          "the weights have decoder.up_blocks.0.resnets.1 but no tensor of "
                          "decoder.up_blocks.0.resnets.0");
  }
  {
    auto file = good;
    file["decoder.up_blocks.x.resnets.0.conv1.weight"] = good.at("decoder.conv_out.bias");
    testing::expect_error([&] { (void)models::infer_vae_decoder_config(file); },
                          ErrorCategory::invalid_argument,
                          "tensor \"decoder.up_blocks.x.resnets.0.conv1.weight\" is not named "
                          "decoder.up_blocks.<index>.<...>");
  }
  testing::expect_error([&] { (void)models::infer_vae_decoder_config({}); },
                        ErrorCategory::invalid_argument,
                        "the weights have no tensor \"decoder.conv_in.weight\", so they are not a "
                        "VAE");
  // The default 32 groups do not divide these widths: the configuration names it.
  testing::expect_error([&] { (void)VaeDecoder(models::infer_vae_decoder_config(good), *device_, good); },
                        ErrorCategory::invalid_argument,
                        "block_out_channels[0] is 16; expected a positive multiple of the 32 norm "
                        "groups");
}

TEST_F(VaeTest, BadLatentsAreErrors) {
  const VaeDecoder model(small_config(), *device_);
  const auto latents = [&](const Shape& shape, DType dtype = DType::float32) {
    return testing::device_tensor(*device_, std::vector<float>(static_cast<std::size_t>(shape.numel())),
                                  shape, dtype);
  };
  testing::expect_error([&] { (void)model.decode(latents({1, 3, 4, 4})); },
                        ErrorCategory::invalid_argument,
                        "VAE decoder: latents must be [batch, 4, h, w] with every size positive, got "
                        "[1, 3, 4, 4]");
  testing::expect_error([&] { (void)model.decode(latents({4, 4, 4})); },
                        ErrorCategory::invalid_argument, "got [4, 4, 4]");
  testing::expect_error([&] { (void)model.decode(latents({0, 4, 4, 4})); },
                        ErrorCategory::invalid_argument, "got [0, 4, 4, 4]");
  testing::expect_error([&] { (void)model.decode(latents({1, 4, 4, 4}, DType::int32)); },
                        ErrorCategory::invalid_argument, "latents have dtype int32");
  // Latents of another float dtype are converted.
  EXPECT_EQ(model.decode(latents({1, 4, 2, 2}, DType::bfloat16)).shape(), Shape({1, 3, 4, 4}));
}

// The files of the CLI's tests (CTest sets RETRACE_VAE_DIR): a small AutoencoderKL file (two
// blocks of 32 and 64 channels, 32 groups as published, an encoder tensor), latents [1, 4, 4, 4]
// and a batch of two [2, 4, 8, 8], and latents of the wrong channel count.
TEST(VaeFiles, WritesFilesForTheCli) {
  const char* dir = std::getenv("RETRACE_VAE_DIR");
  if (dir == nullptr) GTEST_SKIP() << "RETRACE_VAE_DIR is not set (set by CTest)";
  std::filesystem::create_directories(dir);
  auto device = open_cpu_device();
  const VaeDecoder model(VaeDecoderConfig{.block_out_channels = {32, 64}, .layers_per_block = 1,
                                          .seed = 8},
                         *device);
  models::write_safetensors((std::filesystem::path(dir) / "vae.safetensors").string(),
                            autoencoder_file(model));
  const auto latents = [&](const char* name, const Shape& shape, std::uint64_t salt) {
    models::write_npy((std::filesystem::path(dir) / name).string(),
                      Tensor::from_vector<float>(
                          testing::random_floats(static_cast<std::size_t>(shape.numel()), salt),
                          shape, DType::float32));
  };
  latents("latents.npy", {1, 4, 4, 4}, 1);
  latents("noise_batch.npy", {2, 4, 8, 8}, 2);
  latents("latents_3ch.npy", {1, 3, 4, 4}, 3);
}

TEST(VaeImage, MapsAsTorchvisionSaveImage) {
  auto device = open_cpu_device();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // One pixel per value, R = G = B.
  const std::vector<float> values{-2.0f, -1.0f, -0.5f, 0.0f, 0.00196f, 0.5f, 1.0f, 3.0f, nan, -inf, inf};
  const std::vector<std::uint8_t> expected{0, 0, 64, 128, 128, 191, 255, 255, 0, 0, 255};
  std::vector<float> planes;
  for (int ch = 0; ch < 3; ++ch) planes.insert(planes.end(), values.begin(), values.end());
  const auto n = static_cast<std::int64_t>(values.size());
  const Tensor image = testing::device_tensor(*device, planes, {1, 3, 1, n});
  const auto rgb = models::vae_image(image, 0);
  EXPECT_EQ(rgb.width, n);
  EXPECT_EQ(rgb.height, 1);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int ch = 0; ch < 3; ++ch) {
      EXPECT_EQ(rgb.pixels[static_cast<std::size_t>(3 * i + ch)], expected[static_cast<std::size_t>(i)])
          << "value " << values[static_cast<std::size_t>(i)];
    }
  }
  testing::expect_error([&] { (void)models::vae_image(image, 1); }, ErrorCategory::invalid_argument,
                        "vae_image: image 1 of a batch of 1");
  testing::expect_error(
      [&] { (void)models::vae_image(testing::device_tensor(*device, {0, 0}, {1, 2, 1, 1}), 0); },
      ErrorCategory::invalid_argument, "expected an image batch [B, 3, H, W], got [1, 2, 1, 1]");
}

}  // namespace
}  // namespace retrace
