// Strided views: permute, transpose, slice, split, chunk and expand return views of their input's
// storage. Their elements are checked against index arithmetic on the host, every op is checked
// to give on a view exactly what it gives on a dense copy of it (bit for bit, random shapes with
// empty and size-1 dimensions, the three float dtypes), and writes through views, out= rules and
// traces over views are checked.
#include "support.hpp"

#include <bit>
#include <cstring>
#include <functional>
#include <random>

namespace retrace {
namespace {

using testing::device_tensor;
using testing::random_floats;

// The elements of a view of `base` (row-major host values), in the view's row-major order.
std::vector<float> host_view(const std::vector<float>& base, const Shape& shape,
                             std::span<const std::int64_t> strides, std::int64_t offset) {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(shape.numel()));
  std::vector<std::int64_t> index(shape.rank(), 0);
  for (std::int64_t n = 0; n < shape.numel(); ++n) {
    std::int64_t at = offset;
    for (std::size_t d = 0; d < shape.rank(); ++d) at += index[d] * strides[d];
    out.push_back(base[static_cast<std::size_t>(at)]);
    for (std::size_t d = shape.rank(); d-- > 0;) {
      if (++index[d] < shape.dims()[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// Raw bytes of a tensor's logical elements, for bit-for-bit comparisons in any dtype.
std::vector<std::uint8_t> bits(const Tensor& t) {
  const Tensor host = t.to_host();
  const auto bytes = host.host_bytes();
  return {reinterpret_cast<const std::uint8_t*>(bytes.data()),
          reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size()};
}

// Two products of the same operands in another order of summation: each element within a few
// roundings of the output type, relative to the largest output (at least 1).
void expect_close_products(const Tensor& got, const Tensor& want, DType dtype) {
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  ASSERT_EQ(g.size(), w.size());
  const double eps = dtype == DType::float32 ? 0x1p-23 : dtype == DType::float16 ? 0x1p-10 : 0x1p-7;
  double scale = 0.0;
  for (float v : w) scale = std::max(scale, std::abs(static_cast<double>(v)));
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], w[i], 4.0 * eps * std::max(scale, 1.0)) << "element " << i;
  }
}

class ViewTest : public testing::DeviceTest {
 protected:
  Tensor floats(const std::vector<float>& values, const Shape& shape,
                DType dtype = DType::float32) {
    return device_tensor(device(), values, shape, dtype);
  }
  Tensor iota(const Shape& shape) {
    std::vector<float> v(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    return floats(v, shape);
  }
  std::uint64_t commands() { return device().stats().commands_executed; }
};

TEST_F(ViewTest, ShapeOpsReturnViewsWithoutCommands) {
  const Tensor a = iota({2, 3, 4});
  device().synchronize();
  const std::uint64_t before = commands();
  const Tensor p = ops::permute(a, {2, 0, 1});
  const Tensor t = ops::transpose(a, 0, 2);
  const Tensor s = ops::slice(a, 2, 1, 4, 2);
  const std::vector<Tensor> c = ops::chunk(a, 2, 1);
  const Tensor e = ops::expand(ops::slice(a, 1, 0, 1), {5, 2, 3, 4});
  EXPECT_EQ(commands(), before);
  for (const Tensor* v : {&p, &t, &s, &c[0], &c[1], &e}) EXPECT_EQ(v->buffer(), a.buffer());

  EXPECT_EQ(p.shape(), Shape({4, 2, 3}));
  EXPECT_EQ(std::vector<std::int64_t>(p.strides().begin(), p.strides().end()),
            (std::vector<std::int64_t>{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_EQ(std::vector<std::int64_t>(s.strides().begin(), s.strides().end()),
            (std::vector<std::int64_t>{12, 4, 2}));
  EXPECT_EQ(c[1].storage_offset(), 8);
  EXPECT_EQ(e.strides()[0], 0);
  // A slice along the first dimension is contiguous: only its offset moves.
  const Tensor rows = ops::slice(a, 0, 1, 2);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.storage_offset(), 12);
  EXPECT_EQ(rows.address(), a.address() + 12 * sizeof(float));
  EXPECT_NE(p.to_string().find("strides [1, 12, 4]"), std::string::npos) << p.to_string();

  const std::vector<float> base = a.to_vector<float>();
  for (const Tensor* v : {&p, &t, &s, &c[0], &c[1], &e, &rows}) {
    EXPECT_EQ(v->to_vector<float>(),
              host_view(base, v->shape(), v->strides(), v->storage_offset()))
        << v->to_string();
  }
}

TEST_F(ViewTest, WritesToTheStorageShowThroughViews) {
  const Tensor a = iota({3, 4});
  const Tensor col = ops::slice(a, 1, 2, 3);  // [3, 1], stride 4
  const Tensor t = ops::transpose(a, 0, 1);
  ops::fill(a, 0.0);
  ops::add(a, 7.0, a);
  EXPECT_EQ(col.to_vector<float>(), (std::vector<float>{7, 7, 7}));
  // Writing through a view changes the viewed tensor: a KV-cache style column update.
  ops::copy(floats({1, 2, 3}, {3, 1}), col);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{7, 7, 1, 7, 7, 7, 2, 7, 7, 7, 3, 7}));
  EXPECT_EQ(ops::slice(t, 0, 2, 3).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  ops::fill(ops::slice(a, 0, 0, 3, 2), -1.0);  // rows 0 and 2
  EXPECT_EQ(a.to_vector<float>(),
            (std::vector<float>{-1, -1, -1, -1, 7, 7, 2, 7, -1, -1, -1, -1}));
  // A host source written into a strided destination.
  ops::copy(Tensor::from_vector<float>({5, 6, 8}, {1, 3}, DType::float32), ops::slice(t, 0, 0, 1));
  EXPECT_EQ(ops::slice(a, 1, 0, 1).to_vector<float>(), (std::vector<float>{5, 6, 8}));
}

TEST_F(ViewTest, CopiesBetweenOverlappingViewsReadTheSourceWhole) {
  const Tensor a = iota({6});
  ops::copy(ops::slice(a, 0, 0, 5), ops::slice(a, 0, 1, 6));  // shift right by one
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4}));
  const Tensor b = iota({2, 6});
  ops::copy(ops::slice(b, 1, 1, 6), ops::slice(b, 1, 0, 5));  // strided, shift left
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 5, 7, 8, 9, 10, 11, 11}));
  const Tensor m = iota({3, 3});
  ops::copy(ops::transpose(m, 0, 1), m);  // in-place transpose through a copy
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

