// float16 (IEEE binary16): the conversions against references built here from the format's
// definition (every one of the 65,536 values; every rounding boundary between neighbours),
// rounding from double once (bfloat16 too), and the dtype through the ops at its edges:
// overflow to inf, subnormal results, typecasts bit for bit against the header's rounding,
// random draws, mesh collectives. The op-by-op float64 comparisons in float16
// are in test_ops.cpp, test_ops_math.cpp, test_ops_select.cpp and test_ops_image.cpp.
#include "support.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace retrace {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The value of a binary16 bit pattern from the format's definition, in double.
double decode(std::uint16_t bits) {
  const int sign = (bits & 0x8000) != 0 ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The finite non-negative float16 values in order (bits 0 .. 0x7bff are increasing).
const std::vector<double>& positive_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (std::uint16_t b = 0; b <= 0x7bff; ++b) v.push_back(decode(b));
    return v;
  }();
  return values;
}

// x rounded to float16 by the definition: the nearest value, ties to the even bit pattern,
// magnitudes from 65520 (half way to the next power of two) on to infinity.
std::uint16_t reference_round(double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;
  const auto& v = positive_values();
  const auto hi = static_cast<std::uint16_t>(std::lower_bound(v.begin(), v.end(), a) - v.begin());
  if (hi == v.size()) return sign | 0x7bff;  // (65504, 65520): the largest finite value
  if (v[hi] == a || hi == 0) return sign | hi;
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  const double below = a - v[lo], above = v[hi] - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | ((lo & 1) == 0 ? lo : hi);
}

TEST(Float16, EveryValueConvertsToFloatExactly) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float got = float16::from_bits(bits).to_float();
    const double want = decode(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << b;
    ASSERT_EQ(std::signbit(got), (bits & 0x8000) != 0) << std::hex << b;  // -0 stays -0
    ASSERT_EQ(float16::from_float(got).bits, bits) << "round trip of " << std::hex << b;
  }
}

