// bfloat16: the upper 16 bits of an IEEE float32. Conversion from float rounds to nearest even
// and keeps NaNs quiet; conversion to float is exact.
//
//   retrace::bfloat16 h = retrace::bfloat16::from_float(1.5f);
//   float f = h.to_float();
#pragma once

#include "retrace/round_to_odd.hpp"

#include <bit>
#include <cstdint>

namespace retrace {

struct bfloat16 {
  std::uint16_t bits = 0;
  static constexpr int kSignificandBits = 8;  // the implicit bit included

  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  [[nodiscard]] static constexpr bfloat16 from_float(float f) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload
      return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    }
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return from_bits(static_cast<std::uint16_t>((u + rounding) >> 16));
  }
  // Rounds a double once (to nearest even), not through float.
  [[nodiscard]] static constexpr bfloat16 from_double(double d) noexcept {
    return from_float(detail::round_to_odd(d));
  }
  [[nodiscard]] constexpr float to_float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

}  // namespace retrace
