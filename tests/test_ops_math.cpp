// sin, cos, square, erf, pow and clamp: against a float64 reference over wide ranges (within an
// ulp or two in float32, one bfloat16 rounding in bfloat16), at IEEE 754's special values, with
// defined integer results, and bit-identical when traced. Reductions along any dimension, min,
// var, std, log_softmax and group_norm against float64.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <algorithm>
#include <functional>
#include <random>
#include <string>

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

// Rounds a double to float16 once (nearest even), as the device stores a result.
float to_float16(double x) { return float16::from_double(x).to_float(); }

// float16 steps between two float16 values (both exactly representable).
std::int64_t half_steps(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto key = [](float x) {
    const auto bits = static_cast<std::int64_t>(float16::from_float(x).bits);
    return bits >= 0x8000 ? 0x8000 - bits : bits;  // monotone over all float16 values
  };
  return std::abs(key(a) - key(b));
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
    // float16 likewise: the float64 reference rounded once to float16, or one step away.
    std::vector<float> xh(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xh[i] = to_float16(x[i]);
    const std::vector<float> gh = op(floats(xh, DType::float16), kDefaultQueue).to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = to_float16(ref(xh[i]));
      ASSERT_LE(half_steps(gh[i], want), 1)
          << name << " float16(" << xh[i] << ") = " << gh[i] << ", want " << want;
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
  // abs clears the sign bit; relu keeps -0 and NaN as torch's does; gelu(inf) = inf.
  same(ops::abs(x), {0.0f, 0.0f, kInf, kInf, kNaN, 1e-30f, 1e20f});
  same(ops::relu(x), {0.0f, -0.0f, kInf, 0.0f, kNaN, 1e-30f, 1e20f});
  same(ops::gelu(x), {0.0f, -0.0f, kInf, kNaN, kNaN, 5e-31f, 1e20f});
}

TEST_F(OpMathTest, RoundingOpsAsTorch) {
  const Tensor x = floats({-2.5f, -1.5f, -0.5f, -0.2f, 0.0f, -0.0f, 0.5f, 1.5f, 2.5f, 2.7f,
                           8388609.0f, kInf, -kInf, kNaN});
  auto bits = [](const std::vector<float>& v) {
    std::vector<std::uint32_t> out;
    for (float f : v) out.push_back(std::isnan(f) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(f));
    return out;
  };
  // torch.round rounds halves to even; every op keeps -0, infinities and NaN.
  EXPECT_EQ(bits(ops::round(x).to_vector<float>()),
            bits({-2.0f, -2.0f, -0.0f, -0.0f, 0.0f, -0.0f, 0.0f, 2.0f, 2.0f, 3.0f, 8388609.0f,
                  kInf, -kInf, kNaN}));
  EXPECT_EQ(bits(ops::floor(x).to_vector<float>()),
            bits({-3.0f, -2.0f, -1.0f, -1.0f, 0.0f, -0.0f, 0.0f, 1.0f, 2.0f, 2.0f, 8388609.0f,
                  kInf, -kInf, kNaN}));
  EXPECT_EQ(bits(ops::ceil(x).to_vector<float>()),
            bits({-2.0f, -1.0f, -0.0f, -0.0f, 0.0f, -0.0f, 1.0f, 2.0f, 3.0f, 3.0f, 8388609.0f,
                  kInf, -kInf, kNaN}));
  EXPECT_EQ(bits(ops::trunc(x).to_vector<float>()),
            bits({-2.0f, -1.0f, -0.0f, -0.0f, 0.0f, -0.0f, 0.0f, 1.0f, 2.0f, 2.0f, 8388609.0f,
                  kInf, -kInf, kNaN}));
  // 16-bit dtypes and out= (in place).
  const Tensor h = floats({-1.5f, 2.5f, 3.25f}, DType::bfloat16);
  ops::round(h, h);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{-2.0f, 2.0f, 3.0f}));
  EXPECT_EQ(ops::floor(floats({-1.5f, 2.5f}, DType::float16)).to_vector<float>(),
            (std::vector<float>{-2.0f, 2.0f}));
  // Integers keep their values (as torch's); bool is refused.
  EXPECT_EQ(ops::floor(ops::full({2}, -3.0, device(), DType::int32)).to_vector<float>(),
            (std::vector<float>{-3.0f, -3.0f}));
  EXPECT_RETRACE_ERROR((void)ops::floor(ops::full({2}, 1.0, device(), DType::bool_)),
                       invalid_argument, "floor");
}