TEST(Float16, FromFloatRoundsToNearestEvenAtEveryBoundary) {
  // Around each midpoint between neighbours (the tie itself, one float ulp either side) and at
  // each value, both signs.
  const auto& v = positive_values();
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const auto mid = static_cast<float>((v[i] + v[i + 1]) / 2);  // exact: 12 significant bits
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf),
                    static_cast<float>(v[i])}) {
      ASSERT_EQ(float16::from_float(x).bits, reference_round(x)) << x;
      ASSERT_EQ(float16::from_float(-x).bits, reference_round(-x)) << -x;
    }
  }
  // Overflow: 65504 is the largest finite value; 65520 is the tie with the next power of two.
  EXPECT_EQ(float16::from_float(65504.0f).to_float(), 65504.0f);
  EXPECT_EQ(float16::from_float(std::nextafter(65520.0f, 0.0f)).to_float(), 65504.0f);
  EXPECT_EQ(float16::from_float(65520.0f).to_float(), kInf);
  EXPECT_EQ(float16::from_float(-1e30f).to_float(), -kInf);
  EXPECT_EQ(float16::from_float(kInf).bits, 0x7c00);
  // Underflow: 2^-24 is the smallest subnormal, 2^-25 a tie with 0 (even), just above it rounds up.
  EXPECT_EQ(float16::from_float(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(float16::from_float(std::ldexp(1.0f, -25)).bits, 0x0000);
  EXPECT_EQ(float16::from_float(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(float16::from_float(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 steps: to even
  EXPECT_EQ(float16::from_float(-0.0f).bits, 0x8000);
  EXPECT_EQ(float16::from_float(1e-30f).bits, 0x0000);
  // NaN stays a quiet NaN with its sign.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(float16::from_float(nan).to_float()));
  EXPECT_EQ(float16::from_float(-nan).bits & 0x8000, 0x8000);
  const float signalling = std::bit_cast<float>(0x7f800001u);
  EXPECT_EQ(float16::from_float(signalling).bits & 0x7e00, 0x7e00);
}

TEST(Float16, FromFloatMatchesTheReferenceOnRandomFloats) {
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_real_distribution<double> exponent(-30.0, 17.0);
  for (int i = 0; i < 200000; ++i) {
    // Every bit pattern is possible; half of them drawn from float16's range.
    float x = std::bit_cast<float>(any(rng));
    if (i % 2 == 0) x = static_cast<float>(std::exp2(exponent(rng))) * (i % 4 == 0 ? -1.0f : 1.0f);
    if (std::isnan(x)) continue;
    ASSERT_EQ(float16::from_float(x).bits, reference_round(x)) << x;
  }
}

// A double just past a half-way point whose float is the half-way point itself: rounding
// through float would round twice and land on the even neighbour below.
TEST(Float16, DoublesRoundOnceIntoBothSixteenBitFormats) {
  const double f16_case = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(static_cast<double>(static_cast<float>(f16_case)), 1.0 + std::ldexp(1.0, -11));
  EXPECT_EQ(float16::from_double(f16_case).to_float(), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(float16::from_double(-f16_case).to_float(), -1.0f - std::ldexp(1.0f, -10));
  const double bf16_case = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(bfloat16::from_double(bf16_case).to_float(), 1.0f + std::ldexp(1.0f, -7));
  // Exact ties still go to even, and large or special doubles behave as from_float.
  EXPECT_EQ(float16::from_double(1.0 + std::ldexp(1.0, -11)).to_float(), 1.0f);
  EXPECT_EQ(float16::from_double(1e300).to_float(), kInf);
  EXPECT_EQ(float16::from_double(-1e-300).bits, 0x8000);
  EXPECT_TRUE(std::isnan(float16::from_double(std::nan("")).to_float()));
  for (double x : {0.1, 1.0 / 3.0, 65519.999, 3.0e-8, 2.9802322387695312e-08}) {
    EXPECT_EQ(float16::from_double(x).bits, reference_round(x)) << x;
  }
  // Host tensors made from doubles, full and arange take the same single rounding.
  EXPECT_EQ(Tensor::from_vector<double>({f16_case}, {1}, DType::float16).to_vector<float>()[0],
            1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(Tensor::from_vector<double>({bf16_case}, {1}, DType::bfloat16).to_vector<float>()[0],
            1.0f + std::ldexp(1.0f, -7));
}

class Float16OpsTest : public testing::DeviceTest {
 protected:
  Tensor halves(const std::vector<float>& values) {
    return testing::device_tensor(device(), values, {static_cast<std::int64_t>(values.size())},
                                  DType::float16);
  }
};

TEST_F(Float16OpsTest, FullAndArangeRoundOnce) {
  const double f16_case = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(ops::full({3}, f16_case, device(), DType::float16).to_vector<float>(),
            std::vector<float>(3, 1.0f + std::ldexp(1.0f, -10)));
  const double bf16_case = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(ops::full({2}, bf16_case, device(), DType::bfloat16).to_vector<float>(),
            std::vector<float>(2, 1.0f + std::ldexp(1.0f, -7)));
  const Tensor r = ops::arange(f16_case, f16_case + 2.5, 1.0, device(), DType::float16);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{1.0f + std::ldexp(1.0f, -10), 2.0f, 3.0f}));
  // Past float16's range: infinity, as a typecast would give.
  EXPECT_EQ(ops::full({1}, 1e6, device(), DType::float16).to_vector<float>()[0], kInf);
}

TEST_F(Float16OpsTest, ResultsOverflowToInfinityAndUnderflowThroughTheSubnormals) {
  const Tensor a = halves({300.0f, 65504.0f, -300.0f, std::ldexp(1.0f, -14), 1.0f});
  const Tensor b = halves({300.0f, 16.0f, 300.0f, 0.5f, std::ldexp(1.0f, -24)});
  EXPECT_EQ(ops::mul(a, b).to_vector<float>(),
            (std::vector<float>{kInf, kInf, -kInf,
                                std::ldexp(1.0f, -15), std::ldexp(1.0f, -24)}));
  // 65504 + 16 = 65520: the tie with 2^16 rounds to even, which is infinity.
  EXPECT_EQ(ops::add(a, b).to_vector<float>()[1], kInf);
  EXPECT_EQ(ops::add(halves({65504.0f}), 15.0).to_vector<float>()[0], 65504.0f);
  // exp(-20) ~ 2.1e-9 is below half the smallest subnormal: 0; exp(-16) ~ 1.1e-7 a subnormal.
  const std::vector<float> e = ops::exp(halves({-20.0f, -16.0f, 12.0f})).to_vector<float>();
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], float16::from_double(std::exp(-16.0)).to_float());
  EXPECT_EQ(e[2], kInf);  // e^12 ~ 162755
  // A float32 sum rounds once: the mean of 65504 and 65504 is finite although the sum is not
  // a float16.
  EXPECT_EQ(ops::mean(halves({65504.0f, 65504.0f})).to_vector<float>()[0], 65504.0f);
  EXPECT_EQ(ops::sum(halves({65504.0f, 65504.0f})).to_vector<float>()[0], kInf);
  ops::assert_finite(halves({1.0f, 2.0f}));
  device().synchronize();
}

TEST_F(Float16OpsTest, TypecastsRoundAsTheHeaderDoesBitForBit) {
  std::mt19937_64 rng(testing::test_seed() + 16);
  std::uniform_real_distribution<double> exponent(-28.0, 17.0);
  std::vector<float> values{0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(),
                            65504.0f, 65519.99f, 65520.0f, 1e-8f, 3e-8f, std::ldexp(1.0f, -24)};
  for (int i = 0; i < 20000; ++i) {
    values.push_back(static_cast<float>(std::exp2(exponent(rng))) * (i % 2 == 0 ? 1.0f : -1.0f));
  }
  const auto n = static_cast<std::int64_t>(values.size());
  const Tensor f32 = testing::device_tensor(device(), values, {n});
  const Tensor f16 = ops::typecast(f32, DType::float16);
  const Tensor back = ops::typecast(f16, DType::float32);
  const std::vector<float> got = back.to_vector<float>();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float want = float16::from_float(values[i]).to_float();
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got[i]));
      continue;
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want))
        << values[i];
  }
  // float16 <-> bfloat16 goes through float exactly: one rounding.
  const std::vector<float> bf = ops::typecast(f16, DType::bfloat16).to_vector<float>();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float want = bfloat16::from_float(got[i]).to_float();
    if (!std::isnan(want)) {
      ASSERT_EQ(bf[i], want) << got[i];
    }
  }
  // Integers: round once (2049 is a tie between 2048 and 2050: to even), 65520 overflows; back
  // to integers truncating and saturating (inf -> INT_MAX).
  const Tensor ints = Tensor::from_vector<std::int32_t>(
                          {2049, 2051, -2051, 65519, 65520, 16777217, -7, 0}, {8}, DType::int32)
                          .to_device(device());
  const Tensor h = ops::typecast(ints, DType::float16);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{2048.0f, 2052.0f, -2052.0f, 65504.0f, kInf,
                                                      kInf, -7.0f, 0.0f}));
  EXPECT_EQ(ops::typecast(h, DType::int32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{2048, 2052, -2052, 65504, 2147483647, 2147483647, -7, 0}));
  // bfloat16 from a 32-bit integer rounds once too: 2^24 + 2^16 + 1 is past the tie.
  const Tensor big = Tensor::from_vector<std::int32_t>({16842753}, {1}, DType::int32).to_device(device());
  EXPECT_EQ(ops::typecast(big, DType::bfloat16).to_vector<float>()[0], 16908288.0f);
}

