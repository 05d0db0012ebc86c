// sin, cos, square, erf, pow and clamp: against a float64 reference over wide ranges (within an
// ulp or two in float32, one bfloat16 rounding in bfloat16), at IEEE 754's special values, with
// defined integer results, and bit-identical when traced.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace retrace {
namespace {

using testing::device_tensor;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Distance in units in the last place between two floats (0 for equal, NaN == NaN).
std::int64_t ulps(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto key = [](float x) {
    const auto bits = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(x));
    return bits < 0 ? std::int64_t{INT32_MIN} - bits : bits;  // monotone over all floats
  };
  return std::abs(key(a) - key(b));
}

// Rounds a float to bfloat16 (nearest even), as the device stores it.
float to_bfloat16(float x) {
  return Tensor::from_vector<float>({x}, {1}, DType::bfloat16).to_vector<float>()[0];
}

class OpMathTest : public testing::DeviceTest {
 protected:
  Tensor floats(const std::vector<float>& values, DType dtype = DType::float32) {
    return device_tensor(device(), values, {static_cast<std::int64_t>(values.size())}, dtype);
  }
  static std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
    std::mt19937_64 rng(testing::test_seed() + seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  }
  // Every element of op(x) within `max_ulps` of the float64 reference rounded to float32; in
  // bfloat16 (inputs rounded to bfloat16 first), equal to the rounded reference or one
  // bfloat16 step away (the float32 result may sit on the other side of a rounding boundary).
  void expect_accurate(const char* name, Tensor (*op)(const Tensor&, QueueId),
                       double (*ref)(double), const std::vector<float>& x, std::int64_t max_ulps) {
    SCOPED_TRACE(name);
    const std::vector<float> got = op(floats(x), kDefaultQueue).to_vector<float>();
    std::int64_t worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = static_cast<float>(ref(x[i]));
      const std::int64_t e = ulps(got[i], want);
      worst = std::max(worst, e);
      ASSERT_LE(e, max_ulps) << name << "(" << x[i] << ") = " << got[i] << ", want " << want;
    }
    std::vector<float> xb(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xb[i] = to_bfloat16(x[i]);
    const std::vector<float> gb = op(floats(xb, DType::bfloat16), kDefaultQueue).to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = to_bfloat16(static_cast<float>(ref(xb[i])));
      ASSERT_LE(ulps(gb[i], want), std::int64_t{1} << 16)  // one bfloat16 step
          << name << " bfloat16(" << xb[i] << ") = " << gb[i] << ", want " << want;
    }
  }
};

TEST_F(OpMathTest, UnaryOpsAreWithinAnUlpOrTwoOfFloat64) {
  const auto wide = uniform(4096, -1000.0f, 1000.0f, 1);
  const auto narrow = uniform(4096, -4.0f, 4.0f, 2);
  const std::int64_t tolerance = testing::test_backend() == "cpu" ? 1 : 2;  // CUDA's sinf/cosf/erff: 2 ulps
  for (const auto* x : {&wide, &narrow}) {
    expect_accurate("sin", ops::sin, [](double v) { return std::sin(v); }, *x, tolerance);
    expect_accurate("cos", ops::cos, [](double v) { return std::cos(v); }, *x, tolerance);
    expect_accurate("erf", ops::erf, [](double v) { return std::erf(v); }, *x, tolerance);
    expect_accurate("square", ops::square, [](double v) { return v * v; }, *x, 0);
  }
}

