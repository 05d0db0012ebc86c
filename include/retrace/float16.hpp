// float16: IEEE 754 binary16 (1 sign bit, 5 exponent bits, 10 mantissa bits; largest finite
// 65504, subnormals down to 2^-24). Conversion from float rounds to nearest even, overflows to
// infinity past 65520 and keeps NaNs quiet (sign and the top mantissa bits kept); conversion to
// float is exact. The same code runs on the host and in CUDA kernels.
//
//   retrace::float16 h = retrace::float16::from_float(1.5f);
//   float f = h.to_float();
#pragma once

#include "retrace/round_to_odd.hpp"

#include <bit>
#include <cstdint>

namespace retrace {

struct float16 {
  std::uint16_t bits = 0;
  static constexpr int kSignificandBits = 11;  // the implicit bit included

  [[nodiscard]] static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }

  [[nodiscard]] static constexpr float16 from_float(float f) noexcept {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    std::uint32_t a = u & 0x7fffffffu;
    std::uint32_t h = 0;
    if (a > 0x7f800000u) {  // NaN: quiet, keeping the payload's top bits
      h = 0x7e00u | ((a >> 13) & 0x03ffu);
    } else if (a >= 0x477ff000u) {  // >= 65520 (half way past 65504) and infinity
      h = 0x7c00u;
    } else if (a < 0x38800000u) {  // below 2^-14: a subnormal or zero half
      // Adding 0.5f aligns the value's bits so that float addition rounds it to a multiple of
      // 2^-24 (the half subnormal step), to nearest even; the low bits are then the result.
      const float rounded = std::bit_cast<float>(a) + 0.5f;
      h = std::bit_cast<std::uint32_t>(rounded) - 0x3f000000u;
    } else {  // normal: rebias the exponent and round the 13 dropped bits to nearest even
      const std::uint32_t odd = (a >> 13) & 1u;
      a += 0xc8000fffu + odd;  // (15 - 127) << 23, wrapped, plus the rounding bias
      h = a >> 13;
    }
    return from_bits(static_cast<std::uint16_t>(h | sign));
  }

  // Rounds a double once (to nearest even), not through float.
  [[nodiscard]] static constexpr float16 from_double(double d) noexcept {
    return from_float(detail::round_to_odd(d));
  }
  [[nodiscard]] constexpr float to_float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu;
    const std::uint32_t mantissa = bits & 0x03ffu;
    std::uint32_t u = 0;
    if (exponent == 0x1fu) {  // infinity, NaN
      u = 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {  // normal
      u = ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa != 0) {  // subnormal: mantissa * 2^-24, exact in float
      const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | u);
  }

  friend constexpr bool operator==(float16, float16) = default;
};

}  // namespace retrace
