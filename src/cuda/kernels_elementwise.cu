// Elementwise CUDA kernels: fill, binary (broadcasting), binary with a scalar, unary, typecast.
// Contiguous float32 loops use 16-byte (float4) accesses when the pointers and the length allow
// it; everything else is a grid-stride loop over elements.
#include "retrace/backend/apply_binary.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels_cuda.hpp"
#include "retrace/backend/float_to_int.hpp"
#include "retrace/backend/philox.hpp"

#include <type_traits>

namespace retrace::cuda {

namespace {

template <UnaryOp op>
__device__ inline float apply_unary(float x) {
  if constexpr (op == UnaryOp::neg) {
    return -x;
  } else if constexpr (op == UnaryOp::abs) {
    return fabsf(x);
  } else if constexpr (op == UnaryOp::exp) {
    return expf(x);
  } else if constexpr (op == UnaryOp::log) {
    return logf(x);
  } else if constexpr (op == UnaryOp::sqrt) {
    return sqrtf(x);
  } else if constexpr (op == UnaryOp::rsqrt) {
    return 1.0f / sqrtf(x);
  } else if constexpr (op == UnaryOp::tanh) {
    return tanhf(x);
  } else if constexpr (op == UnaryOp::sigmoid) {
    return 1.0f / (1.0f + expf(-x));
  } else if constexpr (op == UnaryOp::relu) {
    return x < 0.0f ? 0.0f : x;  // NaN stays NaN, -0 stays -0 (as torch's relu)
  } else if constexpr (op == UnaryOp::silu) {
    return x / (1.0f + expf(-x));
  } else if constexpr (op == UnaryOp::gelu) {
    // From erfc, so the negative tail has no cancellation, and in double: erfcf of a rounded
    // float -x / sqrt 2 is 10 ulps off near x = -4 (the argument's rounding error grows by 2 z^2
    // through erfc). Elementwise kernels are memory-bound; the double math costs nothing there.
    return static_cast<float>(0.5 * static_cast<double>(x) *
                              erfc(-static_cast<double>(x) * 0.70710678118654752));
  } else if constexpr (op == UnaryOp::sin) {
    return sinf(x);
  } else if constexpr (op == UnaryOp::cos) {
    return cosf(x);
  } else if constexpr (op == UnaryOp::square) {
    return x * x;
  } else if constexpr (op == UnaryOp::floor) {
    return floorf(x);
  } else if constexpr (op == UnaryOp::ceil) {
    return ceilf(x);
  } else if constexpr (op == UnaryOp::round) {
    return rintf(x);  // halves to even, as torch.round
  } else if constexpr (op == UnaryOp::trunc) {
    return truncf(x);
  } else if constexpr (op == UnaryOp::erf) {
    return erff(x);
  } else {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * inner));  // 0.5 x (1 + tanh(u)), no cancellation
  }
}

template <class T>
__global__ void fill_kernel(const FailureRecord* record, T* out, std::int64_t n, T value) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    out[i] = value;
  }
}

template <class T>
__global__ void arange_kernel(const FailureRecord* record, T* out, std::int64_t n, double start,
                              double step) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    if constexpr (std::is_integral_v<T>) {
      const auto v = static_cast<unsigned long long>(static_cast<long long>(start)) +
                     static_cast<unsigned long long>(i) *
                         static_cast<unsigned long long>(static_cast<long long>(step));
      out[i] = static_cast<T>(v);
    } else {
      out[i] = retrace::detail::narrow_from_double<T>(start + static_cast<double>(i) * step);
    }
  }
}

// One Philox block (4 elements) per thread, reading the generator state; random_advance then
// moves the offset on (a separate launch on the same stream, so no thread reads a moved offset).
template <class T, RandomDist dist>
__global__ void random_kernel(const FailureRecord* record, const std::uint32_t* state, T* out,
                              std::int64_t count) {
  if (aborted(record)) return;
  const std::uint64_t seed = state[0] | (static_cast<std::uint64_t>(state[1]) << 32);
  const std::uint64_t offset = state[2] | (static_cast<std::uint64_t>(state[3]) << 32);
  const std::int64_t blocks = (count + 3) / 4;
  RETRACE_GRID_STRIDE(b, blocks) {
    float v[4];
    philox::block_values(seed, offset, static_cast<std::uint64_t>(b),
                         dist == RandomDist::normal, philox::uniform_bits<T>, v);
    const std::int64_t first = 4 * b;
    const std::int64_t n = count - first < 4 ? count - first : 4;
    for (std::int64_t j = 0; j < n; ++j) Elem<T>::store(out, first + j, v[j]);
  }
}

