// The backends of the conformance suite: every backend registered with retrace (the registry,
// retrace/registry.hpp) and the CPU device with inline queues. Every test of the suite runs
// against each; a backend that cannot run here, or cannot run a case, skips it with
// GTEST_SKIP() and the reason.
#pragma once

#include <gtest/gtest.h>
#include <retrace/retrace.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace retrace::conformance {

struct DeviceSpec {
  DeviceId id{0};
  std::size_t memory_bytes = std::size_t{64} << 20;
  std::size_t trace_region_bytes = std::size_t{16} << 20;
  std::size_t guard_bytes = 64;
};

struct Backend {
  std::string name;
  std::function<std::unique_ptr<Device>(const DeviceSpec&)> open;
};

const std::vector<Backend>& backends();
// Why `backend` cannot open a device on this machine ("" when it can).
std::string unavailable_reason(const Backend& backend);

inline void PrintTo(const Backend& backend, std::ostream* os) { *os << backend.name; }

class DeviceConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const std::string reason = unavailable_reason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
    device_ = open();
  }
  std::unique_ptr<Device> open(DeviceSpec spec = {}) const { return GetParam().open(spec); }
  Device& device() { return *device_; }
  std::unique_ptr<Device> device_;
};

std::string backend_name(const ::testing::TestParamInfo<Backend>& info);

}  // namespace retrace::conformance
