// The backend registry, kernel support queries and the `unimplemented` category. A minimal
// backend written against retrace/backend.hpp (host memory, synchronous, two kernels, no
// captures or events) shows what the core does for a backend that lacks something.
#include "support.hpp"

#include <cstring>

namespace retrace {
namespace {

class MiniBackend final : public Backend {
 public:
  explicit MiniBackend(std::size_t bytes, bool host_visible = true)
      : memory_(new std::byte[bytes + 64]), bytes_(bytes), host_visible_(host_visible) {}

  std::string_view name() const noexcept override { return "mini"; }
  bool supports(Capability capability) const noexcept override {
    return capability == Capability::host_visible_memory && host_visible_;
  }
  bool supports(KernelId kernel) const noexcept override {
    return kernel == KernelId::fill || kernel == KernelId::copy;
  }
  MemoryRegion region() override {
    auto* aligned = reinterpret_cast<std::byte*>(
        (reinterpret_cast<std::uintptr_t>(memory_.get()) + 63) / 64 * 64);
    return {aligned, bytes_, 64, host_visible_};
  }
  void write(QueueId, const Buffer& dst, std::size_t offset, std::span<const std::byte> src,
             Blocking) override {
    if (!src.empty()) std::memcpy(static_cast<std::byte*>(dst.data()) + offset, src.data(), src.size());
  }
  void read(QueueId, const Buffer& src, std::size_t offset, std::span<std::byte> dst) override {
    if (!dst.empty()) {
      std::memcpy(dst.data(), static_cast<const std::byte*>(src.data()) + offset, dst.size());
    }
  }
  void enqueue(QueueId, const KernelLaunch& launch) override {
    ++enqueued;
    if (launch.kernel == KernelId::copy) {
      const auto& p = *static_cast<const CopyParams*>(launch.params);
      std::memmove(p.dst, p.src, static_cast<std::size_t>(p.bytes));
      return;
    }
    const auto& p = *static_cast<const FillParams*>(launch.params);
    auto* out = static_cast<float*>(p.out);
    for (std::int64_t i = 0; i < p.count; ++i) out[i] = static_cast<float>(p.value);
  }
  const char* unsupported_reason(const KernelLaunch& launch) const noexcept override {
    if (launch.kernel == KernelId::fill &&
        static_cast<const FillParams*>(launch.params)->dtype != DType::float32) {
      return "fill of anything but float32";
    }
    return nullptr;
  }
  void synchronize(QueueId) override {}
  std::shared_ptr<detail::EventState> record_event(QueueId) override { return nullptr; }
  void wait_event(QueueId, std::shared_ptr<const detail::EventState>) override {}
  void begin_capture(QueueId, TraceId) override {}
  std::unique_ptr<BackendTrace> end_capture(QueueId) override { return nullptr; }
  void abort_capture(QueueId) noexcept override {}
  void execute(BackendTrace&, TraceId, QueueId, Blocking) override {}
  void release(BackendTrace&, TraceId) noexcept override {}
  void reclaim() noexcept override {}
  void shutdown() noexcept override {}

  int enqueued = 0;

