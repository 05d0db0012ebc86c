// The bool dtype, comparisons, where and masked_fill: against a reference computed here
// (numpy's rules: broadcasting, NaN unequal to everything, where moving values unchanged), in
// float32, bfloat16, int32 and uint32, with empty and size-1 dimensions; traced == eager; errors.
#include "support.hpp"

#include <bit>
#include <cmath>
#include <functional>
#include <limits>

namespace retrace {
namespace {

using testing::device_tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class OpSelectTest : public testing::DeviceTest {};

// Flat index of `out_index` (row-major in out_shape) in a tensor of `shape` broadcast to it.
std::size_t source_index(const Shape& shape, const Shape& out_shape, std::int64_t flat) {
  std::int64_t index = 0, stride = 1;
  const auto offset = static_cast<std::int64_t>(out_shape.rank() - shape.rank());
  for (auto d = static_cast<std::int64_t>(out_shape.rank()) - 1; d >= 0; --d) {
    const std::int64_t i = flat % out_shape[d];
    flat /= out_shape[d];
    if (d >= offset) {
      const std::int64_t extent = shape[d - offset];
      if (extent != 1) index += i * stride;
      stride *= extent;
    }
  }
  return static_cast<std::size_t>(index);
}

std::vector<float> values_with_specials(std::size_t n, std::uint64_t salt) {
  std::vector<float> v = testing::random_floats(n, salt, -2.0f, 2.0f);
  const float specials[] = {0.0f, -0.0f, 1.0f, kNaN, kInf, -kInf, 0.5f};
  for (std::size_t i = 0; i < v.size(); i += 3) v[i] = specials[(i / 3 + salt) % 7];
  return v;
}

TEST_F(OpSelectTest, ComparisonsFollowNumpy) {
  using Cmp = Tensor (*)(const Tensor&, const Tensor&, QueueId);
  const std::vector<std::tuple<const char*, Cmp, std::function<bool(double, double)>>> ops_list{
      {"eq", &ops::eq, [](double x, double y) { return x == y; }},
      {"ne", &ops::ne, [](double x, double y) { return x != y; }},
      {"lt", &ops::lt, [](double x, double y) { return x < y; }},
      {"le", &ops::le, [](double x, double y) { return x <= y; }},
      {"gt", &ops::gt, [](double x, double y) { return x > y; }},
      {"ge", &ops::ge, [](double x, double y) { return x >= y; }}};
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{4, 1, 5}, {3, 1}}, {{7}, {7}}, {{2, 3}, {}}, {{0, 3}, {1, 3}}, {{1}, {6, 1, 2}}};
  for (DType dtype :
       {DType::float32, DType::bfloat16, DType::float16, DType::int32, DType::uint32}) {
    std::uint64_t salt = 0;
    for (const auto& [sa, sb] : shapes) {
      auto a = values_with_specials(static_cast<std::size_t>(sa.numel()), ++salt);
      auto b = values_with_specials(static_cast<std::size_t>(sb.numel()), ++salt);
      if (!dtype_info(dtype).is_floating) {  // whole numbers, with equal pairs
        for (float& x : a) x = std::isfinite(x) ? std::abs(std::round(x * 2)) : 3.0f;
        for (float& x : b) x = std::isfinite(x) ? std::abs(std::round(x * 2)) : 3.0f;
      }
      const Tensor ta = ops::typecast(device_tensor(device(), a, sa), dtype);
      const Tensor tb = ops::typecast(device_tensor(device(), b, sb), dtype);
      const std::vector<float> av = ops::typecast(ta, DType::float32).to_vector<float>();
      const std::vector<float> bv = ops::typecast(tb, DType::float32).to_vector<float>();
      for (const auto& [name, op, ref] : ops_list) {
        const Tensor got = op(ta, tb, kDefaultQueue);
        ASSERT_EQ(got.dtype(), DType::bool_);
        const std::vector<std::uint8_t> g = got.to_vector<std::uint8_t>();
        ASSERT_EQ(static_cast<std::int64_t>(g.size()), got.shape().numel());
        for (std::int64_t i = 0; i < got.shape().numel(); ++i) {
          const double x = av[source_index(sa, got.shape(), i)];
          const double y = bv[source_index(sb, got.shape(), i)];
          ASSERT_EQ(g[static_cast<std::size_t>(i)], ref(x, y) ? 1 : 0)
              << fmt::format("{} {} {} vs {} at {}: {}, {}", name, dtype, sa, sb, i, x, y);
        }
      }
    }
  }
  // Broadcast shapes, the scalar forms and out=.
  const Tensor x = device_tensor(device(), {1.0f, kNaN, -3.0f, 0.1f}, {2, 2});
  EXPECT_EQ(ops::lt(x, ops::full({1, 2}, 0.0, device())).shape(), (Shape{2, 2}));
  EXPECT_EQ(ops::gt(x, 0.0).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(ops::eq(x, 0.1).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(ops::ne(x, x).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 1, 0, 0}));
  Tensor out = Tensor::empty({2, 2}, DType::bool_, device());
  ops::ge(x, x, out);
  EXPECT_EQ(out.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{1, 0, 1, 1}));
  const Tensor i = ops::typecast(device_tensor(device(), {-2, 7}, {2}), DType::int32);
  EXPECT_EQ(ops::le(i, 7.0).to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{1, 1}));
  EXPECT_RETRACE_ERROR((void)ops::lt(i, 2.5), invalid_argument,
                       "lt: the scalar 2.5 is not a whole number in the range of int32");
  EXPECT_RETRACE_ERROR((void)ops::lt(x, i), invalid_argument, "lt: a has dtype float32 but b has int32");
  EXPECT_RETRACE_ERROR((void)ops::eq(x, ops::full({3}, 0.0, device())), invalid_argument,
                       "eq: b of shape [3] does not broadcast with the others");
  EXPECT_RETRACE_ERROR(ops::eq(x, x, Tensor::empty({2, 2}, DType::uint8, device())),
                       invalid_argument, "eq: out must be bool [2, 2], got uint8 [2, 2]");
}