TEST_F(ViewTest, OverlappingOrDenseOnlyDestinationsAreRejected) {
  const Tensor a = iota({1, 4});
  const Tensor wide = ops::expand(a, {3, 4});
  EXPECT_RETRACE_ERROR(ops::copy(iota({3, 4}), wide), invalid_argument,
                       "copy: dst is a view whose elements overlap");
  EXPECT_RETRACE_ERROR(ops::fill(wide, 1.0), invalid_argument,
                       "fill: tensor is a view whose elements overlap");
  const Tensor m = iota({4, 4});
  const Tensor t = ops::transpose(m, 0, 1);
  EXPECT_RETRACE_ERROR(ops::add(m, m, t), invalid_argument, "add: out is a strided view");
  EXPECT_RETRACE_ERROR(ops::exp(m, t), invalid_argument, "exp: out is a strided view");
  EXPECT_RETRACE_ERROR(ops::matmul(m, m, t), invalid_argument, "matmul: out is a strided view");
  EXPECT_RETRACE_ERROR(ops::softmax(m, t), invalid_argument, "softmax: out is a strided view");
  // A shifted view of out's own storage would be read after it was written.
  const Tensor v = iota({8});
  EXPECT_RETRACE_ERROR(ops::add(ops::slice(v, 0, 0, 4), ops::slice(v, 0, 3, 7), ops::slice(v, 0, 0, 4)),
                       invalid_argument, "add: out and b overlap in memory");
  EXPECT_RETRACE_ERROR(ops::neg(ops::slice(v, 0, 1, 5), ops::slice(v, 0, 0, 4)), invalid_argument,
                       "neg: out and a overlap in memory");
  // Exactly in place, or disjoint parts of one storage, are fine.
  ops::add(ops::slice(v, 0, 0, 4), ops::slice(v, 0, 4, 8), ops::slice(v, 0, 0, 4));
  ops::mul(v, 2.0, v);
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{8, 12, 16, 20, 8, 10, 12, 14}));
  // Views the strides cannot express, and views past the storage.
  EXPECT_RETRACE_ERROR((void)m.as_strided({4}, std::vector<std::int64_t>{5}, 1),
                       invalid_argument, "past the storage's 16 elements");
  EXPECT_RETRACE_ERROR((void)m.as_strided({2}, std::vector<std::int64_t>{-1}, 3), invalid_argument,
                       "stride -1 of dimension 0 is negative");
  EXPECT_RETRACE_ERROR((void)m.as_strided({2, 2}, std::vector<std::int64_t>{1}, 0), invalid_argument,
                       "1 strides given for shape [2, 2]");
  EXPECT_RETRACE_ERROR((void)m.as_strided({3, 3}, std::vector<std::int64_t>{INT64_MAX / 2, 1}, 0),
                       invalid_argument, "overflows");
  EXPECT_RETRACE_ERROR((void)t.with_shape({16}), invalid_argument, "with_shape: the tensor is a strided view");
  // An empty view may start anywhere.
  EXPECT_EQ(m.as_strided({0, 3}, std::vector<std::int64_t>{1, 1}, 1000).numel(), 0);
}