TEST_F(OpMathTest, UnaryOpsAtSpecialValues) {
  const Tensor x = floats({0.0f, -0.0f, kInf, -kInf, kNaN, 1e-30f, 1e20f});
  auto bits = [](const Tensor& t) {
    std::vector<std::uint32_t> out;
    for (float v : t.to_vector<float>()) out.push_back(std::isnan(v) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(v));
    return out;
  };
  auto same = [&](const Tensor& t, const std::vector<float>& want) {
    std::vector<std::uint32_t> w;
    for (float v : want) w.push_back(std::isnan(v) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(v));
    EXPECT_EQ(bits(t), w);
  };
  same(ops::sin(x), {0.0f, -0.0f, kNaN, kNaN, kNaN, 1e-30f, ops::sin(x).to_vector<float>()[6]});
  same(ops::cos(x), {1.0f, 1.0f, kNaN, kNaN, kNaN, 1.0f, ops::cos(x).to_vector<float>()[6]});
  same(ops::erf(x), {0.0f, -0.0f, 1.0f, -1.0f, kNaN, ops::erf(x).to_vector<float>()[5], 1.0f});
  // The finite ones in those lists are the float64 results within an ulp.
  EXPECT_LE(ulps(ops::sin(x).to_vector<float>()[6], static_cast<float>(std::sin(double{1e20f}))), 1);
  EXPECT_LE(ulps(ops::cos(x).to_vector<float>()[6], static_cast<float>(std::cos(double{1e20f}))), 1);
  EXPECT_LE(ulps(ops::erf(x).to_vector<float>()[5], static_cast<float>(std::erf(double{1e-30f}))), 1);
  same(ops::square(x), {0.0f, 0.0f, kInf, kInf, kNaN, 0.0f, kInf});
}

