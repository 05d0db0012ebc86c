// Registers the CUDA device as backend "cuda" (open_device("cuda:1")). The anchor symbol makes
// the linker keep this file when retrace::cuda is a static library (see CMakeLists.txt).
#include "cuda/collective.hpp"
#include "retrace/backend.hpp"
#include "retrace/cuda.hpp"
#include "retrace/registry.hpp"

namespace {

std::unique_ptr<retrace::Device> open(int n, const retrace::DeviceOptions& options) {
  retrace::CudaDeviceOptions settings;
  settings.id = options.id;
  settings.ordinal = n;
  settings.memory_bytes = options.memory_bytes;
  settings.trace_region_bytes = options.trace_region_bytes;
  settings.num_queues = options.num_queues;
  return retrace::open_cuda_device(settings);
}

retrace::DeviceOptions default_options() {
  const retrace::CudaDeviceOptions defaults;
  return {defaults.id, defaults.memory_bytes, defaults.trace_region_bytes, defaults.num_queues, 0};
}

bool register_cuda() {
  retrace::cuda::register_nccl_transport();  // mesh lines of CUDA devices meet through NCCL
  return retrace::register_backend(
      {"cuda", [] { return retrace::cuda_unavailable_reason(); }, open, default_options});
}

}  // namespace

extern "C" {
extern const bool retrace_cuda_backend_registered;
const bool retrace_cuda_backend_registered = register_cuda();
}