// gelu's negative tail, where x Phi(x) is small: relative accuracy against float64 (a form with
// 1 + erf(x / sqrt 2) loses it there by cancellation).
TEST_F(OpMathTest, GeluIsAccurateInItsTails) {
  const auto x = uniform(4096, -12.0f, 12.0f, 5);
  const std::int64_t tolerance = 8;  // CPU: two exps and the fit; CUDA: erfcf (4 ulp)
  expect_accurate(
      "gelu", ops::gelu, [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }, x,
      tolerance);
  // The tanh form: x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3). Its float32 inner
  // value u carries a relative rounding error that exp(-2u) multiplies by |2u| (17 at x = -5),
  // so the bound is looser (64 ulp), but there is no cancellation of 1 + tanh(u) (which left
  // no correct digit at x = -5).
  const auto y = uniform(4096, -5.0f, 12.0f, 6);
  expect_accurate(
      "gelu_tanh", ops::gelu_tanh,
      [](double v) {
        return v / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
      },
      y, 64);
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
  const std::vector<std::uint32_t> eager = testing::float_bits(program(x));
  auto tracer = make_tracer(program, device());
  EXPECT_EQ(testing::float_bits(tracer(x)), eager);
  EXPECT_EQ(testing::float_bits(tracer(x)), eager);  // a replay
}

// arange: numpy's count, start + i * step in double rounded once, integers wrapping never
// (their range is checked), and a device op that replays.
TEST_F(OpMathTest, ArangeMatchesTheDoubleReference) {
  struct Case {
    double start, end, step;
  };
  for (const Case& c : {Case{0, 10, 1}, Case{0, 1, 0.1}, Case{-3.5, 2.25, 0.37}, Case{5, -5, -0.75},
                        Case{1e6, 1e6 + 1, 1e-3}, Case{0, 1, 3}, Case{2, 2, 1}, Case{3, 1, 1}}) {
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      SCOPED_TRACE(fmt::format("arange({}, {}, {}) {}", c.start, c.end, c.step, dtype));
      const Tensor t = ops::arange(c.start, c.end, c.step, device(), dtype);
      const auto n = static_cast<std::int64_t>(std::max(0.0, std::ceil((c.end - c.start) / c.step)));
      ASSERT_EQ(t.shape(), Shape({n}));
      const std::vector<float> got = t.to_vector<float>();
      for (std::int64_t i = 0; i < n; ++i) {
        // start + i * step in double, rounded once to the dtype.
        const double exact = c.start + static_cast<double>(i) * c.step;
        const float want = dtype == DType::bfloat16  ? bfloat16::from_double(exact).to_float()
                           : dtype == DType::float16 ? to_float16(exact)
                                                     : static_cast<float>(exact);
        ASSERT_EQ(got[static_cast<std::size_t>(i)], want) << "at " << i;
      }
    }
  }
  EXPECT_EQ(ops::arange(-3, 7, 2, device(), DType::int32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{-3, -1, 1, 3, 5}));
  EXPECT_EQ(ops::arange(2147483640.0, 2147483648.0, 3, device(), DType::int32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{2147483640, 2147483643, 2147483646}));
  EXPECT_EQ(ops::arange(250, 256, 2, device(), DType::uint8).to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{250, 252, 254}));
  EXPECT_EQ(ops::arange(0, 4294967296.0, 2147483648.0, device(), DType::uint32).to_vector<std::uint32_t>(),
            (std::vector<std::uint32_t>{0u, 2147483648u}));
  EXPECT_RETRACE_ERROR((void)ops::arange(0, 1, 0, device()), invalid_argument,
                       "arange: step must not be 0");
  EXPECT_RETRACE_ERROR((void)ops::arange(0, kInf, 1, device()), invalid_argument,
                       "arange: start, end and step must be finite");
  EXPECT_RETRACE_ERROR((void)ops::arange(0.5, 3, 1, device(), DType::int32), invalid_argument,
                       "arange: start (0.5) and step (1) must be whole numbers for int32");
  EXPECT_RETRACE_ERROR((void)ops::arange(250, 260, 1, device(), DType::uint8), invalid_argument,
                       "arange: values from 250 to 259 do not fit in uint8");
  EXPECT_RETRACE_ERROR((void)ops::arange(-1, 3, 1, device(), DType::uint32), invalid_argument,
                       "do not fit in uint32");
  EXPECT_RETRACE_ERROR((void)ops::arange(0, 1e300, 1e-300, device()), invalid_argument,
                       "too many");
  // Traced: the values are computed by the replay, bit for bit as eager.
  auto tracer = make_tracer(
      [&](const Tensor& x) { return ops::add(x, ops::arange(-2, 2, 0.25, device())); }, device());
  const Tensor x = floats(std::vector<float>(16, 0.5f));
  const std::vector<float> eager = ops::add(x, ops::arange(-2, 2, 0.25, device())).to_vector<float>();
  EXPECT_EQ(tracer(x).to_vector<float>(), eager);
  EXPECT_EQ(tracer(x).to_vector<float>(), eager);
}

