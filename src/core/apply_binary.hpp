// The arithmetic of each BinaryOp, shared by the CPU kernels and the CUDA kernels (so both
// devices agree on, e.g., which operand maximum returns when they compare equal).
#pragma once

#include "retrace/kernels.hpp"

#include <cmath>
#include <type_traits>

#ifdef __CUDACC__
#define RETRACE_HOST_DEVICE __host__ __device__
#else
#define RETRACE_HOST_DEVICE
#endif

namespace retrace {

// Integers (int32, uint32) have defined results for every input, as documented in ops.hpp:
// add, sub and mul wrap modulo 2^32; division truncates toward zero, x / 0 is 0 and
// INT_MIN / -1 is INT_MIN (wrapped); pow wraps too, and a negative exponent gives 0 except for
// bases 1 and -1 (the integer part of the exact result). Floating point follows IEEE 754 (pow
// as C's powf: pow(x, 0) = 1 and pow(1, y) = 1 even for NaN), and maximum/minimum return NaN
// when either operand is NaN (numpy's maximum/minimum).
template <BinaryOp op, class C>
RETRACE_HOST_DEVICE inline C apply_binary(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    if constexpr (op == BinaryOp::add) {
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (op == BinaryOp::sub) {
      return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
    } else if constexpr (op == BinaryOp::mul) {
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else if constexpr (op == BinaryOp::div) {
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == C(-1)) return static_cast<C>(U(0) - static_cast<U>(a));
      }
      return a / b;
    } else if constexpr (op == BinaryOp::maximum) {
      return a > b ? a : b;
    } else if constexpr (op == BinaryOp::minimum) {
      return a < b ? a : b;
    } else {
      if constexpr (std::is_signed_v<C>) {
        if (b < 0) return a == 1 ? C(1) : a == -1 ? ((b & 1) != 0 ? C(-1) : C(1)) : C(0);
      }
      U result = 1, base = static_cast<U>(a);
      for (U e = static_cast<U>(b); e != 0; e >>= 1) {
        if ((e & 1u) != 0) result *= base;
        base *= base;
      }
      return static_cast<C>(result);
    }
  } else if constexpr (op == BinaryOp::add) {
    return a + b;
  } else if constexpr (op == BinaryOp::sub) {
    return a - b;
  } else if constexpr (op == BinaryOp::mul) {
    return a * b;
  } else if constexpr (op == BinaryOp::div) {
    return a / b;
  } else if constexpr (op == BinaryOp::maximum) {
    return (a > b || a != a) ? a : b;  // a NaN in either operand is the result
  } else if constexpr (op == BinaryOp::minimum) {
    return (a < b || a != a) ? a : b;
  } else {
#ifdef __CUDA_ARCH__
    return powf(a, b);
#else
    return std::pow(a, b);
#endif
  }
}

}  // namespace retrace
