#include "cuda/check.hpp"

#include <filesystem>

namespace retrace::cuda {

namespace {
std::string where_string(const std::source_location& where) {
  return fmt::format("{}:{}", std::filesystem::path(where.file_name()).filename().string(),
                     where.line());
}
}  // namespace

std::string describe(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

void clear_last_error() noexcept {
  // Reading the error is what clears it; its value was reported by the call that failed.
  const cudaError_t previous = cudaGetLastError();
  static_cast<void>(previous);
}

void fail_cuda_call(cudaError_t error, const char* expression, std::string context,
                    std::source_location where) {
  clear_last_error();
  RETRACE_FAIL(device_error, "{}: {} failed: {} at {}", context, expression, describe(error),
               where_string(where));
}

void fail_cublas_call(cublasStatus_t status, const char* expression, std::string context,
                      std::source_location where) {
  RETRACE_FAIL(device_error, "{}: {} failed: cuBLAS {} ({}) at {}", context, expression,
               cublasGetStatusName(status), cublasGetStatusString(status), where_string(where));
}

void warn_cuda_call(cudaError_t error, const char* expression,
                    std::source_location where) noexcept {
  if (error == cudaSuccess) return;
  clear_last_error();
  try {
    log(LogLevel::warning, "CUDA teardown: {} failed: {} at {}", expression, describe(error),
        where_string(where));
  } catch (...) {
    // Logging itself failed (out of memory): nothing more can be done on a teardown path.
  }
}

}  // namespace retrace::cuda
