// Sizes and memory: element and byte counts that would overflow are errors, never small buffers;
// an allocation that fails first lets finished eager work go; zero-element tensors work
// everywhere (checked for undefined behaviour by the asan preset).
#include "support.hpp"

#include <limits>

namespace retrace {
namespace {

constexpr std::int64_t k2to62 = std::int64_t{1} << 62;
constexpr std::int64_t k2to32 = std::int64_t{1} << 32;

TEST(SizeTest, ShapesWhoseElementCountOverflowsAreRejected) {
  EXPECT_RETRACE_ERROR((Shape{k2to32, k2to32}), invalid_argument, "more than 2^63 - 1 elements");
  EXPECT_RETRACE_ERROR((Shape{3, k2to62}), invalid_argument, "more than 2^63 - 1 elements");
  EXPECT_RETRACE_ERROR((Shape{std::numeric_limits<std::int64_t>::max(), 2}), invalid_argument,
                       "overflows");
  // A zero extent makes the count 0, but the other extents must still multiply safely.
  EXPECT_RETRACE_ERROR((Shape{k2to32, k2to32, 0}), invalid_argument, "overflows");
  EXPECT_EQ((Shape{0, k2to62}).numel(), 0);
  EXPECT_EQ((Shape{k2to62}).numel(), k2to62);
}

TEST(SizeTest, StorageBytesThatOverflowAreRejected) {
  EXPECT_RETRACE_ERROR((void)storage_bytes(Shape{k2to62}, DType::float32, Layout::row_major),
                       invalid_argument, "more than 2^63 - 1 bytes");
  EXPECT_RETRACE_ERROR((void)Tensor::empty_host(Shape{k2to62}, DType::float32), invalid_argument,
                       "shape [4611686018427387904]");
  // Tile padding can overflow where the element count does not.
  const Shape fits{33, (std::int64_t{1} << 57) + 1};  // 2^62.04 elements; padded: 2^63 + ...
  EXPECT_RETRACE_ERROR((void)storage_elements(fits, Layout::tile), invalid_argument,
                       "storage elements");
  EXPECT_EQ(storage_bytes(Shape{0, 5}, DType::float32, Layout::tile), 0u);
  EXPECT_EQ(storage_bytes(Shape{1, 1}, DType::float32, Layout::tile), 32u * 32u * 4u);
}

TEST(SizeTest, HugeDeviceTensorsAreErrorsNotSmallBuffers) {
  RETRACE_TEST_DEVICE(device);
  EXPECT_RETRACE_ERROR((void)Tensor::empty(Shape{k2to62}, DType::float32, *device),
                       invalid_argument, "bytes of storage");
  EXPECT_RETRACE_ERROR((void)ops::full(Shape{k2to62 / 4}, 1.0, *device), out_of_memory,
                       "out of memory");
  EXPECT_RETRACE_ERROR((void)device->allocate(std::numeric_limits<std::size_t>::max()),
                       out_of_memory, "more than the whole device");
  EXPECT_RETRACE_ERROR(
      (void)device->allocate(std::numeric_limits<std::size_t>::max() - 10), out_of_memory,
      "out of memory");
  EXPECT_EQ(device->stats().bytes_in_use, 0u);
  Tensor small = ops::full({4}, 1.0, *device);  // still usable
  EXPECT_EQ(small.to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST(SizeTest, HugeCpuDeviceOptionsAreHandled) {
  CpuDeviceOptions options;
  options.memory_bytes = std::numeric_limits<std::size_t>::max();
  EXPECT_RETRACE_ERROR((void)open_cpu_device(options), out_of_memory, "cannot reserve");
  options.memory_bytes = std::size_t{1} << 20;
  options.guard_bytes = std::numeric_limits<std::size_t>::max();
  EXPECT_RETRACE_ERROR((void)open_cpu_device(options), invalid_argument, "guard_bytes");
}

// Dropped tensors still held by queued eager work return to the allocator before an allocation
// gives up: no synchronize needed.
TEST(MemoryTest, AllocationAfterDroppingEverythingSucceedsWithoutSynchronize) {
  if (testing::test_backend() != "cpu") GTEST_SKIP() << "uses CpuDeviceOptions";
  for (ExecutionMode mode : {ExecutionMode::worker, ExecutionMode::inline_}) {
    CpuDeviceOptions options;
    options.memory_bytes = std::size_t{8} << 20;
    options.execution = mode;
    options.eager_batch = 1000;  // eager work stays queued (holding its buffers) as long as it can
    auto device = open_cpu_device(options);
    const Shape mib{256 * 1024};  // 1 MiB of float32
    for (int round = 0; round < 3; ++round) {
      {
        Tensor a = ops::full(mib, 1.0, *device);
        Tensor b = ops::add(a, 1.0);
        Tensor c = ops::mul(b, 2.0);
        Tensor d = ops::add(c, a);
      }  // every handle dropped; the queued commands still hold the four buffers
      Tensor big = Tensor::empty(Shape{7 * 256 * 1024}, DType::float32, *device);
      EXPECT_EQ(big.nbytes(), std::size_t{7} << 20);
    }
    device->synchronize();
  }
}

using ZeroSizeTest = testing::DeviceTest;

TEST_F(ZeroSizeTest, HostAndDeviceRoundTrips) {
  for (const Shape& shape : {Shape{0}, Shape{0, 3}, Shape{3, 0}, Shape{2, 0, 4}}) {
    Tensor host = Tensor::from_vector<float>(std::vector<float>{}, shape, DType::float32);
    EXPECT_EQ(host.nbytes(), 0u);
    EXPECT_TRUE(host.on_host());
    EXPECT_FALSE(host.is_null());
    Tensor d = host.to_device(device());
    Tensor d_async = host.to_device(device(), kDefaultQueue, Blocking::no);
    EXPECT_TRUE(d.to_vector<float>().empty());
    EXPECT_TRUE(d_async.to_vector<float>().empty());
    EXPECT_TRUE(d.clone().to_host().to_vector<float>().empty());
    EXPECT_TRUE(host.clone().to_vector<std::int32_t>().empty());
    ops::copy(host, d);
    EXPECT_NE(d.address(), d_async.address());  // still distinct buffers
  }
}

TEST_F(ZeroSizeTest, OpsOnEmptyTensors) {
  Tensor a = ops::full({0, 8}, 1.0, device());
  Tensor b = ops::full({1, 8}, 2.0, device());
  EXPECT_EQ(ops::add(a, a).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::mul(a, 3.0).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::exp(a).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::softmax(a).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::layer_norm(a).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::sum(a).shape(), (Shape{0}));
  EXPECT_EQ(ops::typecast(a, DType::bfloat16).shape(), (Shape{0, 8}));
  EXPECT_EQ(ops::to_layout(a, Layout::tile).nbytes(), 0u);
  EXPECT_EQ(ops::transpose(a, 0, 1).shape(), (Shape{8, 0}));
  EXPECT_EQ(ops::matmul(a, ops::full({8, 4}, 1.0, device())).shape(), (Shape{0, 4}));
  Tensor pieces[] = {a, b};
  EXPECT_EQ(ops::concat(pieces, 0).to_vector<float>(), std::vector<float>(8, 2.0f));
  EXPECT_EQ(ops::slice(b, 1, 3, 3).shape(), (Shape{1, 0}));
  ops::assert_finite(a);
  ops::fill(a, 5.0);
  device().synchronize();
}

TEST_F(ZeroSizeTest, EmptyInputsTraceAndReplay) {
  auto step = make_tracer([](const Tensor& x) { return ops::add(x, 1.0); }, device());
  Tensor host = Tensor::from_vector<float>(std::vector<float>{}, {0, 4}, DType::float32);
  EXPECT_TRUE(step(host).to_vector<float>().empty());
  EXPECT_TRUE(step(host).to_vector<float>().empty());
  EXPECT_TRUE(step(ops::full({0, 4}, 1.0, device())).to_vector<float>().empty());
  EXPECT_EQ(step.stats().replays, 2u);
}

}  // namespace
}  // namespace retrace
