// The CPU device's elementwise loops, typed and free of any runtime: the commands' kernels
// unpack their parameters and call these, and the benchmarks call them directly as the floor.
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/kernels.hpp"

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
  } else {
    return a * b;
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

}  // namespace retrace::cpu