TEST_F(ViewTest, ReshapeCopiesAStridedViewAndKeepsAContiguousOne) {
  const Tensor a = iota({2, 3});
  const Tensor t = ops::transpose(a, 0, 1);
  const Tensor flat = ops::reshape(t, {-1});
  EXPECT_NE(flat.buffer(), a.buffer());
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const Tensor row = ops::reshape(ops::slice(a, 0, 1, 2), {3, 1});
  EXPECT_EQ(row.buffer(), a.buffer());
  EXPECT_EQ(row.storage_offset(), 3);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  const Tensor dense = ops::contiguous(t);
  EXPECT_TRUE(dense.is_contiguous());
  EXPECT_EQ(ops::contiguous(dense).buffer(), dense.buffer());  // already dense: itself
  EXPECT_EQ(t.clone().to_vector<float>(), flat.to_vector<float>());
}

TEST_F(ViewTest, ReshapeOfAViewIsAViewWhereStridesCanExpressIt) {
  // The heads of a fused qkv projection: [B, T, 3, H, D] -> [3, B, H, T, D], chunk, drop the 1.
  const std::int64_t batch = 2, tokens = 5, heads = 3, d = 4;
  const Tensor qkv = iota({batch, tokens, 3 * heads * d});
  device().synchronize();
  const std::uint64_t before = commands();
  const std::vector<Tensor> parts = ops::chunk(
      ops::permute(ops::reshape(qkv, {batch, tokens, 3, heads, d}), {2, 0, 3, 1, 4}), 3, 0);
  const Tensor k = ops::reshape(parts[1], {batch, heads, tokens, d});
  // A stepped slice split into two dimensions, and one merged with an extent-1 neighbour.
  const Tensor stepped = ops::reshape(ops::slice(iota({12}), 0, 0, 12, 2), {2, 3});
  const Tensor column = ops::slice(iota({4, 6}), 1, 2, 3);  // [4, 1], stride 6
  const Tensor merged = ops::reshape(column, {2, 2});
  device().synchronize();
  EXPECT_EQ(commands(), before);
  EXPECT_EQ(k.buffer(), qkv.buffer());
  EXPECT_EQ(std::vector<std::int64_t>(k.strides().begin(), k.strides().end()),
            (std::vector<std::int64_t>{tokens * 3 * heads * d, d, 3 * heads * d, 1}));
  EXPECT_EQ(k.storage_offset(), heads * d);
  EXPECT_EQ(stepped.to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(std::vector<std::int64_t>(stepped.strides().begin(), stepped.strides().end()),
            (std::vector<std::int64_t>{6, 2}));
  EXPECT_EQ(merged.buffer(), column.buffer());
  EXPECT_EQ(merged.to_vector<float>(), (std::vector<float>{2, 8, 14, 20}));
  EXPECT_EQ(k.to_vector<float>(), ops::contiguous(k).to_vector<float>());
  // Merging dimensions that do not step evenly (a transpose's) needs a copy.
  const Tensor t = ops::transpose(iota({3, 4}), 0, 1);
  EXPECT_NE(ops::reshape(t, {12}).buffer(), t.buffer());
  EXPECT_NE(ops::reshape(k, {batch, heads, tokens * d}).buffer(), qkv.buffer());
  EXPECT_NE(ops::reshape(k, {batch * heads, tokens, d}).buffer(), qkv.buffer());
  const Tensor split = ops::reshape(k, {batch, heads, tokens, 2, d / 2});
  EXPECT_EQ(split.buffer(), qkv.buffer());
  EXPECT_EQ(split.to_vector<float>(), k.to_vector<float>());
}

TEST_F(ViewTest, AttentionReadsKeyValueCacheSlicesInPlace) {
  // A key/value cache of max_s positions per head, sk of them filled, read by grouped-query
  // attention (2 query heads per key/value head) and by multi-query attention through expand;
  // q skips a head. Small products (Eigen on the CPU) and ones large enough for its libraries.
  struct Case {
    std::int64_t sq, sk, d, max_s;
  };
  const std::int64_t batch = 2, heads = 4, kv_heads = 2;
  for (const Case& c : {Case{3, 6, 8, 16}, Case{150, 200, 64, 256}}) {
    for (DType dtype : {DType::float32, DType::bfloat16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " sk " << c.sk);
      auto values = [&](std::int64_t heads_, std::int64_t rows, std::uint64_t salt) {
        return floats(random_floats(static_cast<std::size_t>(batch * heads_ * rows * c.d), salt),
                      {batch, heads_, rows, c.d}, dtype);
      };
      const Tensor cache_k = values(kv_heads, c.max_s, 1), cache_v = values(kv_heads, c.max_s, 2);
      const Tensor q = ops::slice(values(heads + 1, c.sq, 3), 1, 1, heads + 1);
      const Tensor k = ops::slice(cache_k, 2, 0, c.sk), v = ops::slice(cache_v, 2, 0, c.sk);
      // One key/value head for every query head (multi-query attention), by expand: stride 0.
      const Tensor k_one = ops::slice(k, 1, 0, 1), v_one = ops::slice(v, 1, 0, 1);
      const Tensor k_heads = ops::expand(k_one, {batch, heads, c.sk, c.d});
      const Tensor v_heads = ops::expand(v_one, {batch, heads, c.sk, c.d});
      ASSERT_EQ(k_heads.strides()[1], 0);
      device().synchronize();
      const std::uint64_t before = commands();
      const Tensor grouped = ops::scaled_dot_product_attention(q, k, v);
      const Tensor repeated = ops::scaled_dot_product_attention(q, k_heads, v_heads);
      const Tensor causal = ops::scaled_dot_product_attention(q, k, v, {}, {}, ops::Causal::yes);
      device().synchronize();
      if (testing::test_backend() == "cpu") {
        EXPECT_EQ(commands(), before + 3);  // no copies
      }
      EXPECT_EQ(bits(repeated), bits(ops::scaled_dot_product_attention(q, k_one, v_one)));
      const Tensor qd = ops::contiguous(q), kd = ops::contiguous(k), vd = ops::contiguous(v);
      EXPECT_EQ(bits(grouped), bits(ops::scaled_dot_product_attention(qd, kd, vd)));
      EXPECT_EQ(bits(causal),
                bits(ops::scaled_dot_product_attention(qd, kd, vd, {}, {}, ops::Causal::yes)));
    }
  }
}

TEST_F(ViewTest, DevicesSayWhichAttentionOperandStridesTheyTake) {
  AttentionParams p{};
  p.batch = 1;
  p.heads = 2;
  p.sq = 3;
  p.sk = 4;
  p.d = 8;
  p.dv = 8;
  p.dtype = DType::float32;
  set_dense_attention_strides(p);
  EXPECT_TRUE(has_dense_attention_strides(p));
  EXPECT_EQ(p.k_strides[1], 4 * 8);
  const char* op = "scaled_dot_product_attention";
  EXPECT_EQ(device().unsupported_reason(make_launch(op, p, {})), nullptr);
  p.k_strides[1] *= 4;  // the heads of a key cache four times as long
  EXPECT_FALSE(has_dense_attention_strides(p));
  const char* reason = device().unsupported_reason(make_launch(op, p, {}));
  if (testing::test_backend() == "cpu") {
    EXPECT_EQ(reason, nullptr);
  } else if (reason != nullptr) {
    EXPECT_NE(std::string_view(reason).find("strided"), std::string_view::npos) << reason;
  }
}

TEST_F(ViewTest, MatmulReadsATransposedViewInPlace) {
  const Tensor a = floats(random_floats(5 * 7, 1), {5, 7});
  const Tensor b = floats(random_floats(6 * 7, 2), {6, 7});
  const Tensor bt = ops::transpose(b, 0, 1);
  device().synchronize();
  const std::uint64_t before = commands();
  const Tensor viewed = ops::matmul(a, bt);
  device().synchronize();
  EXPECT_EQ(commands(), before + 1);  // no copy of bt
  EXPECT_EQ(bits(viewed), bits(ops::matmul(a, b, ops::Transpose::no, ops::Transpose::yes)));
  // A transposed view given with transpose = yes is the original matrix.
  EXPECT_EQ(bits(ops::matmul(ops::transpose(a, 0, 1), bt, ops::Transpose::yes, ops::Transpose::no)),
            bits(viewed));
  // linear with a weight stored [in, out] and passed transposed: read in place too.
  const Tensor w_in_out = floats(random_floats(7 * 6, 4), {7, 6});
  const Tensor bias = floats(random_floats(6, 5), {6});
  device().synchronize();
  const std::uint64_t at = commands();
  const Tensor lin = ops::linear(a, ops::transpose(w_in_out, 0, 1), bias);
  device().synchronize();
  EXPECT_EQ(commands(), at + 1);
  EXPECT_EQ(bits(ops::linear(a, ops::transpose(w_in_out, 0, 1))), bits(ops::matmul(a, w_in_out)));
  const std::vector<float> want =
      ops::linear(a, ops::contiguous(ops::transpose(w_in_out, 0, 1)), bias).to_vector<float>();
  const std::vector<float> got = lin.to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
  // Batched, and a view that is not a plain transpose (a strided slice) is copied first.
  const Tensor q = floats(random_floats(2 * 4 * 3, 3), {2, 4, 3});
  const Tensor qs = ops::slice(q, 1, 0, 4, 2);
  EXPECT_EQ(bits(ops::matmul(qs, ops::transpose(qs, 1, 2))),
            bits(ops::matmul(ops::contiguous(qs), ops::contiguous(ops::transpose(qs, 1, 2)))));
}

// A random view of a random tensor: a permute, a stepped slice, sometimes an expand of an
// extent-1 dimension. Extents 0..4, ranks 1..4.
struct RandomView {
  Tensor base, view;
};

RandomView random_view(Device& device, std::mt19937_64& rng, DType dtype, std::uint64_t salt) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int rank = pick(1, 4);
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  for (auto& d : dims) d = pick(0, 9) == 0 ? 0 : pick(1, 4);
  const Shape shape{std::span<const std::int64_t>(dims)};
  const Tensor base = device_tensor(
      device, random_floats(static_cast<std::size_t>(shape.numel()), salt, -3.0f, 3.0f), shape,
      dtype);
  std::vector<std::int64_t> order(dims.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  Tensor view = ops::permute(base, order);
  const auto d = static_cast<std::int64_t>(pick(0, rank - 1));
  const std::int64_t extent = view.shape()[d];
  view = ops::slice(view, d, extent > 1 ? pick(0, 1) : 0, extent, pick(1, 2));
  for (std::int64_t k = 0; k < rank; ++k) {
    if (view.shape()[k] == 1 && pick(0, 1) == 1) {
      std::vector<std::int64_t> wide(view.shape().dims().begin(), view.shape().dims().end());
      wide[static_cast<std::size_t>(k)] = 3;
      view = ops::expand(view, wide);
      break;
    }
  }
  return {base, view};
}

using ViewOp = std::function<Tensor(const Tensor&)>;

// Ops (unary in their tensor argument) checked to give the same bits on a view as on its copy.
std::vector<std::pair<const char*, ViewOp>> view_ops(Device& device) {
  std::vector<std::pair<const char*, ViewOp>> list = {
      {"exp", [](const Tensor& x) { return ops::exp(x); }},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }},
      {"mul scalar", [](const Tensor& x) { return ops::mul(x, 1.5); }},
      {"add self", [](const Tensor& x) { return ops::add(x, x); }},
      {"sub dense", [](const Tensor& x) { return ops::sub(x, ops::contiguous(ops::neg(x))); }},
      {"maximum broadcast",
       [](const Tensor& x) { return ops::maximum(x, ops::slice(x, -1, 0, 1)); }},
      {"sum", [](const Tensor& x) { return ops::sum(x, -1); }},
      {"mean dim 0", [](const Tensor& x) { return ops::mean(x, 0); }},
      {"max", [](const Tensor& x) { return ops::max(x, -1); }},
      {"softmax", [](const Tensor& x) { return ops::softmax(x); }},
      {"layer_norm", [](const Tensor& x) { return ops::layer_norm(x, {}, {}, 1e-5); }},
      {"typecast", [](const Tensor& x) { return ops::typecast(x, DType::float32); }},
      {"where", [](const Tensor& x) { return ops::where(ops::gt(x, 0.0), x, ops::neg(x)); }},
      {"gt", [](const Tensor& x) { return ops::typecast(ops::gt(x, ops::flip(x, {0})), x.dtype()); }},
      {"concat", [](const Tensor& x) { return ops::concat(std::vector<Tensor>{x, x}, 0); }},
      {"stack", [](const Tensor& x) { return ops::stack(std::vector<Tensor>{x, x}, -1); }},
      {"flip", [](const Tensor& x) { return ops::flip(x, {-1}); }},
      {"repeat", [](const Tensor& x) {
         std::vector<std::int64_t> r(x.shape().rank(), 1);
         r[0] = 2;
         return ops::repeat(x, r);
       }},
      {"reshape", [](const Tensor& x) { return ops::reshape(x, {-1}); }},
      {"reshape adding extent-1 dimensions", [](const Tensor& x) {
         std::vector<std::int64_t> dims{1};
         for (std::int64_t d : x.shape().dims()) {
           dims.push_back(d);
           dims.push_back(1);
         }
         return ops::reshape(x, dims);
       }},
      {"attention", [](const Tensor& x) {
         if (x.shape().rank() < 3) return ops::mul(x, x);
         return ops::scaled_dot_product_attention(x, x, x);
       }},
      {"permute of view", [](const Tensor& x) {
         std::vector<std::int64_t> r(x.shape().rank());
         for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<std::int64_t>(r.size() - 1 - i);
         return ops::contiguous(ops::permute(x, r));
       }},
      {"index_select", [&device](const Tensor& x) {
         const std::int64_t n = x.shape()[0];
         std::vector<std::int64_t> idx;
         for (std::int64_t i = n; i-- > 0;) idx.push_back(i);
         const Tensor index =
             Tensor::from_vector<std::int64_t>(idx, {n}, DType::int64).to_device(device);
         return ops::index_select(x, 0, index);
       }},
      {"matmul", [](const Tensor& x) {
         if (x.shape().rank() < 2) return ops::mul(x, x);
         return ops::matmul(x, ops::transpose(x, -1, -2));
       }},
      {"linear", [&device](const Tensor& x) {
         const std::int64_t k = x.shape()[-1];
         const Tensor w = device_tensor(device, random_floats(static_cast<std::size_t>(3 * k), 5),
                                        {3, k}, x.dtype());
         return ops::linear(x, w);
       }},
  };
  return list;
}

