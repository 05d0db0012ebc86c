// The boundary between the CUDA device (host bookkeeping, C++) and its kernels (CUDA C++).
//
// The device validates a KernelLaunch (unsupported_reason), then calls launch_command with the stream,
// cuBLAS handle and failure record of the queue or trace the command belongs to. Every kernel
// of ours first reads `record->abort` and returns at once when an earlier command of the same
// queue (or trace) failed, so work queued behind a failure is skipped.
#pragma once

#include "retrace/kernels.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace retrace::cuda {

// Device-side failure record of one queue or one trace (in device memory).
struct FailureRecord {
  unsigned int abort;  // nonzero once a command failed: later kernels skip
  unsigned int site;   // the failing command's site id (see CudaDevice)
  // (element index << 32) | float bits of the first bad element (atomicMin keeps the lowest).
  unsigned long long element;
};

struct LaunchContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;  // for products with a bias epilogue
  void* blas_workspace = nullptr;        // the cuBLAS workspace in use (the queue's or the trace's)
  std::size_t blas_workspace_bytes = 0;
  FailureRecord* record = nullptr;    // device memory
  unsigned int* host_flag = nullptr;  // host-mapped: set to the site id by a failing kernel
  unsigned int site = 0;              // site id of this command (assert_finite)
  void* scratch = nullptr;            // device memory of scratch_bytes(...) bytes
  // float32 scratch of kGemmScratchBytes shared by the commands of one queue (eager) or one
  // trace, which run one after another on their stream; set where needs_gemm_scratch(...).
  void* gemm_scratch = nullptr;
};

inline constexpr std::size_t kGemmScratchBytes = std::size_t{16} << 20;

// Whether the command computes through gemm_scratch (a half-precision product with a bias).
[[nodiscard]] bool needs_gemm_scratch(KernelId kernel, const void* params) noexcept;

// Scratch memory the command needs for the duration of its work (attention scores), or 0.
[[nodiscard]] std::size_t scratch_bytes(KernelId kernel, const void* params) noexcept;

// Why the CUDA device cannot run this command (an unsupported dtype or size), or nullptr.
[[nodiscard]] const char* unsupported_reason(KernelId kernel, const void* params) noexcept;

// Whether the kernel table has an entry for the kernel.
[[nodiscard]] bool supports_kernel(KernelId kernel) noexcept;

// Enqueues the command on ctx.stream. Returns the first CUDA error, or a cuBLAS failure as
// cudaErrorUnknown with *blas_status set.
[[nodiscard]] cudaError_t launch_command(KernelId kernel, const void* params,
                                         const LaunchContext& ctx, cublasStatus_t* blas_status);

// Resets a failure record on `stream` (after the queue has drained).
[[nodiscard]] cudaError_t clear_record(FailureRecord* record, cudaStream_t stream);

}  // namespace retrace::cuda