TEST_F(OpSelectTest, WhereMovesValuesUnchanged) {
  const std::vector<std::tuple<Shape, Shape, Shape>> shapes{
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, {{3, 1}, {1, 4}, {}}, {{4}, {2, 1, 4}, {1}},
      {{0, 2}, {1, 2}, {2}}, {{1}, {5}, {1}}};
  std::uint64_t salt = 100;
  for (DType dtype :
       {DType::float32, DType::bfloat16, DType::float16, DType::int32, DType::uint8}) {
    for (const auto& [sc, sa, sb] : shapes) {
      std::vector<float> c = testing::random_floats(static_cast<std::size_t>(sc.numel()), ++salt);
      for (float& v : c) v = v > 0 ? 1.0f : 0.0f;
      auto a = values_with_specials(static_cast<std::size_t>(sa.numel()), ++salt);
      auto b = values_with_specials(static_cast<std::size_t>(sb.numel()), ++salt);
      if (!dtype_info(dtype).is_floating) {
        for (float& x : a) x = std::isfinite(x) ? std::abs(std::round(x * 9)) : 4.0f;
        for (float& x : b) x = std::isfinite(x) ? std::abs(std::round(x * 9)) : 5.0f;
      }
      const Tensor tc = ops::typecast(device_tensor(device(), c, sc), DType::bool_);
      const Tensor ta = ops::typecast(device_tensor(device(), a, sa), dtype);
      const Tensor tb = ops::typecast(device_tensor(device(), b, sb), dtype);
      const Tensor got = ops::where(tc, ta, tb);
      ASSERT_EQ(got.dtype(), dtype);
      const auto gv = ops::typecast(got, DType::float32).to_vector<float>();
      const auto av = ops::typecast(ta, DType::float32).to_vector<float>();
      const auto bv = ops::typecast(tb, DType::float32).to_vector<float>();
      for (std::int64_t k = 0; k < got.shape().numel(); ++k) {
        const float want = c[source_index(sc, got.shape(), k)] != 0
                               ? av[source_index(sa, got.shape(), k)]
                               : bv[source_index(sb, got.shape(), k)];
        ASSERT_EQ(std::bit_cast<std::uint32_t>(gv[static_cast<std::size_t>(k)]),
                  std::bit_cast<std::uint32_t>(want))
            << fmt::format("{} {} {} {} at {}", dtype, sc, sa, sb, k);
      }
    }
  }
  const Tensor cond = ops::gt(device_tensor(device(), {1, -1, 2}, {3}), 0.0);
  const Tensor a = device_tensor(device(), {1, 2, 3}, {3});
  Tensor out = Tensor::empty({3}, DType::float32, device());
  ops::where(cond, a, ops::neg(a), out);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, -2, 3}));
  EXPECT_RETRACE_ERROR((void)ops::where(a, a, a), invalid_argument,
                       "where: cond must be a bool tensor (a comparison's result, or typecast to "
                       "bool), got float32");
  EXPECT_RETRACE_ERROR((void)ops::where(cond, a, ops::typecast(a, DType::bfloat16)),
                       invalid_argument, "where: a has dtype float32 but b has bfloat16");
  auto other = testing::open_test_device({DeviceId{1}});
  EXPECT_RETRACE_ERROR((void)ops::where(cond, a, device_tensor(*other, {1, 2, 3}, {3})),
                       invalid_argument, "where: cond is on");
}

