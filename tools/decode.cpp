// retrace decode: latents (.npy) to an image with the Stable Diffusion VAE decoder (diffusers'
// AutoencoderKL .safetensors), eager once and traced (capture, then timed replays), compared bit
// for bit. Latents from another pipeline (PyTorch's, say) decode here to the same image within
// rounding; --save-image writes the decoder's float output to compare against it. Exits 1 if
// traced and eager images differ in any bit.
#include "demo_common.hpp"
#include "model_options.hpp"
#include "util/timing.hpp"

#include <retrace/models/npy.hpp>
#include <retrace/models/preview.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>

#include <fmt/ranges.h>

#include <cstdio>

namespace retrace::cli {

int run_decode(ModelOptions& o, const DecodeOptions& d) {
  using timing::Clock;
  const DType dtype = dtype_named(o.dtype);
  const auto weights = models::read_safetensors(d.vae);
  const models::VaeDecoderConfig config = models::infer_vae_decoder_config(
      weights, models::VaeInference{
                   .norm_groups = d.norm_groups, .scaling_factor = d.scaling_factor, .dtype = dtype});
  const Tensor host_latents = models::read_npy(d.latents);
  const Shape& s = host_latents.shape();
  RETRACE_CHECK(s.rank() == 4 && s[1] == config.latent_channels, invalid_argument,
                "decode: --latents {}: expected [batch, {}, h, w] for this VAE, got {}", d.latents,
                config.latent_channels, s);
  // The device holds the eager decode and the trace's buffers.
  o.extra_bytes = 2 * models::VaeDecoder::decode_bytes(config, s);
  o.trace_bytes = models::VaeDecoder::decode_bytes(config, s);
  auto device = open_device(o);
  models::VaeDecoder vae(config, *device, weights,
                         o.allow_unused ? models::UnusedWeights::warn : models::UnusedWeights::error);
  std::printf(
      "retrace decode: VAE %s (%lld latent channels, blocks [%s], %lld layers per block, %lld "
      "groups, %s) on %s\n",
      d.vae.c_str(), static_cast<long long>(config.latent_channels),
      fmt::format("{}", fmt::join(config.block_out_channels, ", ")).c_str(),
      static_cast<long long>(config.layers_per_block), static_cast<long long>(config.norm_groups),
      o.dtype.c_str(), device->name().c_str());
  const Tensor latents = host_latents.to_device(*device);

  // Timed on its second call, as the traced decode on its replays: the first also maps fresh
  // device memory and makes the GEMM libraries' kernels.
  auto t0 = Clock::now();
  (void)vae.decode(latents);
  device->synchronize();
  const double first_eager_ms = timing::milliseconds_since(t0);
  t0 = Clock::now();
  const Tensor eager = vae.decode(latents);
  device->synchronize();
  const double eager_ms = timing::milliseconds_since(t0);
  const std::vector<float> eager_values = eager.to_vector<float>();
  std::printf("  latents %s / %g -> image %s (a decode needs about %s of device memory)\n",
              s.to_string().c_str(), config.scaling_factor, eager.shape().to_string().c_str(),
              human_bytes(models::VaeDecoder::decode_bytes(config, s)).c_str());
  std::printf("  eager   %.1f ms (first call: %.1f ms)\n", eager_ms, first_eager_ms);

  auto decode = traced_method(
      &models::VaeDecoder::decode,
      [](models::VaeDecoder& v) -> Device& { return v.device(); },
      TraceOptions{.name = "VAE decode"});
  t0 = Clock::now();
  (void)decode(vae, latents);
  device->synchronize();
  const double capture_ms = timing::milliseconds_since(t0);
  std::vector<double> replay_ms;
  for (std::int64_t i = 0; i < d.replays; ++i) {
    t0 = Clock::now();
    (void)decode(vae, latents);
    device->synchronize();
    replay_ms.push_back(timing::milliseconds_since(t0));
  }
  const Tensor& image = decode(vae, latents);
  const bool identical = same_bits(image.to_vector<float>(), eager_values);
  const TraceInfo info = device->trace_info(decode.tracer(vae)->trace_ids().front());
  std::printf("  traced  median %.1f ms over %zu replays (first call, with capture: %.1f ms); "
              "%zu commands, %s of private trace memory\n",
              timing::median(replay_ms), replay_ms.size(), capture_ms, info.commands,
              human_bytes(info.bytes).c_str());
  std::printf("  image: traced %s eager %s\n", identical ? "==" : "!=",
              identical ? "bit for bit" : "-- MISMATCH");
  for (std::int64_t i = 0; i < s[0]; ++i) {
    const std::string path = batch_image_path(d.out, i, s[0]);
    const models::RgbImage rgb = models::vae_image(image, i);
    models::write_png(path, rgb);
    std::printf("  wrote %s (%lldx%lld)\n", path.c_str(), static_cast<long long>(rgb.width),
                static_cast<long long>(rgb.height));
  }
  if (!d.save_image.empty()) {
    models::write_npy(d.save_image, image);
    std::printf("  wrote %s (the decoder's output, float32 %s, about [-1, 1])\n",
                d.save_image.c_str(), image.shape().to_string().c_str());
  }
  if (!identical) {
    std::fprintf(stderr, "retrace decode: traced and eager images differ; this is a bug, please "
                         "report it with the command line above\n");
    return 1;
  }
  return 0;
}

}  // namespace retrace::cli
