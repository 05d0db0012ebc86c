// bfloat16 products (linear, matmul, attention) on the CPU device, whichever path this CPU
// takes (oneDNN on AVX512-BF16 / AMX-BF16 instructions, else float32 products of converted
// operands): against float64 sums of the same bfloat16 values, thread counts, NaN and
// infinity, replays, and a weight written between replays.
#include "support.hpp"

#include "cpu/parallel.hpp"

#include <retrace/retrace.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace retrace {
namespace {

using testing::device_tensor;
using testing::float_bits;
using testing::random_floats;

class BFloat16Products : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's bfloat16 products";
    device_ = open_cpu_device(CpuDeviceOptions{.id = DeviceId{21}});
  }
  Tensor bf16(const std::vector<float>& values, const Shape& shape) {
    return device_tensor(*device_, values, shape, DType::bfloat16);
  }
  std::unique_ptr<Device> device_;
};

// |got - want| within one bfloat16 rounding of want (2^-8 relative: half an ulp is 2^-9, and
// the float32 sum may sit on the other side of a tie) plus float32 summation over k terms.
void expect_product_close(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& magnitude, std::int64_t k,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double limit = std::ldexp(std::abs(want[i]), -8) +
                         static_cast<double>(k + 1) * std::ldexp(magnitude[i], -23) + 1e-30;
    ASSERT_LE(std::abs(got[i] - want[i]), limit)
        << what << ", element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

struct Product {
  std::vector<double> value, magnitude;  // sum of a b, and of |a b|
};

// op(A)[m, k] x op(B)[k, n] in float64 from row-major values (A stored [k, m] when ta, B
// stored [n, k] when tb), plus bias.
Product reference(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& bias, std::int64_t m, std::int64_t n, std::int64_t k,
                  bool ta, bool tb) {
  Product out;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = bias.empty() ? 0.0 : bias[j], magnitude = bias.empty() ? 0.0 : std::abs(bias[j]);
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = a[ta ? p * m + i : i * k + p], y = b[tb ? j * k + p : p * n + j];
        sum += x * y;
        magnitude += std::abs(x * y);
      }
      out.value.push_back(sum);
      out.magnitude.push_back(magnitude);
    }
  }
  return out;
}

TEST_F(BFloat16Products, MatchFloat64OnEveryShape) {
  struct Case {
    std::int64_t m, n, k;
    bool ta, tb, bias;
  };
  // K and N off every tile size, one row (the thin path), just above it, one column, one k, a
  // wide C (split by columns) and large enough to split over the threads.
  const std::vector<Case> cases{{67, 129, 93, false, true, true},  {5, 300, 70, false, true, false},
                                {1, 1536, 256, false, true, true}, {130, 1, 300, false, false, false},
                                {300, 130, 1, true, false, false}, {33, 17, 65, true, true, false},
                                {24, 2000, 40, false, true, true}, {256, 384, 257, false, true, true}};
  std::uint64_t salt = 100;
  for (const Case& c : cases) {
    const std::string what = fmt::format("{}x{}x{} ta={} tb={}", c.m, c.n, c.k, c.ta, c.tb);
    Tensor a = bf16(random_floats(static_cast<std::size_t>(c.m * c.k), salt++),
                    c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k});
    Tensor b = bf16(random_floats(static_cast<std::size_t>(c.k * c.n), salt++),
                    c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n});
    Tensor bias = c.bias ? bf16(random_floats(static_cast<std::size_t>(c.n), salt++), {c.n})
                         : Tensor();
    const std::vector<float> bias_values = c.bias ? bias.to_vector<float>() : std::vector<float>{};
    const Product want = reference(a.to_vector<float>(), b.to_vector<float>(), bias_values, c.m,
                                   c.n, c.k, c.ta, c.tb);
    Tensor got;
    if (c.tb && !c.ta) {
      got = ops::linear(a, b, bias);
    } else {
      got = ops::matmul(a, b, c.ta ? ops::Transpose::yes : ops::Transpose::no,
                        c.tb ? ops::Transpose::yes : ops::Transpose::no);
      ASSERT_FALSE(c.bias);
    }
    ASSERT_EQ(got.dtype(), DType::bfloat16);
    expect_product_close(got.to_vector<float>(), want.value, want.magnitude, c.k, what);
  }
  // Batches (a broadcast B) and empty products.
  Tensor a = bf16(random_floats(3 * 40 * 50, 130), {3, 40, 50});
  Tensor b = bf16(random_floats(50 * 60, 131), {50, 60});
  const std::vector<float> av = a.to_vector<float>();
  const std::vector<float> bv = b.to_vector<float>();
  const std::vector<float> got = ops::matmul(a, b).to_vector<float>();
  for (std::int64_t batch = 0; batch < 3; ++batch) {
    const std::vector<float> slice(av.begin() + batch * 2000, av.begin() + (batch + 1) * 2000);
    const Product want = reference(slice, bv, {}, 40, 60, 50, false, false);
    expect_product_close({got.begin() + batch * 2400, got.begin() + (batch + 1) * 2400},
                         want.value, want.magnitude, 50, fmt::format("batch {}", batch));
  }
  EXPECT_EQ(ops::matmul(bf16({}, {0, 64}), bf16(random_floats(64 * 64, 132), {64, 64})).shape(),
            (Shape{0, 64}));
  EXPECT_EQ(ops::linear(bf16(random_floats(64 * 64, 133), {64, 64}), bf16({}, {0, 64}))
                .shape(),
            (Shape{64, 0}));
  const std::vector<float> zeros =
      ops::matmul(bf16(random_floats(0, 134), {64, 0}), bf16({}, {0, 64})).to_vector<float>();
  EXPECT_EQ(zeros, std::vector<float>(64 * 64, 0.0f));
}

