// Stream-capture bookkeeping shared by the CUDA backend's files.
#pragma once

#include "cuda/check.hpp"

#include <cuda_runtime_api.h>

namespace retrace::cuda {

// Stream captures this thread has open (on any CUDA device).
inline thread_local int t_open_captures = 0;

// While this thread has a capture open, CUDA refuses calls it deems unsafe (waiting on a
// stream, allocating) and invalidates the capture, even when they concern other streams. The
// device's own bookkeeping (reaping finished work, reading or waiting on another queue or
// device, allocating staging memory) never touches the capturing stream, so it runs in the
// relaxed mode; kernel launches never do.
class RelaxedCapture {
 public:
  RelaxedCapture() noexcept {
    if (t_open_captures > 0) active_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
  }
  ~RelaxedCapture() {
    if (active_) RETRACE_CUDA_WARN(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool active_ = false;
};

}  // namespace retrace::cuda
