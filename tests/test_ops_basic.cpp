// The minimal ops: results for each dtype and layout, and every argument error.
#include "support.hpp"

namespace retrace {
namespace {

using testing::device_tensor;
using testing::random_floats;

class BasicOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = testing::open_test_device();
  void SetUp() override { RETRACE_SKIP_WITHOUT_DEVICE(); }
  Device& device() { return *device_; }
};

TEST_F(BasicOpsTest, FullAndFillEveryDType) {
  for (const DTypeInfo& info : kDTypeTable) {
    Tensor t = ops::full({3, 5}, 7.0, device(), info.dtype);
    EXPECT_EQ(t.dtype(), info.dtype);
    const float one = info.dtype == DType::bool_ ? 1.0f : 0.0f;  // bool: nonzero is true (1)
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(15, one != 0 ? one : 7.0f)) << info.name;
    ops::fill(t, 2.0);
    EXPECT_EQ(t.to_vector<float>(), std::vector<float>(15, one != 0 ? one : 2.0f)) << info.name;
  }
}

TEST_F(BasicOpsTest, AddAndMulMatchAReference) {
  const auto a = random_floats(777, 10), b = random_floats(777, 11);
  Tensor ta = device_tensor(device(), a, {777}), tb = device_tensor(device(), b, {777});
  const auto sum = ops::add(ta, tb).to_vector<float>();
  const auto product = ops::mul(ta, tb).to_vector<float>();
  const auto shifted = ops::add(ta, 0.5).to_vector<float>();
  const auto scaled = ops::mul(ta, -2.0).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(product[i], a[i] * b[i]);
    EXPECT_EQ(shifted[i], a[i] + 0.5f);
    EXPECT_EQ(scaled[i], a[i] * -2.0f);
  }
}

TEST_F(BasicOpsTest, BFloat16ComputesInFloatAndRoundsOnce) {
  const auto a = random_floats(100, 12, -4.0f, 4.0f), b = random_floats(100, 13, -4.0f, 4.0f);
  Tensor ta = device_tensor(device(), a, {100}, DType::bfloat16);
  Tensor tb = device_tensor(device(), b, {100}, DType::bfloat16);
  const auto ha = ta.to_vector<float>(), hb = tb.to_vector<float>();
  const auto product = ops::mul(ta, tb).to_vector<bfloat16>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(product[i], bfloat16::from_float(ha[i] * hb[i]));
  }
}

TEST_F(BasicOpsTest, IntegerArithmetic) {
  Tensor a = Tensor::from_vector<std::int32_t>({1, -2, 3}, {3}, DType::int32).to_device(device());
  EXPECT_EQ(ops::mul(ops::add(a, a), 3.0).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{6, -12, 18}));
}

TEST_F(BasicOpsTest, TileLayoutOperandsWork) {
  const auto a = random_floats(40 * 50, 14);
  Tensor t = device_tensor(device(), a, {40, 50}, DType::float32, Layout::tile);
  const auto doubled = ops::add(t, t).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(doubled[i], a[i] + a[i]);
}

TEST_F(BasicOpsTest, CopyDeviceToDeviceAndHostToDevice) {
  Tensor src = ops::full({8}, 4.0, device());
  Tensor dst = ops::full({8}, 0.0, device());
  const auto address = dst.address();
  ops::copy(src, dst);
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(8, 4.0f));
  ops::copy(Tensor::from_vector<float>(std::vector<float>(8, 6.0f), {8}, DType::float32), dst);
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(8, 6.0f));
  EXPECT_EQ(dst.address(), address);
  ops::copy(dst, dst);  // same address: nothing to do
  EXPECT_RETRACE_ERROR(ops::copy(ops::full({4}, 1.0, device()), dst), invalid_argument,
                       "copy: src is [4] float32 row_major but dst is [8] float32 row_major");
  EXPECT_RETRACE_ERROR(
      ops::copy(src, Tensor::from_vector<float>(std::vector<float>(8), {8}, DType::float32)),
      invalid_argument, "copy: dst is a host tensor");
}

TEST_F(BasicOpsTest, ArgumentErrorsNameTheOpAndArgument) {
  Tensor a = ops::full({2, 3}, 1.0, device());
  Tensor host = Tensor::from_vector<float>(std::vector<float>(6), {2, 3}, DType::float32);
  EXPECT_RETRACE_ERROR((void)ops::add(a, host), invalid_argument,
                       "add: b is a host tensor; move it to a device with to_device() first");
  EXPECT_RETRACE_ERROR((void)ops::mul(a, Tensor()), invalid_argument, "mul: b is a null tensor");
  EXPECT_RETRACE_ERROR((void)ops::add(a, ops::full({3, 2}, 1.0, device())), invalid_argument,
                       "add: shapes [2, 3] and [3, 2] do not broadcast (axis -2: 2 vs 3)");
  EXPECT_RETRACE_ERROR((void)ops::add(a, ops::full({2, 3}, 1.0, device(), DType::bfloat16)),
                       invalid_argument, "add: a has dtype float32 but b has bfloat16");
  EXPECT_RETRACE_ERROR(
      (void)ops::add(a, ops::full({2, 3}, 1.0, device(), DType::float32, Layout::tile)),
      invalid_argument, "add: a has layout row_major but b has tile");
  EXPECT_RETRACE_ERROR((void)ops::add(ops::full({2}, 1.0, device(), DType::uint8), 1.0),
                       invalid_argument, "add: a has dtype uint8; supported: float32, bfloat16, float16");
  auto other = testing::open_test_device({.id = DeviceId{1}});
  EXPECT_RETRACE_ERROR((void)ops::mul(a, ops::full({2, 3}, 1.0, *other)), invalid_argument,
                       fmt::format("mul: a is on {} but b is on {}", device().name(),
                                   other->name()));
  EXPECT_RETRACE_ERROR(ops::add(a, a, ops::full({6}, 0.0, device())), invalid_argument,
                       "add: out is [6] float32 row_major but the result is [2, 3] float32 "
                       "row_major");
  EXPECT_RETRACE_ERROR(ops::assert_finite(ops::full({2}, 1.0, device(), DType::int32)),
                       invalid_argument, "assert_finite: tensor has dtype int32");
}

TEST_F(BasicOpsTest, HostCopyDuringCaptureIsAViolation) {
  Tensor dst = ops::full({4}, 0.0, device());
  device().begin_trace_capture(kDefaultQueue);
  EXPECT_RETRACE_ERROR(
      ops::copy(Tensor::from_vector<float>(std::vector<float>(4), {4}, DType::float32), dst),
      capture_violation,
      fmt::format("writing host data to the device is not allowed while queue 0 of {}",
                  device().name()));
  (void)device().end_trace_capture(kDefaultQueue);
}

}  // namespace
}  // namespace retrace