TEST_F(OpSelectTest, MaskedFillAndBoolTypecasts) {
  const Tensor scores = device_tensor(device(), {0.5f, 1.5f, -2.0f, 3.0f, 0.0f, 1.0f}, {2, 3});
  const Tensor keep = ops::typecast(device_tensor(device(), {1, 1, 0}, {3}), DType::bool_);
  const Tensor masked = ops::masked_fill(scores, ops::eq(keep, 0.0), -kInf);
  EXPECT_EQ(masked.to_vector<float>(),
            (std::vector<float>{0.5f, 1.5f, -kInf, 3.0f, 0.0f, -kInf}));
  // A key-padding mask for attention: softmax gives the padded keys weight 0.
  const std::vector<float> p = ops::softmax(masked).to_vector<float>();
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(p[5], 0.0f);
  EXPECT_RETRACE_ERROR((void)ops::masked_fill(scores, ops::full({4, 2, 3}, 1.0, device(), DType::bool_), 0.0),
                       invalid_argument, "masked_fill: mask [4, 2, 3] must broadcast to a's shape [2, 3]");
  EXPECT_RETRACE_ERROR((void)ops::masked_fill(ops::typecast(scores, DType::int32), keep, 0.5),
                       invalid_argument, "masked_fill: the scalar 0.5 is not a whole number");
  // Typecasts to bool: nonzero (NaN, -0 is zero) is true; back to float gives 0 and 1.
  const Tensor special = device_tensor(device(), {0.0f, -0.0f, kNaN, 0.25f, -kInf}, {5});
  const Tensor flags = ops::typecast(special, DType::bool_);
  EXPECT_EQ(flags.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(ops::typecast(flags, DType::float32).to_vector<float>(),
            (std::vector<float>{0, 0, 1, 1, 1}));
  EXPECT_EQ(ops::full({2}, 7.0, device(), DType::bool_).to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{1, 1}));
  EXPECT_EQ(dtype_name(DType::bool_), "bool");
  EXPECT_RETRACE_ERROR((void)ops::add(flags, flags), invalid_argument, "add");
  // Empty.
  EXPECT_EQ(ops::masked_fill(ops::full({0, 3}, 1.0, device()), keep, 2.0).shape(), (Shape{0, 3}));
}

// A boolean attention mask (true: the key takes part) gives the same bits as the additive mask
// of 0 and -inf it stands for, broadcast the same ways (key padding [B, 1, 1, Sk], per query).
TEST_F(OpSelectTest, AttentionTakesABooleanMask) {
  const Tensor q = device_tensor(device(), testing::random_floats(2 * 2 * 3 * 4, 1), {2, 2, 3, 4});
  const Tensor k = device_tensor(device(), testing::random_floats(2 * 2 * 5 * 4, 2), {2, 2, 5, 4});
  const Tensor v = device_tensor(device(), testing::random_floats(2 * 2 * 5 * 4, 3), {2, 2, 5, 4});
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::vector<float>, Shape>> masks{
      {{1, 1, 1, 0, 0, 1, 1, 1, 1, 0}, {2, 1, 1, 5}},  // key padding
      {{1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0}, {3, 5}}};
  for (const auto& [bits, shape] : masks) {
    std::vector<float> additive;
    for (float b : bits) additive.push_back(b != 0.0f ? 0.0f : -inf);
    const Tensor as_bool = device_tensor(device(), bits, shape, DType::bool_);
    const Tensor as_add = device_tensor(device(), additive, shape);
    const std::vector<float> got =
        ops::scaled_dot_product_attention(q, k, v, as_bool).to_vector<float>();
    const std::vector<float> want =
        ops::scaled_dot_product_attention(q, k, v, as_add).to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << i;
    }
  }
}