__global__ void random_advance(const FailureRecord* record, std::uint32_t* state) {
  if (aborted(record)) return;
  const std::uint64_t next = (state[2] | (static_cast<std::uint64_t>(state[3]) << 32)) + 1;
  state[2] = static_cast<std::uint32_t>(next);
  state[3] = static_cast<std::uint32_t>(next >> 32);
}

// Element offsets of flat index i in up to three strided operands of a row-major space.
struct SelectSpace {
  std::int64_t shape[kMaxKernelRank];
  std::int64_t strides[3][kMaxKernelRank];
  int rank;
  std::int64_t count;
};

__device__ inline void select_offsets(const SelectSpace& s, std::int64_t i, int operands,
                                      std::int64_t* offsets) {
  for (int o = 0; o < operands; ++o) offsets[o] = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const std::int64_t idx = i % s.shape[d];
    i /= s.shape[d];
    for (int o = 0; o < operands; ++o) offsets[o] += idx * s.strides[o][d];
  }
}

template <class T>
__global__ void compare_kernel(const FailureRecord* record, SelectSpace s, const T* a, const T* b,
                               std::uint8_t* out, CompareOp op) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, s.count) {
    std::int64_t off[2];
    select_offsets(s, i, 2, off);
    const auto x = Elem<T>::load(a, off[0]);
    const auto y = Elem<T>::load(b, off[1]);
    bool r = false;
    switch (op) {
      case CompareOp::eq: r = x == y; break;
      case CompareOp::ne: r = x != y; break;
      case CompareOp::lt: r = x < y; break;
      case CompareOp::le: r = x <= y; break;
      case CompareOp::gt: r = x > y; break;
      case CompareOp::ge: r = x >= y; break;
    }
    out[i] = r ? 1 : 0;
  }
}

template <class U>
__global__ void where_kernel(const FailureRecord* record, SelectSpace s, const std::uint8_t* cond,
                             const U* a, const U* b, U* out) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, s.count) {
    std::int64_t off[3];
    select_offsets(s, i, 3, off);
    out[i] = cond[off[0]] != 0 ? a[off[1]] : b[off[2]];
  }
}

template <class P>
SelectSpace select_space(const P& p, std::initializer_list<const std::int64_t*> strides) {
  SelectSpace s{};
  s.rank = p.rank;
  s.count = 1;
  for (int d = 0; d < p.rank; ++d) {
    s.shape[d] = p.shape[d];
    s.count *= p.shape[d];
  }
  int o = 0;
  for (const std::int64_t* st : strides) {
    for (int d = 0; d < p.rank; ++d) s.strides[o][d] = st[d];
    ++o;
  }
  return s;
}

// Same-shape operands: a flat loop.
template <BinaryOp op, class T>
__global__ void binary_flat_kernel(const FailureRecord* record, const T* a, const T* b, T* out,
                                   std::int64_t n) {
  if (aborted(record)) return;
  using E = Elem<T>;
  RETRACE_GRID_STRIDE(i, n) {
    E::store(out, i, apply_binary<op>(E::load(a, i), E::load(b, i)));
  }
}

// float32 same-shape operands, 16-byte aligned: four elements per thread.
template <BinaryOp op>
__global__ void binary_flat4_kernel(const FailureRecord* record, const float4* a, const float4* b,
                                    float4* out, std::int64_t n4) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n4) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(apply_binary<op>(x.x, y.x), apply_binary<op>(x.y, y.y),
                         apply_binary<op>(x.z, y.z), apply_binary<op>(x.w, y.w));
  }
}

template <BinaryOp op, class T>
__global__ void binary_broadcast_kernel(const FailureRecord* record, const T* a, const T* b, T* out,
                                        std::int64_t n, TwoOperandSpace g) {
  if (aborted(record)) return;
  using E = Elem<T>;
  RETRACE_GRID_STRIDE(i, n) {
    std::int64_t ia = 0, ib = 0;
    g.offsets(i, ia, ib);
    E::store(out, i, apply_binary<op>(E::load(a, ia), E::load(b, ib)));
  }
}

