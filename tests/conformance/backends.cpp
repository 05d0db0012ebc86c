#include "conformance/backends.hpp"

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
}  // namespace

const std::vector<Backend>& backends() {
  static const std::vector<Backend> all = {
      cpu_backend("cpu_worker", ExecutionMode::worker),
      cpu_backend("cpu_inline", ExecutionMode::inline_),
  };
  return all;
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::ValuesIn(backends()),
                         backend_name);

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

}  // namespace retrace::conformance