// Products of at most 4 rows read the bfloat16 weight in place with the float32 lanes of the
// float32 path: the bits of a float32 product of the converted operands, rounded once.
TEST_F(BFloat16Products, ThinProductsGiveTheBitsOfConvertedFloat32) {
  std::uint64_t salt = 180;
  for (std::int64_t m : {1, 2, 3, 4}) {
    for (bool tb : {true, false}) {
      const std::int64_t n = 1536, k = 257;
      Tensor a = bf16(random_floats(static_cast<std::size_t>(m * k), salt++), {m, k});
      Tensor w = bf16(random_floats(static_cast<std::size_t>(n * k), salt++),
                      tb ? Shape{n, k} : Shape{k, n});
      Tensor bias = bf16(random_floats(static_cast<std::size_t>(n), salt++), {n});
      const auto as_float = [](const Tensor& t) { return ops::typecast(t, DType::float32); };
      Tensor got, want;
      if (tb) {
        got = ops::linear(a, w, bias);
        want = ops::typecast(ops::linear(as_float(a), as_float(w), as_float(bias)),
                             DType::bfloat16);
      } else {
        got = ops::matmul(a, w);
        want = ops::typecast(ops::matmul(as_float(a), as_float(w)), DType::bfloat16);
      }
      EXPECT_EQ(float_bits(got), float_bits(want)) << "m " << m << ", tb " << tb;
    }
  }
}

// NaN and infinity go where float64 puts them: a NaN poisons its row, an infinity makes its row
// infinite (or NaN where it meets a zero or an infinity of the other sign).
TEST_F(BFloat16Products, NaNAndInfinityLandWhereFloat64PutsThem) {
  const std::int64_t m = 40, n = 72, k = 96;
  std::vector<float> av = random_floats(static_cast<std::size_t>(m * k), 140);
  std::vector<float> bv = random_floats(static_cast<std::size_t>(n * k), 141, 0.5f, 1.0f);
  av[3 * k + 5] = NAN;
  av[7 * k + 2] = INFINITY;
  av[9 * k + 4] = -INFINITY;
  bv[11 * k + 4] = 0.0f;  // -inf * 0 in row 9, column 11: NaN
  Tensor a = bf16(av, {m, k}), b = bf16(bv, {n, k});
  const Product want =
      reference(a.to_vector<float>(), b.to_vector<float>(), {}, m, n, k, false, true);
  const std::vector<float> got = ops::linear(a, b).to_vector<float>();
  int non_finite = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double w = want.value[i];
    if (std::isfinite(w)) {
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
      continue;
    }
    ++non_finite;
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << ": " << got[i];
    } else {
      EXPECT_EQ(got[i], static_cast<float>(w)) << "element " << i;
    }
  }
  EXPECT_EQ(non_finite, 3 * n);
}

