// Registers the CPU device as backend "cpu" (open_device("cpu")). The anchor symbol makes the
// linker keep this file when retrace::cpu is a static library (see CMakeLists.txt).
#include "retrace/backend.hpp"
#include "retrace/cpu.hpp"
#include "retrace/registry.hpp"

namespace {

std::unique_ptr<retrace::Device> open(int, const retrace::DeviceOptions& options) {
  retrace::CpuDeviceOptions settings;
  settings.id = options.id;
  settings.memory_bytes = options.memory_bytes;
  settings.trace_region_bytes = options.trace_region_bytes;
  settings.num_queues = options.num_queues;
  settings.guard_bytes = options.guard_bytes;
  settings.kernel_threads = options.kernel_threads;
  return retrace::open_cpu_device(settings);
}

retrace::DeviceOptions default_options() {
  const retrace::CpuDeviceOptions defaults;
  return {defaults.id,         defaults.memory_bytes, defaults.trace_region_bytes,
          defaults.num_queues, defaults.guard_bytes,  defaults.kernel_threads};
}

bool register_cpu() {
  return retrace::register_backend({"cpu", [] { return std::string(); }, open, default_options});
}

}  // namespace

extern "C" {
extern const bool retrace_cpu_backend_registered;
const bool retrace_cpu_backend_registered = register_cpu();
}
