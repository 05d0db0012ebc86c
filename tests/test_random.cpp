// Generator, rand and randn: Philox4x32-10 against its published known answers, the draws
// against a host reference computed here, their statistics, reproducibility (seed, offset,
// shape-independence), traces (a replay draws new numbers, the same as eager from the same seed
// and offset, bit for bit), and the errors.
#include "support.hpp"
#include "retrace/backend/philox.hpp"

#include <bit>
#include <cmath>
#include <numeric>

namespace retrace {
namespace {

TEST(Philox, Random123KnownAnswers) {
  using philox::Words;
  const auto check = [](Words counter, std::uint32_t k0, std::uint32_t k1, Words want) {
    const Words got = philox::philox4x32_10(counter, k0, k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], want.w[i]) << "word " << i;
  };
  check({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
        {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  check({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
        {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

// Element i of the draw at `offset`, computed on the host in double from the Philox words.
double reference_normal(std::uint64_t seed, std::uint64_t offset, std::int64_t i) {
  const philox::Words w = philox::block_words(seed, offset, static_cast<std::uint64_t>(i / 4));
  const int pair = static_cast<int>(i % 4) / 2;
  const double u1 = (static_cast<double>(w.w[2 * pair]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(w.w[2 * pair + 1]) / 4294967296.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  return i % 2 == 0 ? r * std::cos(2.0 * M_PI * u2) : r * std::sin(2.0 * M_PI * u2);
}

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

class RandomTest : public testing::DeviceTest {};

TEST_F(RandomTest, NormalsMatchTheHostReference) {
  Generator gen(device(), 0x1234'5678'9abc'def0ull);
  for (std::uint64_t offset = 0; offset < 3; ++offset) {
    const std::vector<float> z = ops::randn({1001}, gen).to_vector<float>();
    for (std::int64_t i = 0; i < 1001; ++i) {
      const double want = reference_normal(0x1234'5678'9abc'def0ull, offset, i);
      ASSERT_NEAR(z[static_cast<std::size_t>(i)], want, 2e-7 * std::max(1.0, std::abs(want)))
          << "offset " << offset << " element " << i;
    }
  }
  EXPECT_EQ(gen.offset(), 3u);
  EXPECT_EQ(gen.seed(), 0x1234'5678'9abc'def0ull);
}

TEST_F(RandomTest, UniformsAreTheTop24BitsOfEachWord) {
  Generator gen(device(), 99);
  const std::vector<float> u = ops::rand({4, 5, 3}, gen).to_vector<float>();
  for (std::size_t i = 0; i < u.size(); ++i) {
    const philox::Words w = philox::block_words(99, 0, i / 4);
    EXPECT_EQ(u[i], static_cast<float>(w.w[i % 4] >> 8) / 16777216.0f) << "element " << i;
  }
}

TEST_F(RandomTest, Statistics) {
  Generator gen(device(), 2026);
  constexpr std::int64_t kN = 1 << 20;
  const std::vector<float> z = ops::randn({kN}, gen).to_vector<float>();
  double sum = 0, squares = 0;
  std::int64_t within_one = 0;
  for (float v : z) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    squares += double{v} * v;
    within_one += std::abs(v) < 1.0f;
  }
  const double mean = sum / kN, var = squares / kN - mean * mean;
  // Standard errors: mean 1/sqrt(N) ~ 0.001, variance sqrt(2/N) ~ 0.0014; 5 sigma bounds.
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(var, 1.0, 0.007);
  EXPECT_NEAR(static_cast<double>(within_one) / kN, 0.682689, 0.0025);

  const std::vector<float> u = ops::rand({kN}, gen).to_vector<float>();
  std::vector<std::int64_t> bins(16, 0);
  for (float v : u) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    ++bins[static_cast<std::size_t>(v * 16)];
  }
  for (std::int64_t count : bins) EXPECT_NEAR(static_cast<double>(count) / kN, 1.0 / 16, 0.0012);
  // Neighbouring draws are not correlated (offsets are independent streams).
  const std::vector<float> z2 = ops::randn({kN}, gen).to_vector<float>();
  double cross = 0;
  for (std::int64_t i = 0; i < kN; ++i) cross += double{z[i]} * z2[i];
  EXPECT_NEAR(cross / kN, 0.0, 0.005);
}

TEST_F(RandomTest, SeedsOffsetsAndShapesReproduce) {
  Generator a(device(), 7), b(device(), 7), c(device(), 8);
  const std::vector<float> first = ops::randn({2, 3, 5}, a).to_vector<float>();
  const std::vector<float> second = ops::randn({2, 3, 5}, a).to_vector<float>();
  EXPECT_NE(first, second);
  // The same seed gives the same numbers; a prefix does not depend on the shape.
  const std::vector<float> prefix = ops::randn({7}, b).to_vector<float>();
  for (std::size_t i = 0; i < prefix.size(); ++i) EXPECT_EQ(bits(prefix[i]), bits(first[i]));
  EXPECT_NE(ops::randn({30}, c).to_vector<float>(), first);
  // set_offset goes back; manual_seed restarts.
  a.set_offset(1);
  EXPECT_EQ(ops::randn({2, 3, 5}, a).to_vector<float>(), second);
  a.manual_seed(7);
  EXPECT_EQ(a.offset(), 0u);
  EXPECT_EQ(ops::randn({2, 3, 5}, a).to_vector<float>(), first);
  // An empty draw still uses an offset, so later draws do not depend on shapes.
  const Tensor empty = ops::randn({0, 4}, a);
  EXPECT_EQ(empty.shape(), (Shape{0, 4}));
  EXPECT_EQ(a.offset(), 2u);
  // Offsets past 2^32 carry into the high word.
  a.set_offset(0xffff'ffffull);
  (void)ops::rand({3}, a);
  EXPECT_EQ(a.offset(), 0x1'0000'0000ull);
  EXPECT_EQ(a.seed(), 7u);
}

TEST_F(RandomTest, BFloat16IsTheRoundedFloat32Draw) {
  Generator f(device(), 5), h(device(), 5);
  const std::vector<float> z32 = ops::randn({257}, f).to_vector<float>();
  const std::vector<float> z16 = ops::randn({257}, h, DType::bfloat16).to_vector<float>();
  for (std::size_t i = 0; i < z32.size(); ++i) {
    const float rounded =
        Tensor::from_vector<float>({z32[i]}, {1}, DType::bfloat16).to_vector<float>()[0];
    EXPECT_EQ(bits(z16[i]), bits(rounded)) << "element " << i;
  }
  const std::vector<float> u16 = ops::rand({4096}, h, DType::bfloat16).to_vector<float>();
  for (float v : u16) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);  // 8 random bits: never rounds up to 1
    ASSERT_EQ(v * 256.0f, std::floor(v * 256.0f));
  }
}

TEST_F(RandomTest, OutFormsFillExistingTensors) {
  Generator a(device(), 11), b(device(), 11);
  Tensor out = Tensor::empty({3, 9}, DType::float32, device());
  ops::randn(a, out);
  EXPECT_EQ(out.to_vector<float>(), ops::randn({27}, b).to_vector<float>());
  ops::rand(a, out);
  EXPECT_EQ(out.to_vector<float>(), ops::rand({3, 9}, b).to_vector<float>());
}

// A traced function that draws: every replay draws anew, the numbers those of eager draws from
// the same seed, in order.
TEST_F(RandomTest, ReplaysDrawNewNumbersEqualToEager) {
  Generator traced_gen(device(), 31), eager_gen(device(), 31);
  const Tensor x = testing::device_tensor(device(), testing::random_floats(64, 3), {8, 8});
  auto noisy = [](const Tensor& latents, Generator& gen) {
    return ops::add(ops::mul(latents, 0.5), ops::randn(latents.shape(), gen));
  };
  auto tracer = make_tracer([&](const Tensor& latents) { return noisy(latents, traced_gen); },
                            device());
  std::vector<std::vector<float>> seen;
  for (int call = 0; call < 5; ++call) {
    const std::vector<float> traced = tracer(x).to_vector<float>();
    const std::vector<float> eager = noisy(x, eager_gen).to_vector<float>();
    ASSERT_EQ(traced.size(), eager.size());
    for (std::size_t i = 0; i < traced.size(); ++i) {
      ASSERT_EQ(bits(traced[i]), bits(eager[i])) << "call " << call << " element " << i;
    }
    for (const auto& earlier : seen) EXPECT_NE(traced, earlier) << "call " << call;
    seen.push_back(traced);
  }
  EXPECT_EQ(tracer.stats().captures, 1u);
  // The prep run before the capture drew without advancing: 5 calls, 5 offsets.
  EXPECT_EQ(traced_gen.offset(), 5u);
  // Reseeding between replays restarts the replayed sequence.
  traced_gen.manual_seed(31);
  EXPECT_EQ(tracer(x).to_vector<float>(), seen[0]);
}

TEST_F(RandomTest, GeneratorAsABoundArgumentOfATracedFunction) {
  auto draw = traced_function([](const Tensor& x, Device& dev, Generator& gen) {
    EXPECT_EQ(&dev, x.device());
    return ops::add(x, ops::rand(x.shape(), gen));
  });
  Generator g1(device(), 1), g2(device(), 2);
  const Tensor zeros = ops::full({16}, 0.0, device());
  const std::vector<float> a1 = draw(zeros, device(), g1).to_vector<float>();
  const std::vector<float> a2 = draw(zeros, device(), g2).to_vector<float>();  // its own trace
  EXPECT_NE(a1, a2);
  Generator r1(device(), 1);
  EXPECT_EQ(a1, ops::rand({16}, r1).to_vector<float>());
  EXPECT_EQ(draw(zeros, device(), g1).to_vector<float>(), ops::rand({16}, r1).to_vector<float>());
}

TEST_F(RandomTest, Errors) {
  Generator gen(device(), 1);
  EXPECT_RETRACE_ERROR((void)ops::randn({4}, gen, DType::int32), invalid_argument,
                       "randn: dtype must be float32, bfloat16 or float16, got int32");
  EXPECT_RETRACE_ERROR(ops::rand(gen, Tensor::empty({4}, DType::uint32, device())),
                       invalid_argument, "rand");
  EXPECT_RETRACE_ERROR(ops::randn(gen, ops::to_layout(ops::full({32, 32}, 0.0, device()),
                                                      Layout::tile)),
                       invalid_argument, "randn: out must be row-major");
  EXPECT_RETRACE_ERROR(ops::randn(gen, Tensor::empty_host({4}, DType::float32)),
                       invalid_argument, "randn");
  auto other = testing::open_test_device({DeviceId{1}});
  EXPECT_RETRACE_ERROR(ops::randn(gen, Tensor::empty({4}, DType::float32, *other)),
                       invalid_argument, "randn: out is on");
  // A failed draw did not advance the generator.
  EXPECT_EQ(gen.offset(), 0u);
  // Reseeding is a host write: not during a capture.
  auto tracer = make_tracer(
      [&](const Tensor& x) {
        gen.manual_seed(3);
        return ops::add(x, 1.0);
      },
      device(), TraceOptions{.prep_run = false});
  EXPECT_RETRACE_ERROR((void)tracer(ops::full({4}, 0.0, device())), capture_violation, "");
  EXPECT_EQ(gen.seed(), 1u);
  EXPECT_EQ(ops::randn({2}, gen).to_vector<float>().size(), 2u);
}

TEST_F(RandomTest, ClosedDevice) {
  auto dev = testing::open_test_device({DeviceId{2}});
  Generator gen(*dev, 4);
  dev->close();
  EXPECT_RETRACE_ERROR((void)ops::randn({4}, gen), failed_precondition, "closed");
  EXPECT_RETRACE_ERROR((void)gen.offset(), failed_precondition, "closed");
}

}  // namespace
}  // namespace retrace