// Attention's two products in bfloat16 against float64 (the scores and the softmax of the same
// bfloat16 q, k and v): the softmax's weights are rounded to bfloat16 on the native path, so the
// limit is a few bfloat16 roundings of the output's scale.
TEST_F(BFloat16Products, AttentionMatchesFloat64) {
  const std::int64_t H = 3, Sq = 150, Sk = 200, D = 64;
  for (bool causal : {false, true}) {
    Tensor q = bf16(random_floats(H * Sq * D, 150), {1, H, Sq, D});
    Tensor k = bf16(random_floats(H * Sk * D, 151), {1, H, Sk, D});
    Tensor v = bf16(random_floats(H * Sk * D, 152), {1, H, Sk, D});
    const std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>(),
                             vv = v.to_vector<float>();
    const std::vector<float> got =
        ops::scaled_dot_product_attention(q, k, v, Tensor(), std::nullopt,
                                          causal ? ops::Causal::yes : ops::Causal::no)
            .to_vector<float>();
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t keys = causal ? std::min(Sk, i + 1) : Sk;
        std::vector<double> s(static_cast<std::size_t>(keys));
        double top = -1e300, z = 0.0;
        for (std::int64_t j = 0; j < keys; ++j) {
          double dot = 0.0;
          for (std::int64_t p = 0; p < D; ++p) {
            dot += double(qv[(h * Sq + i) * D + p]) * kv[(h * Sk + j) * D + p];
          }
          s[j] = dot / 8.0;
          top = std::max(top, s[j]);
        }
        for (double& e : s) z += (e = std::exp(e - top));
        for (std::int64_t e = 0; e < D; ++e) {
          double want = 0.0;
          for (std::int64_t j = 0; j < keys; ++j) want += s[j] / z * vv[(h * Sk + j) * D + e];
          const float g = got[(h * Sq + i) * D + e];
          // |v| <= 1: 2^-8 for the weights' rounding, 2^-8 for the output's.
          ASSERT_NEAR(g, want, std::ldexp(1.0, -7))
              << "causal " << causal << ", head " << h << ", row " << i << ", column " << e;
        }
      }
    }
  }
}

// A product's bits do not depend on how many kernel threads split it: the same device limited
// to one kernel thread gives the bits of all of them. (A device opened with kernel_threads = 1
// may take another library for its single-threaded GEMMs; see devices.md.)
TEST_F(BFloat16Products, TheKernelThreadsGiveTheBitsOfOneThread) {
  const auto xv = random_floats(256 * 384, 160), wv = random_floats(1152 * 384, 161),
             bv = random_floats(1152, 162), qv = random_floats(2 * 4 * 256 * 64, 163);
  auto run = [&] {
    auto put = [&](const std::vector<float>& v, const Shape& s) {
      return device_tensor(*device_, v, s, DType::bfloat16);
    };
    const Tensor x = put(xv, {256, 384});
    const Tensor q = put(qv, {2, 4, 256, 64});
    return std::vector<std::vector<std::uint32_t>>{
        float_bits(ops::linear(x, put(wv, {1152, 384}), put(bv, {1152}))),
        float_bits(ops::matmul(x, put(wv, {384, 1152}))),
        // One row against a [1536, 256] weight: its columns split over the threads.
        float_bits(ops::linear(put({xv.begin(), xv.begin() + 256}, {1, 256}),
                               put({wv.begin(), wv.begin() + 1536 * 256}, {1536, 256}))),
        float_bits(ops::scaled_dot_product_attention(q, q, q))};
  };
  const auto shared = run();
  cpu::set_kernel_thread_limit(1);
  const auto one = run();
  cpu::set_kernel_thread_limit(1 << 20);
  EXPECT_EQ(shared, one);
}

// A weight written between replays (in place, as a training step or a LoRA merge would)
// changes the next replay's result, exactly as eager, packed copy or not.
TEST_F(BFloat16Products, AWeightWrittenBetweenReplaysIsRead) {
  Tensor x = bf16(random_floats(64 * 256, 170), {64, 256});
  Tensor w = bf16(random_floats(512 * 256, 171), {512, 256});
  auto traced = make_tracer([](const Tensor& a, const Tensor& b) { return ops::linear(a, b); },
                            *device_);
  const auto first = float_bits(traced(x, w));
  EXPECT_EQ(first, float_bits(ops::linear(x, w)));
  ops::copy(bf16(random_floats(512 * 256, 172), {512, 256}), w);
  const auto second = float_bits(traced(x, w));
  EXPECT_NE(second, first);
  EXPECT_EQ(second, float_bits(ops::linear(x, w)));
  // Written through the host pointer of the buffer itself, and announced (the device cannot
  // see such writes; a packed copy of the weight would otherwise stay in use).
  auto* raw = static_cast<bfloat16*>(w.buffer()->data()) + w.storage_offset();
  for (std::int64_t i = 0; i < 512 * 256; ++i) raw[i] = bfloat16::from_float(0.25f);
  w.buffer()->mark_written();
  const auto third = float_bits(traced(x, w));
  EXPECT_NE(third, second);
  EXPECT_EQ(third, float_bits(ops::linear(x, w)));
}

// Which path bfloat16 products take here is stated, in the device's description too.
TEST_F(BFloat16Products, ThePathIsNamed) {
  const std::string path = cpu_bfloat16_products(*device_);
  EXPECT_TRUE(path == "amx_bf16" || path == "avx512_bf16" || path == "float32") << path;
  EXPECT_NE(device_->description().find("bfloat16 products on " + path), std::string::npos)
      << device_->description();
}

}  // namespace
}  // namespace retrace
