// int64: values past 2^53 kept exactly by every data movement (host round trips, copies,
// permute, slice, concat, where, gather), integer arithmetic wrapping modulo 2^64 with the same
// defined corner cases as int32 (x / 0 = 0, INT64_MIN / -1 = INT64_MIN), comparisons,
// typecasts (floats saturate, NaN 0; int64 -> float32 rounds once), int64 indices, mesh sums.
#include "support.hpp"

#include <limits>

namespace retrace {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kBig = (std::int64_t{1} << 53) + 1;  // not a double

class Int64Test : public testing::DeviceTest {
 protected:
  Tensor longs(const std::vector<std::int64_t>& v, const Shape& shape) {
    return Tensor::from_vector<std::int64_t>(v, shape, DType::int64).to_device(device());
  }
  Tensor longs(const std::vector<std::int64_t>& v) {
    return longs(v, {static_cast<std::int64_t>(v.size())});
  }
  static std::vector<std::int64_t> values(const Tensor& t) { return t.to_vector<std::int64_t>(); }
};

TEST_F(Int64Test, DataMovementKeepsEveryBit) {
  const std::vector<std::int64_t> v{kBig, kMax, kMin, -kBig, 0, 1, -1, kBig + 2};
  const Tensor a = longs(v, {2, 4});
  EXPECT_EQ(a.dtype(), DType::int64);
  EXPECT_EQ(a.nbytes(), 64u);
  EXPECT_EQ(values(a), v);
  EXPECT_EQ(values(ops::transpose(a, 0, 1)),
            (std::vector<std::int64_t>{kBig, 0, kMax, 1, kMin, -1, -kBig, kBig + 2}));
  EXPECT_EQ(values(ops::slice(a, 1, 1, 3)), (std::vector<std::int64_t>{kMax, kMin, 1, -1}));
  const Tensor parts[] = {a, a};
  EXPECT_EQ(values(ops::concat(parts, 0)).size(), 16u);
  const Tensor cond = ops::gt(longs({1, 0, 1, 0, 0, 0, 0, 1}, {2, 4}), 0.0);
  EXPECT_EQ(values(ops::where(cond, a, ops::full({2, 4}, 0.0, device(), DType::int64))),
            (std::vector<std::int64_t>{kBig, 0, kMin, 0, 0, 0, 0, kBig + 2}));
  EXPECT_EQ(values(ops::to_layout(ops::to_layout(a, Layout::tile), Layout::row_major)), v);
  const Tensor copy = ops::full({2, 4}, 0.0, device(), DType::int64);
  ops::copy(a, copy);
  EXPECT_EQ(values(copy), v);
}

TEST_F(Int64Test, ArithmeticWrapsAndHasDefinedCorners) {
  const Tensor a = longs({kMax, kMin, kMin, -7, 7, kBig, 3, 0});
  const Tensor b = longs({1, -1, 0, 2, -2, 2, 40, 5});
  EXPECT_EQ(values(ops::add(a, b)),
            (std::vector<std::int64_t>{kMin, kMax, kMin, -5, 5, kBig + 2, 43, 5}));
  EXPECT_EQ(values(ops::sub(a, b)),
            (std::vector<std::int64_t>{kMax - 1, kMin + 1, kMin, -9, 9, kBig - 2, -37, -5}));
  EXPECT_EQ(values(ops::div(a, b)),
            (std::vector<std::int64_t>{kMax, kMin, 0, -3, -3, kBig / 2, 0, 0}));
  EXPECT_EQ(values(ops::mul(a, b))[0], kMax);
  EXPECT_EQ(values(ops::mul(a, b))[1], kMin);  // -INT64_MIN wraps to itself
  EXPECT_EQ(values(ops::pow(a, b))[6], std::int64_t{-6289078614652622815});  // 3^40 mod 2^64
  EXPECT_EQ(values(ops::maximum(a, b)),
            (std::vector<std::int64_t>{kMax, -1, 0, 2, 7, kBig, 40, 5}));
  EXPECT_EQ(values(ops::add(longs({kBig}), 1.0)), std::vector<std::int64_t>{kBig + 1});
  EXPECT_RETRACE_ERROR((void)ops::add(longs({1}), 9223372036854775808.0), invalid_argument,
                       "add: the scalar");
  EXPECT_RETRACE_ERROR((void)ops::add(longs({1}), 0.5), invalid_argument, "add: the scalar");
}

TEST_F(Int64Test, ComparisonsSeeEveryBit) {
  const Tensor a = longs({kBig, kBig - 1, kMin, kMax});
  const Tensor b = longs({kBig - 1, kBig - 1, kMax, kMin});
  EXPECT_EQ(ops::gt(a, b).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(ops::eq(a, b).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 1, 0, 0}));
}

