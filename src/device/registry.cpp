#include "retrace/registry.hpp"

#include "retrace/backend.hpp"
#include "retrace/error.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <mutex>

namespace retrace {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<BackendRegistration> backends;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: registrations run from static initialisers
  return *r;
}

std::optional<BackendRegistration> find(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const BackendRegistration& b : r.backends) {
    if (b.name == name) return b;
  }
  return std::nullopt;
}

std::vector<std::string> names() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> out;
  for (const BackendRegistration& b : r.backends) out.push_back(b.name);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::pair(a != "cpu", a) < std::pair(b != "cpu", b);
  });
  return out;
}

// "cuda:1" -> ("cuda", 1); "cpu" -> ("cpu", 0).
std::pair<std::string_view, int> parse_spec(std::string_view spec) {
  const std::size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  int n = 0;
  if (colon != std::string_view::npos) {
    const std::string_view digits = spec.substr(colon + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    RETRACE_CHECK(!digits.empty() && error == std::errc() && end == digits.data() + digits.size() &&
                      n >= 0,
                  invalid_argument,
                  "open_device: \"{}\" is not a device spec (\"<backend>\" or \"<backend>:<n>\", "
                  "n a whole number)",
                  spec);
  }
  RETRACE_CHECK(!name.empty(), invalid_argument,
                "open_device: \"{}\" does not name a backend (known: {})", spec,
                fmt::join(names(), ", "));
  return {name, n};
}

}  // namespace

bool register_backend(BackendRegistration registration) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (BackendRegistration& b : r.backends) {
    if (b.name == registration.name) {
      b = std::move(registration);
      return true;
    }
  }
  r.backends.push_back(std::move(registration));
  return true;
}

std::vector<BackendStatus> available_backends() {
  std::vector<BackendRegistration> backends;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    backends = r.backends;
  }
  // "cpu" first (always built), then by name: registration order is static-initialisation order.
  std::stable_sort(backends.begin(), backends.end(), [](const auto& a, const auto& b) {
    return std::pair(a.name != "cpu", a.name) < std::pair(b.name != "cpu", b.name);
  });
  std::vector<BackendStatus> out;
  for (const BackendRegistration& b : backends) {
    std::string reason = b.unavailable_reason ? b.unavailable_reason() : std::string();
    out.push_back(BackendStatus{b.name, reason.empty(), std::move(reason)});
  }
  return out;
}

DeviceOptions default_device_options(std::string_view spec) {
  const auto [name, n] = parse_spec(spec);
  const std::optional<BackendRegistration> backend = find(name);
  RETRACE_CHECK(backend.has_value(), invalid_argument,
                "open_device: no backend \"{}\" in this build (known: {})", name,
                fmt::join(names(), ", "));
  DeviceOptions options = backend->default_options ? backend->default_options() : DeviceOptions{};
  options.id = DeviceId{static_cast<std::uint32_t>(n)};
  return options;
}

std::unique_ptr<Device> open_device(std::string_view spec) {
  return open_device(spec, default_device_options(spec));
}

std::unique_ptr<Device> open_device(std::string_view spec, const DeviceOptions& options) {
  const auto [name, n] = parse_spec(spec);
  const std::optional<BackendRegistration> backend = find(name);
  RETRACE_CHECK(backend.has_value(), invalid_argument,
                "open_device: no backend \"{}\" in this build (known: {})", name,
                fmt::join(names(), ", "));
  if (backend->unavailable_reason) {
    const std::string reason = backend->unavailable_reason();
    RETRACE_CHECK(reason.empty(), failed_precondition, "open_device(\"{}\"): {} cannot be used here: {}",
                  spec, name, reason);
  }
  DeviceOptions with_id = options;
  with_id.id = DeviceId{static_cast<std::uint32_t>(n)};
  return backend->open(n, with_id);
}

}  // namespace retrace
