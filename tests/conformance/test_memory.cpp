// Conformance: memory, stats and out-of-memory behaviour.
#include "conformance/backends.hpp"
#include "support.hpp"

namespace retrace::conformance {
namespace {

TEST_P(DeviceConformance, AllocationsAreAlignedDistinctAndCounted) {
  const DeviceStats before = device().stats();
  auto a = device().allocate(100);
  auto b = device().allocate(0);
  auto c = device().allocate(4096);
  EXPECT_EQ(a->address() % 64, 0u);
  EXPECT_EQ(c->address() % 64, 0u);
  EXPECT_NE(a->address(), b->address());
  EXPECT_NE(b->address(), c->address());
  EXPECT_EQ(a->size(), 100u);
  EXPECT_EQ(a->device(), &device());
  const DeviceStats during = device().stats();
  EXPECT_GE(during.bytes_in_use, before.bytes_in_use + 100 + 4096);
  EXPECT_EQ(during.live_buffers, before.live_buffers + 3);
  a.reset();
  b.reset();
  c.reset();
  const DeviceStats after = device().stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.live_buffers, before.live_buffers);
  EXPECT_GE(after.peak_bytes_in_use, during.bytes_in_use);
}

TEST_P(DeviceConformance, AddressesAreStableAndMemoryIsReused) {
  auto a = device().allocate(1 << 16);
  const std::uint64_t address = a->address();
  Tensor t = Tensor::empty({1 << 14}, DType::float32, device());
  ops::fill(t, 1.0);
  device().synchronize();
  EXPECT_EQ(a->address(), address);
  a.reset();
  auto again = device().allocate(1 << 16);
  EXPECT_EQ(again->address(), address);  // first fit: the freed block is found again
}

TEST_P(DeviceConformance, OutOfMemoryNamesTheRequest) {
  DeviceSpec spec;
  spec.memory_bytes = 1 << 20;
  auto small = open(spec);
  auto keep = small->allocate(600 << 10);
  EXPECT_RETRACE_ERROR((void)small->allocate(600 << 10), out_of_memory,
                       "cannot allocate 600.00 KiB (614400 bytes)");
  EXPECT_RETRACE_ERROR((void)small->allocate(600 << 10), out_of_memory, "largest free block");
  // Nothing was half-done: the device still allocates what fits.
  EXPECT_NO_THROW((void)small->allocate(100 << 10));
}

TEST_P(DeviceConformance, ForeignBuffersAreRejected) {
  auto other = open(DeviceSpec{DeviceId{1}});
  auto buffer = other->allocate(64);
  std::vector<std::byte> bytes(64);
  EXPECT_RETRACE_ERROR(device().read(kDefaultQueue, *buffer, 0, bytes), invalid_argument,
                       fmt::format("belongs to {}, not {}", other->name(), device().name()));
  EXPECT_RETRACE_ERROR(device().write(kDefaultQueue, *buffer, 0, bytes), invalid_argument,
                       fmt::format("belongs to {}", other->name()));
}

TEST_P(DeviceConformance, ReadAndWriteCheckBounds) {
  auto buffer = device().allocate(16);
  std::vector<std::byte> bytes(32);
  EXPECT_RETRACE_ERROR(device().write(kDefaultQueue, *buffer, 0, bytes), invalid_argument,
                       "32 bytes at offset 0 do not fit the 16-byte buffer");
  EXPECT_RETRACE_ERROR(device().read(kDefaultQueue, *buffer, 8, std::span(bytes).first(16)),
                       invalid_argument, "16 bytes at offset 8 exceed the 16-byte buffer");
}

TEST_P(DeviceConformance, BuffersOutliveTheirDevice) {
  std::shared_ptr<Buffer> survivor;
  {
    auto device = open();
    survivor = device->allocate(256);
  }
  EXPECT_EQ(survivor->device(), nullptr);
  survivor.reset();  // must not touch the closed device
}

TEST_P(DeviceConformance, SeveralDevicesAreIndependent) {
  auto devices = std::vector<std::unique_ptr<Device>>();
  for (std::uint32_t i = 0; i < 3; ++i) devices.push_back(open(DeviceSpec{DeviceId{i}}));
  EXPECT_EQ(devices[2]->name(), fmt::format("{}:2", devices[2]->backend()));
  Tensor a = ops::full({16}, 1.0, *devices[0]);
  Tensor b = ops::full({16}, 2.0, *devices[1]);
  EXPECT_EQ(devices[2]->stats().bytes_in_use, 0u);
  EXPECT_RETRACE_ERROR((void)ops::add(a, b), invalid_argument,
                       fmt::format("a is on {} but b is on {}", devices[0]->name(),
                                   devices[1]->name()));
  // A capture on one device does not affect another.
  devices[0]->begin_trace_capture(kDefaultQueue);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(16, 2.0f));
  (void)devices[0]->end_trace_capture(kDefaultQueue);
}

TEST_P(DeviceConformance, GuardBytesCatchOutOfBoundsWrites) {
  if (!device().supports(Capability::host_visible_memory)) {
    GTEST_SKIP() << "guard bytes need host-visible memory, which " << device().name()
                 << " does not have";
  }
  auto victim = device().allocate(64);
  auto source = device().allocate(256);
  // A buggy kernel: copies 128 bytes into a 64-byte buffer.
  CopyParams params{source->data(), victim->data(), 128};
  Buffer* buffers[] = {source.get(), victim.get()};
  device().enqueue(kDefaultQueue, make_launch("buggy_copy", params, buffers));
  device().synchronize();
  victim.reset();
  EXPECT_RETRACE_ERROR(device().synchronize(kDefaultQueue), device_error,
                       "wrote past the end of the 64-byte buffer");
  EXPECT_NO_THROW(device().synchronize());  // reported once
}

}  // namespace
}  // namespace retrace::conformance
