// The op library at the edges of its range: empty and size-1 dimensions, overflow to infinity,
// NaN propagation, integer corner cases, and errors that name the op the user called.
#include "support.hpp"

#include <bit>
#include <climits>
#include <cmath>
#include <limits>

namespace retrace {
namespace {

using testing::device_tensor;

class OpEdgesTest : public testing::DeviceTest {
 protected:
  Tensor floats(const std::vector<float>& values, const Shape& shape) {
    return device_tensor(device(), values, shape);
  }
  Tensor empty_of(const Shape& shape, DType dtype = DType::float32) {
    return ops::full(shape, 0.0, device(), dtype);
  }
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST_F(OpEdgesTest, ZeroExtentBroadcastsAgainstOneToZero) {
  const Tensor a = empty_of({0, 3});
  const Tensor b = floats({1, 2, 3}, {1, 3});
  for (const Tensor& r : {ops::add(a, b), ops::add(b, a), ops::mul(a, b), ops::maximum(b, a)}) {
    EXPECT_EQ(r.shape(), Shape({0, 3}));
    EXPECT_TRUE(r.to_vector<float>().empty());
  }
  const Tensor out = empty_of({0, 3});
  ops::sub(a, b, out);
  ops::sub(b, a, out);
  EXPECT_EQ(ops::add(empty_of({2, 0, 1}), empty_of({1, 4})).shape(), Shape({2, 0, 4}));
  // A 0 against another extent (not 1) still does not broadcast.
  EXPECT_RETRACE_ERROR((void)ops::add(empty_of({0, 3}), empty_of({2, 3})), invalid_argument,
                       "add: shapes [0, 3] and [2, 3] do not broadcast");
}

// chunk follows torch.chunk: pieces of ceil(extent / chunks), fewer where they run out, and
// `chunks` empty pieces of an empty extent (an empty batch unpacks like a full one).
TEST_F(OpEdgesTest, ChunkCountsAsTorchChunk) {
  auto extents = [](const std::vector<Tensor>& pieces, std::size_t dim) {
    std::vector<std::int64_t> out;
    for (const Tensor& t : pieces) out.push_back(t.shape().dims()[dim]);
    return out;
  };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(extents(ops::chunk(empty_of({2, 5}), 4, 1), 1), (V{2, 2, 1}));
  EXPECT_EQ(extents(ops::chunk(empty_of({2, 6}), 4, -1), 1), (V{2, 2, 2}));
  EXPECT_EQ(extents(ops::chunk(empty_of({2, 1}), 3, 1), 1), (V{1}));
  EXPECT_EQ(extents(ops::chunk(empty_of({0, 6}), 3, 0), 0), (V{0, 0, 0}));
  EXPECT_EQ(extents(ops::chunk(empty_of({4, 0}), 1, 1), 1), (V{0}));
  for (const Tensor& piece : ops::chunk(empty_of({0, 6}), 3, 0)) {
    EXPECT_EQ(piece.shape(), Shape({0, 6}));
  }
  EXPECT_RETRACE_ERROR((void)ops::chunk(empty_of({0, 6}), 0, 0), invalid_argument,
                       "chunk: chunks must be positive, got 0");
  // split by one size, as torch.split with an integer.
  EXPECT_EQ(extents(ops::split(empty_of({2, 5}), std::int64_t{2}, 1), 1), (V{2, 2, 1}));
  EXPECT_EQ(extents(ops::split(empty_of({2, 4}), std::int64_t{2}, -1), 1), (V{2, 2}));
  EXPECT_EQ(extents(ops::split(empty_of({2, 3}), std::int64_t{7}, 1), 1), (V{3}));
  EXPECT_EQ(extents(ops::split(empty_of({0, 3}), std::int64_t{2}, 0), 0), (V{0}));
  EXPECT_EQ(extents(ops::split(empty_of({0, 3}), std::int64_t{0}, 0), 0), (V{0}));
  EXPECT_RETRACE_ERROR((void)ops::split(empty_of({2, 3}), std::int64_t{0}, 1), invalid_argument,
                       "split: size 0 along dimension 1 of [2, 3]");
}

TEST_F(OpEdgesTest, LinearWithNoInputFeaturesGivesTheBias) {
  const Tensor x = empty_of({3, 0});
  const Tensor w = empty_of({4, 0});
  const Tensor bias = floats({1, 2, 3, 4}, {4});
  const std::vector<float> with_bias = ops::linear(x, w, bias).to_vector<float>();
  ASSERT_EQ(with_bias.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(with_bias[i], static_cast<float>(i % 4 + 1));
  // Poison the memory the next output is likely to get, then check it is zeroed.
  { const Tensor junk = ops::full({3, 4}, 7.0, device()); }
  for (float v : ops::linear(x, w).to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : ops::matmul(empty_of({2, 0}), empty_of({0, 5})).to_vector<float>()) {
    EXPECT_EQ(v, 0.0f);
  }
}

// Linears of a few rows (one conditioning row, a decoding step's tokens) at sizes around every
// vector width and tile edge: within float32 rounding of a float64 reference, NaN carried, and
// (on the CPU, whose thin-product kernel sums each column on its own) a column's bits do not
// depend on how many columns the product has, so a split over threads rounds as a whole does,
// nor on whether the weight is stored [n, k] or [k, n].
TEST_F(OpEdgesTest, ThinLinearsMatchAFloat64Reference) {
  const std::string isa = cpu_kernel_isa(device());  // "" on other backends
  const bool thin_kernels = isa == "avx2" || isa == "avx512";
  std::uint64_t salt = 700;
  for (std::int64_t m : {1, 2, 3, 4, 5}) {
    for (std::int64_t k : {1, 5, 16, 17, 40, 300}) {
      for (std::int64_t n : {1, 3, 4, 5, 67}) {
        SCOPED_TRACE(fmt::format("m {} k {} n {}", m, k, n));
        const std::vector<float> xs = testing::random_floats(m * k, ++salt);
        const std::vector<float> ws = testing::random_floats(n * k, ++salt);
        const std::vector<float> bs = testing::random_floats(n, ++salt);
        const Tensor x = floats(xs, {m, k}), w = floats(ws, {n, k}), bias = floats(bs, {n});
        const std::vector<float> got = ops::linear(x, w, bias).to_vector<float>();
        ASSERT_EQ(got.size(), static_cast<std::size_t>(m * n));
        for (std::int64_t r = 0; r < m; ++r) {
          for (std::int64_t j = 0; j < n; ++j) {
            double want = bs[j], magnitude = std::abs(bs[j]);
            for (std::int64_t p = 0; p < k; ++p) {
              want += double(xs[r * k + p]) * ws[j * k + p];
              magnitude += std::abs(double(xs[r * k + p]) * ws[j * k + p]);
            }
            EXPECT_NEAR(got[r * n + j], want, (k + 2) * 0x1p-23 * magnitude) << r << ", " << j;
          }
        }
        if (thin_kernels && m <= 4 && n > 1) {
          const std::int64_t j = n - 1;
          const std::vector<float> alone =
              ops::linear(x, ops::slice(w, 0, j, n), floats({bs[j]}, {1})).to_vector<float>();
          for (std::int64_t r = 0; r < m; ++r) EXPECT_EQ(alone[r], got[r * n + j]) << r;
          const Tensor w_kn = ops::contiguous(ops::transpose(w, 0, 1));
          const Tensor product = ops::add(ops::matmul(x, w_kn), bias);
          const Tensor product_nk = ops::add(ops::matmul(x, ops::transpose(w, 0, 1)), bias);
          EXPECT_EQ(product.to_vector<float>(), product_nk.to_vector<float>());
          const Tensor xt = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);
          EXPECT_EQ(ops::matmul(xt, w_kn).to_vector<float>(),
                    ops::matmul(x, w_kn).to_vector<float>());
        }
      }
    }
  }
  std::vector<float> xs = testing::random_floats(2 * 37, 1);
  xs[37 + 36] = kNaN;
  const std::vector<float> got =
      ops::linear(floats(xs, {2, 37}), floats(testing::random_floats(9 * 37, 2), {9, 37}))
          .to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(std::isnan(got[i]), i >= 9) << i;
}

// Elementwise, row-wise and copy kernels split their rows or elements over the process's kernel
// threads (from 8192 elements a part); a device with kernel_threads = 1 runs them whole on its
// queue's thread, one with kernel_threads = 2 over at most two. Every element's value must not
// depend on where the split falls: all give the same bits, at shapes around the split sizes and
// with odd extents whose parts end mid-vector.
TEST(StreamingKernelThreads, TheKernelThreadsGiveTheBitsOfOneThread) {
  if (testing::test_backend() != "cpu") GTEST_SKIP() << "the CPU device's kernel threads";
  auto split = open_cpu_device(CpuDeviceOptions{.id = DeviceId{3}});
  auto whole = open_cpu_device(CpuDeviceOptions{.id = DeviceId{4}, .kernel_threads = 1});
  auto capped = open_cpu_device(CpuDeviceOptions{.id = DeviceId{5}, .kernel_threads = 2});
  const std::vector<Shape> shapes = {{256, 256}, {257, 131}, {3, 40001}, {16385}, {2, 8193},
                                     {64, 3, 129}};
  std::uint64_t salt = 0;
  for (const Shape& shape : shapes) {
    for (DType dtype : {DType::float32, DType::bfloat16}) {
      const auto n = static_cast<std::size_t>(shape.numel());
      std::vector<float> a_values = testing::random_floats(n, ++salt, -4.0f, 4.0f);
      a_values[n / 2] = std::numeric_limits<float>::quiet_NaN();
      a_values[n - 1] = std::numeric_limits<float>::infinity();
      const std::vector<float> b_values = testing::random_floats(n, ++salt, -4.0f, 4.0f);
      const std::int64_t last = shape.dims().back();
      const std::vector<float> row_values =
          testing::random_floats(static_cast<std::size_t>(last), ++salt);
      auto run = [&](Device& device) {
        const Tensor a = testing::device_tensor(device, a_values, shape, dtype);
        const Tensor b = testing::device_tensor(device, b_values, shape, dtype);
        const Tensor row = testing::device_tensor(device, row_values, Shape({last}), dtype);
        const std::int64_t rank = static_cast<std::int64_t>(shape.rank());
        std::vector<Tensor> results = {
            ops::add(a, b),          ops::mul(a, row),   ops::mul(ops::sub(a, b), 0.37),
            ops::gelu_tanh(a),       ops::exp(a),        ops::silu(b),
            ops::gelu(b),            ops::softmax(a),    ops::layer_norm(b, row, row),
            ops::rms_norm(a, row),   ops::sum(b),        ops::max(a),
            ops::contiguous(ops::transpose(a, 0, rank - 1)),
        };
        std::vector<std::vector<std::uint32_t>> bits;
        for (const Tensor& r : results) bits.push_back(testing::float_bits(r));
        return bits;
      };
      const auto on_threads = run(*split);
      const auto on_one = run(*whole);
      const auto on_two = run(*capped);
      ASSERT_EQ(on_threads.size(), on_one.size());
      ASSERT_EQ(on_two.size(), on_one.size());
      for (std::size_t i = 0; i < on_one.size(); ++i) {
        EXPECT_EQ(on_threads[i], on_one[i])
            << "result " << i << " of " << fmt::format("{}", shape) << " in " << dtype_name(dtype);
        EXPECT_EQ(on_two[i], on_one[i]) << "kernel_threads = 2: result " << i << " of "
                                        << fmt::format("{}", shape) << " in " << dtype_name(dtype);
      }
    }
  }
}

TEST_F(OpEdgesTest, HalfPrecisionLinearRoundsItsOutputOnce) {
  // x w = 0.5 + t lies halfway between 0.5 and the next value up (ties go to 0.5), and the bias
  // -0.5 leaves t, which the dtype holds exactly: rounded once the output is t; rounding x w
  // before adding the bias (what cuBLAS does with the bias as its C input) gives 0.
  for (const auto& [dtype, t] : {std::pair{DType::bfloat16, 0x1p-9f}, std::pair{DType::float16, 0x1p-12f}}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = device_tensor(device(), {1.0f, t, 1.0f, t, 1.0f, t}, {3, 2}, dtype);
    const Tensor w = device_tensor(device(), {0.5f, 1.0f}, {1, 2}, dtype);
    const Tensor bias = device_tensor(device(), {-0.5f}, {1}, dtype);
    EXPECT_EQ(ops::linear(x, w, bias).to_vector<float>(), (std::vector<float>{t, t, t}));
    EXPECT_EQ(ops::linear(x, w).to_vector<float>(), (std::vector<float>{0.5f, 0.5f, 0.5f}));
  }
}

TEST_F(OpEdgesTest, ReductionsOverAnEmptyLastDimension) {
  { const Tensor junk = ops::full({4}, 7.0, device()); }
  const Tensor a = empty_of({4, 0});
  for (float v : ops::sum(a).to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : ops::mean(a).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  for (float v : ops::max(a).to_vector<float>()) EXPECT_EQ(v, -kInf);
  EXPECT_EQ(ops::sum(a, ops::KeepDim::yes).shape(), Shape({4, 1}));
  // No rows at all: empty results.
  EXPECT_TRUE(ops::sum(empty_of({0, 5})).to_vector<float>().empty());
  EXPECT_TRUE(ops::softmax(empty_of({0, 5})).to_vector<float>().empty());
  EXPECT_EQ(ops::softmax(empty_of({3, 0})).shape(), Shape({3, 0}));
}

TEST_F(OpEdgesTest, ExpOverflowsToInfinity) {
  const std::vector<float> in = {88.5f, 89.0f, 100.0f, kInf, -kInf, -104.0f, kNaN, 88.0f, 0.0f};
  const std::vector<float> got = ops::exp(floats(in, {9})).to_vector<float>();
  EXPECT_NEAR(got[0], 2.7231e38f, 2.7231e38f * 1e-4f);  // exp(88.5): finite, near FLT_MAX
  EXPECT_EQ(got[1], kInf);
  EXPECT_EQ(got[2], kInf);
  EXPECT_EQ(got[3], kInf);
  EXPECT_EQ(got[4], 0.0f);
  EXPECT_GE(got[5], 0.0f);
  EXPECT_LT(got[5], 1e-44f);
  EXPECT_TRUE(std::isnan(got[6]));
  EXPECT_NEAR(got[7], std::exp(88.0f), std::exp(88.0f) * 1e-6f);
  EXPECT_EQ(got[8], 1.0f);
}

TEST_F(OpEdgesTest, NaNPropagatesThroughReluMaxMaximumMinimum) {
  const Tensor nan_first = floats({kNaN, 1.0f, -1.0f}, {3});
  const Tensor plain = floats({0.5f, kNaN, 2.0f}, {3});
  const std::vector<float> relu = ops::relu(nan_first).to_vector<float>();
  EXPECT_TRUE(std::isnan(relu[0]));
  for (const Tensor& r : {ops::maximum(nan_first, plain), ops::maximum(plain, nan_first),
                          ops::minimum(nan_first, plain), ops::minimum(plain, nan_first)}) {
    const std::vector<float> v = r.to_vector<float>();
    EXPECT_TRUE(std::isnan(v[0])) << v[0];
    EXPECT_TRUE(std::isnan(v[1])) << v[1];
    EXPECT_FALSE(std::isnan(v[2]));
  }
  EXPECT_TRUE(std::isnan(ops::maximum(nan_first, 3.0).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(ops::minimum(nan_first, 3.0).to_vector<float>()[0]));
  for (const Tensor& row : {floats({kNaN, 1.0f, 2.0f}, {1, 3}), floats({1.0f, 2.0f, kNaN}, {1, 3})}) {
    EXPECT_TRUE(std::isnan(ops::max(row).to_vector<float>()[0]));
  }
}

TEST_F(OpEdgesTest, AttentionMasksBroadcastAsDocumented) {
  const std::int64_t b = 2, h = 3, sq = 4, sk = 5, d = 8;
  const Tensor q = device_tensor(device(), testing::random_floats(b * h * sq * d, 1), {b, h, sq, d});
  const Tensor k = device_tensor(device(), testing::random_floats(b * h * sk * d, 2), {b, h, sk, d});
  const Tensor v = device_tensor(device(), testing::random_floats(b * h * sk * d, 3), {b, h, sk, d});
  const std::vector<float> row = {0.0f, -1.0f, 0.5f, -1e9f, 0.25f};
  std::vector<float> full_mask;
  for (std::int64_t i = 0; i < b * h * sq; ++i) full_mask.insert(full_mask.end(), row.begin(), row.end());
  const std::vector<float> want =
      ops::scaled_dot_product_attention(q, k, v, floats(full_mask, {b, h, sq, sk})).to_vector<float>();
  auto repeat = [&](std::int64_t n) {
    std::vector<float> out;
    for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), row.begin(), row.end());
    return out;
  };
  for (const Shape& shape : {Shape{b, 1, 1, sk}, Shape{b, h, 1, sk}, Shape{1, sk}, Shape{sk},
                             Shape{1, 1, sq, sk}, Shape{sq, sk}}) {
    SCOPED_TRACE(fmt::format("mask {}", shape));
    const Tensor mask = floats(repeat(shape.numel() / sk), shape);
    EXPECT_EQ(ops::scaled_dot_product_attention(q, k, v, mask).to_vector<float>(), want);
  }
}

// A query row whose keys are all masked out attends to nothing: zeros, as torch's attention
// gives (not the NaNs of 0 / 0), with a bool or an additive mask, in every float dtype, eager
// and traced; the other rows are unchanged, and a NaN score still gives NaN.
TEST_F(OpEdgesTest, AttentionRowsWithEveryKeyMaskedAreZero) {
  const std::int64_t h = 2, sq = 3, sk = 4, d = 8;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto put = [&](std::uint64_t seed, std::int64_t rows) {
      return device_tensor(device(), testing::random_floats(h * rows * d, seed), {h, rows, d},
                           dtype);
    };
    const Tensor q = put(11, sq), k = put(12, sk), v = put(13, sk);
    // Row 1 sees no key; rows 0 and 2 see keys 0, 2 and all.
    const std::vector<float> keep = {1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    std::vector<float> additive;
    for (float x : keep) additive.push_back(x != 0 ? 0.0f : -kInf);
    const Tensor bool_mask = device_tensor(device(), keep, {sq, sk}, DType::bool_);
    const Tensor add_mask = device_tensor(device(), additive, {sq, sk}, dtype);
    const std::vector<float> got =
        ops::scaled_dot_product_attention(q, k, v, bool_mask).to_vector<float>();
    EXPECT_EQ(ops::scaled_dot_product_attention(q, k, v, add_mask).to_vector<float>(), got);
    // Each row against attention over its own keys alone (row 0: keys 0 and 2).
    const std::vector<float> all = ops::scaled_dot_product_attention(q, k, v).to_vector<float>();
    for (std::int64_t head = 0; head < h; ++head) {
      for (std::int64_t c = 0; c < d; ++c) {
        EXPECT_EQ(got[static_cast<std::size_t>((head * sq + 1) * d + c)], 0.0f) << head;
        EXPECT_EQ(got[static_cast<std::size_t>((head * sq + 2) * d + c)],
                  all[static_cast<std::size_t>((head * sq + 2) * d + c)])
            << head;
      }
    }
    auto traced = make_tracer(
        [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& m) {
          return ops::scaled_dot_product_attention(a, b, c, m);
        },
        device());
    EXPECT_EQ(traced(q, k, v, bool_mask).to_vector<float>(), got);
    // A NaN in a query makes its row NaN still: only rows of -inf scores are zeroed.
    std::vector<float> qv = q.to_vector<float>();
    qv[static_cast<std::size_t>(2 * d)] = kNaN;  // head 0, row 2
    const std::vector<float> nan_row =
        ops::scaled_dot_product_attention(device_tensor(device(), qv, {h, sq, d}, dtype), k, v,
                                          bool_mask)
            .to_vector<float>();
    EXPECT_TRUE(std::isnan(nan_row[static_cast<std::size_t>(2 * d)]));
    EXPECT_EQ(nan_row[static_cast<std::size_t>(d)], 0.0f);
  }
}

// The unary ops torch also runs on integers: neg and square wrap, abs(INT_MIN) is INT_MIN, an
// unsigned abs and the roundings keep the values; out= forms in place too; other unary ops
// refuse integers naming the op.
TEST_F(OpEdgesTest, IntegerUnaryOpsWrapAsTorchs) {
  constexpr std::int64_t kMin = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::vector<std::int64_t> values = {kMin, -7, -1, 0, 1, 46341, kMax};
  auto run = [&](DType dtype, const std::vector<std::int64_t>& v, auto&& op) {
    const Tensor a = Tensor::from_vector<std::int64_t>(v, {static_cast<std::int64_t>(v.size())},
                                                      dtype)
                         .to_device(device());
    return op(a).template to_vector<std::int64_t>();
  };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(run(DType::int32, values, [](const Tensor& a) { return ops::neg(a); }),
            (V{kMin, 7, 1, 0, -1, -46341, -kMax}));
  EXPECT_EQ(run(DType::int32, values, [](const Tensor& a) { return ops::abs(a); }),
            (V{kMin, 7, 1, 0, 1, 46341, kMax}));
  EXPECT_EQ(run(DType::int32, values, [](const Tensor& a) { return ops::relu(a); }),
            (V{0, 0, 0, 0, 1, 46341, kMax}));
  // 46341^2 = 2147488281 wraps to -2147479015; kMax^2 wraps to 1; kMin^2 to 0.
  EXPECT_EQ(run(DType::int32, values, [](const Tensor& a) { return ops::square(a); }),
            (V{0, 49, 1, 0, 1, -2147479015, 1}));
  for (auto* round : {+[](const Tensor& a) { return ops::floor(a); },
                      +[](const Tensor& a) { return ops::ceil(a); },
                      +[](const Tensor& a) { return ops::round(a); },
                      +[](const Tensor& a) { return ops::trunc(a); }}) {
    EXPECT_EQ(run(DType::int32, values, round), values);
  }
  const V big = {std::numeric_limits<std::int64_t>::min(), -5, 5};
  EXPECT_EQ(run(DType::int64, big, [](const Tensor& a) { return ops::abs(a); }),
            (V{std::numeric_limits<std::int64_t>::min(), 5, 5}));
  const V u = {0, 1, 4294967295};
  EXPECT_EQ(run(DType::uint32, u, [](const Tensor& a) { return ops::neg(a); }),
            (V{0, 4294967295, 1}));
  EXPECT_EQ(run(DType::uint32, u, [](const Tensor& a) { return ops::abs(a); }), u);
  // out= forms, in place.
  const Tensor a =
      Tensor::from_vector<std::int64_t>({-3, 4}, {2}, DType::int64).to_device(device());
  ops::neg(a, a);
  EXPECT_EQ(a.to_vector<std::int64_t>(), (V{3, -4}));
  ops::abs(a, a);
  EXPECT_EQ(a.to_vector<std::int64_t>(), (V{3, 4}));
  ops::floor(a, a);
  EXPECT_EQ(a.to_vector<std::int64_t>(), (V{3, 4}));
  auto traced = make_tracer([](const Tensor& x) { return ops::abs(ops::neg(x)); }, device());
  EXPECT_EQ(traced(a).to_vector<std::int64_t>(), (V{3, 4}));
  EXPECT_RETRACE_ERROR((void)ops::exp(a), invalid_argument, "exp: a has dtype int64");
  EXPECT_RETRACE_ERROR((void)ops::neg(empty_of({2}, DType::uint8)), invalid_argument,
                       "neg: a has dtype uint8");
}

TEST_F(OpEdgesTest, IntegerArithmeticHasDefinedResults) {
  auto ints = [&](const std::vector<float>& v) {
    return device_tensor(device(), v, {static_cast<std::int64_t>(v.size())}, DType::int32);
  };
  const float int_min = -2147483648.0f;
  const Tensor a = ints({7, -7, int_min, int_min, 5, 0});
  const Tensor b = ints({2, 2, -1, 1, 0, 0});
  // Truncation toward zero, x / 0 = 0, INT_MIN / -1 = INT_MIN: no SIGFPE, clean under UBSan.
  EXPECT_EQ(ops::div(a, b).to_vector<float>(),
            (std::vector<float>{3, -3, int_min, int_min, 0, 0}));
  EXPECT_EQ(ops::div(a, 0.0).to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ops::div(a, -1.0).to_vector<float>(),
            (std::vector<float>{-7, 7, int_min, int_min, -5, 0}));
  // Overflow wraps modulo 2^32.
  const Tensor big = ints({2147483520.0f, -2147483520.0f});
  EXPECT_EQ(ops::add(big, big).to_vector<float>(), (std::vector<float>{-256, 256}));
  EXPECT_EQ(ops::sub(ints({int_min}), 1.0).to_vector<float>(), (std::vector<float>{2147483647.0f}));
  EXPECT_EQ(ops::mul(ints({65536}), ints({65536})).to_vector<float>(), (std::vector<float>{0}));
  // A fractional or out-of-range scalar is an error, not a silent truncation.
  EXPECT_RETRACE_ERROR((void)ops::div(a, 0.5), invalid_argument,
                       "div: the scalar 0.5 is not a whole number in the range of int32");
  EXPECT_RETRACE_ERROR((void)ops::add(a, 1e10), invalid_argument, "add: the scalar");
  EXPECT_RETRACE_ERROR((void)ops::mul(a, std::nan("")), invalid_argument, "mul: the scalar");
  const Tensor u = device_tensor(device(), {0, 1}, {2}, DType::uint32);
  EXPECT_EQ(ops::sub(u, 1.0).to_vector<float>(), (std::vector<float>{4294967295.0f, 0}));
  EXPECT_RETRACE_ERROR((void)ops::add(u, -1.0), invalid_argument, "range of uint32");
}

TEST_F(OpEdgesTest, TrueDivideGivesFloatsAsPythonsSlash) {
  const float int_min = -2147483648.0f, inf = std::numeric_limits<float>::infinity();
  const Tensor a = device_tensor(device(), {7, -7, int_min, 5, 0, 1}, {6}, DType::int32);
  const Tensor b = device_tensor(device(), {2, 2, -1, 0, 0, 3}, {6}, DType::int32);
  const Tensor q = ops::true_divide(a, b);
  EXPECT_EQ(q.dtype(), DType::float32);
  const std::vector<float> got = q.to_vector<float>();
  EXPECT_EQ(got[0], 3.5f);
  EXPECT_EQ(got[1], -3.5f);
  EXPECT_EQ(got[2], 2147483648.0f);
  EXPECT_EQ(got[3], inf);
  EXPECT_TRUE(std::isnan(got[4]));
  EXPECT_EQ(got[5], 1.0f / 3.0f);
  // A fractional scalar divisor, and broadcasting against a float operand of another width.
  EXPECT_EQ(ops::true_divide(a, 0.5).to_vector<float>()[0], 14.0f);
  const Tensor halves = device_tensor(device(), {2}, {1}, DType::bfloat16);
  const Tensor mixed = ops::true_divide(a, halves);
  EXPECT_EQ(mixed.dtype(), DType::bfloat16);
  EXPECT_EQ(mixed.to_vector<float>()[0], 3.5f);
  EXPECT_EQ(ops::true_divide(device_tensor(device(), {1, 0}, {2}, DType::bool_), 4.0)
                .to_vector<float>(),
            (std::vector<float>{0.25f, 0.0f}));
  // Floats divide as div does; int64 promotes to float32 too.
  const Tensor f = device_tensor(device(), {1, 2}, {2});
  EXPECT_EQ(ops::true_divide(f, 4.0).to_vector<float>(), ops::div(f, 4.0).to_vector<float>());
  EXPECT_EQ(ops::true_divide(device_tensor(device(), {9}, {1}, DType::int64), 2.0).dtype(),
            DType::float32);
  // out= takes the floating result; an integer out is refused by name.
  const Tensor out = ops::full({6}, 0.0, device());
  ops::true_divide(a, b, out);
  EXPECT_EQ(out.to_vector<float>()[0], 3.5f);
  EXPECT_RETRACE_ERROR(ops::true_divide(a, b, a), invalid_argument, "true_divide");
  EXPECT_RETRACE_ERROR((void)ops::true_divide(a, ops::full({4}, 1.0, device(), DType::int32)),
                       invalid_argument, "true_divide");
  EXPECT_RETRACE_ERROR((void)ops::true_divide(Tensor{}, 2.0), invalid_argument,
                       "true_divide: a is a null tensor");
}

// Python's float `//` and `%`, computed exactly in double: float32 operands' fmod is exact, the
// quotient (a - fmod) / b is a whole number exactly representable in double for these ranges,
// and remainder's mod + b (opposite signs, |mod| < |b|) is exact before its one rounding.
double floor_divide_reference(double a, double b) {
  if (b == 0) return a / b;
  const double mod = std::fmod(a, b);
  double q = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) q -= 1;
  return q == 0 ? std::copysign(0.0, a / b) : q;
}
double remainder_reference(double a, double b) {
  const double mod = std::fmod(a, b);
  return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;
}

TEST_F(OpEdgesTest, FloorDivideFmodRemainderMatchPythonOnFloats) {
  // Random operands of mixed signs and magnitudes (quotients below 2^22, where float32 holds
  // every whole number), then the special values.
  std::vector<float> a = testing::random_floats(4000, 71), b = testing::random_floats(4000, 72);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = a[i] * std::ldexp(1.0f, static_cast<int>(i % 13));
    b[i] = b[i] + (b[i] < 0 ? -0.01f : 0.01f);
  }
  const std::vector<float> specials = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -2.5f, 3.0f, 1e-30f,
                                       kInf, -kInf, kNaN, 7.0f, -7.0f, 1e30f};
  for (float x : specials) {
    for (float y : specials) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  const Shape shape{static_cast<std::int64_t>(a.size())};
  const Tensor at = floats(a, shape), bt = floats(b, shape);
  const std::vector<float> q = ops::floor_divide(at, bt).to_vector<float>();
  const std::vector<float> r = ops::remainder(at, bt).to_vector<float>();
  const std::vector<float> f = ops::fmod(at, bt).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto want_q = static_cast<float>(floor_divide_reference(a[i], b[i]));
    const auto want_r = static_cast<float>(remainder_reference(a[i], b[i]));
    const auto want_f = static_cast<float>(std::fmod(static_cast<double>(a[i]), b[i]));
    const auto same = [](float x, float y) {
      return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y) ||
             (std::isnan(x) && std::isnan(y));
    };
    if (std::abs(want_q) < 0x1p22f || !std::isfinite(want_q)) {
      EXPECT_TRUE(same(q[i], want_q)) << a[i] << " // " << b[i] << " = " << q[i] << ", not " << want_q;
    } else {
      EXPECT_NEAR(q[i], want_q, std::abs(want_q) * 0x1p-22f) << a[i] << " // " << b[i];
    }
    EXPECT_TRUE(same(r[i], want_r)) << a[i] << " % " << b[i] << " = " << r[i] << ", not " << want_r;
    EXPECT_TRUE(same(f[i], want_f)) << "fmod(" << a[i] << ", " << b[i] << ") = " << f[i];
  }
  // The three with a scalar, and broadcasting, agree with the tensor forms.
  const Tensor col = floats({-7.5f, 7.5f}, {2, 1});
  const Tensor row = floats({2.0f, -2.0f, 0.5f}, {1, 3});
  EXPECT_EQ(ops::floor_divide(col, row).to_vector<float>(),
            (std::vector<float>{-4, 3, -15, 3, -4, 15}));
  EXPECT_EQ(ops::remainder(col, row).to_vector<float>(),
            (std::vector<float>{0.5f, -1.5f, 0, 1.5f, -0.5f, 0}));
  EXPECT_EQ(ops::fmod(col, -2.0).to_vector<float>(), (std::vector<float>{-1.5f, 1.5f}));
  EXPECT_EQ(ops::remainder(col, -2.0).to_vector<float>(), (std::vector<float>{-1.5f, -0.5f}));
}