template <BinaryOp op, class T>
__global__ void binary_scalar_kernel(const FailureRecord* record, const T* a, T* out,
                                     std::int64_t n, typename Elem<T>::compute s) {
  if (aborted(record)) return;
  using E = Elem<T>;
  RETRACE_GRID_STRIDE(i, n) {
    E::store(out, i, apply_binary<op>(E::load(a, i), s));
  }
}

template <BinaryOp op>
__global__ void binary_scalar4_kernel(const FailureRecord* record, const float4* a, float4* out,
                                      std::int64_t n4, float s) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n4) {
    const float4 x = a[i];
    out[i] = make_float4(apply_binary<op>(x.x, s), apply_binary<op>(x.y, s),
                         apply_binary<op>(x.z, s), apply_binary<op>(x.w, s));
  }
}

template <UnaryOp op, class T>
__global__ void unary_kernel(const FailureRecord* record, const T* a, T* out, std::int64_t n) {
  if (aborted(record)) return;
  using E = Elem<T>;
  RETRACE_GRID_STRIDE(i, n) {
    const float y = apply_unary<op>(static_cast<float>(E::load(a, i)));
    E::store(out, i, static_cast<typename E::compute>(y));
  }
}

template <UnaryOp op>
__global__ void unary4_kernel(const FailureRecord* record, const float4* a, float4* out,
                              std::int64_t n4) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n4) {
    const float4 x = a[i];
    out[i] = make_float4(apply_unary<op>(x.x), apply_unary<op>(x.y), apply_unary<op>(x.z),
                         apply_unary<op>(x.w));
  }
}

template <class From, class To>
__global__ void typecast_kernel(const FailureRecord* record, const From* src, To* dst,
                                std::int64_t n, bool to_bool) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    const auto v = Elem<From>::load(src, i);
    if constexpr (std::is_same_v<To, std::uint8_t>) {
      if (to_bool) {
        dst[i] = v != 0 ? 1 : 0;  // nonzero (NaN included) -> 1, as torch
        continue;
      }
    }
    if constexpr (std::is_same_v<To, bfloat16> || std::is_same_v<To, float16>) {
      // From an integer through double (exact for 32 bits): one rounding, not two.
      dst[i] = std::is_integral_v<decltype(v)> ? To::from_double(static_cast<double>(v))
                                               : To::from_float(static_cast<float>(v));
    } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<decltype(v)>) {
      dst[i] = retrace::detail::float_to_int<To>(v);  // NaN 0, saturating: never undefined
    } else {
      dst[i] = static_cast<To>(v);
    }
  }
}

template <BinaryOp op, class T>
void launch_binary_typed(const BinaryParams& p, const LaunchContext& ctx) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  std::int64_t n = 1;
  bool flat = true;
  for (int d = 0; d < p.rank; ++d) n *= p.shape[d];
  {
    std::int64_t expect = 1;
    for (int d = p.rank - 1; d >= 0; --d) {
      if (p.shape[d] != 1 && (p.a_strides[d] != expect || p.b_strides[d] != expect)) flat = false;
      expect *= p.shape[d];
    }
  }
  if (n == 0) return;
  if (flat) {
    if constexpr (std::is_same_v<T, float>) {
      if (n % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
        binary_flat4_kernel<op><<<blocks_for(n / 4), kThreads, 0, ctx.stream>>>(
            ctx.record, reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
            reinterpret_cast<float4*>(out), n / 4);
        return;
      }
    }
    binary_flat_kernel<op, T><<<blocks_for(n), kThreads, 0, ctx.stream>>>(ctx.record, a, b, out, n);
    return;
  }
  const TwoOperandSpace g = make_space(p.shape, p.a_strides, p.b_strides, p.rank);
  binary_broadcast_kernel<op, T>
      <<<blocks_for(n), kThreads, 0, ctx.stream>>>(ctx.record, a, b, out, n, g);
}