// argmax: the first maximum along any dimension, the first NaN when a row has one (torch), int32
// indices, keepdim; ties and infinities; an empty reduced dimension is an error.
TEST_F(OpSelectTest, ArgmaxPointsAtTheFirstMaximum) {
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    std::vector<float> v = testing::random_floats(4 * 5 * 6, 21, -3.0f, 3.0f);
    for (std::size_t i = 0; i < v.size(); i += 7) v[i] = 2.5f;  // ties
    v[13] = kNaN;
    v[40] = kInf;
    v[41] = kInf;
    v[77] = -kInf;
    const Shape shape{4, 5, 6};
    const Tensor a = device_tensor(device(), v, shape, dtype);
    std::vector<double> stored;
    for (float x : a.to_vector<float>()) stored.push_back(x);
    const std::int64_t ext[3] = {4, 5, 6};
    for (std::int64_t dim = 0; dim < 3; ++dim) {
      for (ops::KeepDim keep : {ops::KeepDim::no, ops::KeepDim::yes}) {
        const Tensor got = ops::argmax(a, dim - (dim == 2 ? 3 : 0), keep);
        EXPECT_EQ(got.dtype(), DType::int32);
        std::vector<std::int64_t> out_dims;
        for (std::int64_t d = 0; d < 3; ++d) {
          if (d != dim) out_dims.push_back(ext[d]);
          else if (keep == ops::KeepDim::yes) out_dims.push_back(1);
        }
        EXPECT_EQ(got.shape(), Shape(std::span<const std::int64_t>(out_dims)));
        const std::vector<std::int32_t> idx = got.to_vector<std::int32_t>();
        const std::int64_t stride = dim == 0 ? 30 : dim == 1 ? 6 : 1;
        std::size_t at = 0;
        for (std::int64_t i = 0; i < 4; ++i) {
          for (std::int64_t j = 0; j < 5; ++j) {
            for (std::int64_t k = 0; k < 6; ++k) {
              const std::int64_t pos[3] = {i, j, k};
              if (pos[dim] != 0) continue;
              const std::int64_t base = i * 30 + j * 6 + k;
              std::int64_t best = 0;
              double top = stored[static_cast<std::size_t>(base)];
              for (std::int64_t c = 1; c < ext[dim] && !std::isnan(top); ++c) {
                const double x = stored[static_cast<std::size_t>(base + c * stride)];
                if (x > top || std::isnan(x)) {
                  top = x;
                  best = c;
                }
              }
              EXPECT_EQ(idx[at++], best) << dtype_name(dtype) << " dim " << dim;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(ops::argmax(ops::full({0, 3}, 1.0, device())).shape(), (Shape{0}));
  try {
    (void)ops::argmax(ops::full({3, 0}, 1.0, device()));
    ADD_FAILURE() << "argmax of an empty row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argmax: the reduced dimension of [3, 0] is empty"),
              std::string::npos)
        << e.what();
  }
  auto f = [](const Tensor& x) { return ops::argmax(ops::add(x, 1.0), 0); };
  auto tracer = make_tracer(f, device());
  const Tensor x = device_tensor(device(), testing::random_floats(24, 5), {4, 6});
  (void)tracer(x);
  const Tensor x2 = device_tensor(device(), testing::random_floats(24, 6), {4, 6});
  EXPECT_EQ(tracer(x2).to_vector<std::int32_t>(), f(x2).to_vector<std::int32_t>());
}

TEST_F(OpSelectTest, TracedEqualsEager) {
  auto f = [](const Tensor& x, const Tensor& y) {
    const Tensor m = ops::gt(x, y);
    return ops::add(ops::where(m, x, y), ops::masked_fill(x, ops::le(x, 0.0), 0.0));
  };
  const Tensor x = device_tensor(device(), testing::random_floats(60, 7), {3, 20});
  const Tensor y = device_tensor(device(), testing::random_floats(20, 8), {20});
  auto tracer = make_tracer(f, device());
  (void)tracer(x, y);
  const Tensor x2 = device_tensor(device(), testing::random_floats(60, 9), {3, 20});
  const std::vector<float> replayed = tracer(x2, y).to_vector<float>();
  const std::vector<float> eager = f(x2, y).to_vector<float>();
  ASSERT_EQ(replayed.size(), eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(replayed[i]), std::bit_cast<std::uint32_t>(eager[i]));
  }
  EXPECT_EQ(tracer.stats().replays, 1u);
}

// --- embedding, index_select, gather ------------------------------------------------------------

Tensor int_tensor(Device& device, const std::vector<std::int32_t>& values, const Shape& shape) {
  return Tensor::from_vector<std::int32_t>(values, shape, DType::int32).to_device(device);
}

// Distinct values per element (0, 1, 2, ...), exact in every dtype up to 256 elements.
Tensor counting(Device& device, const Shape& shape, DType dtype) {
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 256);
  return ops::typecast(device_tensor(device, v, shape), dtype);
}

std::vector<double> values_of(const Tensor& t) {
  const std::vector<float> f = ops::typecast(t, DType::float32).to_vector<float>();
  return {f.begin(), f.end()};
}

TEST_F(OpSelectTest, EmbeddingTakesRowsOfTheTable) {
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16, DType::int32,
                      DType::uint8, DType::bool_}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor table = dtype == DType::bool_
                             ? ops::gt(counting(device(), {6, 3}, DType::float32), 8.0)
                             : counting(device(), {6, 3}, dtype);
    const std::vector<double> t = values_of(table);
    for (const Shape& shape : {Shape{}, Shape{5}, Shape{2, 3}, Shape{0}, Shape{1, 1, 2}}) {
      std::vector<std::int32_t> idx(static_cast<std::size_t>(shape.numel()));
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>((i * 5 + 1) % 6);
      const Tensor out = ops::embedding(table, int_tensor(device(), idx, shape));
      std::vector<std::int64_t> want_shape(shape.dims().begin(), shape.dims().end());
      want_shape.push_back(3);
      ASSERT_EQ(out.shape(), Shape(std::span<const std::int64_t>(want_shape)));
      ASSERT_EQ(out.dtype(), table.dtype());
      std::vector<double> want;
      for (std::int32_t r : idx) {
        for (int c = 0; c < 3; ++c) want.push_back(t[static_cast<std::size_t>(r * 3 + c)]);
      }
      EXPECT_EQ(values_of(out), want) << fmt::format("{}", shape);
    }
  }
}

