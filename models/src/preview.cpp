#include "retrace/models/preview.hpp"

#include <retrace/error.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>

namespace retrace::models {

namespace {

// Approximate contribution of each SD-VAE latent channel to R, G and B (model-space latents).
constexpr std::array<std::array<float, 3>, 4> kLatentToRgb{{{0.3512f, 0.2297f, 0.3227f},
                                                           {0.3250f, 0.4974f, 0.2350f},
                                                           {-0.2829f, 0.1762f, 0.2721f},
                                                           {-0.2120f, -0.2616f, -0.7177f}}};

std::uint8_t to_byte(float v) {  // [0, 1] -> 0 .. 255; NaN -> 0
  if (!(v > 0.0f)) return 0;
  return static_cast<std::uint8_t>(std::lround(std::min(v, 1.0f) * 255.0f));
}

std::uint32_t crc32(std::uint32_t crc, std::span<const std::uint8_t> bytes) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::uint8_t b : bytes) crc = table[(crc ^ b) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

void write_chunk(std::ofstream& file, const char (&type)[5], std::span<const std::uint8_t> data) {
  std::vector<std::uint8_t> head;
  put_be32(head, static_cast<std::uint32_t>(data.size()));
  head.insert(head.end(), type, type + 4);
  std::uint32_t crc = crc32(0, std::span(head).subspan(4));
  crc = crc32(crc, data);
  std::vector<std::uint8_t> tail;
  put_be32(tail, crc);
  file.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
  file.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  file.write(reinterpret_cast<const char*>(tail.data()), static_cast<std::streamsize>(tail.size()));
}

}  // namespace

RgbImage latent_preview(const Tensor& latent, std::int64_t scale) {
  const Shape& s = latent.shape();
  RETRACE_CHECK((s.rank() == 3 || (s.rank() == 4 && s[0] == 1)) && s[-3] > 0 && s[-2] > 0 &&
                    s[-1] > 0,
                invalid_argument, "latent_preview: the latent must be [C, H, W] or [1, C, H, W], got {}",
                s);
  RETRACE_CHECK(scale >= 1 && scale <= 64 && s[-2] * scale <= 65536 && s[-1] * scale <= 65536,
                invalid_argument,
                "latent_preview: scale {} is outside [1, 64] or makes an image over 65536 pixels "
                "wide",
                scale);
  const std::int64_t channels = s[-3], h = s[-2], w = s[-1], plane = h * w;
  const std::vector<float> v = latent.to_vector<float>();
  std::vector<std::array<float, 3>> rgb(static_cast<std::size_t>(plane));
  if (channels == 4) {
    for (std::int64_t i = 0; i < plane; ++i) {
      for (int k = 0; k < 3; ++k) {
        float sum = 0.0f;
        for (int c = 0; c < 4; ++c) sum += v[static_cast<std::size_t>(c * plane + i)] * kLatentToRgb[c][k];
        rgb[static_cast<std::size_t>(i)][k] = (sum + 1.0f) * 0.5f;  // [-1, 1] -> [0, 1]
      }
    }
  } else {
    for (int k = 0; k < 3; ++k) {
      const std::int64_t c = std::min<std::int64_t>(k, channels - 1);
      const auto first = v.begin() + c * plane, last = first + plane;
      float lo = INFINITY, hi = -INFINITY;
      for (auto it = first; it != last; ++it) {
        if (std::isfinite(*it)) lo = std::min(lo, *it), hi = std::max(hi, *it);
      }
      const float range = hi > lo ? hi - lo : 1.0f;
      for (std::int64_t i = 0; i < plane; ++i) rgb[static_cast<std::size_t>(i)][k] = (first[i] - lo) / range;
    }
  }
  RgbImage image{w * scale, h * scale, {}};
  image.pixels.resize(static_cast<std::size_t>(image.width * image.height * 3));
  for (std::int64_t y = 0; y < image.height; ++y) {
    for (std::int64_t x = 0; x < image.width; ++x) {
      const auto& p = rgb[static_cast<std::size_t>((y / scale) * w + x / scale)];
      std::uint8_t* dst = &image.pixels[static_cast<std::size_t>((y * image.width + x) * 3)];
      for (int k = 0; k < 3; ++k) dst[k] = to_byte(p[k]);
    }
  }
  return image;
}

void write_png(const std::string& path, const RgbImage& image) {
  RETRACE_CHECK(image.width > 0 && image.height > 0 && image.width <= (1 << 24) &&
                    image.height <= (1 << 24) &&
                    image.pixels.size() == static_cast<std::size_t>(image.width * image.height * 3),
                invalid_argument,
                "write_png: {}: a {}x{} RGB image needs {} bytes of pixels, got {}", path,
                image.width, image.height, image.width * image.height * 3, image.pixels.size());
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  RETRACE_CHECK(file.good(), invalid_argument, "write_png: cannot open {} for writing", path);
  static constexpr std::uint8_t kSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  file.write(reinterpret_cast<const char*>(kSignature), sizeof kSignature);
  std::vector<std::uint8_t> header;
  put_be32(header, static_cast<std::uint32_t>(image.width));
  put_be32(header, static_cast<std::uint32_t>(image.height));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, filter 0, no interlace
  write_chunk(file, "IHDR", header);
  // Scanlines, each a filter byte (0: none) and the row, in stored deflate blocks.
  const std::size_t row = static_cast<std::size_t>(image.width) * 3;
  std::vector<std::uint8_t> raw;
  raw.reserve((row + 1) * static_cast<std::size_t>(image.height));
  for (std::int64_t y = 0; y < image.height; ++y) {
    raw.push_back(0);
    const auto begin = image.pixels.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(y));
    raw.insert(raw.end(), begin, begin + static_cast<std::ptrdiff_t>(row));
  }
  std::vector<std::uint8_t> z{0x78, 0x01};
  std::uint32_t a = 1, b = 0;  // Adler-32
  for (std::uint8_t byte : raw) a = (a + byte) % 65521u, b = (b + a) % 65521u;
  // raw is never empty: the image has at least one row, each with its filter byte.
  for (std::size_t at = 0; at < raw.size(); at += 65535) {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - at);
    z.push_back(at + n >= raw.size() ? 1 : 0);
    z.insert(z.end(), {static_cast<std::uint8_t>(n), static_cast<std::uint8_t>(n >> 8),
                       static_cast<std::uint8_t>(~n), static_cast<std::uint8_t>(~n >> 8)});
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(at),
             raw.begin() + static_cast<std::ptrdiff_t>(at + n));
  }
  put_be32(z, (b << 16) | a);
  write_chunk(file, "IDAT", z);
  write_chunk(file, "IEND", {});
  file.close();
  RETRACE_CHECK(!file.fail(), invalid_argument, "write_png: writing {} failed", path);
}

}  // namespace retrace::models
