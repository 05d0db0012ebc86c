// The CPU device's elementwise loops, typed and free of any runtime: the commands' kernels
// unpack their parameters and call these, and the benchmarks call them directly as the floor.
#pragma once

#include "retrace/backend/apply_binary.hpp"
#include "retrace/bfloat16.hpp"
#include "retrace/float16.hpp"
#include "retrace/round_to_odd.hpp"
#include "retrace/kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace retrace::cpu {

// Element access in the arithmetic type of each storage type (bfloat16 and float16 compute in
// float).
template <class T>
struct Elem {
  using compute = T;
  static compute load(const T* p, std::int64_t i) { return p[i]; }
  static void store(T* p, std::int64_t i, compute v) { p[i] = v; }
};
template <class H>
struct HalfElem {
  using compute = float;
  static float load(const H* p, std::int64_t i) { return p[i].to_float(); }
  static void store(H* p, std::int64_t i, float v) { p[i] = H::from_float(v); }
};
template <>
struct Elem<bfloat16> : HalfElem<bfloat16> {};
template <>
struct Elem<float16> : HalfElem<float16> {};

// The part of vector_exp shared with its 16-lane form (V: float or a vector of floats): from the
// clamped argument c, n = round(c / ln 2) and the polynomial p ~ exp(c - n ln 2).
template <class V>
[[gnu::always_inline]] inline V exp_reduced(V c, V& n) {
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no libm call, so it vectorises).
  constexpr float kRound = 12582912.0f;
  n = (c * 1.44269504088896341f + kRound) - kRound;
  V r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// exp for float in a form the compiler vectorises (no libm call): range reduction to
// r in [-ln2/2, ln2/2], a degree-6 polynomial (Cephes expf), scaling by 2^n through the exponent
// bits, in two steps so that results past FLT_MAX overflow to inf (exp(88.5), exp(inf)) and
// tiny ones fall gradually into the subnormals and to 0 (exp(-104), exp(-inf)). Relative error
// ~2 ulp in the normal range; NaN stays NaN.
[[gnu::always_inline]] inline float vector_exp(float x) {
  const bool nan = x != x;
  const float c = nan ? 0.0f : std::min(std::max(x, -104.0f), 89.0f);
  float n;
  const float p = exp_reduced(c, n);
  // 2^n = 2^a * 2^b with a, b in [-75, 65]: both normal floats; the products are exact unless
  // the result leaves the normal range, where it rounds once (to inf, or a subnormal).
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t a = ni >> 1, b = ni - a;
  const float result = p * std::bit_cast<float>(static_cast<std::uint32_t>(a + 127) << 23) *
                       std::bit_cast<float>(static_cast<std::uint32_t>(b + 127) << 23);
  return nan ? x : result;
}

// gelu(x) = x Phi(x) = x erfc(-x / sqrt 2) / 2, from erfc so that the negative tail keeps its
// relative accuracy (1 + erf(x / sqrt 2) cancels there: 3e-5 relative error at x = -2.9 with an
// erf of absolute error 1e-7). erfc(z), z = |x| / sqrt 2, is t exp(-z^2 + P(t)) with
// t = 1 / (1 + z / 2) and the Chebyshev fit P of Numerical Recipes' erfcc (fractional error
// < 1.2e-7); z^2 = x^2 / 2 is taken from x split into a 12-bit head (whose square is exact) and
// the rest, because a rounded z^2 of ~30 would cost exp 2e-6 of relative error. No libm call,
// so it vectorises. gelu(inf) = inf; gelu(-inf) is NaN (-inf * 0), as torch's.
[[gnu::always_inline]] inline float vector_gelu(float x) {
  const float a = x < 0.0f ? -x : x;
  const float head = std::bit_cast<float>(std::bit_cast<std::uint32_t>(a) & 0xfffff000u);
  const float rest = a - head;  // exact
  const float t = 1.0f / (1.0f + 0.35355339059327376f * a);  // 1 / (1 + z / 2)
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  // -x^2 / 2 = -head^2 / 2 (exact) - rest (a + head) / 2; past |x| = 20 the tail is 0.
  const float tail = t * vector_exp(-0.5f * head * head) *
                     vector_exp(-0.5f * rest * (a + head) + p);
  const float half_tail = a < 20.0f ? 0.5f * tail : 0.0f;
  return x * (x < 0.0f ? half_tail : 1.0f - half_tail);
}