TEST_F(OpSelectTest, IndicesThatAreViewsAreReadThroughTheirStrides) {
  // Every other index of a list, a column of a matrix of indices and an expanded index: views
  // whose one-dimensional reshape is a view too, not a dense copy.
  const Tensor table = counting(device(), {6, 3}, DType::float32);
  const std::vector<double> t = values_of(table);
  const Tensor list = int_tensor(device(), {5, 0, 4, 1, 3, 2, 2, 3}, {8});
  const Tensor matrix = int_tensor(device(), {1, 5, 2, 4, 3, 0}, {3, 2});
  const Tensor one = int_tensor(device(), {4}, {1});
  const std::vector<std::pair<Tensor, std::vector<std::int32_t>>> cases = {
      {ops::slice(list, 0, 0, 8, 2), {5, 4, 3, 2}},
      {ops::slice(list, 0, 1, 8, 3), {0, 3, 3}},
      {ops::slice(matrix, 1, 1, 2), {5, 4, 0}},
      {ops::transpose(matrix, 0, 1), {1, 2, 3, 5, 4, 0}},
      {ops::expand(one, {3}), {4, 4, 4}},
  };
  for (const auto& [index, rows] : cases) {
    SCOPED_TRACE(index.to_string());
    std::vector<double> want;
    for (std::int32_t r : rows) {
      for (int c = 0; c < 3; ++c) want.push_back(t[static_cast<std::size_t>(r * 3 + c)]);
    }
    EXPECT_EQ(values_of(ops::embedding(table, index)), want);
    EXPECT_EQ(values_of(ops::index_select(table, 0, ops::reshape(index, {-1}))), want);
    EXPECT_EQ(values_of(ops::index_select(table, 0, ops::contiguous(ops::reshape(index, {-1})))),
              want);
  }
  // Along the columns (dim 1 of the table): every other index of [2, 0, 1, 1, 0, 2].
  const Tensor column_index = ops::slice(int_tensor(device(), {2, 0, 1, 1, 0, 2}, {6}), 0, 0, 6, 2);
  std::vector<double> want;
  for (int r = 0; r < 6; ++r) {
    for (int c : {2, 1, 0}) want.push_back(t[static_cast<std::size_t>(r * 3 + c)]);
  }
  EXPECT_EQ(values_of(ops::index_select(table, 1, column_index)), want);
}

