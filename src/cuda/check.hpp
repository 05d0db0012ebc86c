// How the CUDA backend calls CUDA: every call goes through one of these, so no result is
// dropped silently.
//
//   RETRACE_CUDA_CHECK(cudaStreamCreate(&s), "creating a stream for {}", label);   // throws
//   RETRACE_CUDA_WARN(cudaStreamDestroy(s));              // teardown: logs at warning level
//
// A failure names the call as written, CUDA's error name and text, what was being done, and the
// source line: "creating a stream for queue 0 of cuda:0: cudaStreamCreate(&s) failed:
// cudaErrorMemoryAllocation (out of memory) at cuda_backend.cpp:120". A non-sticky error is
// cleared first, so the device stays usable.
#pragma once

#include "retrace/error.hpp"
#include "retrace/log.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <source_location>
#include <string>
#include <string_view>

namespace retrace::cuda {

// "out of memory (cudaErrorMemoryAllocation)"
std::string describe(cudaError_t error);

// Clears CUDA's last (non-sticky) error, after a failure was handled.
void clear_last_error() noexcept;

[[noreturn]] void fail_cuda_call(cudaError_t error, const char* expression, std::string context,
                                 std::source_location where);
[[noreturn]] void fail_cublas_call(cublasStatus_t status, const char* expression,
                                   std::string context, std::source_location where);
void warn_cuda_call(cudaError_t error, const char* expression, std::source_location where) noexcept;

}  // namespace retrace::cuda

#define RETRACE_CUDA_CHECK(expression, ...)                                                  \
  do {                                                                                       \
    if (const cudaError_t retrace_cuda_error_ = (expression);                                \
        retrace_cuda_error_ != cudaSuccess) [[unlikely]] {                                   \
      ::retrace::cuda::fail_cuda_call(retrace_cuda_error_, #expression,                      \
                                      ::fmt::format(__VA_ARGS__),                            \
                                      ::std::source_location::current());                    \
    }                                                                                        \
  } while (false)

#define RETRACE_CUBLAS_CHECK(expression, ...)                                                \
  do {                                                                                       \
    if (const cublasStatus_t retrace_cublas_status_ = (expression);                          \
        retrace_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                      \
      ::retrace::cuda::fail_cublas_call(retrace_cublas_status_, #expression,                 \
                                        ::fmt::format(__VA_ARGS__),                          \
                                        ::std::source_location::current());                  \
    }                                                                                        \
  } while (false)

// For teardown paths that must not throw: a failure is logged (warning), never dropped.
#define RETRACE_CUDA_WARN(expression)                                                        \
  ::retrace::cuda::warn_cuda_call((expression), #expression, ::std::source_location::current())