 private:
  std::unique_ptr<std::byte[]> memory_;
  std::size_t bytes_;
  bool host_visible_;
};

std::unique_ptr<Device> open_mini(std::size_t bytes = std::size_t{1} << 20, DeviceId id = {}) {
  DeviceOptions options;
  options.id = id;
  options.memory_bytes = bytes;
  return make_device(std::make_unique<MiniBackend>(bytes), options);
}

TEST(RegistryTest, OpensTheCpuDeviceByName) {
  auto device = open_device("cpu");
  EXPECT_EQ(device->name(), "cpu:0");
  EXPECT_EQ(device->backend(), "cpu");
  auto third = open_device("cpu:3");
  EXPECT_EQ(third->name(), "cpu:3");
  DeviceOptions small;
  small.memory_bytes = std::size_t{4} << 20;
  small.num_queues = 3;
  auto sized = open_device("cpu:1", small);
  EXPECT_EQ(sized->name(), "cpu:1");
  EXPECT_EQ(sized->num_queues(), 3u);
  EXPECT_EQ(sized->stats().capacity_bytes, std::size_t{4} << 20);
  EXPECT_FALSE(device->description().empty());
}

// The defaults open_device(spec) uses, to change one setting: the CPU backend's own defaults
// (CpuDeviceOptions), with the spec's id.
TEST(RegistryTest, DefaultOptionsAreTheBackendsOwn) {
  const DeviceOptions options = default_device_options("cpu:2");
  const CpuDeviceOptions cpu;
  EXPECT_EQ(options.id, DeviceId{2});
  EXPECT_EQ(options.memory_bytes, cpu.memory_bytes);
  EXPECT_EQ(options.num_queues, cpu.num_queues);
  DeviceOptions bigger = options;
  bigger.memory_bytes = std::size_t{3} << 30;
  auto device = open_device("cpu:2", bigger);
  EXPECT_EQ(device->stats().capacity_bytes, std::size_t{3} << 30);
  EXPECT_EQ(device->num_queues(), cpu.num_queues);
  EXPECT_RETRACE_ERROR((void)default_device_options("tpu"), invalid_argument,
                       "open_device: no backend \"tpu\" in this build");
  EXPECT_RETRACE_ERROR((void)default_device_options("cpu:x"), invalid_argument,
                       "is not a device spec");
}

TEST(RegistryTest, ListsEveryBackendWithTheReasonOneIsUnavailable) {
  const std::vector<BackendStatus> all = available_backends();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().name, "cpu");
  EXPECT_TRUE(all.front().available);
  EXPECT_TRUE(all.front().reason.empty());
  for (const BackendStatus& status : all) {
    EXPECT_EQ(status.available, status.reason.empty()) << status.name << ": " << status.reason;
    if (!status.available) {
      EXPECT_RETRACE_ERROR((void)open_device(status.name), failed_precondition, status.reason);
    }
  }
}

TEST(RegistryTest, BadSpecsAreClearErrors) {
  EXPECT_RETRACE_ERROR((void)open_device("tpu"), invalid_argument,
                       "no backend \"tpu\" in this build (known: cpu");
  EXPECT_RETRACE_ERROR((void)open_device("cpu:x"), invalid_argument, "is not a device spec");
  EXPECT_RETRACE_ERROR((void)open_device("cpu:"), invalid_argument, "is not a device spec");
  EXPECT_RETRACE_ERROR((void)open_device("cpu:-1"), invalid_argument, "is not a device spec");
  EXPECT_RETRACE_ERROR((void)open_device(":1"), invalid_argument, "does not name a backend");
  DeviceOptions no_queues;
  no_queues.num_queues = 0;
  EXPECT_RETRACE_ERROR((void)open_device("cpu", no_queues), invalid_argument,
                       "num_queues must be in [1, 64]");
}

TEST(RegistryTest, ABackendRegistersAndIsOpenedByName) {
  EXPECT_TRUE(register_backend({"mini", [] { return std::string(); },
                                [](int, const DeviceOptions& options) {
                                  return open_mini(options.memory_bytes, options.id);
                                },
                                [] { return DeviceOptions{}; }}));
  auto device = open_device("mini:2");
  EXPECT_EQ(device->name(), "mini:2");
  bool listed = false;
  for (const BackendStatus& status : available_backends()) listed |= status.name == "mini";
  EXPECT_TRUE(listed);
  // A later registration of the same name replaces the earlier one.
  EXPECT_TRUE(register_backend({"mini", [] { return std::string("switched off for a test"); },
                                nullptr, nullptr}));
  EXPECT_RETRACE_ERROR((void)open_device("mini"), failed_precondition, "switched off for a test");
}

TEST(SupportsTest, TheCpuDeviceImplementsEveryKernel) {
  auto device = open_device("cpu");
  for (std::size_t k = 0; k < kKernelCount; ++k) {
    const auto kernel = static_cast<KernelId>(k);
    EXPECT_TRUE(device->supports(kernel)) << kernel_name(kernel);
    EXPECT_NE(kernel_name(kernel), "unknown");
  }
}

TEST(SupportsTest, AMissingKernelIsUnimplementedNamingTheOpAndTheDevice) {
  auto device = open_mini();
  EXPECT_TRUE(device->supports(KernelId::fill));
  EXPECT_FALSE(device->supports(KernelId::binary));
  Tensor x = ops::full({4}, 2.5, *device);  // fill: implemented
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 2.5f));
  EXPECT_EQ(x.clone().to_vector<float>(), std::vector<float>(4, 2.5f));  // copy
  EXPECT_RETRACE_ERROR((void)ops::add(x, 1.0), unimplemented,
                       "add: mini:0 has no binary_scalar kernel");
  EXPECT_RETRACE_ERROR((void)ops::softmax(x), unimplemented, "softmax: mini:0 has no softmax kernel");
  EXPECT_RETRACE_ERROR((void)ops::full({4}, 1.0, *device, DType::int32), unimplemented,
                       "fill: mini:0 has no kernel for fill of anything but float32");
  EXPECT_RETRACE_ERROR(device->begin_trace_capture(kDefaultQueue), unimplemented,
                       "mini:0 cannot capture traces");
  EXPECT_RETRACE_ERROR((void)device->record_event(kDefaultQueue), unimplemented,
                       "mini:0 has no events");
  auto* backend = backend_of<MiniBackend>(*device);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->enqueued, 2);  // the rejected launches never reached the backend
  EXPECT_EQ(backend_of<MiniBackend>(*open_device("cpu")), nullptr);
  EXPECT_EQ(category_name(ErrorCategory::unimplemented), "unimplemented");
}

TEST(SupportsTest, GuardBytesNeedHostVisibleMemory) {
  DeviceOptions options;
  options.memory_bytes = std::size_t{1} << 20;
  options.guard_bytes = 64;
  auto device = make_device(std::make_unique<MiniBackend>(options.memory_bytes), options);
  EXPECT_TRUE(device->supports(Capability::host_visible_memory));
  EXPECT_RETRACE_ERROR(
      (void)make_device(std::make_unique<MiniBackend>(options.memory_bytes, false), options),
      invalid_argument, "guard_bytes need host-visible memory");
  EXPECT_RETRACE_ERROR((void)make_device(nullptr, options), invalid_argument, "backend is null");
}

}  // namespace
}  // namespace retrace
