// Row-wise CPU kernels: reductions over the last dimension, softmax, layer_norm and rms_norm.
// Accumulation is in float (double for float32 sums of long rows is not needed at these
// tolerances); rows are split across cores when there are many.
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/error.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace retrace::cpu {

namespace {

// The sum of value(0) .. value(n - 1) in 16 interleaved partial sums, added up in order at the
// end, then the tail: a fixed order whatever the vector width, so every kernel variant gives the
// same bits, and one that vectorises (a single running sum is one long dependency chain, 4
// cycles an element; layer_norm over 256 columns spent 1.9 ns an element on it).
template <class F>
float lane_sum(std::int64_t n, F&& value) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += value(i + l);
  }
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (; i < n; ++i) sum += value(i);
  return sum;
}

// The index of a row's first maximum, or of its first NaN (NaN is the largest, as in torch).
template <class T>
std::int32_t argmax_row(const T* row, std::int64_t cols) {
  std::int64_t best = 0;
  float top = float(Elem<T>::load(row, 0));
  for (std::int64_t c = 1; c < cols && top == top; ++c) {
    const float v = float(Elem<T>::load(row, c));
    if (v > top || v != v) {
      top = v;
      best = c;
    }
  }
  return static_cast<std::int32_t>(best);
}

template <class T>
void reduce_kernel(const std::byte* raw) {
  const auto& p = params_as<ReduceParams>(raw);
  using E = Elem<T>;
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  if (p.op == ReduceOp::argmax) {
    auto* index = static_cast<std::int32_t*>(p.out);
    parallel_for(p.rows, rows_per_task(p.cols, kMinTaskElements),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t r = begin; r < end; ++r) {
                     index[r] = argmax_row(a + r * p.cols, p.cols);
                   }
                 });
    return;
  }
  parallel_for(
      p.rows, rows_per_task(p.cols, kMinTaskElements), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t r = begin; r < end; ++r) {
          const T* row = a + r * p.cols;
          float acc = p.op == ReduceOp::max ? -std::numeric_limits<float>::infinity() : 0.0f;
          if (p.op == ReduceOp::max) {
            // NaN wins, wherever it is in the row (std::max would drop a NaN that comes later).
            for (std::int64_t c = 0; c < p.cols; ++c) {
              const float v = float(E::load(row, c));
              acc = (v > acc || v != v) ? v : acc;
            }
          } else {
            acc = lane_sum(p.cols, [&](std::int64_t c) { return float(E::load(row, c)); });
            if (p.op == ReduceOp::mean) acc /= static_cast<float>(p.cols);
          }
          E::store(out, r, acc);
        }
      });
}

template <class T>
void softmax_kernel(const std::byte* raw) {
  const auto& p = params_as<SoftmaxParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  parallel_for(p.rows, rows_per_task(p.cols, kMinTaskElements),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t r = begin; r < end; ++r) {
                   if constexpr (std::is_same_v<T, float>) {
                     softmax_row(a + r * p.cols, out + r * p.cols, p.cols);
                   } else {
                     thread_local std::vector<float> row;
                     row.resize(static_cast<std::size_t>(p.cols));
                     widen_block(a + r * p.cols, row.data(), p.cols);
                     softmax_row(row.data(), row.data(), p.cols);
                     narrow_block(row.data(), out + r * p.cols, p.cols);
                   }
                 }
               });
}

// One row of layer_norm (or rms_norm) in float32: mean and variance in fixed lanes, then
// (x - mean) * inv (* w) (+ b). w and b may be null.
void norm_row(const float* row, const float* w, const float* b, float* o, std::int64_t cols,
              bool rms, float eps) {
  const auto n = static_cast<float>(cols);
  const auto x = [&](std::int64_t c) { return row[c]; };
  const float mean = rms ? 0.0f : lane_sum(cols, x) / n;
  const float var = lane_sum(cols, [&](std::int64_t c) {
    const float d = x(c) - mean;
    return d * d;
  });
  const float inv = 1.0f / std::sqrt(var / n + eps);
  for (std::int64_t c = 0; c < cols; ++c) {
    float y = (x(c) - mean) * inv;
    if (w != nullptr) y *= w[c];
    if (b != nullptr) y += b[c];
    o[c] = y;
  }
}

// bfloat16 and float16 rows are widened to float32 once (weight and bias once per thread),
// normalised by the float32 code and rounded back: the same values through the same float32
// operations, without converting each value three times.
template <class T>
void norm_kernel(const std::byte* raw) {
  const auto& p = params_as<NormParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  parallel_for(p.rows, rows_per_task(p.cols, kMinTaskElements),
               [&](std::int64_t begin, std::int64_t end) {
                 if constexpr (std::is_same_v<T, float>) {
                   for (std::int64_t r = begin; r < end; ++r) {
                     norm_row(a + r * p.cols, w, b, out + r * p.cols, p.cols, p.rms, p.eps);
                   }
                 } else {
                   thread_local std::vector<float> row, weight, bias;
                   // A row of values as float32 in `to` (null for null).
                   const auto widened = [&](const T* values, std::vector<float>& to) {
                     if (values == nullptr) return static_cast<const float*>(nullptr);
                     to.resize(static_cast<std::size_t>(p.cols));
                     widen_block(values, to.data(), p.cols);
                     return static_cast<const float*>(to.data());
                   };
                   row.resize(static_cast<std::size_t>(p.cols));
                   const float* wf = widened(w, weight);
                   const float* bf = widened(b, bias);
                   for (std::int64_t r = begin; r < end; ++r) {
                     widen_block(a + r * p.cols, row.data(), p.cols);
                     norm_row(row.data(), wf, bf, row.data(), p.cols, p.rms, p.eps);
                     narrow_block(row.data(), out + r * p.cols, p.cols);
                   }
                 }
               });
}

template <class T>
struct ReduceK {
  static void run(const std::byte* p) { reduce_kernel<T>(p); }
};
template <class T>
struct SoftmaxK {
  static void run(const std::byte* p) { softmax_kernel<T>(p); }
};
template <class T>
struct NormK {
  static void run(const std::byte* p) { norm_kernel<T>(p); }
};

}  // namespace

KernelFn resolve(const ReduceParams& p) {
  return float_kernel<ReduceK>(p, "reduce");
}
KernelFn resolve(const SoftmaxParams& p) {
  return float_kernel<SoftmaxK>(p, "softmax");
}
KernelFn resolve(const NormParams& p) {
  return float_kernel<NormK>(p, "norm");
}

}  // namespace retrace::cpu