TEST_F(OpEdgesTest, FloorDivideFmodRemainderOnIntegersAreDefinedEverywhere) {
  const std::int32_t lo = std::numeric_limits<std::int32_t>::min();
  const std::vector<std::int32_t> a = {7, -7, 7, -7, 6, -6, lo, lo, 5, 0, -1, lo};
  const std::vector<std::int32_t> b = {2, 2, -2, -2, 3, 3, -1, 1, 0, 0, 5, 2};
  const Tensor at = Tensor::from_vector<std::int32_t>(a, {12}, DType::int32).to_device(device());
  const Tensor bt = Tensor::from_vector<std::int32_t>(b, {12}, DType::int32).to_device(device());
  EXPECT_EQ(ops::floor_divide(at, bt).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{3, -4, -4, 3, 2, -2, lo, lo, 0, 0, -1, lo / 2}));
  EXPECT_EQ(ops::remainder(at, bt).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{1, 1, -1, -1, 0, 0, 0, 0, 0, 0, 4, 0}));
  EXPECT_EQ(ops::fmod(at, bt).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{1, -1, 1, -1, 0, 0, 0, 0, 0, 0, -1, 0}));
  // Every remainder satisfies a == floor_divide(a, b) * b + remainder(a, b) (b != 0).
  const std::vector<std::int32_t> q = ops::floor_divide(at, bt).to_vector<std::int32_t>();
  const std::vector<std::int32_t> r = ops::remainder(at, bt).to_vector<std::int32_t>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (b[i] == 0) continue;
    EXPECT_EQ(static_cast<std::int64_t>(q[i]) * b[i] + r[i] - a[i],
              b[i] == -1 && a[i] == lo ? std::int64_t{1} << 32 : 0)
        << a[i] << ", " << b[i];
  }
  // int64 and uint32, scalar divisors.
  const Tensor big = Tensor::from_vector<std::int64_t>({-9, std::numeric_limits<std::int64_t>::min()},
                                                       {2}, DType::int64)
                         .to_device(device());
  EXPECT_EQ(ops::floor_divide(big, 4.0).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{-3, std::numeric_limits<std::int64_t>::min() / 4}));
  EXPECT_EQ(ops::remainder(big, -1.0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 0}));
  const Tensor u = Tensor::from_vector<std::uint32_t>({7, 4294967295u}, {2}, DType::uint32)
                       .to_device(device());
  EXPECT_EQ(ops::remainder(u, 4.0).to_vector<std::uint32_t>(), (std::vector<std::uint32_t>{3, 3}));
  EXPECT_EQ(ops::floor_divide(u, 0.0).to_vector<std::uint32_t>(), (std::vector<std::uint32_t>{0, 0}));
  // A fractional scalar for an integer tensor is refused, naming the op.
  EXPECT_RETRACE_ERROR((void)ops::remainder(at, 2.5), invalid_argument, "remainder: the scalar");
  EXPECT_RETRACE_ERROR((void)ops::floor_divide(at, ops::full({3}, 1.0, device(), DType::int32)),
                       invalid_argument, "floor_divide");
}