TEST_F(ViewTest, RandomReshapesOfViewsGiveTheElementsOfTheirDenseCopies) {
  std::mt19937_64 rng(testing::test_seed() + 79);
  int views = 0, copies = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const RandomView rv = random_view(device(), rng, DType::float32, static_cast<std::uint64_t>(trial));
    // A random shape of the same element count: the extents split into factors and regrouped.
    std::vector<std::int64_t> factors;
    for (std::int64_t extent : rv.view.shape().dims()) {
      for (std::int64_t f = 2; f <= extent; ++f) {
        while (extent % f == 0) {
          factors.push_back(f);
          extent /= f;
        }
      }
      if (extent == 0) factors.push_back(0);
    }
    std::vector<std::int64_t> dims;
    for (std::int64_t f : factors) {
      if (!dims.empty() && std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
        dims.back() *= f;
      } else {
        dims.push_back(f);
      }
      if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) dims.push_back(1);
    }
    if (dims.size() > Shape::kMaxRank) continue;
    SCOPED_TRACE(::testing::Message() << rv.view.to_string() << " -> " << dims.size() << " dims");
    device().synchronize();
    const std::uint64_t before = commands();
    const Tensor r = ops::reshape(rv.view, dims);
    device().synchronize();
    // A view (same storage, no command) or a dense copy (one command).
    const bool view = r.buffer() == rv.base.buffer();
    (view ? views : copies) += rv.view.numel() > 0 && !rv.view.is_contiguous() ? 1 : 0;
    EXPECT_EQ(commands(), before + (view || r.numel() == 0 ? 0 : 1));
    EXPECT_EQ(r.to_vector<float>(), ops::contiguous(rv.view).to_vector<float>());
    EXPECT_EQ(r.shape(), Shape(std::span<const std::int64_t>(dims)));
  }
  // Both outcomes were exercised on strided views.
  EXPECT_GT(views, 20);
  EXPECT_GT(copies, 20);
}