template <BinaryOp op, class T>
void launch_binary_scalar_typed(const BinaryScalarParams& p, const LaunchContext& ctx) {
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  if (p.count == 0) return;
  const auto s = static_cast<typename Elem<T>::compute>(p.scalar);
  if constexpr (std::is_same_v<T, float>) {
    if (p.count % 4 == 0 && aligned16(a) && aligned16(out)) {
      binary_scalar4_kernel<op><<<blocks_for(p.count / 4), kThreads, 0, ctx.stream>>>(
          ctx.record, reinterpret_cast<const float4*>(a), reinterpret_cast<float4*>(out),
          p.count / 4, s);
      return;
    }
  }
  binary_scalar_kernel<op, T>
      <<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(ctx.record, a, out, p.count, s);
}

template <class F>
cudaError_t with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add:
      f(std::integral_constant<BinaryOp, BinaryOp::add>{});
      break;
    case BinaryOp::sub:
      f(std::integral_constant<BinaryOp, BinaryOp::sub>{});
      break;
    case BinaryOp::mul:
      f(std::integral_constant<BinaryOp, BinaryOp::mul>{});
      break;
    case BinaryOp::div:
      f(std::integral_constant<BinaryOp, BinaryOp::div>{});
      break;
    case BinaryOp::maximum:
      f(std::integral_constant<BinaryOp, BinaryOp::maximum>{});
      break;
    case BinaryOp::minimum:
      f(std::integral_constant<BinaryOp, BinaryOp::minimum>{});
      break;
    case BinaryOp::pow:
      f(std::integral_constant<BinaryOp, BinaryOp::pow>{});
      break;
    case BinaryOp::floor_divide:
      f(std::integral_constant<BinaryOp, BinaryOp::floor_divide>{});
      break;
    case BinaryOp::fmod:
      f(std::integral_constant<BinaryOp, BinaryOp::fmod>{});
      break;
    case BinaryOp::remainder:
      f(std::integral_constant<BinaryOp, BinaryOp::remainder>{});
      break;
  }
  return cudaGetLastError();
}

template <class T>
void launch_unary_typed(UnaryOp op, const UnaryParams& p, const LaunchContext& ctx) {
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  if (p.count == 0) return;
  auto go = [&](auto tag) {
    constexpr UnaryOp kOp = decltype(tag)::value;
    if constexpr (std::is_same_v<T, float>) {
      if (p.count % 4 == 0 && aligned16(a) && aligned16(out)) {
        unary4_kernel<kOp><<<blocks_for(p.count / 4), kThreads, 0, ctx.stream>>>(
            ctx.record, reinterpret_cast<const float4*>(a), reinterpret_cast<float4*>(out),
            p.count / 4);
        return;
      }
    }
    unary_kernel<kOp, T>
        <<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(ctx.record, a, out, p.count);
  };
  using U = UnaryOp;
  switch (op) {
    case U::neg:
      go(std::integral_constant<U, U::neg>{});
      break;
    case U::abs:
      go(std::integral_constant<U, U::abs>{});
      break;
    case U::exp:
      go(std::integral_constant<U, U::exp>{});
      break;
    case U::log:
      go(std::integral_constant<U, U::log>{});
      break;
    case U::sqrt:
      go(std::integral_constant<U, U::sqrt>{});
      break;
    case U::rsqrt:
      go(std::integral_constant<U, U::rsqrt>{});
      break;
    case U::tanh:
      go(std::integral_constant<U, U::tanh>{});
      break;
    case U::sigmoid:
      go(std::integral_constant<U, U::sigmoid>{});
      break;
    case U::relu:
      go(std::integral_constant<U, U::relu>{});
      break;
    case U::silu:
      go(std::integral_constant<U, U::silu>{});
      break;
    case U::gelu:
      go(std::integral_constant<U, U::gelu>{});
      break;
    case U::gelu_tanh:
      go(std::integral_constant<U, U::gelu_tanh>{});
      break;
    case U::sin:
      go(std::integral_constant<U, U::sin>{});
      break;
    case U::cos:
      go(std::integral_constant<U, U::cos>{});
      break;
    case U::square:
      go(std::integral_constant<U, U::square>{});
      break;
    case U::erf:
      go(std::integral_constant<U, U::erf>{});
      break;
    case U::floor:
      go(std::integral_constant<U, U::floor>{});
      break;
    case U::ceil:
      go(std::integral_constant<U, U::ceil>{});
      break;
    case U::round:
      go(std::integral_constant<U, U::round>{});
      break;
    case U::trunc:
      go(std::integral_constant<U, U::trunc>{});
      break;
  }
}

}  // namespace

