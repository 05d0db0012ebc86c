// Row-wise and data-movement CUDA kernels: reductions, softmax, layer/rms norm (one block per
// row, float accumulation), assert_finite, copies, strided copies and tile layout conversion.
#include "cuda/common.cuh"
#include "cuda/kernels_cuda.hpp"

namespace retrace::cuda {

namespace {

template <class T>
__global__ void reduce_kernel(const FailureRecord* record, const T* a, T* out, std::int64_t cols,
                              ReduceOp op) {
  if (aborted(record)) return;
  using E = Elem<T>;
  const T* row = a + static_cast<std::int64_t>(blockIdx.x) * cols;
  float acc = op == ReduceOp::max ? -INFINITY : 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = static_cast<float>(E::load(row, c));
    acc = op == ReduceOp::max ? nan_max(acc, v) : acc + v;
  }
  float total = op == ReduceOp::max ? block_reduce<true>(acc) : block_reduce<false>(acc);
  if (op == ReduceOp::mean) total /= static_cast<float>(cols);
  if (threadIdx.x == 0) E::store(out, blockIdx.x, total);
}

// argmax: one row per thread (the first maximum, or the first NaN).
template <class T>
__global__ void argmax_kernel(const FailureRecord* record, const T* a, std::int32_t* out,
                              std::int64_t rows, std::int64_t cols) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(r, rows) {
    const T* row = a + r * cols;
    std::int64_t best = 0;
    float top = static_cast<float>(Elem<T>::load(row, 0));
    for (std::int64_t c = 1; c < cols && top == top; ++c) {
      const float v = static_cast<float>(Elem<T>::load(row, c));
      if (v > top || v != v) {
        top = v;
        best = c;
      }
    }
    out[r] = static_cast<std::int32_t>(best);
  }
}

// Softmax of one row per block; `in` and `out` may alias.
template <class T>
__global__ void softmax_kernel(const FailureRecord* record, const T* in, T* out,
                               std::int64_t cols) {
  if (aborted(record)) return;
  using E = Elem<T>;
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    m = fmaxf(m, static_cast<float>(E::load(in, base + c)));
  }
  m = block_reduce<true>(m);
  float s = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    s += expf(static_cast<float>(E::load(in, base + c)) - m);
  }
  const float inv = 1.0f / block_reduce<false>(s);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    E::store(out, base + c, expf(static_cast<float>(E::load(in, base + c)) - m) * inv);
  }
}

template <class T>
__global__ void norm_kernel(const FailureRecord* record, const T* a, const T* w, const T* b, T* out,
                            std::int64_t cols, float eps, bool rms) {
  if (aborted(record)) return;
  using E = Elem<T>;
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * cols;
  const float n = static_cast<float>(cols);
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      s += static_cast<float>(E::load(a, base + c));
    mean = block_reduce<false>(s) / n;
  }
  float v = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = static_cast<float>(E::load(a, base + c)) - mean;
    v += d * d;
  }
  const float inv = rsqrtf(block_reduce<false>(v) / n + eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float y = (static_cast<float>(E::load(a, base + c)) - mean) * inv;
    if (w != nullptr) y *= static_cast<float>(E::load(w, c));
    if (b != nullptr) y += static_cast<float>(E::load(b, c));
    E::store(out, base + c, y);
  }
}

template <class T>
__global__ void assert_finite_kernel(FailureRecord* record, unsigned int* host_flag,
                                     unsigned int site, const T* data, std::int64_t n) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    const float v = static_cast<float>(Elem<T>::load(data, i));
    if (!isfinite(v)) record_failure(record, host_flag, site, i, __float_as_uint(v));
  }
}

__global__ void copy16_kernel(const FailureRecord* record, const uint4* src, uint4* dst,
                              std::int64_t n) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    dst[i] = src[i];
  }
}

__global__ void copy1_kernel(const FailureRecord* record, const unsigned char* src,
                             unsigned char* dst, std::int64_t n) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    dst[i] = src[i];
  }
}

template <class T>
__global__ void strided_copy_kernel(const FailureRecord* record, const T* src, T* dst,
                                    std::int64_t n, TwoOperandSpace g) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    std::int64_t is = 0, id = 0;
    g.offsets(i, is, id);
    dst[id] = src[is];
  }
}

// One thread per output element. An index outside [0, dim_size) fails the command like
// assert_finite: the lowest such element and its value go to the failure record, nothing is
// read out of bounds (the output element is left as it was).
// (The record keeps 32 bits of the value: an int64 index outside int32's range is reported
// saturated to it.)
template <class T, class I>
__global__ void gather_kernel(FailureRecord* record, unsigned int* host_flag, unsigned int site,
                              const T* src, const I* index, T* out, std::int64_t n,
                              TwoOperandSpace g, std::int64_t dim_stride, std::int64_t dim_size) {
  if (aborted(record)) return;
  RETRACE_GRID_STRIDE(i, n) {
    std::int64_t at_src = 0, at_index = 0;
    g.offsets(i, at_src, at_index);
    const std::int64_t v = index[at_index];
    if (v < 0 || v >= dim_size) {
      const std::int64_t shown = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v;
      record_failure(record, host_flag, site, at_index,
                     static_cast<std::uint32_t>(static_cast<std::int32_t>(shown)));
      continue;
    }
    out[i] = src[at_src + static_cast<std::int64_t>(v) * dim_stride];
  }
}