TEST_F(OpSelectTest, IndexSelectAndGatherAlongEveryDimension) {
  const Shape shape{3, 4, 5};
  const Tensor a = counting(device(), shape, DType::float32);
  const std::vector<double> av = values_of(a);
  auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
    return av[static_cast<std::size_t>((i * 4 + j) * 5 + k)];
  };
  for (std::int64_t dim = -3; dim < 3; ++dim) {
    const std::int64_t d = dim < 0 ? dim + 3 : dim;
    SCOPED_TRACE(fmt::format("dim {}", dim));
    // index_select: repeated and reordered indices, and an empty index.
    const std::vector<std::int32_t> pick{2, 0, 2, 1};
    const Tensor sel = ops::index_select(a, dim, int_tensor(device(), pick, {4}));
    std::vector<std::int64_t> dims{3, 4, 5};
    dims[static_cast<std::size_t>(d)] = 4;
    ASSERT_EQ(sel.shape(), Shape(std::span<const std::int64_t>(dims)));
    std::vector<double> want;
    for (std::int64_t i = 0; i < dims[0]; ++i) {
      for (std::int64_t j = 0; j < dims[1]; ++j) {
        for (std::int64_t k = 0; k < dims[2]; ++k) {
          std::int64_t ix[3] = {i, j, k};
          ix[d] = pick[static_cast<std::size_t>(ix[d])];
          want.push_back(at(ix[0], ix[1], ix[2]));
        }
      }
    }
    EXPECT_EQ(values_of(sel), want);
    dims[static_cast<std::size_t>(d)] = 0;
    EXPECT_EQ(ops::index_select(a, dim, int_tensor(device(), {}, {0})).shape(),
              Shape(std::span<const std::int64_t>(dims)));
    // gather: an index smaller than a in the other dimensions, larger along dim.
    std::vector<std::int64_t> ishape{2, 3, 4};
    ishape[static_cast<std::size_t>(d)] = 6;
    const Shape is{std::span<const std::int64_t>(ishape)};
    std::vector<std::int32_t> idx(static_cast<std::size_t>(is.numel()));
    for (std::size_t n = 0; n < idx.size(); ++n) {
      idx[n] = static_cast<std::int32_t>((n * 7 + 3) % static_cast<std::size_t>(shape[static_cast<std::size_t>(d)]));
    }
    const Tensor g = ops::gather(a, dim, int_tensor(device(), idx, is));
    ASSERT_EQ(g.shape(), is);
    want.clear();
    std::size_t n = 0;
    for (std::int64_t i = 0; i < ishape[0]; ++i) {
      for (std::int64_t j = 0; j < ishape[1]; ++j) {
        for (std::int64_t k = 0; k < ishape[2]; ++k, ++n) {
          std::int64_t ix[3] = {i, j, k};
          ix[d] = idx[n];
          want.push_back(at(ix[0], ix[1], ix[2]));
        }
      }
    }
    EXPECT_EQ(values_of(g), want);
  }
  // Size-1 and empty tensors.
  const Tensor one = counting(device(), {1, 1}, DType::float16);
  EXPECT_EQ(values_of(ops::gather(one, 1, int_tensor(device(), {0, 0}, {1, 2}))),
            (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(ops::gather(a, 0, int_tensor(device(), {}, {0, 4, 5})).shape(), (Shape{0, 4, 5}));
}

TEST_F(OpSelectTest, IndexedReadsReplayWithNewIndices) {
  const Tensor table = device_tensor(device(), testing::random_floats(40, 3), {10, 4});
  auto f = [&](const Tensor& idx) {
    return ops::add(ops::embedding(table, idx), ops::mul(ops::index_select(table, 0, idx), 2.0));
  };
  auto tracer = make_tracer(f, device());
  (void)tracer(int_tensor(device(), {1, 2, 3, 4}, {4}));
  const Tensor idx2 = int_tensor(device(), {9, 0, 9, 5}, {4});
  const std::vector<float> replayed = tracer(idx2).to_vector<float>();
  const std::vector<float> eager = f(idx2).to_vector<float>();
  ASSERT_EQ(replayed.size(), eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(replayed[i]), std::bit_cast<std::uint32_t>(eager[i]));
  }
  EXPECT_EQ(tracer.stats().replays, 1u);
}

