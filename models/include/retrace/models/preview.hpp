// A look at a latent without a VAE: latent channels mapped to colours and written as a PNG.
//
// Four-channel latents (the Stable Diffusion VAE's latent space, which DiT samples in) go through
// the widely used approximate linear map from those channels to RGB; any other channel count
// shows its first three channels (or one, as grey), each stretched over its own range. Each latent
// pixel becomes a `scale` x `scale` square (8: the VAE's own upsampling).
//
//   auto image = retrace::models::latent_preview(latent, 8);   // latent [C, H, W] or [1, C, H, W]
//   retrace::models::write_png("sample.png", image);
#pragma once

#include <retrace/tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace retrace::models {

struct RgbImage {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> pixels;  // row-major, 3 bytes (R, G, B) per pixel
};

[[nodiscard]] RgbImage latent_preview(const Tensor& latent, std::int64_t scale = 8);

// An 8-bit RGB PNG (uncompressed deflate blocks: no compression library needed; any PNG reader
// opens it). Errors (a file that cannot be written, an empty or inconsistent image) are
// invalid_argument naming the path.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace retrace::models
