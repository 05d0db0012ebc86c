#include "conformance/backends.hpp"
#include "support.hpp"

#ifdef RETRACE_HAVE_CUDA
#include <retrace/cuda.hpp>
#endif

namespace retrace::conformance {

namespace {
Backend cpu_backend(std::string name, ExecutionMode mode) {
  return Backend{std::move(name),
                 [mode](const DeviceSpec& spec) {
                   CpuDeviceOptions options;
                   options.id = spec.id;
                   options.memory_bytes = spec.memory_bytes;
                   options.trace_region_bytes = spec.trace_region_bytes;
                   options.guard_bytes = spec.guard_bytes;
                   options.execution = mode;
                   return open_cpu_device(options);
                 },
                 /*can_detect_guard_damage=*/true};
}

// The CUDA device when retrace was built with it; nullptr (the test skips, printing
// unavailable_reason) without a usable GPU.
Backend cuda_backend() {
  return Backend{"cuda",
                 [](const DeviceSpec& spec) -> std::unique_ptr<Device> {
#ifdef RETRACE_HAVE_CUDA
                   if (!testing::cuda_skip_reason().empty()) return nullptr;
                   CudaDeviceOptions options;
                   options.id = spec.id;
                   options.memory_bytes = spec.memory_bytes;
                   options.trace_region_bytes = spec.trace_region_bytes;
                   options.cublas_workspace_bytes = std::size_t{4} << 20;
                   return open_cuda_device(options);
#else
                   (void)spec;
                   return nullptr;
#endif
                 },
                 /*can_detect_guard_damage=*/false};
}
}  // namespace

std::string unavailable_reason(const Backend& backend) {
  return backend.name == "cuda" ? testing::cuda_skip_reason() : std::string();
}

const std::vector<Backend>& backends() {
  static const std::vector<Backend> all = {
      cpu_backend("cpu_worker", ExecutionMode::worker),
      cpu_backend("cpu_inline", ExecutionMode::inline_),
      cuda_backend(),
  };
  return all;
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::ValuesIn(backends()),
                         backend_name);

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

}  // namespace retrace::conformance