#ifdef __AVX512F__
using Lanes16 = float __attribute__((vector_size(16 * sizeof(float))));
// vector_exp on 16 lanes, bit for bit (checked on every float): the same reduction and
// polynomial, with the scaling by 2^n done by vscalefps, which rounds once exactly where the two
// exponent-bit products of vector_exp do (0.33 -> 0.24 ns per element on an AVX-512 Xeon).
[[gnu::always_inline]] inline Lanes16 vector_exp16(Lanes16 x) {
  // vmaxps/vminps give their second operand unless the first is greater (smaller): exactly
  // `x > lo ? x : lo` and `c < hi ? c : hi`, in one instruction each instead of a compare and a
  // blend (softmax rows 6 % faster). A NaN lane becomes lo here and x again at the end. The
  // zero-masking forms with every lane on, here and for scalef: the plain ones start from an
  // undefined register, which GCC 12 warns about.
  const __mmask16 all = 0xffff;
  const Lanes16 c = reinterpret_cast<Lanes16>(_mm512_maskz_min_ps(
      all, _mm512_maskz_max_ps(all, reinterpret_cast<__m512>(x), _mm512_set1_ps(-104.0f)),
      _mm512_set1_ps(89.0f)));
  Lanes16 n;
  const Lanes16 p = exp_reduced(c, n);
  const auto result = reinterpret_cast<Lanes16>(
      _mm512_maskz_scalef_ps(all, reinterpret_cast<__m512>(p), reinterpret_cast<__m512>(n)));
  return x != x ? x : result;
}
#endif

using retrace::apply_binary;

template <UnaryOp op, class C>
inline C apply_unary(C x) {
  if constexpr (op == UnaryOp::neg) {
    return -x;
  } else if constexpr (op == UnaryOp::abs) {
    return std::fabs(x);  // clears the sign: abs(-0) = +0
  } else if constexpr (op == UnaryOp::exp) {
    if constexpr (std::is_same_v<C, float>) {
      return vector_exp(x);
    } else {
      return std::exp(x);
    }
  } else if constexpr (op == UnaryOp::log) {
    return std::log(x);
  } else if constexpr (op == UnaryOp::sqrt) {
    return std::sqrt(x);
  } else if constexpr (op == UnaryOp::rsqrt) {
    return C(1) / std::sqrt(x);
  } else if constexpr (op == UnaryOp::tanh) {
    return std::tanh(x);
  } else if constexpr (op == UnaryOp::sigmoid) {
    return C(1) / (C(1) + vector_exp(-x));
  } else if constexpr (op == UnaryOp::relu) {
    return x < C(0) ? C(0) : x;  // NaN stays NaN, -0 stays -0 (as torch's relu)
  } else if constexpr (op == UnaryOp::silu) {
    return x / (C(1) + vector_exp(-x));
  } else if constexpr (op == UnaryOp::gelu) {
    if constexpr (std::is_same_v<C, float>) {
      return vector_gelu(x);
    } else {
      return C(0.5) * x * std::erfc(-x * C(0.70710678118654752));
    }
  } else if constexpr (op == UnaryOp::sin) {
    return std::sin(x);
  } else if constexpr (op == UnaryOp::cos) {
    return std::cos(x);
  } else if constexpr (op == UnaryOp::square) {
    return x * x;
  } else if constexpr (op == UnaryOp::floor) {
    return std::floor(x);
  } else if constexpr (op == UnaryOp::ceil) {
    return std::ceil(x);
  } else if constexpr (op == UnaryOp::round) {
    return std::nearbyint(x);  // halves to even (the default rounding mode), as torch.round
  } else if constexpr (op == UnaryOp::trunc) {
    return std::trunc(x);
  } else if constexpr (op == UnaryOp::erf) {
    return std::erf(x);  // libm: within an ulp (gelu has its own vectorised erfc, above)
  } else {
    // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), without a libm call and without the
    // cancellation of 1 + tanh(u) in the negative tail.
    const C inner = C(0.79788456080286536) * (x + C(0.044715) * x * x * x);
    return x / (C(1) + vector_exp(C(-2) * inner));
  }
}

