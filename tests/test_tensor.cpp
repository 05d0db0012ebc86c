// Unit tests for Tensor: host construction and conversion, layouts, device round trips, null
// handling, clone and reshape.
#include "support.hpp"

#include <cmath>
#include <limits>

namespace retrace {
namespace {

using testing::random_floats;

TEST(TensorTest, NullTensorIsRejectedByName) {
  Tensor t;
  EXPECT_TRUE(t.is_null());
  EXPECT_FALSE(static_cast<bool>(t));
  EXPECT_EQ(t.to_string(), "Tensor(null)");
  EXPECT_RETRACE_ERROR((void)t.to_host(), invalid_argument, "to_host: the tensor is a null tensor");
  EXPECT_RETRACE_ERROR((void)t.clone(), invalid_argument, "clone: the tensor is a null tensor");
  auto device = open_cpu_device();
  EXPECT_RETRACE_ERROR((void)t.to_device(*device), invalid_argument, "null tensor");
  EXPECT_RETRACE_ERROR((void)ops::add(t, 1.0), invalid_argument, "add: a is a null tensor");
}

TEST(TensorTest, FromVectorChecksCount) {
  std::vector<float> v(5);
  EXPECT_RETRACE_ERROR((void)Tensor::from_vector<float>(v, {2, 3}, DType::float32),
                       invalid_argument, "5 values do not fill shape [2, 3] (6 elements)");
}

TEST(TensorTest, HostRoundTripEveryDType) {
  const std::vector<float> values{0.0f, 1.0f, 2.0f, 3.0f, 100.0f, 255.0f};
  for (const DTypeInfo& info : kDTypeTable) {
    Tensor t = Tensor::from_vector<float>(values, {2, 3}, info.dtype);
    EXPECT_EQ(t.nbytes(), 6u * info.size) << info.name;
    if (info.dtype == DType::bool_) {  // 0 or 1: nonzero is true
      EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 1, 1, 1, 1}));
    } else {
      EXPECT_EQ(t.to_vector<float>(), values) << info.name;
    }
  }
}

TEST(TensorTest, FloatToBFloat16Rounds) {
  Tensor t = Tensor::from_vector<float>({1.00390625f, 3.14159265f}, {2}, DType::bfloat16);
  const auto bits = t.to_vector<bfloat16>();
  EXPECT_EQ(bits[0].bits, 0x3f80);
  EXPECT_EQ(bits[1], bfloat16::from_float(3.14159265f));
  EXPECT_FLOAT_EQ(t.to_vector<float>()[1], bfloat16::from_float(3.14159265f).to_float());
}

TEST(TensorTest, TileLayoutPadsAndRoundTrips) {
  const auto values = random_floats(2 * 33 * 40, 1);
  Tensor t = Tensor::from_vector<float>(values, {2, 33, 40}, DType::float32, Layout::tile);
  EXPECT_EQ(storage_elements(t.shape(), Layout::tile), 2 * 64 * 64);
  EXPECT_EQ(t.nbytes(), 2u * 64 * 64 * 4);
  EXPECT_EQ(t.to_vector<float>(), values);
  // Element (r=1, c=33) of batch 0 lives in tile (0, 1), row 1, column 1.
  const auto* raw = reinterpret_cast<const float*>(t.host_bytes().data());
  EXPECT_EQ(raw[1 * 1024 + 1 * 32 + 1], values[1 * 40 + 33]);
  // Padding is zero.
  EXPECT_EQ(raw[1 * 1024 + 1 * 32 + 8], 0.0f);
  Tensor r1 = Tensor::from_vector<float>({1.0f, 2.0f}, {2}, DType::float32, Layout::tile);
  EXPECT_EQ(r1.nbytes(), 32u * 32 * 4);
  EXPECT_EQ(r1.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

TEST(TensorTest, DeviceRoundTripAndAddress) {
  auto device = open_cpu_device();
  const auto values = random_floats(3 * 5, 2);
  Tensor host = Tensor::from_vector<float>(values, {3, 5}, DType::float32);
  EXPECT_TRUE(host.on_host());
  EXPECT_EQ(host.device(), nullptr);
  EXPECT_EQ(host.address(), 0u);
  Tensor d = host.to_device(*device);
  EXPECT_TRUE(d.on_device());
  EXPECT_EQ(d.device(), device.get());
  EXPECT_NE(d.address(), 0u);
  EXPECT_EQ(d.address() % 64, 0u);
  EXPECT_EQ(d.to_vector<float>(), values);
  EXPECT_EQ(d.to_device(*device).address(), d.address());  // already there: same storage
  EXPECT_NE(d.to_string().find("cpu:0 @0x"), std::string::npos);
}

TEST(TensorTest, CloneIsIndependent) {
  auto device = open_cpu_device();
  Tensor a = ops::full({8}, 1.0, *device);
  Tensor b = a.clone();
  EXPECT_NE(a.address(), b.address());
  ops::fill(a, 5.0);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(8, 1.0f));
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(8, 5.0f));
  Tensor h = Tensor::from_vector<float>({1.0f}, {1}, DType::float32);
  Tensor hc = h.clone();
  hc.host_bytes_mutable()[0] = std::byte{0};
  EXPECT_EQ(h.to_vector<float>()[0], 1.0f);
}

TEST(TensorTest, CopyBetweenDevicesGoesThroughTheHost) {
  auto devices = open_cpu_devices(2);
  Tensor a = ops::full({4}, 3.0, *devices[0]);
  Tensor b = a.to_device(*devices[1]);
  EXPECT_EQ(b.device(), devices[1].get());
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(4, 3.0f));
}

TEST(TensorTest, WithShapeSharesStorage) {
  auto device = open_cpu_device();
  Tensor a = ops::full({2, 6}, 1.0, *device);
  Tensor b = a.with_shape({3, 4});
  EXPECT_EQ(a.address(), b.address());
  EXPECT_RETRACE_ERROR((void)a.with_shape({5}), invalid_argument,
                       "shape [5] (5 elements) does not match the tensor's shape [2, 6]");
}

TEST(TensorTest, OutlivesItsDevice) {
  Tensor t;
  {
    auto device = open_cpu_device();
    t = ops::full({4}, 1.0, *device);
    device->synchronize();
  }
  EXPECT_EQ(t.device(), nullptr);
  EXPECT_RETRACE_ERROR((void)t.to_host(), failed_precondition, "cpu:0 was closed");
  EXPECT_RETRACE_ERROR((void)ops::add(t, 1.0), failed_precondition, "closed");
}

// Host values become storage values as typecast would make them: bool holds 0 or 1 (nonzero and
// NaN true), floats saturate into integers (NaN 0), 64-bit integers keep every bit.
TEST(TensorTest, HostConversionsFollowTypecastsRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Tensor::from_vector<float>({2.0f, 0.0f, -0.5f, nan}, {4}, DType::bool_)
                .to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(Tensor::from_vector<double>({1e10, -1e10, 2.9, std::nan("")}, {4}, DType::int32)
                .to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{2147483647, -2147483648, 2, 0}));
  const std::int64_t big = (std::int64_t{1} << 62) + 1;
  EXPECT_EQ(Tensor::from_vector<std::int64_t>({big}, {1}, DType::int64).to_vector<std::int64_t>(),
            std::vector<std::int64_t>{big});
}

}  // namespace
}  // namespace retrace