TEST_F(Float16OpsTest, RandomDrawsAreTheFloat32DrawsRoundedAndReplayBitForBit) {
  Generator g(device(), 5), h(device(), 5);
  const std::vector<float> z32 = ops::randn({513}, g).to_vector<float>();
  const std::vector<float> z16 = ops::randn({513}, h, DType::float16).to_vector<float>();
  for (std::size_t i = 0; i < z32.size(); ++i) {
    ASSERT_EQ(z16[i], float16::from_float(z32[i]).to_float()) << i;
  }
  // Uniform draws use float16's 11 significant bits: multiples of 2^-11 in [0, 1).
  const std::vector<float> u = ops::rand({4096}, h, DType::float16).to_vector<float>();
  bool finer_than_bfloat16 = false;
  for (float v : u) {
    ASSERT_TRUE(v >= 0.0f && v < 1.0f) << v;
    ASSERT_EQ(std::ldexp(v, 11), std::trunc(std::ldexp(v, 11))) << v;
    finer_than_bfloat16 |= std::ldexp(v, 8) != std::trunc(std::ldexp(v, 8));
  }
  EXPECT_TRUE(finer_than_bfloat16);
  Generator noise(device(), 9);
  auto draw = make_tracer(
      [&](const Tensor& x) { return ops::add(x, ops::randn(x.shape(), noise, DType::float16)); },
      device());
  const Tensor x = ops::full({64}, 0.5, device(), DType::float16);
  const std::vector<float> first = draw(x).to_vector<float>();
  const std::vector<float> second = draw(x).to_vector<float>();  // a replay: new noise
  EXPECT_NE(first, second);
  noise.manual_seed(9);
  EXPECT_EQ(ops::add(x, ops::randn(x.shape(), noise, DType::float16)).to_vector<float>(), first);
  EXPECT_EQ(ops::add(x, ops::randn(x.shape(), noise, DType::float16)).to_vector<float>(), second);
}

TEST_F(Float16OpsTest, DTypeNamesAndErrors) {
  EXPECT_EQ(dtype_name(DType::float16), "float16");
  EXPECT_EQ(dtype_size(DType::float16), 2u);
  EXPECT_TRUE(dtype_info(DType::float16).is_floating);
  EXPECT_EQ(fmt::format("{}", ops::full({2}, 1.0, device(), DType::float16).dtype()), "float16");
  const Tensor a = ops::full({2}, 1.0, device(), DType::float16);
  const Tensor b = ops::full({2}, 1.0, device(), DType::bfloat16);
  testing::expect_error([&] { (void)ops::add(a, b); }, ErrorCategory::invalid_argument,
                        "add: a has dtype float16 but b has bfloat16");
}

TEST(Float16Mesh, AllReduceSumsInFloatAndRoundsOnce) {
  auto mesh = MeshDevice::open("cpu", {2});
  std::vector<Tensor> parts;
  // 1 + 2^-11 twice: 2 + 2^-10 exactly, a float16 value; a float16 running sum would round
  // the first addend's tail away.
  for (std::size_t k = 0; k < 2; ++k) {
    parts.push_back(ops::full({3}, 1.0 + std::ldexp(1.0, -10), mesh->member(k), DType::float16));
  }
  const MeshTensor r = ops::all_reduce(MeshTensor(parts, *mesh, {Placement::partial()}));
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(r.shard(k).dtype(), DType::float16);
    EXPECT_EQ(r.shard(k).to_vector<float>(),
              std::vector<float>(3, 2.0f + std::ldexp(1.0f, -9)));
  }
}

}  // namespace
}  // namespace retrace