// out = exp(in - max(in)) over one row of n floats (in and out may alias); returns the sum of
// out, the softmax's divisor. The maximum and the sum of the exponentials run in interleaved
// lanes (added up in order at the end): 16 lanes in 512-bit registers where the kernels are
// built for AVX-512 (1.8x faster than the 8-lane loop there, whose lane sums GCC keeps in
// memory), 8 lanes otherwise (faster than 16 on AVX2). `max_out`, when given, receives the
// maximum (-inf for a row of -inf: every numerator is then NaN).
inline float softmax_numerators(const float* in, float* out, std::int64_t n,
                                float* max_out = nullptr) {
#ifdef __AVX512F__
  constexpr int kLanes = 16;
  using Lanes = Lanes16;
  Lanes top = {};
  top -= std::numeric_limits<float>::infinity();
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes x;
    std::memcpy(&x, in + i, sizeof x);
    top = top > x ? top : x;  // a NaN in x is taken (maxps)
  }
  float max = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < kLanes; ++l) max = max > top[l] ? max : top[l];
  for (; i < n; ++i) max = max > in[i] ? max : in[i];
  Lanes lanes = {};
  for (i = 0; i + kLanes <= n; i += kLanes) {
    Lanes x;
    std::memcpy(&x, in + i, sizeof x);
    const Lanes e = vector_exp16(x - max);
    std::memcpy(out + i, &e, sizeof e);
    lanes += e;
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
#else
  constexpr int kLanes = 8;
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = lanes[l] > in[i + l] ? lanes[l] : in[i + l];
  }
  float max = -std::numeric_limits<float>::infinity();
  for (float l : lanes) max = max > l ? max : l;
  for (; i < n; ++i) max = max > in[i] ? max : in[i];
  for (float& l : lanes) l = 0.0f;
  for (i = 0; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      out[i + l] = vector_exp(in[i + l] - max);
      lanes[l] += out[i + l];
    }
  }
  float sum = 0.0f;
  for (float l : lanes) sum += l;
#endif
  for (; i < n; ++i) sum += (out[i] = vector_exp(in[i] - max));
  if (max_out != nullptr) *max_out = max;
  return sum;
}

// out = softmax(in) over one row of n floats (in and out may alias).
inline void softmax_row(const float* in, float* out, std::int64_t n) {
  const float inv = 1.0f / softmax_numerators(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] *= inv;
}

// bfloat16 and float16 loops run in blocks of kHalfBlock values: widened to float32 on the
// stack, the float32 loop (vectorised, its 16-lane forms included), rounded back. Each loop
// then vectorises, where the element-by-element form (convert, op, round per value) ran 1.6x
// slower than float32 (gelu_tanh on the DiT's activations); every value is the same float32
// function of the same inputs, rounded once, so the bits are those of the element-by-element
// form. A block is read whole before it is written, so out may be an input.
template <class T>
inline constexpr bool kIsHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
inline constexpr std::int64_t kHalfBlock = 256;
template <class T>
void widen_block(const T* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = in[i].to_float();
}
#ifdef __AVX512F__
// Whether this CPU has AVX512-BF16 (vcvtneps2bf16), checked once.
inline bool cpu_has_avx512_bf16() noexcept {
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
}
// bfloat16::from_float 16 values at a time by vcvtneps2bf16, from in[i] while 16 remain (i is
// advanced): the instruction rounds to nearest even and quiets NaNs as from_float does, but reads
// a subnormal input as zero, so lanes holding one are rounded by from_float instead (the same
// bits on every float32, checked on all 2^32). 1.7x faster than the AVX2 integer rounding.
__attribute__((target("avx512bf16"))) inline void narrow_bf16_instructions(const float* in,
                                                                            bfloat16* out,
                                                                            std::int64_t& i,
                                                                            std::int64_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), fraction = _mm512_set1_epi32(0x7fffff);
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 subnormal =
        _mm512_testn_epi32_mask(u, exponent) & _mm512_test_epi32_mask(u, fraction);
    if (subnormal != 0) [[unlikely]] {
      for (int l = 0; l < 16; ++l) {
        if ((subnormal >> l & 1) != 0) out[i + l] = bfloat16::from_float(in[i + l]);
      }
    }
  }
}
#endif

template <class T>
void narrow_block(const float* in, T* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (cpu_has_avx512_bf16()) narrow_bf16_instructions(in, out, i, n);
  }