// One thread per element of the tiled buffer (padding included).
template <class T>
__global__ void tilize_kernel(const FailureRecord* record, const T* src, T* dst, std::int64_t n,
                              std::int64_t rows, std::int64_t cols, std::int64_t prows,
                              std::int64_t pcols, bool to_tile) {
  if (aborted(record)) return;
  constexpr std::int64_t kTile = kTileSize;
  const std::int64_t tiles_per_row = pcols / kTile;
  RETRACE_GRID_STRIDE(t, n) {
    const std::int64_t plane = prows * pcols;
    const std::int64_t b = t / plane, in_plane = t % plane;
    const std::int64_t tile = in_plane / (kTile * kTile), in_tile = in_plane % (kTile * kTile);
    const std::int64_t r = (tile / tiles_per_row) * kTile + in_tile / kTile;
    const std::int64_t c = (tile % tiles_per_row) * kTile + in_tile % kTile;
    const bool inside = r < rows && c < cols;
    const std::int64_t plain = (b * rows + r) * cols + c;
    if (to_tile) {
      dst[t] = inside ? src[plain] : T{};
    } else if (inside) {
      dst[plain] = src[t];
    }
  }
}

}  // namespace

cudaError_t launch_reduce(const ReduceParams& p, const LaunchContext& ctx) {
  if (p.rows == 0) return cudaSuccess;
  return with_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.op == ReduceOp::argmax) {
      argmax_kernel<T><<<blocks_for(p.rows), kThreads, 0, ctx.stream>>>(
          ctx.record, static_cast<const T*>(p.a), static_cast<std::int32_t*>(p.out), p.rows,
          p.cols);
      return;
    }
    reduce_kernel<T><<<static_cast<unsigned int>(p.rows), row_threads(p.cols), 0, ctx.stream>>>(
        ctx.record, static_cast<const T*>(p.a), static_cast<T*>(p.out), p.cols, p.op);
  });
}

cudaError_t launch_softmax(const SoftmaxParams& p, const LaunchContext& ctx) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return with_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<static_cast<unsigned int>(p.rows), row_threads(p.cols), 0, ctx.stream>>>(
        ctx.record, static_cast<const T*>(p.a), static_cast<T*>(p.out), p.cols);
  });
}

cudaError_t launch_norm(const NormParams& p, const LaunchContext& ctx) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return with_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    norm_kernel<T><<<static_cast<unsigned int>(p.rows), row_threads(p.cols), 0, ctx.stream>>>(
        ctx.record, static_cast<const T*>(p.a), static_cast<const T*>(p.weight),
        static_cast<const T*>(p.bias), static_cast<T*>(p.out), p.cols, p.eps, p.rms);
  });
}

cudaError_t launch_assert_finite(const AssertFiniteParams& p, const LaunchContext& ctx) {
  if (p.count == 0) return cudaSuccess;
  return with_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    assert_finite_kernel<T><<<blocks_for(p.count), kThreads, 0, ctx.stream>>>(
        ctx.record, ctx.host_flag, ctx.site, static_cast<const T*>(p.data), p.count);
  });
}

cudaError_t launch_copy(const CopyParams& p, const LaunchContext& ctx) {
  if (p.bytes == 0 || p.src == p.dst) return cudaSuccess;
  if (p.bytes % 16 == 0 && aligned16(p.src) && aligned16(p.dst)) {
    copy16_kernel<<<blocks_for(p.bytes / 16), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const uint4*>(p.src), static_cast<uint4*>(p.dst), p.bytes / 16);
  } else {
    copy1_kernel<<<blocks_for(p.bytes), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const unsigned char*>(p.src), static_cast<unsigned char*>(p.dst),
        p.bytes);
  }
  return cudaGetLastError();
}

cudaError_t launch_strided_copy(const StridedCopyParams& p, const LaunchContext& ctx) {
  std::int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.shape[d];
  const TwoOperandSpace g = make_space(p.shape, p.src_strides, p.dst_strides, p.rank);
  if (n == 0) return cudaSuccess;
  return with_size(p.elem_size, [&](auto tag) {
    using T = decltype(tag);
    strided_copy_kernel<T><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const T*>(p.src), static_cast<T*>(p.dst), n, g);
  });
}

cudaError_t launch_gather(const GatherParams& p, const LaunchContext& ctx) {
  std::int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.shape[d];
  if (n == 0) return cudaSuccess;
  const TwoOperandSpace g = make_space(p.shape, p.src_strides, p.index_strides, p.rank);
  return with_size(p.elem_size, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto index_tag) {  // int64 or int32 indices
      using I = decltype(index_tag);
      gather_kernel<T, I><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
          ctx.record, ctx.host_flag, ctx.site, static_cast<const T*>(p.src),
          static_cast<const I*>(p.index), static_cast<T*>(p.out), n, g, p.dim_stride,
          p.dim_size);
    };
    if (p.index_size == 8) {
      launch(std::int64_t{});
    } else {
      launch(std::int32_t{});
    }
  });
}

cudaError_t launch_tilize(const TilizeParams& p, const LaunchContext& ctx) {
  const auto pad = [](std::int64_t n) { return (n + kTileSize - 1) / kTileSize * kTileSize; };
  const std::int64_t prows = pad(p.rows), pcols = pad(p.cols);
  const std::int64_t n = p.batch * prows * pcols;
  if (n == 0) return cudaSuccess;
  return with_size(p.elem_size, [&](auto tag) {
    using T = decltype(tag);
    tilize_kernel<T><<<blocks_for(n), kThreads, 0, ctx.stream>>>(
        ctx.record, static_cast<const T*>(p.src), static_cast<T*>(p.dst), n, p.rows, p.cols, prows,
        pcols, p.to_tile);
  });
}

}  // namespace retrace::cuda
