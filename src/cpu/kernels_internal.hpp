// Shared by the CPU kernel files: parameter access and the per-family resolvers.
#pragma once

#include "cpu/program.hpp"
#include "retrace/bfloat16.hpp"
#include "retrace/dtype_dispatch.hpp"
#include "retrace/error.hpp"
#include "retrace/kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace retrace::cpu {

template <class P>
const P& params_as(const std::byte* params) {
  return *reinterpret_cast<const P*>(params);
}

// Rows of an iteration space of `rank` dimensions whose last one is the inner loop.
inline std::int64_t outer_rows(const std::int64_t* shape, int rank) {
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < rank; ++d) rows *= shape[d];
  return rows;
}

// The fewest elements a parallel task of a streaming kernel (elementwise, row-wise, copies)
// takes: 8192, so a [256, 256] float32 activation splits across two cores. Splitting such ops
// costs a few microseconds, but keeping them on one core cost more: the GEMMs before and after
// split their rows over the kernel threads, and a one-core op pulled half its operand from the
// other core's cache (measured at the DiT bench's M size on two threads: mul/add/layer_norm 2x
// faster split, and the following linears faster too, the step 12.1-14.0 -> 9.3-10.4 ms).
// Rows and element ranges are split in order, as the GEMMs split their rows: part i of each
// op covers the same rows.
inline constexpr std::int64_t kMinTaskElements = std::int64_t{1} << 13;

// Rows per parallel task, so that a task covers at least `elements` elements.
inline std::int64_t rows_per_task(std::int64_t row_length, std::int64_t elements) {
  return std::max<std::int64_t>(1, elements / std::max<std::int64_t>(row_length, 1));
}

// Per-thread float scratch in `slot` that only grows: no allocation once warmed up (the prep run
// does that). Slots 0 .. 5 are matmul's and attention's, kWinogradScratchSlot the Winograd
// convolution's, so one kernel never hands out rows another still reads.
inline constexpr int kWinogradScratchSlot = 6;
inline constexpr int kScratchSlots = 7;
inline float* thread_scratch(int slot, std::int64_t elements) {
  thread_local std::vector<float> buffers[kScratchSlots];
  auto& buffer = buffers[slot];
  if (static_cast<std::int64_t>(buffer.size()) < elements) {
    buffer.resize(static_cast<std::size_t>(elements));
  }
  return buffer.data();
}

// Element offsets of operands for `row` of an iteration space whose last dimension is the
// contiguous inner loop: row indexes dimensions 0 .. last-1 in row-major order.
template <std::size_t N>
void row_offsets(std::int64_t row, const std::int64_t* shape, int last,
                 const std::int64_t* const (&strides)[N], std::int64_t (&offsets)[N]) {
  for (auto& o : offsets) o = 0;
  for (int d = last - 1; d >= 0; --d) {
    const std::int64_t i = row % shape[d];
    row /= shape[d];
    for (std::size_t k = 0; k < N; ++k) offsets[k] += i * strides[k][d];
  }
}

// For kernels that only move elements: the kernel make(U{}) returns for the unsigned type U of
// `elem_size` bytes (1, 2, 4 or 8), or an `unimplemented` error naming `what`.
template <class Make>
KernelFn by_elem_size(std::int32_t elem_size, std::string_view what, Make&& make) {
  switch (elem_size) {
    case 1: return make(std::uint8_t{});
    case 2: return make(std::uint16_t{});
    case 4: return make(std::uint32_t{});
    case 8: return make(std::uint64_t{});
    default: break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no {} kernel for {}-byte elements", what,
               elem_size);
}

// The float32, bfloat16 or float16 instantiation K<T>::run for p.dtype.
template <template <class> class K, class P>
KernelFn float_kernel(const P& p, std::string_view what) {
  switch (p.dtype) {
    case DType::float32: return [](const std::byte* raw) { K<float>::run(raw); };
    case DType::bfloat16: return [](const std::byte* raw) { K<bfloat16>::run(raw); };
    case DType::float16: return [](const std::byte* raw) { K<float16>::run(raw); };
    default: break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no {} kernel for {}", what, p.dtype);
}

KernelFn resolve(const FillParams& p);
KernelFn resolve(const CopyParams& p);
KernelFn resolve(const AssertFiniteParams& p);
KernelFn resolve(const BinaryParams& p);
KernelFn resolve(const BinaryScalarParams& p);
KernelFn resolve(const UnaryParams& p);
KernelFn resolve(const ReduceParams& p);
KernelFn resolve(const SoftmaxParams& p);
KernelFn resolve(const NormParams& p);
KernelFn resolve(const MatmulParams& p);
KernelFn resolve(const AttentionParams& p);
KernelFn resolve(const StridedCopyParams& p);
KernelFn resolve(const TypecastParams& p);
KernelFn resolve(const TilizeParams& p);
KernelFn resolve(const CollectiveParams& p);
KernelFn resolve(const RandomParams& p);
KernelFn resolve(const CompareParams& p);
KernelFn resolve(const WhereParams& p);
KernelFn resolve(const GatherParams& p);
KernelFn resolve(const WinogradParams& p);

}  // namespace retrace::cpu