// A float64 reference of a reduction along `dim` of a row-major [d0, d1, d2] tensor.
std::vector<double> reduce_ref(const std::vector<float>& x, const std::vector<std::int64_t>& shape,
                               std::size_t dim,
                               const std::function<double(const std::vector<double>&)>& f) {
  std::vector<std::int64_t> strides(3, 1);
  for (int i = 1; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  std::vector<double> out;
  std::vector<std::int64_t> idx(3, 0);
  for (idx[0] = 0; idx[0] < (dim == 0 ? 1 : shape[0]); ++idx[0])
    for (idx[1] = 0; idx[1] < (dim == 1 ? 1 : shape[1]); ++idx[1])
      for (idx[2] = 0; idx[2] < (dim == 2 ? 1 : shape[2]); ++idx[2]) {
        std::vector<double> values;
        std::vector<std::int64_t> j = idx;
        for (j[dim] = 0; j[dim] < shape[dim]; ++j[dim])
          values.push_back(x[j[0] * strides[0] + j[1] * strides[1] + j[2] * strides[2]]);
        out.push_back(f(values));
      }
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " at " << i;
  }
}

TEST_F(OpMathTest, ReductionsAlongAnyDimension) {
  const std::vector<std::int64_t> dims{3, 5, 7};
  const auto x = uniform(105, -3.0f, 3.0f, 6);
  const Tensor t = device_tensor(device(), x, {3, 5, 7});
  const auto sum = [](const std::vector<double>& v) { double s = 0; for (double e : v) s += e; return s; };
  const auto mean = [&](const std::vector<double>& v) { return sum(v) / static_cast<double>(v.size()); };
  const auto var = [&](const std::vector<double>& v) {
    const double m = mean(v);
    double s = 0;
    for (double e : v) s += (e - m) * (e - m);
    return s / static_cast<double>(v.size() - 1);
  };
  for (std::int64_t dim : {0, 1, 2, -3, -1}) {
    const auto d = static_cast<std::size_t>(dim < 0 ? dim + 3 : dim);
    const std::string at = "dim " + std::to_string(dim);
    expect_near_all(ops::sum(t, dim).to_vector<float>(), reduce_ref(x, dims, d, sum), 1e-5, "sum " + at);
    expect_near_all(ops::mean(t, dim).to_vector<float>(), reduce_ref(x, dims, d, mean), 1e-5, "mean " + at);
    expect_near_all(ops::max(t, dim).to_vector<float>(),
                    reduce_ref(x, dims, d, [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }),
                    0, "max " + at);
    expect_near_all(ops::min(t, dim).to_vector<float>(),
                    reduce_ref(x, dims, d, [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }),
                    0, "min " + at);
    expect_near_all(ops::var(t, dim).to_vector<float>(), reduce_ref(x, dims, d, var), 1e-5, "var " + at);
    expect_near_all(ops::std(t, dim).to_vector<float>(),
                    reduce_ref(x, dims, d, [&](const std::vector<double>& v) { return std::sqrt(var(v)); }),
                    1e-5, "std " + at);
    std::vector<std::int64_t> kept = dims;
    kept[d] = 1;
    EXPECT_EQ(ops::sum(t, dim, ops::KeepDim::yes).shape(), Shape(std::span<const std::int64_t>(kept)));
  }
  // Population variance (correction 0); a single element with correction 1 is NaN (0 / 0).
  expect_near_all(ops::var(t, 1, 0.0).to_vector<float>(),
                  reduce_ref(x, dims, 1, [&](const std::vector<double>& v) {
                    return var(v) * static_cast<double>(v.size() - 1) / static_cast<double>(v.size());
                  }),
                  1e-5, "var correction 0");
  EXPECT_TRUE(std::isnan(ops::var(device_tensor(device(), {2.0f}, {1})).to_vector<float>()[0]));
  // The divisor stops at 0, as torch's: n < correction is inf (never a negative variance), an
  // empty or constant row NaN; std follows.
  const Tensor pair = device_tensor(device(), {1.0f, 3.0f, 2.0f, 2.0f}, {2, 2});
  const std::vector<float> short_rows = ops::var(pair, 1, 3.0).to_vector<float>();
  EXPECT_EQ(short_rows[0], kInf);
  EXPECT_TRUE(std::isnan(short_rows[1]));
  EXPECT_EQ(ops::std(pair, 1, 3.0).to_vector<float>()[0], kInf);
  for (const Tensor& r : {ops::var(ops::full({3, 0}, 1.0, device()), 1),
                          ops::std(ops::full({0, 2}, 1.0, device()), 0),
                          ops::var(ops::full({0}, 1.0, device()), 0, 0.0)}) {
    for (float v : r.to_vector<float>()) EXPECT_TRUE(std::isnan(v)) << v;
  }
  // min propagates NaN and gives +inf over nothing.
  EXPECT_TRUE(std::isnan(ops::min(floats({1.0f, kNaN, -1.0f})).to_vector<float>()[0]));
  EXPECT_EQ(ops::min(ops::full({2, 0}, 0.0, device())).to_vector<float>(),
            (std::vector<float>{kInf, kInf}));
  EXPECT_RETRACE_ERROR((void)ops::sum(t, 3), invalid_argument, "sum");
  EXPECT_RETRACE_ERROR((void)ops::var(t, 0, -1.0), invalid_argument,
                       "var: correction must be finite and not negative");
}