TEST_F(ViewTest, EveryOpGivesOnAViewWhatItGivesOnADenseCopy) {
  std::mt19937_64 rng(testing::test_seed() + 77);
  const auto list = view_ops(device());
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    for (int trial = 0; trial < 24; ++trial) {
      const RandomView rv = random_view(device(), rng, dtype, static_cast<std::uint64_t>(trial));
      const Tensor dense = ops::contiguous(rv.view);
      ASSERT_TRUE(dense.is_contiguous());
      // The view's elements are the base's, by its strides.
      const std::vector<float> base = rv.base.to_vector<float>();
      ASSERT_EQ(rv.view.to_vector<float>(),
                host_view(base, rv.view.shape(), rv.view.strides(), rv.view.storage_offset()))
          << rv.view.to_string();
      for (const auto& [name, op] : list) {
        if (rv.view.numel() == 0 && std::string_view(name) == "max") continue;  // -inf either way
        SCOPED_TRACE(::testing::Message() << name << " on " << rv.view.to_string() << " ("
                                          << dtype_name(dtype) << ")");
        Tensor on_view, on_dense;
        try {
          on_dense = op(dense);
        } catch (const Error&) {
          // The op refuses this shape (mean over an empty dimension 0 ...): the view must too.
          EXPECT_THROW((void)op(rv.view), Error);
          continue;
        }
        on_view = op(rv.view);
        ASSERT_EQ(on_view.shape(), on_dense.shape());
        const std::string_view op_name(name);
        if (testing::test_backend() != "cpu" && (op_name == "matmul" || op_name == "linear")) {
          // A view that is not a plain transpose is copied dense first, so the product may read
          // its operands in another orientation than on the dense copy. cuBLAS picks its kernel
          // (and summation order) by orientation: equal to rounding, not bit for bit.
          expect_close_products(on_view, on_dense, dtype);
        } else {
          EXPECT_EQ(bits(on_view), bits(on_dense));
        }
      }
    }
  }
}