TEST_F(OpEdgesTest, FloorDivideAndRemainderIn16BitFloatsRoundOnce) {
  const std::vector<float> a = {-7.5f, 7.5f, 10.25f, -3.0f, 0.0f};
  const std::vector<float> b = {2.0f, -2.0f, 3.0f, 0.75f, -2.0f};
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    const Tensor at = device_tensor(device(), a, {5}, dtype);
    const Tensor bt = device_tensor(device(), b, {5}, dtype);
    EXPECT_EQ(ops::floor_divide(at, bt).to_vector<float>(),
              (std::vector<float>{-4, -4, 3, -4, -0.0f}));
    EXPECT_EQ(ops::remainder(at, bt).to_vector<float>(),
              (std::vector<float>{0.5f, -0.5f, 1.25f, 0, 0}));
  }
}

TEST_F(OpEdgesTest, FloorDivideAndRemainderTraceBitForBit) {
  testing::expect_traced_equals_eager(
      device(),
      [](const Tensor& x) {
        return ops::add(ops::floor_divide(x, 0.37), ops::remainder(ops::mul(x, 5.0), x));
      },
      Shape{3, 65}, 801);
}

TEST_F(OpEdgesTest, ErrorsNameTheOpTheUserCalled) {
  const Tensor a = floats({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_RETRACE_ERROR((void)ops::reshape(a, {4, 2}), invalid_argument, "reshape");
  EXPECT_RETRACE_ERROR((void)ops::permute(a, {0, 0}), invalid_argument, "permute");
  EXPECT_RETRACE_ERROR((void)ops::transpose(a, 0, 5), invalid_argument, "transpose");
  EXPECT_RETRACE_ERROR((void)ops::reshape(a, {-2, -3}), invalid_argument, "reshape: extent 0");
  EXPECT_RETRACE_ERROR((void)ops::slice(a, 4, 0, 1), invalid_argument, "slice");
  EXPECT_RETRACE_ERROR((void)ops::linear(a, floats({1, 2, 3, 4}, {2, 2})), invalid_argument,
                       "linear");
  EXPECT_RETRACE_ERROR((void)ops::matmul(a, a), invalid_argument, "matmul");
}

TEST_F(OpEdgesTest, EveryOpTakesEveryRankAShapeAllows) {
  // Rank 8 broadcasting that cannot be merged into fewer dimensions.
  const Shape sa{2, 1, 2, 1, 2, 1, 2, 1}, sb{1, 2, 1, 2, 1, 2, 1, 2};
  const Tensor a = device_tensor(device(), testing::random_floats(16, 4), sa);
  const Tensor b = device_tensor(device(), testing::random_floats(16, 5), sb);
  const Tensor sum = ops::add(a, b);
  EXPECT_EQ(sum.shape(), Shape({2, 2, 2, 2, 2, 2, 2, 2}));
  const std::vector<float> ha = a.to_vector<float>(), hb = b.to_vector<float>();
  const std::vector<float> got = sum.to_vector<float>();
  for (std::int64_t i = 0; i < 256; ++i) {
    std::int64_t ia = 0, ib = 0;
    for (int d = 0; d < 8; ++d) {
      const std::int64_t bit = (i >> (7 - d)) & 1;
      if (d % 2 == 0) ia = ia * 2 + bit;
      else ib = ib * 2 + bit;
    }
    EXPECT_EQ(got[static_cast<std::size_t>(i)], ha[static_cast<std::size_t>(ia)] + hb[static_cast<std::size_t>(ib)]);
  }
  // Rank-8 permute and a matmul with six batch dimensions.
  const Tensor p = ops::permute(sum, {7, 6, 5, 4, 3, 2, 1, 0});
  EXPECT_EQ(p.to_vector<float>().size(), 256u);
  const Tensor m = ops::matmul(ops::full({2, 1, 2, 1, 2, 1, 3, 4}, 1.0, device()),
                               ops::full({1, 2, 1, 2, 1, 2, 4, 5}, 0.5, device()));
  EXPECT_EQ(m.shape(), Shape({2, 2, 2, 2, 2, 2, 3, 5}));
  for (float v : m.to_vector<float>()) EXPECT_EQ(v, 2.0f);
  // One limit, stated: a ninth dimension is refused by Shape itself.
  EXPECT_RETRACE_ERROR((void)Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), invalid_argument, "8");
}


// numpy's rank-1 matmul: [K] x [K] -> [], [K] x [K, N] -> [N], [M, K] x [K] -> [M], batched too.
TEST_F(OpEdgesTest, MatmulTakesRankOneOperandsAsNumpy) {
  const Tensor v = floats({1, 2, 3}, {3});
  const Tensor m = floats({1, 2, 3, 4, 5, 6}, {3, 2});  // [K=3, N=2]
  const Tensor mt = floats({1, 2, 3, 4, 5, 6}, {2, 3});  // [M=2, K=3]
  const Tensor dot = ops::matmul(v, v);
  EXPECT_EQ(dot.shape(), Shape(std::span<const std::int64_t>{}));
  EXPECT_EQ(dot.to_vector<float>(), (std::vector<float>{14}));
  const Tensor vm = ops::matmul(v, m);
  EXPECT_EQ(vm.shape(), Shape({2}));
  EXPECT_EQ(vm.to_vector<float>(), (std::vector<float>{22, 28}));
  const Tensor mv = ops::matmul(mt, v);
  EXPECT_EQ(mv.shape(), Shape({2}));
  EXPECT_EQ(mv.to_vector<float>(), (std::vector<float>{14, 32}));
  const Tensor batched = ops::matmul(floats({1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, {2, 2, 3}), v);
  EXPECT_EQ(batched.shape(), Shape({2, 2}));
  EXPECT_EQ(batched.to_vector<float>(), (std::vector<float>{1, 2, 3, 6}));
  EXPECT_RETRACE_ERROR((void)ops::matmul(v, m, ops::Transpose::yes), invalid_argument,
                       "matmul: a rank-1 operand cannot be transposed");
  EXPECT_RETRACE_ERROR((void)ops::matmul(v, floats({1, 2}, {2})), invalid_argument,
                       "matmul: inner dimensions differ");
  const Tensor out = floats({0, 0}, {2});
  ops::matmul(v, m, out);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{22, 28}));
}