cudaError_t launch_fill(const FillParams& p, const LaunchContext& ctx) {
  if (p.count == 0) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.step != 0.0) {
      arange_kernel<T><<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(
          ctx.record, static_cast<T*>(p.out), p.count, p.value, p.step);
      return cudaGetLastError();
    }
    fill_kernel<T><<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<T*>(p.out), p.count, retrace::detail::narrow_from_double<T>(p.value));
    return cudaGetLastError();
  });
}

cudaError_t launch_compare(const CompareParams& p, const LaunchContext& ctx) {
  const SelectSpace s = select_space(p, {p.a_strides, p.b_strides});
  if (s.count == 0) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    compare_kernel<T><<<blocks_for(s.count), kThreads, 0, ctx.stream>>>(
        ctx.record, s, static_cast<const T*>(p.a), static_cast<const T*>(p.b), p.out, p.op);
    return cudaGetLastError();
  });
}

cudaError_t launch_where(const WhereParams& p, const LaunchContext& ctx) {
  const SelectSpace s = select_space(p, {p.cond_strides, p.a_strides, p.b_strides});
  if (s.count == 0) return cudaSuccess;
  const unsigned int blocks = blocks_for(s.count);
  return with_size(p.elem_size, [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(
        ctx.record, s, p.cond, static_cast<const T*>(p.a), static_cast<const T*>(p.b),
        static_cast<T*>(p.out));
  });
}

cudaError_t launch_random(const RandomParams& p, const LaunchContext& ctx) {
  if (p.count > 0) {
    const auto blocks = (p.count + 3) / 4;
    const bool normal = p.dist == RandomDist::normal;
    const cudaError_t e = with_float(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* out = static_cast<T*>(p.out);
      if (normal) {
        random_kernel<T, RandomDist::normal>
            <<<blocks_for(blocks), kThreads, 0, ctx.stream>>>(ctx.record, p.state, out, p.count);
      } else {
        random_kernel<T, RandomDist::uniform>
            <<<blocks_for(blocks), kThreads, 0, ctx.stream>>>(ctx.record, p.state, out, p.count);
      }
    });
    if (e != cudaSuccess) return e;
  }
  if (!p.advance) return cudaSuccess;
  random_advance<<<1, 1, 0, ctx.stream>>>(ctx.record, p.state);
  return cudaGetLastError();
}

// Binary kernels exist for every dtype but uint8 (as on the CPU device).
template <class P, class Launch>
cudaError_t dispatch_binary(const P& p, Launch&& launch) {
  return dispatch_dtype(p.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      return cudaErrorInvalidValue;
    } else {
      return with_binary_op(p.op, [&](auto op) { launch(op, tag); });
    }
  });
}

cudaError_t launch_binary(const BinaryParams& p, const LaunchContext& ctx) {
  return dispatch_binary(p, [&](auto op, auto tag) {
    launch_binary_typed<decltype(op)::value, decltype(tag)>(p, ctx);
  });
}

cudaError_t launch_binary_scalar(const BinaryScalarParams& p, const LaunchContext& ctx) {
  return dispatch_binary(p, [&](auto op, auto tag) {
    launch_binary_scalar_typed<decltype(op)::value, decltype(tag)>(p, ctx);
  });
}

cudaError_t launch_unary(const UnaryParams& p, const LaunchContext& ctx) {
  return with_float(p.dtype,
                    [&](auto tag) { launch_unary_typed<decltype(tag)>(p.op, p, ctx); });
}

cudaError_t launch_typecast(const TypecastParams& p, const LaunchContext& ctx) {
  if (p.count == 0) return cudaSuccess;
  return dispatch_dtype(p.from, [&](auto from_tag) {
    using From = decltype(from_tag);
    return dispatch_dtype(p.to, [&](auto to_tag) {
      using To = decltype(to_tag);
      typecast_kernel<From, To><<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(
          ctx.record, static_cast<const From*>(p.src), static_cast<To*>(p.dst), p.count,
          p.to == DType::bool_);
      return cudaGetLastError();
    });
  });
}

}  // namespace retrace::cuda