TEST_F(ViewTest, TracedFunctionsOverViewsReplayBitForBitAndTakeViewInputs) {
  // Views inside the function: chunk (the adaLN pattern), permute, transposed matmul.
  const auto f = [](const Tensor& x) {
    const std::vector<Tensor> parts = ops::chunk(x, 3, -1);  // [4, 2] each, stride 6
    const Tensor mod = ops::add(ops::mul(parts[0], ops::add(parts[1], 1.0)), parts[2]);
    const Tensor rows = ops::slice(ops::permute(x, {1, 0}), 0, 0, 4);  // [4, 4], strided
    return ops::add(ops::matmul(mod, ops::transpose(mod, 0, 1)), ops::sum(rows, -1, ops::KeepDim::yes));
  };
  testing::expect_traced_equals_eager(device(), f, {4, 6}, 500);

  // A view as the traced function's input: a dense slot of its own; later calls may pass other
  // views (or dense tensors) of the same shape.
  auto tracer = make_tracer([](const Tensor& x) { return ops::mul(x, 2.0); }, device());
  const Tensor a = iota({3, 4});
  const Tensor first = ops::transpose(a, 0, 1);
  EXPECT_EQ(bits(tracer(first)), bits(ops::mul(first, 2.0)));
  const Tensor b = floats(random_floats(12, 9), {4, 3});
  const Tensor second = ops::transpose(ops::reshape(b, {3, 4}), 0, 1);
  EXPECT_EQ(bits(tracer(second)), bits(ops::mul(second, 2.0)));
  EXPECT_EQ(a.to_vector<float>()[1], 1.0f);  // the caller's storage was not the slot
  const Tensor third = ops::contiguous(ops::transpose(a, 0, 1));
  EXPECT_EQ(bits(tracer(third)), bits(ops::mul(third, 2.0)));
  // Views of the traced output follow it (and go stale with it).
  const Tensor& out = tracer(first);
  const Tensor out_row = ops::slice(out, 0, 1, 2);
  EXPECT_EQ(out_row.to_vector<float>(), (std::vector<float>{2, 10, 18}));
}

TEST_F(ViewTest, StateTensorsTakeViews) {
  // A view written as a StateTensor's traced value, and a view as its initial value.
  StateTensor state;
  const Tensor a = iota({2, 3});
  state.update(ops::transpose(a, 0, 1), Traced::no);
  EXPECT_EQ(state.value().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  state.update(ops::contiguous(ops::transpose(ops::add(a, 1.0), 0, 1)), Traced::yes);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));  // wrote through
}

}  // namespace
}  // namespace retrace
