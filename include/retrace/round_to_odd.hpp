// Rounding a double to a 16-bit float once: through a float rounded to odd (when the double is
// not a float, the one of its two float neighbours whose last mantissa bit is 1). A float rounded
// to odd keeps enough to round again, to a format with at most 22 mantissa bits (bfloat16 has 7,
// float16 10), to the same result as rounding the double directly; a plain double -> float ->
// 16-bit conversion rounds twice and is off by one step for values just past a half-way point.
// Used by bfloat16::from_double and float16::from_double, on the host and in CUDA kernels.
#pragma once

#include <bit>
#include <cstdint>

namespace retrace::detail {

[[nodiscard]] constexpr float round_to_odd(double d) noexcept {
  const float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;  // NaN, or exact
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 1u) != 0) return f;
  const double fd = static_cast<double>(f);
  const bool past = (fd < 0 ? -fd : fd) > (d < 0 ? -d : d);  // f is farther from 0 than d
  return std::bit_cast<float>(past ? bits - 1u : bits + 1u);
}

// A double as storage type T, rounded once: the 16-bit floats through from_double, float and
// the integer types by a plain conversion (callers check integer values are in range).
template <class T>
[[nodiscard]] constexpr T narrow_from_double(double d) noexcept {
  if constexpr (requires { T::from_double(d); }) {
    return T::from_double(d);
  } else {
    return static_cast<T>(d);
  }
}

}  // namespace retrace::detail
