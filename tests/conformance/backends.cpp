#include "conformance/backends.hpp"
#include "support.hpp"

namespace retrace::conformance {

namespace {

// A backend from the registry, opened by name with the spec's memory settings.
Backend registered(const BackendStatus& status) {
  const std::string name = status.name;
  return Backend{name,
                 [name](const DeviceSpec& spec) {
                   DeviceOptions options;
                   options.memory_bytes = spec.memory_bytes;
                   options.trace_region_bytes = spec.trace_region_bytes;
                   auto probe = testing::open_backend_device(name, spec.id, options);
                   if (spec.guard_bytes == 0 || !probe->supports(Capability::host_visible_memory)) {
                     return probe;
                   }
                   probe.reset();
                   options.guard_bytes = spec.guard_bytes;
                   return testing::open_backend_device(name, spec.id, options);
                 }};
}

// The CPU device once more with inline queues (work runs on the calling thread): the
// execution mode is a CPU setting, so this variant opens it directly.
Backend cpu_inline() {
  return Backend{"cpu_inline",
                 [](const DeviceSpec& spec) {
                   CpuDeviceOptions options;
                   options.id = spec.id;
                   options.memory_bytes = spec.memory_bytes;
                   options.trace_region_bytes = spec.trace_region_bytes;
                   options.guard_bytes = spec.guard_bytes;
                   options.execution = ExecutionMode::inline_;
                   return open_cpu_device(options);
                 }};
}

}  // namespace

std::string unavailable_reason(const Backend& backend) {
  return backend.name == "cpu_inline" ? std::string() : testing::backend_skip_reason(backend.name);
}

// Every backend this build registered, whether or not it can run here (those that cannot skip
// every case with the reason), then the CPU variant.
const std::vector<Backend>& backends() {
  static const std::vector<Backend> all = [] {
    std::vector<Backend> list;
    for (const BackendStatus& status : available_backends()) list.push_back(registered(status));
    list.push_back(cpu_inline());
    return list;
  }();
  return all;
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::ValuesIn(backends()),
                         backend_name);

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param.name;
}

}  // namespace retrace::conformance