TEST_F(OpMathTest, LogSoftmaxIsStableAndMatchesFloat64) {
  const std::vector<std::int64_t> dims{2, 6, 9};
  auto x = uniform(108, -20.0f, 20.0f, 7);
  x[3] = 1000.0f;  // a naive log(sum(exp(x))) overflows here
  const Tensor t = device_tensor(device(), x, {2, 6, 9});
  for (std::int64_t dim : {-1, 1, 0}) {
    const auto d = static_cast<std::size_t>(dim < 0 ? dim + 3 : dim);
    // log_softmax(x)_i = x_i - logsumexp(x): rebuild it per element from the reduction.
    const auto lse = reduce_ref(x, dims, d, [](const std::vector<double>& v) {
      const double m = *std::max_element(v.begin(), v.end());
      double s = 0;
      for (double e : v) s += std::exp(e - m);
      return m + std::log(s);
    });
    const std::vector<float> got = ops::log_softmax(t, dim).to_vector<float>();
    std::vector<double> want(x.size());
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 6; ++j)
        for (std::int64_t k = 0; k < 9; ++k) {
          const std::int64_t r = d == 0 ? j * 9 + k : d == 1 ? i * 9 + k : i * 6 + j;
          want[static_cast<std::size_t>((i * 6 + j) * 9 + k)] = x[static_cast<std::size_t>((i * 6 + j) * 9 + k)] - lse[static_cast<std::size_t>(r)];
        }
    expect_near_all(got, want, 2e-6, "log_softmax dim " + std::to_string(dim));
  }
}