TEST_F(OpSelectTest, IndexErrorsNameTheOpAndTheArgument) {
  const Tensor a = counting(device(), {4, 3}, DType::float32);
  const Tensor idx = int_tensor(device(), {0, 1}, {2});
  EXPECT_RETRACE_ERROR((void)ops::embedding(a, ops::typecast(idx, DType::float32)),
                       invalid_argument, "embedding: index must be int32 or int64, got float32");
  EXPECT_RETRACE_ERROR((void)ops::embedding(ops::reshape(a, {12}), idx), invalid_argument,
                       "embedding: weight must be [num_embeddings, embedding_dim], got [12]");
  EXPECT_RETRACE_ERROR((void)ops::index_select(a, 2, idx), invalid_argument, "index_select");
  EXPECT_RETRACE_ERROR((void)ops::index_select(a, 0, ops::reshape(idx, {1, 2})),
                       invalid_argument, "index_select: index must be one-dimensional");
  EXPECT_RETRACE_ERROR((void)ops::gather(a, 0, idx), invalid_argument,
                       "gather: index must have a's rank (2)");
  EXPECT_RETRACE_ERROR((void)ops::gather(a, 0, int_tensor(device(), {0, 0, 0, 0}, {1, 4})),
                       invalid_argument, "gather: index [1, 4] is larger than a [4, 3] along dimension 1");
  EXPECT_RETRACE_ERROR((void)ops::embedding(ops::to_layout(a, Layout::tile), idx),
                       invalid_argument, "embedding: weight must be row-major, got tile");
  auto other = testing::open_test_device({.id = DeviceId{3}});
  EXPECT_RETRACE_ERROR((void)ops::embedding(a, idx.to_device(*other)), invalid_argument,
                       "embedding");
}

// An index outside the table fails the queue at the next synchronisation, naming the op, the
// index element and its value; nothing is read out of bounds and the queue works afterwards.
TEST_F(OpSelectTest, AnOutOfRangeIndexFailsTheQueueNamingIt) {
  const Tensor table = counting(device(), {10, 4}, DType::float32);
  for (std::int32_t bad : {10, -1, 2147483647}) {
    SCOPED_TRACE(bad);
    Tensor out = ops::embedding(table, int_tensor(device(), {3, 0, bad, 9}, {4}));
    EXPECT_RETRACE_ERROR(device().synchronize(), device_error,
                         fmt::format("op 'embedding' failed on queue 0 of {} (eager): index "
                                     "element 2 is {}, outside [0, 10)",
                                     device().name(), bad));
    EXPECT_NO_THROW(device().synchronize());
  }
  // Inside a trace: each replay checks the indices it is given.
  auto tracer = make_tracer([&](const Tensor& idx) { return ops::gather(table, 0, idx); },
                            device());
  (void)tracer(int_tensor(device(), {1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}));
  EXPECT_RETRACE_ERROR((void)tracer(int_tensor(device(), {1, 2, 3, 4, 5, 6, 7, 12}, {2, 4})),
                       device_error, "index element 7 is 12, outside [0, 10)");
  device().synchronize();
  const Tensor good = int_tensor(device(), {9, 9, 9, 9, 0, 0, 0, 0}, {2, 4});
  EXPECT_EQ(tracer(good).to_vector<float>(), ops::gather(table, 0, good).to_vector<float>());
}

