// Shared by the CUDA kernel files: element access (bfloat16 and float16 computed in float), the
// skip-after-failure check and launch geometry.
#pragma once

#include "cuda/launch.hpp"
#include "retrace/bfloat16.hpp"
#include "retrace/float16.hpp"
#include "retrace/round_to_odd.hpp"
#include "retrace/dtype_dispatch.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace retrace::cuda {

template <class T>
struct Elem {
  using compute = T;
  __device__ static T load(const T* p, std::int64_t i) { return p[i]; }
  __device__ static void store(T* p, std::int64_t i, T v) { p[i] = v; }
};

// The 16-bit floats are retrace::bfloat16 and retrace::float16 themselves (not CUDA's types):
// their constexpr conversions run in device code too (--expt-relaxed-constexpr), so both
// devices round the same way by construction.
template <class H>
struct HalfElem {
  using compute = float;
  __device__ static float load(const H* p, std::int64_t i) { return p[i].to_float(); }
  __device__ static void store(H* p, std::int64_t i, float v) { p[i] = H::from_float(v); }
};
template <>
struct Elem<bfloat16> : HalfElem<bfloat16> {};
template <>
struct Elem<float16> : HalfElem<float16> {};

// f(T{}) for the floating dtypes (float, bfloat16, float16); cudaErrorInvalidValue for others,
// else the launch's error.
template <class F>
cudaError_t with_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32:
      f(float{});
      break;
    case DType::bfloat16:
      f(bfloat16{});
      break;
    case DType::float16:
      f(float16{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// f(U{}) with the unsigned type of elem_size bytes (1, 2, 4, 8): for kernels that only move
// elements; cudaErrorInvalidValue for other sizes, else the launch's error.
template <class F>
cudaError_t with_size(std::int32_t elem_size, F&& f) {
  switch (elem_size) {
    case 1:
      f(std::uint8_t{});
      break;
    case 2:
      f(std::uint16_t{});
      break;
    case 4:
      f(std::uint32_t{});
      break;
    case 8:
      f(std::uint64_t{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Fails the command from a kernel thread: keeps the lowest (element << 32 | value bits) in the
// record (so the first bad element is the one reported), names the site, makes later kernels
// skip and raises the host-mapped flag. `element` is clamped to 32 bits.
__device__ inline void record_failure(FailureRecord* record, unsigned int* host_flag,
                                      unsigned int site, std::int64_t element,
                                      std::uint32_t value_bits) {
  const unsigned long long index =
      element < 0xffffffffLL ? static_cast<unsigned long long>(element) : 0xffffffffULL;
  atomicMin(&record->element, (index << 32) | value_bits);
  record->site = site;
  __threadfence();
  atomicExch(&record->abort, 1u);
  *reinterpret_cast<volatile unsigned int*>(host_flag) = site;
  __threadfence_system();
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// True when an earlier command of this queue or trace failed: the kernel must do nothing.
__device__ inline bool aborted(const FailureRecord* record) {
  return *reinterpret_cast<const volatile unsigned int*>(&record->abort) != 0u;
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements.
inline unsigned int blocks_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  constexpr std::int64_t kMaxBlocks = 65535LL * 8;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

#define RETRACE_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// A row-major iteration space of up to kMaxKernelRank dimensions over two strided operands.
struct TwoOperandSpace {
  std::int64_t shape[kMaxKernelRank];
  std::int64_t first[kMaxKernelRank];   // strides (elements) of the first operand
  std::int64_t second[kMaxKernelRank];  // ... and of the second
  int rank;

  // Element offsets in both operands of flat index i.
  __device__ void offsets(std::int64_t i, std::int64_t& o_first, std::int64_t& o_second) const {
    o_first = 0;
    o_second = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t idx = i % shape[d];
      i /= shape[d];
      o_first += idx * first[d];
      o_second += idx * second[d];
    }
  }
};

inline TwoOperandSpace make_space(const std::int64_t* shape, const std::int64_t* first,
                                  const std::int64_t* second, int rank) {
  TwoOperandSpace g{};
  g.rank = rank;
  for (int d = 0; d < rank; ++d) {
    g.shape[d] = shape[d];
    g.first[d] = first[d];
    g.second[d] = second[d];
  }
  return g;
}

// max that returns NaN when either operand is NaN (fmaxf drops it), as the CPU device does.
__device__ inline float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// Sum (or max) of one value per thread over the block; every thread gets the result.
// Needs blockDim.x a multiple of 32 and at most 1024.
template <bool kMax>
__device__ inline float block_reduce(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? nan_max(v, other) : v + other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  v = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? nan_max(v, other) : v + other;
  }
  return v;
}

// Threads per block for a kernel that gives one block to each row of `cols` elements.
inline unsigned int row_threads(std::int64_t cols) {
  std::int64_t t = 32;
  while (t < cols && t < 1024) t *= 2;
  return static_cast<unsigned int>(t > 512 ? 512 : t);
}

}  // namespace retrace::cuda
