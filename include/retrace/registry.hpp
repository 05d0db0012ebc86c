// Backends by name. Each backend registers itself (from its own folder) when its library is
// linked; tools and tests find what exists here instead of asking the build.
//
//   auto cpu = retrace::open_device("cpu");       // "cpu:0"
//   auto gpu = retrace::open_device("cuda:1");    // GPU 1, named "cuda:1"
//   for (const auto& b : retrace::available_backends())
//     std::printf("%s: %s\n", b.name.c_str(), b.available ? "available" : b.reason.c_str());
#pragma once

#include "retrace/device.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retrace {

struct BackendStatus {
  std::string name;      // "cpu", "cuda"
  bool available = false;
  std::string reason;    // why not, when unavailable ("no CUDA GPU is visible")
};

// Every registered backend, available or not, in registration order ("cpu" first).
[[nodiscard]] std::vector<BackendStatus> available_backends();

// Opens a device from a spec "<backend>" or "<backend>:<n>" (n: the device's id, and for a
// backend with several physical devices the one to use; default 0). Memory sizes, queues and
// guard bytes come from `options` (its id is replaced by n); backend-specific settings keep
// their defaults (use open_cpu_device / open_cuda_device for those). Throws invalid_argument
// for an unknown backend or a malformed spec, failed_precondition (with the reason) for a
// backend that cannot be used here.
[[nodiscard]] std::unique_ptr<Device> open_device(std::string_view spec);
[[nodiscard]] std::unique_ptr<Device> open_device(std::string_view spec,
                                                  const DeviceOptions& options);
// The options open_device(spec) would use (the backend's defaults, id n), to change a few:
//   auto options = retrace::default_device_options("cpu");
//   options.memory_bytes = std::size_t{8} << 30;
//   auto device = retrace::open_device("cpu", options);
[[nodiscard]] DeviceOptions default_device_options(std::string_view spec);

// --- for backends ------------------------------------------------------------------------------

struct BackendRegistration {
  std::string name;
  // "" when devices can be opened here, else why not. Never throws.
  std::function<std::string()> unavailable_reason;
  // Opens device n with these options (options.id is n).
  std::function<std::unique_ptr<Device>(int n, const DeviceOptions& options)> open;
  // Options a device of this backend gets when open_device is given none.
  std::function<DeviceOptions()> default_options;
};

// Adds a backend (a later registration of the same name replaces the earlier). Returns true, so
// a backend can register from a static initialiser: `const bool registered = register_backend(...)`.
bool register_backend(BackendRegistration registration);

}  // namespace retrace
