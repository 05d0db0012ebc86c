// The CPU device's elementwise loops, typed and free of any runtime: the commands' kernels
// unpack their parameters and call these, and the benchmarks call them directly as the floor.
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace retrace::cpu {

// Element access in the arithmetic type of each storage type (bfloat16 computes in float).
template <class T>
struct Elem {
  using compute = T;
  static compute load(const T* p, std::int64_t i) { return p[i]; }
  static void store(T* p, std::int64_t i, compute v) { p[i] = v; }
};
template <>
struct Elem<bfloat16> {
  using compute = float;
  static float load(const bfloat16* p, std::int64_t i) { return p[i].to_float(); }
  static void store(bfloat16* p, std::int64_t i, float v) { p[i] = bfloat16::from_float(v); }
};

template <BinaryOp op, class C>
inline C apply_binary(C a, C b) {
  if constexpr (op == BinaryOp::add) {
    return a + b;
  } else if constexpr (op == BinaryOp::sub) {
    return a - b;
  } else if constexpr (op == BinaryOp::mul) {
    return a * b;
  } else if constexpr (op == BinaryOp::div) {
    return a / b;
  } else if constexpr (op == BinaryOp::maximum) {
    return a > b ? a : b;
  } else {
    return a < b ? a : b;
  }
}

template <UnaryOp op, class C>
inline C apply_unary(C x) {
  if constexpr (op == UnaryOp::neg) {
    return -x;
  } else if constexpr (op == UnaryOp::abs) {
    return x < C(0) ? -x : x;
  } else if constexpr (op == UnaryOp::exp) {
    return std::exp(x);
  } else if constexpr (op == UnaryOp::log) {
    return std::log(x);
  } else if constexpr (op == UnaryOp::sqrt) {
    return std::sqrt(x);
  } else if constexpr (op == UnaryOp::rsqrt) {
    return C(1) / std::sqrt(x);
  } else if constexpr (op == UnaryOp::tanh) {
    return std::tanh(x);
  } else if constexpr (op == UnaryOp::sigmoid) {
    return C(1) / (C(1) + std::exp(-x));
  } else if constexpr (op == UnaryOp::relu) {
    return x > C(0) ? x : C(0);
  } else if constexpr (op == UnaryOp::silu) {
    return x / (C(1) + std::exp(-x));
  } else if constexpr (op == UnaryOp::gelu) {
    return C(0.5) * x * (C(1) + std::erf(x * C(0.70710678118654752)));
  } else {
    const C inner = C(0.79788456080286536) * (x + C(0.044715) * x * x * x);
    return C(0.5) * x * (C(1) + std::tanh(inner));
  }
}

template <class T>
void fill_loop(T* out, std::int64_t n, typename Elem<T>::compute value) {
  for (std::int64_t i = 0; i < n; ++i) Elem<T>::store(out, i, value);
}

template <BinaryOp op, class T>
void binary_loop(const T* a, const T* b, T* out, std::int64_t n) {
  using E = Elem<T>;
  for (std::int64_t i = 0; i < n; ++i) E::store(out, i, apply_binary<op>(E::load(a, i), E::load(b, i)));
}

template <BinaryOp op, class T>
void binary_scalar_loop(const T* a, T* out, std::int64_t n, typename Elem<T>::compute s) {
  using E = Elem<T>;
  for (std::int64_t i = 0; i < n; ++i) E::store(out, i, apply_binary<op>(E::load(a, i), s));
}

template <UnaryOp op, class T>
void unary_loop(const T* a, T* out, std::int64_t n) {
  using E = Elem<T>;
  for (std::int64_t i = 0; i < n; ++i) E::store(out, i, apply_unary<op>(E::load(a, i)));
}

}  // namespace retrace::cpu