TEST_F(Int64Test, TypecastsSaturateRoundOnceAndWrap) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor f = testing::device_tensor(
      device(), {1e30f, -inf, std::nanf(""), 4611686018427387904.0f, -2.75f, 9.2233715e18f}, {6});
  EXPECT_EQ(values(ops::typecast(f, DType::int64)),
            (std::vector<std::int64_t>{kMax, kMin, 0, std::int64_t{1} << 62, -2,
                                       9223371487098961920}));  // the largest float below 2^63
  // int64 -> float32 rounds once: 2^53 + 1 is a tie-free value just above 2^53.
  const Tensor big = longs({kBig, (std::int64_t{1} << 24) + 1, kMax});
  EXPECT_EQ(ops::typecast(big, DType::float32).to_vector<float>(),
            (std::vector<float>{9007199254740992.0f, 16777216.0f, 9223372036854775808.0f}));
  EXPECT_EQ(ops::typecast(longs({(std::int64_t{1} << 32) + 5, -1}), DType::int32)
                .to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{5, -1}));
  const Tensor i32 = Tensor::from_vector<std::int32_t>({-5, 7}, {2}, DType::int32).to_device(device());
  EXPECT_EQ(values(ops::typecast(i32, DType::int64)), (std::vector<std::int64_t>{-5, 7}));
  // Host conversions follow the same rules.
  EXPECT_EQ(Tensor::from_vector<float>({1e30f, -1.5f}, {2}, DType::int64).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{kMax, -1}));
}

TEST_F(Int64Test, FullArangeAndIndices) {
  EXPECT_EQ(values(ops::full({2}, 9007199254740992.0, device(), DType::int64)),
            (std::vector<std::int64_t>{std::int64_t{1} << 53, std::int64_t{1} << 53}));
  EXPECT_EQ(values(ops::arange(4294967296.0, 4294967299.0, 1.0, device(), DType::int64)),
            (std::vector<std::int64_t>{4294967296, 4294967297, 4294967298}));
  const Tensor table = testing::device_tensor(device(), {0, 1, 2, 3, 4, 5}, {3, 2});
  EXPECT_EQ(ops::embedding(table, longs({2, 0})).to_vector<float>(),
            (std::vector<float>{4, 5, 0, 1}));
  EXPECT_EQ(ops::gather(table, 1, longs({1, 1, 0}, {3, 1})).to_vector<float>(),
            (std::vector<float>{1, 3, 4}));
  (void)ops::embedding(table, longs({1, std::int64_t{1} << 40}));
  EXPECT_RETRACE_ERROR(device().synchronize(), device_error,
                       testing::test_backend() == "cpu"
                           ? "index element 1 is 1099511627776, outside [0, 3)"
                           : "index element 1 is 2147483647, outside [0, 3)");
}

TEST_F(Int64Test, ReplaysEqualEager) {
  auto f = [](const Tensor& x) { return ops::mul(ops::add(x, 3.0), x); };
  auto tracer = make_tracer(f, device());
  (void)tracer(longs({1, 2, kBig}));
  const Tensor x2 = longs({kMax, -4, 5});
  EXPECT_EQ(values(tracer(x2)), values(f(x2)));
}

TEST(Int64Mesh, AllReduceWraps) {
  auto mesh = MeshDevice::open("cpu", {2});
  std::vector<Tensor> parts;
  for (std::size_t k = 0; k < 2; ++k) {
    parts.push_back(Tensor::from_vector<std::int64_t>({kMax, kBig}, {2}, DType::int64)
                        .to_device(mesh->member(k)));
  }
  const MeshTensor r = ops::all_reduce(MeshTensor(parts, *mesh, {Placement::partial()}));
  EXPECT_EQ(r.shard(1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{-2, 2 * kBig}));
}

}  // namespace
}  // namespace retrace
