// Float to integer conversion with a defined result for every input, shared by the CPU and CUDA
// typecast kernels: truncation toward zero inside the integer's range, saturation to its lowest
// or highest value outside it (infinities included), and 0 for NaN. (A plain C++ conversion of
// an out-of-range float is undefined behaviour; this is what CUDA's __float2int_rz family does.)
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define RETRACE_CONVERT_FN __host__ __device__ inline
#else
#define RETRACE_CONVERT_FN inline
#endif

namespace retrace::detail {

template <class To, class From>
RETRACE_CONVERT_FN To float_to_int(From value) {
  static_assert(std::is_integral_v<To> && std::is_floating_point_v<From>);
  const double v = static_cast<double>(value);
  if (v != v) return To{0};  // NaN
  // The bounds are exact in double for every integer type up to 32 bits.
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
  if (v <= lo) return std::numeric_limits<To>::min();
  if (v >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(v);  // truncates toward zero, in range
}

}  // namespace retrace::detail