TEST_F(OpMathTest, PowFollowsCAndBroadcasts) {
  // Tensor ** tensor over a wide range, against float64.
  const auto base = uniform(4096, 0.0f, 20.0f, 3);
  const auto exponent = uniform(4096, -12.0f, 12.0f, 4);
  const std::vector<float> got = ops::pow(floats(base), floats(exponent)).to_vector<float>();
  const std::int64_t tolerance = testing::test_backend() == "cpu" ? 1 : 2;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const float want = static_cast<float>(std::pow(double(base[i]), double(exponent[i])));
    ASSERT_LE(ulps(got[i], want), tolerance) << base[i] << " ** " << exponent[i];
  }
  // C's special cases.
  const Tensor a = floats({0.0f, -8.0f, kNaN, 1.0f, -1.0f, 2.0f, 2.0f, -2.0f, 0.0f, kInf});
  const Tensor b = floats({-1.0f, 1.0f / 3, 0.0f, kNaN, kInf, 200.0f, -140.0f, 3.0f, 0.0f, -1.0f});
  const std::vector<float> special = ops::pow(a, b).to_vector<float>();
  EXPECT_EQ(special[0], kInf);
  EXPECT_TRUE(std::isnan(special[1]));  // negative base, non-integer exponent
  EXPECT_EQ(special[2], 1.0f);          // x ** 0 = 1, NaN included
  EXPECT_EQ(special[3], 1.0f);          // 1 ** y = 1, NaN included
  EXPECT_EQ(special[4], 1.0f);          // -1 ** inf = 1
  EXPECT_EQ(special[5], kInf);          // overflow
  EXPECT_EQ(special[6], std::ldexp(1.0f, -140));  // a subnormal, not flushed
  EXPECT_EQ(special[7], -8.0f);
  EXPECT_EQ(special[8], 1.0f);
  EXPECT_EQ(special[9], 0.0f);
  // Broadcasting and the scalar and out= forms.
  const Tensor m = device_tensor(device(), {1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(ops::pow(m, 2.0).to_vector<float>(), (std::vector<float>{1, 4, 9, 16, 25, 36}));
  EXPECT_EQ(ops::pow(m, device_tensor(device(), {0, 1, 2}, {3})).to_vector<float>(),
            (std::vector<float>{1, 2, 9, 1, 5, 36}));
  ops::pow(m, 0.5, m);
  EXPECT_EQ(m.to_vector<float>()[3], 2.0f);
}

TEST_F(OpMathTest, IntegerPowWrapsAndHasDefinedNegativeExponents) {
  auto ints = [&](const std::vector<float>& v, DType dtype = DType::int32) {
    return device_tensor(device(), v, {static_cast<std::int64_t>(v.size())}, dtype);
  };
  const Tensor a = ints({3, 2, 2, -2, 5, 1, -1, -1, 0, 0, 7});
  const Tensor b = ints({4, 31, 32, 3, -1, -5, -3, -4, 0, -1, 0});
  EXPECT_EQ(ops::pow(a, b).to_vector<float>(),
            (std::vector<float>{81, -2147483648.0f, 0, -8, 0, 1, -1, 1, 1, 0, 1}));
  EXPECT_EQ(ops::pow(ints({2, 3}, DType::uint32), 33.0).to_vector<float>(),
            (std::vector<float>{0, 2790964099.0f}));  // 3^33 mod 2^32
  EXPECT_RETRACE_ERROR((void)ops::pow(a, 0.5), invalid_argument,
                       "pow: the scalar 0.5 is not a whole number in the range of int32");
}

TEST_F(OpMathTest, ClampAsTorch) {
  const Tensor x = floats({-3.0f, -0.5f, 0.25f, 2.0f, kNaN, kInf, -kInf});
  EXPECT_EQ(ops::clamp(x, -1.0, 1.0).to_vector<float>()[1], -0.5f);
  const std::vector<float> both = ops::clamp(x, -1.0, 1.0).to_vector<float>();
  EXPECT_EQ(both[0], -1.0f);
  EXPECT_EQ(both[3], 1.0f);
  EXPECT_TRUE(std::isnan(both[4]));  // NaN stays NaN
  EXPECT_EQ(both[5], 1.0f);
  EXPECT_EQ(both[6], -1.0f);
  EXPECT_EQ(ops::clamp(x, 0.0, std::nullopt).to_vector<float>()[5], kInf);
  EXPECT_EQ(ops::clamp(x, std::nullopt, 0.0).to_vector<float>()[6], -kInf);
  for (float v : ops::clamp(floats({-5, 0, 5}), 2.0, -2.0).to_vector<float>()) {
    EXPECT_EQ(v, -2.0f);  // lo > hi gives hi
  }
  const std::vector<float> none = ops::clamp(x, std::nullopt, std::nullopt).to_vector<float>();
  EXPECT_EQ(none[0], -3.0f);
  Tensor in_place = floats({-3, 3});
  ops::clamp(in_place, -1.0, 1.0, in_place);
  EXPECT_EQ(in_place.to_vector<float>(), (std::vector<float>{-1, 1}));
  const Tensor i = device_tensor(device(), {-7, 0, 9}, {3}, DType::int32);
  EXPECT_EQ(ops::clamp(i, -2.0, 4.0).to_vector<float>(), (std::vector<float>{-2, 0, 4}));
  EXPECT_RETRACE_ERROR((void)ops::clamp(i, 0.5, 4.0), invalid_argument,
                       "clamp: the scalar 0.5 is not a whole number");
  EXPECT_RETRACE_ERROR((void)ops::clamp(x, std::nan(""), 1.0), invalid_argument,
                       "clamp: the bound lo is NaN");
}

TEST_F(OpMathTest, TracedEqualsEagerBitForBit) {
  const auto values = uniform(777, -30.0f, 30.0f, 5);
  const Tensor x = floats(values);
  auto program = [](const Tensor& t) {
    Tensor y = ops::add(ops::sin(t), ops::cos(ops::square(t)));
    y = ops::add(y, ops::erf(ops::mul(t, 0.1)));
    y = ops::pow(ops::abs(y), ops::clamp(t, -2.0, 2.0));
    return ops::pow(y, 1.5);
  };
  auto bits = [](const Tensor& t) {
    std::vector<std::uint32_t> out;
    for (float v : t.to_vector<float>()) out.push_back(std::bit_cast<std::uint32_t>(v));
    return out;
  };
  const std::vector<std::uint32_t> eager = bits(program(x));
  auto tracer = make_tracer(program, device());
  EXPECT_EQ(bits(tracer(x)), eager);
  EXPECT_EQ(bits(tracer(x)), eager);  // a replay
}

}  // namespace
}  // namespace retrace