TEST_F(OpMathTest, GroupNormMatchesFloat64) {
  const std::int64_t n = 2, c = 6, h = 3, w = 5, groups = 3;
  const auto x = uniform(static_cast<std::size_t>(n * c * h * w), -2.0f, 4.0f, 8);
  const auto weight = uniform(6, 0.5f, 1.5f, 9), bias = uniform(6, -1.0f, 1.0f, 10);
  const std::vector<float> got =
      ops::group_norm(device_tensor(device(), x, {n, c, h, w}), groups,
                      device_tensor(device(), weight, {c}), device_tensor(device(), bias, {c}), 1e-5)
          .to_vector<float>();
  const std::int64_t per_group = (c / groups) * h * w;
  std::vector<double> want(x.size());
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t base = (b * c + g * (c / groups)) * h * w;
      double mean = 0, var = 0;
      for (std::int64_t i = 0; i < per_group; ++i) mean += x[static_cast<std::size_t>(base + i)];
      mean /= static_cast<double>(per_group);
      for (std::int64_t i = 0; i < per_group; ++i) {
        const double dlt = x[static_cast<std::size_t>(base + i)] - mean;
        var += dlt * dlt;
      }
      var /= static_cast<double>(per_group);
      for (std::int64_t i = 0; i < per_group; ++i) {
        const std::int64_t channel = g * (c / groups) + i / (h * w);
        want[static_cast<std::size_t>(base + i)] =
            (x[static_cast<std::size_t>(base + i)] - mean) / std::sqrt(var + 1e-5) * weight[channel] + bias[channel];
      }
    }
  expect_near_all(got, want, 1e-5, "group_norm");
  EXPECT_RETRACE_ERROR((void)ops::group_norm(ops::full({1, 6, 2}, 0.0, device()), 4), invalid_argument,
                       "group_norm: 6 channels do not split into 4 groups");
  EXPECT_RETRACE_ERROR((void)ops::group_norm(ops::full({1, 6, 2}, 0.0, device()), 3,
                                             ops::full({5}, 1.0, device())),
                       invalid_argument, "group_norm: weight must hold 6 values");
}


// is_causal (top-left aligned) against float64, with and without an additive mask on top, for
// Sq < Sk and Sq > Sk; traced equals eager.
TEST_F(OpMathTest, CausalAttentionMatchesFloat64) {
  for (const auto& [sq, sk] : {std::pair<std::int64_t, std::int64_t>{5, 5}, {3, 6}, {6, 4}}) {
    const std::int64_t b = 2, h = 2, d = 8, dv = 4;
    const auto q = uniform(static_cast<std::size_t>(b * h * sq * d), -1.0f, 1.0f, 11);
    const auto k = uniform(static_cast<std::size_t>(b * h * sk * d), -1.0f, 1.0f, 12);
    const auto v = uniform(static_cast<std::size_t>(b * h * sk * dv), -1.0f, 1.0f, 13);
    const auto m = uniform(static_cast<std::size_t>(sk), -0.5f, 0.5f, 14);
    const Tensor tq = device_tensor(device(), q, {b, h, sq, d});
    const Tensor tk = device_tensor(device(), k, {b, h, sk, d});
    const Tensor tv = device_tensor(device(), v, {b, h, sk, dv});
    const Tensor tm = device_tensor(device(), m, {sk});
    for (bool with_mask : {false, true}) {
      std::vector<double> want;
      for (std::int64_t bh = 0; bh < b * h; ++bh)
        for (std::int64_t i = 0; i < sq; ++i) {
          std::vector<double> w(static_cast<std::size_t>(sk), 0.0);
          double top = -INFINITY, total = 0;
          for (std::int64_t j = 0; j <= std::min(i, sk - 1); ++j) {
            double dot = 0;
            for (std::int64_t e = 0; e < d; ++e)
              dot += double(q[static_cast<std::size_t>((bh * sq + i) * d + e)]) * k[static_cast<std::size_t>((bh * sk + j) * d + e)];
            w[static_cast<std::size_t>(j)] = dot / std::sqrt(double(d)) + (with_mask ? m[static_cast<std::size_t>(j)] : 0.0);
            top = std::max(top, w[static_cast<std::size_t>(j)]);
          }
          for (std::int64_t j = 0; j <= std::min(i, sk - 1); ++j) total += (w[static_cast<std::size_t>(j)] = std::exp(w[static_cast<std::size_t>(j)] - top));
          for (std::int64_t e = 0; e < dv; ++e) {
            double sum = 0;
            for (std::int64_t j = 0; j <= std::min(i, sk - 1); ++j)
              sum += w[static_cast<std::size_t>(j)] * v[static_cast<std::size_t>((bh * sk + j) * dv + e)];
            want.push_back(sum / total);
          }
        }
      const Tensor got = ops::scaled_dot_product_attention(tq, tk, tv, with_mask ? tm : Tensor(),
                                                           std::nullopt, ops::Causal::yes);
      expect_near_all(got.to_vector<float>(), want, 2e-6,
                      "causal " + std::to_string(sq) + "x" + std::to_string(sk) + (with_mask ? " masked" : ""));
    }
    auto tracer = make_tracer(
        [](const Tensor& x, const Tensor& y, const Tensor& z) {
          return ops::scaled_dot_product_attention(x, y, z, {}, std::nullopt, ops::Causal::yes);
        },
        device());
    EXPECT_EQ(tracer(tq, tk, tv).to_vector<float>(),
              ops::scaled_dot_product_attention(tq, tk, tv, {}, std::nullopt, ops::Causal::yes)
                  .to_vector<float>());
  }
}