// The out= forms of matmul, linear, attention, softmax and the norms give the allocating forms'
// bits; softmax and the norms also work in place; an out that aliases what the kernel reads is
// refused; and they trace.
TEST_F(OpEdgesTest, OutFormsOfProductsAndRowOps) {
  auto random = [&](const Shape& shape, std::uint64_t salt) {
    return device_tensor(device(), testing::random_floats(static_cast<std::size_t>(shape.numel()), salt),
                         shape);
  };
  const Tensor a = random({2, 5, 8}, 1), b = random({8, 6}, 2), w = random({6, 8}, 3);
  const Tensor bias = random({6}, 4), gamma = random({8}, 5), beta = random({8}, 6);
  const Tensor q = random({1, 2, 5, 8}, 7), k = random({1, 2, 7, 8}, 8), v = random({1, 2, 7, 4}, 9);
  const Tensor mask = random({7}, 10);
  Tensor out = ops::full({2, 5, 6}, 0.0, device());
  ops::matmul(a, b, out);
  EXPECT_EQ(testing::float_bits(out), testing::float_bits(ops::matmul(a, b)));
  ops::linear(a, w, bias, out);
  EXPECT_EQ(testing::float_bits(out), testing::float_bits(ops::linear(a, w, bias)));
  Tensor attn = ops::full({1, 2, 5, 4}, 0.0, device());
  ops::scaled_dot_product_attention(q, k, v, mask, 0.3, attn);
  EXPECT_EQ(testing::float_bits(attn), testing::float_bits(ops::scaled_dot_product_attention(q, k, v, mask, 0.3)));
  Tensor rows = ops::full({2, 5, 8}, 0.0, device());
  ops::softmax(a, rows);
  EXPECT_EQ(testing::float_bits(rows), testing::float_bits(ops::softmax(a)));
  ops::layer_norm(a, gamma, beta, 1e-5, rows);
  EXPECT_EQ(testing::float_bits(rows), testing::float_bits(ops::layer_norm(a, gamma, beta, 1e-5)));
  ops::rms_norm(a, gamma, 1e-6, rows);
  EXPECT_EQ(testing::float_bits(rows), testing::float_bits(ops::rms_norm(a, gamma, 1e-6)));
  // In place.
  Tensor in_place = a.clone();
  ops::softmax(in_place, in_place);
  EXPECT_EQ(testing::float_bits(in_place), testing::float_bits(ops::softmax(a)));
  in_place = a.clone();
  ops::layer_norm(in_place, gamma, beta, 1e-5, in_place);
  EXPECT_EQ(testing::float_bits(in_place), testing::float_bits(ops::layer_norm(a, gamma, beta, 1e-5)));
  // Refused: aliasing an operand the kernel reads while writing, a wrong shape or dtype.
  Tensor square = random({8, 8}, 11);
  EXPECT_RETRACE_ERROR(ops::matmul(square, square, square), invalid_argument,
                       "matmul: out shares storage with a");
  EXPECT_RETRACE_ERROR(ops::linear(a, w, bias, ops::reshape(w, {1, 6, 8})), invalid_argument,
                       "linear: out is [1, 6, 8] float32 row_major but the result is [2, 5, 6]");
  Tensor w8 = random({8}, 12);
  EXPECT_RETRACE_ERROR(ops::layer_norm(ops::reshape(w8, {1, 8}), w8, {}, 1e-5,
                                       ops::reshape(w8, {1, 8})),
                       invalid_argument, "layer_norm: out shares storage with weight");
  EXPECT_RETRACE_ERROR(ops::scaled_dot_product_attention(q, k, v, {}, std::nullopt, Tensor()),
                       invalid_argument, "scaled_dot_product_attention: out is a null tensor");
  EXPECT_RETRACE_ERROR(ops::softmax(a, ops::full({2, 5, 8}, 0.0, device(), DType::bfloat16)),
                       invalid_argument, "softmax: out is [2, 5, 8] bfloat16");
  // Traced: the out= forms write into the same tensors every replay.
  Tensor traced_out = ops::full({2, 5, 6}, 0.0, device());
  auto tracer = make_tracer(
      [&](const Tensor& x) {
        ops::linear(x, w, bias, traced_out);
        ops::softmax(traced_out, traced_out);
        return traced_out;
      },
      device());
  const std::vector<std::uint32_t> want = testing::float_bits(ops::softmax(ops::linear(a, w, bias)));
  EXPECT_EQ(testing::float_bits(tracer(a)), want);
  EXPECT_EQ(testing::float_bits(tracer(a)), want);
}

}  // namespace
}  // namespace retrace
