// Packed weights on the CPU device: products that read a weight from a buffer outside any
// trace (linear, matmul) may multiply by a copy of it in oneDNN's layout, made once and kept
// while the buffer's write count stays the same. Every way of writing the weight must reach the
// next product, replays must equal eager products bit for bit, and a buffer made where another
// was freed must never be taken for it.
#include "support.hpp"

#include <retrace/retrace.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace retrace {
namespace {

using testing::device_tensor;
using testing::float_bits;
using testing::random_floats;

class PackedWeights : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's packed weights";
    device_ = open_cpu_device(CpuDeviceOptions{.id = DeviceId{23}});
  }
  Tensor put(const std::vector<float>& values, const Shape& shape) {
    return device_tensor(*device_, values, shape, GetParam());
  }
  // Whether this CPU's products of this dtype go through oneDNN, where weights are packed
  // (float16 products are float32 products of converted operands everywhere).
  bool packs() {
    return GetParam() != DType::float16 && cpu_bfloat16_products(*device_) != "float32";
  }
  std::unique_ptr<Device> device_;
};

TEST_P(PackedWeights, ReplaysFollowEveryWayOfWritingTheWeight) {
  const Tensor x = put(random_floats(64 * 256, 300), {64, 256});
  Tensor w = put(random_floats(512 * 256, 301), {512, 256});
  const Tensor bias = put(random_floats(512, 302), {512});
  auto traced = make_tracer(
      [](const Tensor& a, const Tensor& b, const Tensor& c) { return ops::linear(a, b, c); },
      *device_);
  const std::int64_t packed_before = cpu_packed_weight_bytes(*device_);
  std::vector<std::uint32_t> previous;
  // Three replays at each write count: the first reads the weight as it is, the second packs
  // it, the third multiplies by the packed copy. Each equals an eager product and differs from
  // the product before the write.
  auto expect_follows = [&](const char* how) {
    const auto eager = float_bits(ops::linear(x, w, bias));
    EXPECT_NE(eager, previous) << how;
    for (int replay = 0; replay < 3; ++replay) {
      EXPECT_EQ(float_bits(traced(x, w, bias)), eager) << how << ", replay " << replay;
    }
    previous = eager;
  };
  expect_follows("before any write");
  if (packs()) {
    EXPECT_GT(cpu_packed_weight_bytes(*device_), packed_before);
  }

  // A device copy into the weight (eager).
  ops::copy(put(random_floats(512 * 256, 303), {512, 256}), w);
  expect_follows("after a device copy");
  // A host copy into it (Device::write).
  ops::copy(Tensor::from_vector<float>(random_floats(512 * 256, 304), {512, 256}, GetParam()), w);
  expect_follows("after a host copy");
  // An in-place op on it.
  ops::mul(w, put(std::vector<float>(512 * 256, 0.5f), {512, 256}), w);
  expect_follows("after an in-place mul");
  // Host writes through the buffer's pointer, announced.
  const auto values = random_floats(512 * 256, 305);
  const Tensor host = Tensor::from_vector<float>(values, {512, 256}, GetParam());
  std::memcpy(static_cast<std::byte*>(w.buffer()->data()), host.host_bytes().data(),
              static_cast<std::size_t>(512 * 256) * dtype_size(GetParam()));
  w.buffer()->mark_written();
  expect_follows("after a host write through data() and mark_written()");
}

// A traced function that writes the weight, then multiplies by it: each replay's product
// reads what that replay wrote.
TEST_P(PackedWeights, AWriteInsideTheTraceReachesTheProductAfterIt) {
  const Tensor x = put(random_floats(48 * 128, 310), {48, 128});
  const Tensor w = put(random_floats(256 * 128, 311), {256, 128});
  auto traced = make_tracer(
      [w](const Tensor& a, const Tensor& source) {
        ops::copy(source, w);
        return ops::linear(a, w);
      },
      *device_);
  for (std::uint64_t round = 0; round < 5; ++round) {
    const Tensor source = put(random_floats(256 * 128, 312 + round), {256, 128});
    const auto got = float_bits(traced(x, source));
    EXPECT_EQ(got, float_bits(ops::linear(x, source))) << "round " << round;
  }
}

// A weight freed and another made (likely at the same address): the new one's products never
// use the old one's packed copy. The first product at a write count reads the weight as it
// is, so later ones must equal it.
TEST_P(PackedWeights, ABufferMadeWhereAnotherWasFreedIsNotTakenForIt) {
  const Tensor x = put(random_floats(32 * 192, 320), {32, 192});
  for (std::uint64_t round = 0; round < 4; ++round) {
    const Tensor w = put(random_floats(320 * 192, 321 + round), {320, 192});
    const auto first = float_bits(ops::linear(x, w));
    for (int again = 0; again < 3; ++again) {
      EXPECT_EQ(float_bits(ops::linear(x, w)), first) << "round " << round << ", call " << again;
    }
  }
}

// NaN and infinity in the weight: the packed product puts them where the plain one does.
TEST_P(PackedWeights, NonFiniteWeightsGiveTheSameBitsPacked) {
  const Tensor x = put(random_floats(40 * 160, 330), {40, 160});
  auto values = random_floats(200 * 160, 331);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  values[160 * 9 + 3] = std::numeric_limits<float>::infinity();
  values[160 * 150 + 100] = -std::numeric_limits<float>::infinity();
  const Tensor w = put(values, {200, 160});
  const auto first = float_bits(ops::linear(x, w));
  auto traced = make_tracer(
      [](const Tensor& a, const Tensor& b) { return ops::matmul(a, ops::transpose(b, 0, 1)); },
      *device_);
  for (int call = 0; call < 3; ++call) {
    EXPECT_EQ(float_bits(ops::linear(x, w)), first) << "call " << call;
    EXPECT_EQ(float_bits(traced(x, w)), first) << "replay " << call;
  }
}

// An operand rewritten before every product (activations as matmul's B) is never packed.
TEST_P(PackedWeights, OperandsWrittenBeforeEveryProductAreNotPacked) {
  const Tensor x = put(random_floats(64 * 128, 340), {64, 128});
  Tensor y = put(random_floats(128 * 256, 341), {128, 256});
  (void)ops::matmul(x, y);
  const std::int64_t before = cpu_packed_weight_bytes(*device_);
  for (std::uint64_t call = 0; call < 4; ++call) {
    ops::copy(put(random_floats(128 * 256, 342 + call), {128, 256}), y);
    (void)ops::matmul(x, y).to_host();
  }
  EXPECT_EQ(cpu_packed_weight_bytes(*device_), before);
}

// A product whose B the trace itself computes (its handle gone after the capture; the trace
// keeps only the memory): each replay reads that replay's B (under ASan: nothing freed read).
TEST_P(PackedWeights, AProductOfTheTracesOwnResultsReadsEachReplays) {
  const Tensor x = put(random_floats(64 * 128, 350), {64, 128});
  auto traced = make_tracer(
      [x](const Tensor& y) { return ops::matmul(x, ops::mul(y, y)); }, *device_);
  for (std::uint64_t round = 0; round < 4; ++round) {
    const Tensor y = put(random_floats(128 * 192, 351 + round), {128, 192});
    EXPECT_EQ(float_bits(traced(y)), float_bits(ops::matmul(x, ops::mul(y, y))))
        << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(, PackedWeights,
                         ::testing::Values(DType::float32, DType::bfloat16, DType::float16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

}  // namespace
}  // namespace retrace