// Grouped-query attention: 6 query heads over 2 or 3 key/value heads (and 1: multi-query),
// against float64 with a per-head mask and causal, equal to attention over the key/value heads
// repeated per group (torch's enable_gqa) bit for bit, traced == eager; bad head counts named.
TEST_F(OpMathTest, GroupedQueryAttentionMatchesFloat64AndRepeatedHeads) {
  const std::int64_t b = 2, h = 6, sq = 5, sk = 7, d = 8, dv = 4;
  const auto q = uniform(static_cast<std::size_t>(b * h * sq * d), -1.0f, 1.0f, 21);
  const auto m = uniform(static_cast<std::size_t>(h * sq * sk), -0.5f, 0.5f, 24);
  const Tensor tq = device_tensor(device(), q, {b, h, sq, d});
  const Tensor tm = device_tensor(device(), m, {1, h, sq, sk});
  for (const std::int64_t hkv : {1, 2, 3}) {
    const std::int64_t group = h / hkv;
    const auto k = uniform(static_cast<std::size_t>(b * hkv * sk * d), -1.0f, 1.0f, 22 + hkv);
    const auto v = uniform(static_cast<std::size_t>(b * hkv * sk * dv), -1.0f, 1.0f, 32 + hkv);
    // The key/value heads repeated per group: [b, h, ...].
    std::vector<float> k_rep, v_rep;
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t hh = 0; hh < h; ++hh) {
        const std::int64_t src = bb * hkv + hh / group;
        k_rep.insert(k_rep.end(), k.begin() + src * sk * d, k.begin() + (src + 1) * sk * d);
        v_rep.insert(v_rep.end(), v.begin() + src * sk * dv, v.begin() + (src + 1) * sk * dv);
      }
    const Tensor tk = device_tensor(device(), k, {b, hkv, sk, d});
    const Tensor tv = device_tensor(device(), v, {b, hkv, sk, dv});
    const Tensor tk_rep = device_tensor(device(), k_rep, {b, h, sk, d});
    const Tensor tv_rep = device_tensor(device(), v_rep, {b, h, sk, dv});
    for (const bool causal : {false, true}) {
      const auto c = causal ? ops::Causal::yes : ops::Causal::no;
      const std::string what = "hkv " + std::to_string(hkv) + (causal ? " causal" : "");
      std::vector<double> want;
      for (std::int64_t bh = 0; bh < b * h; ++bh) {
        const std::int64_t kv = (bh / h) * hkv + (bh % h) / group, head = bh % h;
        for (std::int64_t i = 0; i < sq; ++i) {
          const std::int64_t last = causal ? std::min(i, sk - 1) : sk - 1;
          std::vector<double> w(static_cast<std::size_t>(sk), 0.0);
          double top = -INFINITY, total = 0;
          for (std::int64_t j = 0; j <= last; ++j) {
            double dot = 0;
            for (std::int64_t e = 0; e < d; ++e)
              dot += double(q[static_cast<std::size_t>((bh * sq + i) * d + e)]) *
                     k[static_cast<std::size_t>((kv * sk + j) * d + e)];
            w[static_cast<std::size_t>(j)] =
                dot / std::sqrt(double(d)) + m[static_cast<std::size_t>((head * sq + i) * sk + j)];
            top = std::max(top, w[static_cast<std::size_t>(j)]);
          }
          for (std::int64_t j = 0; j <= last; ++j)
            total += (w[static_cast<std::size_t>(j)] = std::exp(w[static_cast<std::size_t>(j)] - top));
          for (std::int64_t e = 0; e < dv; ++e) {
            double sum = 0;
            for (std::int64_t j = 0; j <= last; ++j)
              sum += w[static_cast<std::size_t>(j)] * v[static_cast<std::size_t>((kv * sk + j) * dv + e)];
            want.push_back(sum / total);
          }
        }
      }
      const Tensor got = ops::scaled_dot_product_attention(tq, tk, tv, tm, std::nullopt, c);
      ASSERT_EQ(got.shape(), (Shape{b, h, sq, dv}));
      expect_near_all(got.to_vector<float>(), want, 2e-6, what);
      EXPECT_EQ(got.to_vector<float>(),
                ops::scaled_dot_product_attention(tq, tk_rep, tv_rep, tm, std::nullopt, c)
                    .to_vector<float>())
          << what;
    }
    auto tracer = make_tracer(
        [](const Tensor& x, const Tensor& y, const Tensor& z) {
          return ops::scaled_dot_product_attention(x, y, z);
        },
        device());
    EXPECT_EQ(tracer(tq, tk, tv).to_vector<float>(),
              ops::scaled_dot_product_attention(tq, tk, tv).to_vector<float>());
    // Rank 3 (no batch) and bfloat16 take the same path.
    const Tensor q3 = ops::reshape(ops::slice(tq, 0, 0, 1), {h, sq, d});
    const Tensor k3 = ops::reshape(ops::slice(tk, 0, 0, 1), {hkv, sk, d});
    const Tensor v3 = ops::reshape(ops::slice(tv, 0, 0, 1), {hkv, sk, dv});
    const Tensor k3r = ops::reshape(ops::slice(tk_rep, 0, 0, 1), {h, sk, d});
    const Tensor v3r = ops::reshape(ops::slice(tv_rep, 0, 0, 1), {h, sk, dv});
    EXPECT_EQ(ops::scaled_dot_product_attention(q3, k3, v3).to_vector<float>(),
              ops::scaled_dot_product_attention(q3, k3r, v3r).to_vector<float>());
    const auto bf = [](const Tensor& t) { return ops::typecast(t, DType::bfloat16); };
    EXPECT_EQ(ops::scaled_dot_product_attention(bf(tq), bf(tk), bf(tv)).to_vector<float>(),
              ops::scaled_dot_product_attention(bf(tq), bf(tk_rep), bf(tv_rep)).to_vector<float>());
  }
  const Tensor k4 = device_tensor(device(), uniform(b * 4 * sk * d, -1, 1, 40), {b, 4, sk, d});
  const Tensor v4 = device_tensor(device(), uniform(b * 4 * sk * dv, -1, 1, 41), {b, 4, sk, dv});
  EXPECT_RETRACE_ERROR((void)ops::scaled_dot_product_attention(tq, k4, v4), invalid_argument,
                       "scaled_dot_product_attention: 6 query heads do not split into groups over "
                       "4 key/value heads");
  const Tensor k12 = device_tensor(device(), uniform(b * 12 * sk * d, -1, 1, 42), {b, 12, sk, d});
  const Tensor v12 = device_tensor(device(), uniform(b * 12 * sk * dv, -1, 1, 43), {b, 12, sk, dv});
  EXPECT_RETRACE_ERROR((void)ops::scaled_dot_product_attention(tq, k12, v12), invalid_argument,
                       "6 query heads do not split into groups over 12 key/value heads");
  EXPECT_RETRACE_ERROR((void)ops::scaled_dot_product_attention(tq, k4, ops::slice(v12, 1, 0, 2)),
                       invalid_argument, "v needs k's B, H and S");
}

}  // namespace
}  // namespace retrace
