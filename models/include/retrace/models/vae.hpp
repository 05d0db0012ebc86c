// The decoder of the Stable Diffusion VAE (diffusers' AutoencoderKL, as used by DiT's sample.py
// and every latent-diffusion pipeline), written with retrace ops: latents back to pixels.
//
//   latents [B, C_lat, h, w] / scaling_factor --post_quant_conv (1x1)--> --conv_in (3x3)-->
//   mid block: ResNet block, single-head self-attention over the h*w positions, ResNet block;
//   up blocks (widest first): layers_per_block + 1 ResNet blocks each, then (all but the last)
//   nearest 2x upsampling and a 3x3 convolution; group norm, SiLU, conv_out (3x3)
//   -> image [B, 3, h * 2^(blocks - 1), w * 2^(blocks - 1)], values about [-1, 1].
//
// A ResNet block is x + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) with a 1x1 conv_shortcut on x
// when the width changes; every norm is a group norm (32 groups, eps 1e-6). Tensor names are
// diffusers' (decoder.*, post_quant_conv.*), so a diffusers diffusion_pytorch_model.safetensors
// of an AutoencoderKL loads as it is: its encoder's tensors (encoder.*, quant_conv.*) are
// ignored, and the attention's older names (query, key, value, proj_attn, as in the published
// sd-vae-ft-ema and -mse files) are read as to_q, to_k, to_v, to_out.0.
//
//   auto weights = retrace::models::read_safetensors("diffusion_pytorch_model.safetensors");
//   retrace::models::VaeDecoder vae(retrace::models::infer_vae_decoder_config(weights), device,
//                                   weights);
//   Tensor image = vae.decode(latents);                    // [B, 3, 8h, 8w]
//   auto rgb = retrace::models::vae_image(image, 0);      // 8-bit RGB of the first image
#pragma once

#include "retrace/models/dit.hpp"
#include "retrace/models/preview.hpp"

#include <retrace/retrace.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace retrace::models {

struct VaeDecoderConfig {
  std::int64_t latent_channels = 4;
  // The widths of the blocks in diffusers' order (the encoder's, narrowest first); the decoder
  // runs them widest first and upsamples between them.
  std::vector<std::int64_t> block_out_channels{128, 256, 512, 512};
  std::int64_t layers_per_block = 2;  // an up block has layers_per_block + 1 ResNet blocks
  std::int64_t out_channels = 3;
  std::int64_t norm_groups = 32;
  double norm_eps = 1e-6;
  bool mid_attention = true;    // the mid block's self-attention (diffusers' default)
  bool post_quant_conv = true;  // the 1x1 convolution before the decoder
  // Latents are divided by this before decoding (the sampler works on scaled latents):
  // 0.18215 for the Stable Diffusion 1.x/2.x VAE that DiT uses.
  double scaling_factor = 0.18215;
  DType dtype = DType::float32;
  std::uint64_t seed = 0;  // random weights (the constructor without weights)

  // The image is this many times the latent's height and width (8 for 4 blocks).
  [[nodiscard]] std::int64_t upscale() const noexcept;
};

// What the tensors cannot say: the group count of the norms (diffusers' default 32), the latent
// scale, the dtype to compute in.
struct VaeInference {
  std::int64_t norm_groups = 32;
  double scaling_factor = 0.18215;
  DType dtype = DType::float32;
};

// The configuration of a decoder in diffusers' layout, from its tensors' shapes: latent channels
// from decoder.conv_in, the widths from each up block's first ResNet block, layers per block
// from the ResNet blocks present (0 .. N-1 in every up block, no gaps), the output channels from
// decoder.conv_out, the mid attention and post_quant_conv from their presence. Errors name the
// tensor that is missing or does not fit.
[[nodiscard]] VaeDecoderConfig infer_vae_decoder_config(
    const std::map<std::string, Tensor>& weights, const VaeInference& inference = {});

class VaeDecoder : public TraceOwner {
 public:
  // Random weights from config.seed (convolutions N(0, 1/fan_in), norms weight 1 + small noise),
  // so activations stay O(1) through the blocks.
  VaeDecoder(const VaeDecoderConfig& config, Device& device);
  // Weights from named tensors (host or device; e.g. read_safetensors). Every tensor of
  // weight_shapes must be present with its shape (the attention's under either name; its
  // projections also as 1x1 convolutions [C, C, 1, 1]); encoder.* and quant_conv.* are
  // skipped; any other tensor is an error naming it, or a logged warning with
  // UnusedWeights::warn. Everything is checked before anything is uploaded.
  VaeDecoder(const VaeDecoderConfig& config, Device& device,
             const std::map<std::string, Tensor>& weights,
             UnusedWeights unused = UnusedWeights::error);

  [[nodiscard]] const VaeDecoderConfig& config() const noexcept { return config_; }
  [[nodiscard]] Device& device() const noexcept { return *device_; }
  // Every tensor of the decoder with its shape, in diffusers' current names, in a fixed order.
  [[nodiscard]] static std::vector<std::pair<std::string, Shape>> weight_shapes(
      const VaeDecoderConfig& config);
  [[nodiscard]] const Tensor& weight(const std::string& name) const;
  [[nodiscard]] const std::map<std::string, Tensor>& weights() const noexcept { return weights_; }

  // Device memory a decode of latents of this shape needs at its peak (the weights, the largest
  // convolution's temporaries and the activations it keeps), for sizing a device; a trace of
  // the decode holds about as much again.
  [[nodiscard]] static std::size_t decode_bytes(const VaeDecoderConfig& config,
                                                const Shape& latents);

  // latents [B, latent_channels, h, w] in the sampler's (scaled) space, any positive size ->
  // image [B, out_channels, h * upscale(), w * upscale()] in the model's dtype, about [-1, 1].
  [[nodiscard]] Tensor decode(const Tensor& latents) const;

 private:
  void check_config() const;
  const Tensor& w(const std::string& name) const { return weight(name); }
  Tensor conv(const Tensor& x, const std::string& prefix, std::int64_t padding) const;
  Tensor norm(const Tensor& x, const std::string& prefix) const;
  Tensor resnet(const Tensor& x, const std::string& prefix) const;
  Tensor attention(const Tensor& x, const std::string& prefix) const;

  VaeDecoderConfig config_;
  Device* device_;
  std::map<std::string, Tensor> weights_;
};

// Image i of a decoded batch ([B, 3, H, W]) as 8-bit RGB, mapped as torchvision's save_image
// with value_range (-1, 1) does (DiT's sample.py): clamp to [-1, 1], (x + 1) / 2, then
// floor(255 v + 0.5). NaN becomes 0.
[[nodiscard]] RgbImage vae_image(const Tensor& image, std::int64_t index = 0);

}  // namespace retrace::models