// --- logical ops ---------------------------------------------------------------------------------

std::vector<bool> truths(const std::vector<float>& v) {
  std::vector<bool> out;
  for (float x : v) out.push_back(x != 0.0f || std::isnan(x));  // NaN is true, as torch
  return out;
}

std::vector<bool> bools_of(const Tensor& t) {
  std::vector<bool> out;
  for (std::uint8_t v : t.to_vector<std::uint8_t>()) {
    EXPECT_LE(v, 1u);
    out.push_back(v != 0);
  }
  return out;
}

TEST_F(OpSelectTest, LogicalOpsFollowTorch) {
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{2, 3}, {2, 3}}, {{4, 1}, {3}}, {{}, {5}}, {{0, 2}, {1, 2}}};
  std::uint64_t salt = 300;
  for (DType dtype : {DType::bool_, DType::float32, DType::float16, DType::int32}) {
    for (const auto& [sa, sb] : shapes) {
      SCOPED_TRACE(fmt::format("{} {} {}", dtype, sa, sb));
      auto a = values_with_specials(static_cast<std::size_t>(sa.numel()), ++salt);
      auto b = values_with_specials(static_cast<std::size_t>(sb.numel()), ++salt);
      for (auto* v : {&a, &b}) {
        for (float& x : *v) {
          if (dtype != DType::float32 && dtype != DType::float16) x = std::isfinite(x) ? std::round(x) : 1.0f;
          if (dtype == DType::bool_) x = x != 0.0f ? 1.0f : 0.0f;
        }
      }
      const Tensor ta = ops::typecast(device_tensor(device(), a, sa), dtype);
      const Tensor tb = ops::typecast(device_tensor(device(), b, sb), dtype);
      const std::vector<bool> av = truths(a), bv = truths(b);
      const Shape out_shape = ops::logical_and(ta, tb).shape();
      std::vector<bool> want_and, want_or, want_xor;
      for (std::int64_t i = 0; i < out_shape.numel(); ++i) {
        const bool x = av[source_index(sa, out_shape, i)];
        const bool y = bv[source_index(sb, out_shape, i)];
        want_and.push_back(x && y);
        want_or.push_back(x || y);
        want_xor.push_back(x != y);
      }
      EXPECT_EQ(bools_of(ops::logical_and(ta, tb)), want_and);
      EXPECT_EQ(bools_of(ops::logical_or(ta, tb)), want_or);
      EXPECT_EQ(bools_of(ops::logical_xor(ta, tb)), want_xor);
      std::vector<bool> want_not;
      for (bool x : av) want_not.push_back(!x);
      const Tensor n = ops::logical_not(ta);
      EXPECT_EQ(n.dtype(), DType::bool_);
      EXPECT_EQ(n.shape(), sa);
      EXPECT_EQ(bools_of(n), want_not);
    }
  }
  // Mixed dtypes are fine (each operand becomes bool); devices must agree, named by the op.
  const Tensor f = device_tensor(device(), {0.0f, 2.0f}, {2});
  const Tensor i = ops::typecast(device_tensor(device(), {3.0f, 0.0f}, {2}), DType::int32);
  EXPECT_EQ(bools_of(ops::logical_or(f, i)), (std::vector<bool>{true, true}));
  auto other = testing::open_test_device({.id = DeviceId{4}});
  EXPECT_RETRACE_ERROR((void)ops::logical_and(f, i.to_device(*other)), invalid_argument,
                       "logical_and: a is on");
  auto traced = make_tracer([](const Tensor& x, const Tensor& y) {
    return ops::logical_xor(ops::logical_not(x), ops::logical_and(x, y));
  }, device());
  (void)traced(f, i);
  const Tensor f2 = device_tensor(device(), {5.0f, 0.0f}, {2});
  EXPECT_EQ(bools_of(traced(f2, i)),
            bools_of(ops::logical_xor(ops::logical_not(f2), ops::logical_and(f2, i))));
}

}  // namespace
}  // namespace retrace