#endif
#ifdef __AVX2__
  if constexpr (std::is_same_v<T, bfloat16>) {
    // bfloat16::from_float 16 values at a time: round to nearest even by adding 0x7fff plus
    // the lowest kept bit, NaN kept quiet with its sign; the halves packed in order.
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    const __m256i infinity = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
      __m256i half[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(in + i + 8 * h));
        const __m256i high = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(high, one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, magnitude), infinity);
        half[h] = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(half[0], half[1]), 0xd8));
    }
  }
#endif
  for (; i < n; ++i) out[i] = T::from_float(in[i]);
}

// out[0, n) from a (and b, when not null) block by block: each block widened into x (and y),
// float_loop(x, y, m) leaves its m results in x, which are rounded into out.
template <class T, class FloatLoop>
void in_float_blocks(const T* a, const T* b, T* out, std::int64_t n, FloatLoop&& float_loop) {
  float x[kHalfBlock], y[kHalfBlock];
  for (std::int64_t i = 0; i < n; i += kHalfBlock) {
    const std::int64_t m = std::min(kHalfBlock, n - i);
    widen_block(a + i, x, m);
    if (b != nullptr) widen_block(b + i, y, m);
    float_loop(x, y, m);
    narrow_block(x, out + i, m);
  }
}

template <BinaryOp op, class T>
void binary_loop(const T* a, const T* b, T* out, std::int64_t n) {
  using E = Elem<T>;
  if constexpr (kIsHalf<T>) {
    in_float_blocks(a, b, out, n, [](float* x, const float* y, std::int64_t m) {
      binary_loop<op, float>(x, y, x, m);
    });
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      E::store(out, i, apply_binary<op>(E::load(a, i), E::load(b, i)));
  }
}

template <BinaryOp op, class T>
void binary_scalar_loop(const T* a, T* out, std::int64_t n, typename Elem<T>::compute s) {
  using E = Elem<T>;
  if constexpr (kIsHalf<T>) {
    in_float_blocks(a, static_cast<const T*>(nullptr), out, n,
                    [s](float* x, const float*, std::int64_t m) {
                      binary_scalar_loop<op, float>(x, x, m, s);
                    });
  } else {
    for (std::int64_t i = 0; i < n; ++i) E::store(out, i, apply_binary<op>(E::load(a, i), s));
  }
}

#ifdef __AVX512F__
// The unary ops built on exp, 16 lanes at a time through vector_exp16: the same expressions as
// apply_unary's, so the same bits (tests/kernels/exp_lanes.cpp checks them), 1.3x faster (gelu
// tanh in cache on an AVX-512 Xeon).
template <UnaryOp op>
inline constexpr bool kHasLanesForm = op == UnaryOp::exp || op == UnaryOp::sigmoid ||
                                      op == UnaryOp::silu || op == UnaryOp::gelu_tanh;
template <UnaryOp op>
[[gnu::always_inline]] inline Lanes16 apply_unary_lanes(Lanes16 x) {
  static_assert(kHasLanesForm<op>);
  if constexpr (op == UnaryOp::exp) {
    return vector_exp16(x);
  } else if constexpr (op == UnaryOp::sigmoid) {
    return 1.0f / (1.0f + vector_exp16(-x));
  } else if constexpr (op == UnaryOp::silu) {
    return x / (1.0f + vector_exp16(-x));
  } else {
    const Lanes16 inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return x / (1.0f + vector_exp16(-2.0f * inner));
  }
}
#endif

template <UnaryOp op, class T>
void unary_loop(const T* a, T* out, std::int64_t n) {
  using E = Elem<T>;
  if constexpr (kIsHalf<T>) {
    in_float_blocks(a, static_cast<const T*>(nullptr), out, n,
                    [](float* x, const float*, std::int64_t m) { unary_loop<op, float>(x, x, m); });
    return;
  }
  std::int64_t i = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float> && kHasLanesForm<op>) {
    for (; i + 16 <= n; i += 16) {  // a and out may be the same: each block is read first
      Lanes16 x;
      std::memcpy(&x, a + i, sizeof x);
      const Lanes16 y = apply_unary_lanes<op>(x);
      std::memcpy(out + i, &y, sizeof y);
    }
  }
#endif
  for (; i < n; ++i) E::store(out, i, apply_unary<op>(E::load(a, i)));
}

}  // namespace retrace::cpu
