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

// C's fmod for float (or double) on either device.
template <class C>
RETRACE_HOST_DEVICE inline C float_fmod(C a, C b) {
#ifdef __CUDA_ARCH__
  return fmod(a, b);
#else
  return std::fmod(a, b);
#endif
}

// Whether a nonzero remainder's sign differs from the divisor's: where floor division steps the
// truncated quotient down by one and remainder adds the divisor to fmod (floats and integers).
template <class C>
RETRACE_HOST_DEVICE inline bool remainder_sign_differs(C mod, C b) {
  return mod != C(0) && ((mod < C(0)) != (b < C(0)));
}

// Floor division of floats as Python's float `//` (and torch.floor_divide): (a - fmod(a, b)) / b,
// a whole number but for the rounding of the subtraction and division, one less when the
// remainder's sign differs from the divisor's, then snapped to the nearest whole number (the
// rounding can leave it at x.999...); a zero quotient keeps the sign of a / b, and x // 0 is
// a / b (+-inf or NaN).
template <class C>
RETRACE_HOST_DEVICE inline C float_floor_divide(C a, C b) {
  if (b == C(0)) return a / b;
  const C mod = float_fmod(a, b);
  C quotient = (a - mod) / b;
  if (remainder_sign_differs(mod, b)) quotient -= C(1);
#ifdef __CUDA_ARCH__
  if (quotient == C(0)) return copysign(C(0), a / b);
  C whole = floor(quotient);
#else
  if (quotient == C(0)) return std::copysign(C(0), a / b);
  C whole = std::floor(quotient);
#endif
  if (quotient - whole > C(0.5)) whole += C(1);
  return whole;
}

// Integers (int32, uint32, int64) have defined results for every input, as documented in
// ops.hpp: add, sub and mul wrap modulo 2^32 (2^64); division truncates toward zero, x / 0 is 0
// and INT_MIN / -1 is INT_MIN (wrapped); floor_divide rounds toward -inf with the same two
// cases; fmod (the sign of a) and remainder (the sign of b) give 0 for a zero divisor and for
// INT_MIN by -1; pow wraps too, and a negative exponent gives 0 except for bases 1 and -1 (the
// integer part of the exact result). Floating point follows IEEE 754 (pow as C's powf:
// pow(x, 0) = 1 and pow(1, y) = 1 even for NaN; fmod as C's fmodf; remainder is fmod plus b
// when their signs differ, as torch.remainder), and maximum/minimum return NaN when either
// operand is NaN (numpy's maximum/minimum).
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
    } else if constexpr (op == BinaryOp::floor_divide) {
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == C(-1)) return static_cast<C>(U(0) - static_cast<U>(a));
        const C quotient = a / b;
        return remainder_sign_differs(C(a % b), b) ? C(quotient - 1) : quotient;
      } else {
        return a / b;
      }
    } else if constexpr (op == BinaryOp::fmod || op == BinaryOp::remainder) {
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == C(-1)) return C(0);
        const C mod = a % b;
        if constexpr (op == BinaryOp::remainder) {
          if (remainder_sign_differs(mod, b)) return C(mod + b);
        }
        return mod;
      } else {
        return a % b;
      }
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
  } else if constexpr (op == BinaryOp::floor_divide) {
    return float_floor_divide(a, b);
  } else if constexpr (op == BinaryOp::fmod) {
    return float_fmod(a, b);
  } else if constexpr (op == BinaryOp::remainder) {
    const C mod = float_fmod(a, b);
    return remainder_sign_differs(mod, b) ? mod + b : mod;
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
