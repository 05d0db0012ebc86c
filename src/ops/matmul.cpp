// Matrix products: matmul (batched, broadcast batch dimensions, transposes), linear, and
// scaled_dot_product_attention as one op.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace retrace::ops {

using namespace detail;

namespace {


void check_pair(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name,
                std::string_view op) {
  Device& da = device_of(a, op, a_name);
  Device& db = device_of(b, op, b_name);
  RETRACE_CHECK(&da == &db, invalid_argument, "{}: {} is on {} but {} is on {}", op, a_name,
                da.name(), b_name, db.name());
  RETRACE_CHECK(a.dtype() == b.dtype(), invalid_argument, "{}: {} has dtype {} but {} has {}", op,
                a_name, a.dtype(), b_name, b.dtype());
  RETRACE_CHECK(a.layout() == Layout::row_major && b.layout() == Layout::row_major,
                invalid_argument, "{}: operands must be row_major ({} is {}, {} is {})", op, a_name,
                a.layout(), b_name, b.layout());
  check_dtype_in(a, op, a_name, kFloatTypes);
}

}  // namespace

namespace {

// A product's kernel parameters for operands of rank 2 or more, and its output shape.
struct MatmulPlan {
  MatmulParams params{};
  Shape out_shape;
};

// user_a and user_b: the operands as the user gave them (rank 1 included), for messages.
MatmulPlan plan_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, const Shape& user_a,
                       const Shape& user_b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const std::int64_t m = ta ? sa[-1] : sa[-2], k = ta ? sa[-2] : sa[-1];
  const std::int64_t kb = tb ? sb[-1] : sb[-2], n = tb ? sb[-2] : sb[-1];
  RETRACE_CHECK(k == kb, invalid_argument,
                "matmul: inner dimensions differ: a {}{} has {} columns, b {}{} has {} rows", user_a,
                ta ? " (transposed)" : "", k, user_b, tb ? " (transposed)" : "", kb);
  // Broadcast the batch dimensions.
  const std::size_t ra = sa.rank() - 2, rb = sb.rank() - 2, rank = std::max(ra, rb);
  RETRACE_CHECK(rank <= static_cast<std::size_t>(kMaxBatchRank), invalid_argument,
                "matmul: at most {} batch dimensions, got {}", kMaxBatchRank, rank);
  MatmulPlan plan;
  MatmulParams& params = plan.params;
  std::vector<std::int64_t> out_shape;
  std::int64_t a_stride = m * k, b_stride = k * n;
  std::vector<std::int64_t> batch(rank), as(rank), bs(rank);
  for (std::size_t i = rank; i-- > 0;) {
    const std::int64_t da = i + ra >= rank ? sa.dims()[i + ra - rank] : 1;
    const std::int64_t db = i + rb >= rank ? sb.dims()[i + rb - rank] : 1;
    RETRACE_CHECK(da == db || da == 1 || db == 1, invalid_argument,
                  "matmul: batch dimensions of {} and {} do not broadcast", user_a, user_b);
    batch[i] = std::max(da, db);
    as[i] = da == 1 ? 0 : a_stride;
    bs[i] = db == 1 ? 0 : b_stride;
    a_stride *= da;
    b_stride *= db;
  }
  for (std::size_t i = 0; i < rank; ++i) {
    params.batch_shape[i] = batch[i];
    params.a_batch_strides[i] = as[i];
    params.b_batch_strides[i] = bs[i];
    out_shape.push_back(batch[i]);
  }
  out_shape.push_back(m);
  out_shape.push_back(n);
  plan.out_shape = Shape(std::span<const std::int64_t>(out_shape));
  params.m = m;
  params.n = n;
  params.k = k;
  params.batch_rank = static_cast<std::int32_t>(rank);
  params.alpha = 1.0f;
  params.dtype = a.dtype();
  params.trans_a = ta;
  params.trans_b = tb;
  return plan;
}

// numpy's rule for rank-1 operands: a [K] is a row [1, K], b [K] a column [K, 1], and that
// dimension is dropped from the result. Views, no copies.
struct MatmulOperands {
  Tensor a, b;
  bool a_vector, b_vector;
};

MatmulOperands promote(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_pair(a, "a", b, "b", "matmul");
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  RETRACE_CHECK(sa.rank() >= 1 && sb.rank() >= 1, invalid_argument,
                "matmul: operands need rank 1 or more, got {} and {}", sa, sb);
  RETRACE_CHECK((sa.rank() > 1 || !ta) && (sb.rank() > 1 || !tb), invalid_argument,
                "matmul: a rank-1 operand cannot be transposed (a {}, b {})", sa, sb);
  MatmulOperands out{a, b, sa.rank() == 1, sb.rank() == 1};
  if (out.a_vector) out.a = reshape(a, {1, sa[0]});
  if (out.b_vector) out.b = reshape(b, {sb[0], 1});
  return out;
}

Shape squeezed(const Shape& shape, const MatmulOperands& operands) {
  std::vector<std::int64_t> dims(shape.dims().begin(), shape.dims().end());
  if (operands.b_vector) dims.erase(dims.end() - 1);
  if (operands.a_vector) dims.erase(dims.end() - (operands.b_vector ? 1 : 2));
  return Shape(std::span<const std::int64_t>(dims));
}

// MatmulParams::b_buffer for a B read from `t`: its buffer, unless a trace's capture made it
// (the trace keeps that memory, not the Buffer object, which may be gone at a replay; and a
// trace's own buffers are rewritten by every replay anyway).
const Buffer* weight_source(const Tensor& t) {
  return t.buffer()->trace().has_value() ? nullptr : t.buffer().get();
}

// A strided operand that is a dense matrix (stack) with its last two dimensions swapped, as
// transpose(x, -1, -2) of a contiguous x, is read in place with its transpose flag flipped;
// any other view is copied dense.
Tensor matmul_operand(const Tensor& t, bool& transposed, QueueId queue) {
  const std::size_t rank = t.shape().rank();
  if (t.is_contiguous() || rank < 2) return dense(t, queue);
  std::vector<std::int64_t> dims(t.shape().dims().begin(), t.shape().dims().end());
  std::vector<std::int64_t> strides = strides_of(t);
  std::swap(dims[rank - 1], dims[rank - 2]);
  std::swap(strides[rank - 1], strides[rank - 2]);
  Tensor swapped = t.as_strided(Shape(std::span<const std::int64_t>(dims)), strides,
                                t.storage_offset());
  if (!swapped.is_contiguous()) return dense(t, queue);
  transposed = !transposed;
  return swapped;
}

// The planned product of (possibly strided) operands: views read in place where the kernel can.
void enqueue_matmul(MatmulPlan& plan, const Tensor& a_in, const Tensor& b_in, const Tensor& out,
                    const Shape& user_a, const Shape& user_b, QueueId queue) {
  bool ta = plan.params.trans_a, tb = plan.params.trans_b;
  const Tensor a = matmul_operand(a_in, ta, queue), b = matmul_operand(b_in, tb, queue);
  if (ta != plan.params.trans_a || tb != plan.params.trans_b) {
    plan = plan_matmul(a, b, ta, tb, user_a, user_b);
  }
  plan.params.a = data_of(a);
  plan.params.b = data_of(b);
  plan.params.out = data_of(out);
  plan.params.b_buffer = weight_source(b);
  Buffer* buffers[] = {a.buffer().get(), b.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch("matmul", plan.params, buffers, writes_only({2})));
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, Transpose transpose_a, Transpose transpose_b,
              QueueId queue) {
  const bool ta = transpose_a == Transpose::yes, tb = transpose_b == Transpose::yes;
  const MatmulOperands operands = promote(a, b, ta, tb);
  MatmulPlan plan = plan_matmul(operands.a, operands.b, ta, tb, a.shape(), b.shape());
  Tensor out = empty_like(a, plan.out_shape, "matmul");
  enqueue_matmul(plan, operands.a, operands.b, out, a.shape(), b.shape(), queue);
  return operands.a_vector || operands.b_vector ? reshape(out, squeezed(plan.out_shape, operands).dims())
                                                : out;
}

void matmul(const Tensor& a, const Tensor& b, const Tensor& out, Transpose transpose_a,
            Transpose transpose_b, QueueId queue) {
  const bool ta = transpose_a == Transpose::yes, tb = transpose_b == Transpose::yes;
  const MatmulOperands operands = promote(a, b, ta, tb);
  MatmulPlan plan = plan_matmul(operands.a, operands.b, ta, tb, a.shape(), b.shape());
  check_out(out, a, squeezed(plan.out_shape, operands), "matmul");
  check_not_aliased(out, "matmul", {{&a, "a"}, {&b, "b"}});
  enqueue_matmul(plan, operands.a, operands.b, reshape(out, plan.out_shape.dims()), a.shape(),
                 b.shape(), queue);
}

namespace {

void enqueue_linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                    const Tensor& out, QueueId queue) {
  // A weight stored [in, out] and given transposed (a view) is read in place.
  bool trans_b = true;
  const Tensor x = dense(x_in, queue), weight = matmul_operand(weight_in, trans_b, queue),
               bias = dense(bias_in, queue);
  MatmulParams params{};
  params.a = data_of(x);
  params.b = data_of(weight);
  params.bias = bias.is_null() ? nullptr : data_of(bias);
  params.out = data_of(out);
  std::int64_t rows = 1;  // from the leading extents, so 0 input features still leave the rows
  for (std::size_t d = 0; d + 1 < x.shape().rank(); ++d) rows *= x.shape().dims()[d];
  params.m = rows;
  params.n = weight_in.shape()[0];
  params.k = x.shape()[-1];
  params.alpha = 1.0f;
  params.dtype = x.dtype();
  params.trans_b = trans_b;
  params.b_buffer = weight_source(weight);
  std::vector<Buffer*> buffers{x.buffer().get(), weight.buffer().get(), out.buffer().get()};
  if (!bias.is_null()) buffers.push_back(bias.buffer().get());
  x.device()->enqueue(queue, make_launch("linear", params, buffers, writes_only({2})));
}

Shape linear_shape(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "linear";
  check_pair(x, "x", weight, "weight", op);
  RETRACE_CHECK(x.shape().rank() >= 1 && weight.shape().rank() == 2, invalid_argument,
                "linear: x needs rank 1 or more and weight rank 2 ([out, in]), got {} and {}",
                x.shape(), weight.shape());
  const std::int64_t in = x.shape()[-1], out_features = weight.shape()[0];
  RETRACE_CHECK(weight.shape()[1] == in, invalid_argument,
                "linear: weight {} expects {} input features, x {} has {}", weight.shape(),
                weight.shape()[1], x.shape(), in);
  if (!bias.is_null()) {
    check_pair(x, "x", bias, "bias", op);
    RETRACE_CHECK(bias.numel() == out_features, invalid_argument,
                  "linear: bias {} must hold {} elements", bias.shape(), out_features);
  }
  std::vector<std::int64_t> shape(x.shape().dims().begin(), x.shape().dims().end());
  shape.back() = out_features;
  return Shape(std::span<const std::int64_t>(shape));
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, QueueId queue) {
  Tensor out = empty_like(x, linear_shape(x, weight, bias), "linear");
  enqueue_linear(x, weight, bias, out, queue);
  return out;
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
            QueueId queue) {
  check_out(out, x, linear_shape(x, weight, bias), "linear");
  check_not_aliased(out, "linear", {{&x, "x"}, {&weight, "weight"}, {&bias, "bias"}});
  enqueue_linear(x, weight, bias, out, queue);
}

namespace {

// The (batch, head, row) element strides under which the attention kernel reads `t`
// ([B, H, S, D] or [H, S, D]) where it is: each head's [S, D] rows dense, the heads and batches
// anywhere (a slice of a key/value cache along S, heads repeated by expand). False, leaving
// `strides` as they were, for other views (the kernel could read them too, but rows far apart in memory run slower than a dense
// copy made first: measured on the heads of a fused qkv projection).
bool attention_rows(const Tensor& t, std::int64_t (&strides)[3]) {
  if (t.layout() != Layout::row_major) return false;
  const std::size_t rank = t.shape().rank();
  const std::vector<std::int64_t> st =
      t.is_contiguous() ? contiguous_strides(t.shape()) : strides_of(t);
  const std::int64_t rows = t.shape()[-2], cols = t.shape()[-1];
  if ((cols > 1 && st[rank - 1] != 1) || (rows > 1 && st[rank - 2] != cols)) return false;
  if (std::any_of(st.begin(), st.end(), [](std::int64_t x) { return x < 0; })) return false;
  strides[0] = rank == 4 ? st[0] : 0;
  strides[1] = st[rank - 3];
  strides[2] = cols;
  return true;
}

// Allocates the output when `given_out` is null.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& given_mask,
                 std::optional<double> scale, bool causal, const Tensor& given_out,
                 QueueId queue) {
  constexpr const char* op = "scaled_dot_product_attention";
  check_pair(q, "q", k, "k", op);
  // A boolean mask (true: the key takes part, as torch's) becomes the additive one: 0 or -inf.
  Tensor mask = given_mask;
  if (!mask.is_null() && mask.dtype() == DType::bool_) {
    Device& device = device_of(mask, op, "mask");
    RETRACE_CHECK(&device == q.device(), invalid_argument,
                  "{}: mask is on {}, q on another device", op, device.name());
    mask = masked_fill(full(mask.shape(), 0.0, device, q.dtype(), Layout::row_major, queue),
                       eq(mask, 0.0, queue), -std::numeric_limits<double>::infinity(), queue);
  }
  check_pair(q, "q", v, "v", op);
  const std::size_t rank = q.shape().rank();
  RETRACE_CHECK((rank == 3 || rank == 4) && k.shape().rank() == rank && v.shape().rank() == rank,
                invalid_argument,
                "{}: q, k and v must all be [B, H, S, D] or [H, S, D], got {}, {} and {}", op,
                q.shape(), k.shape(), v.shape());
  const std::int64_t batch = rank == 4 ? q.shape()[0] : 1, heads = q.shape()[-3];
  const std::int64_t sq = q.shape()[-2], d = q.shape()[-1];
  const std::int64_t sk = k.shape()[-2], dv = v.shape()[-1], kv_heads = k.shape()[-3];
  const bool kv_match = k.shape()[-1] == d && v.shape()[-2] == sk && v.shape()[-3] == kv_heads &&
                        (rank == 3 || (k.shape()[0] == batch && v.shape()[0] == batch));
  RETRACE_CHECK(kv_match, invalid_argument,
                "{}: shapes do not fit: q {}, k {}, v {} (k needs q's B and D; v needs k's B, "
                "H and S)",
                op, q.shape(), k.shape(), v.shape());
  // Grouped-query attention: fewer key/value heads than query heads, dividing them.
  RETRACE_CHECK(kv_heads == heads || (kv_heads > 0 && kv_heads < heads && heads % kv_heads == 0), invalid_argument,
                "{}: {} query heads do not split into groups over {} key/value heads (q {}, k {}; "
                "grouped-query attention needs the key/value heads to divide the query heads)",
                op, heads, kv_heads, q.shape(), k.shape());
  AttentionParams params{};
  if (!mask.is_null()) {
    check_pair(q, "q", mask, "mask", op);
    const Shape& ms = mask.shape();
    // [Sk], [Sq|1, Sk], [H|1, Sq|1, Sk] or [B|1, H|1, Sq|1, Sk].
    const std::size_t mr = ms.rank();
    const std::int64_t m_sq = mr >= 2 ? ms[-2] : 1, mh = mr >= 3 ? ms[-3] : 1,
                       mb = mr == 4 ? ms[0] : 1;
    RETRACE_CHECK(mr >= 1 && mr <= 4 && ms[-1] == sk && (m_sq == 1 || m_sq == sq) &&
                      (mh == 1 || mh == heads) && (mb == 1 || mb == batch),
                  invalid_argument, "{}: mask {} does not broadcast to [{}, {}, {}, {}] (B, H, Sq, Sk)",
                  op, ms, batch, heads, sq, sk);
    mask = dense(mask, queue);
    params.mask = data_of(mask);
    params.mask_row_stride = m_sq == 1 ? 0 : sk;
    params.mask_head_stride = mh == 1 ? 0 : m_sq * sk;
    params.mask_batch_stride = mb == 1 ? 0 : mh * m_sq * sk;
  }
  std::vector<std::int64_t> shape(q.shape().dims().begin(), q.shape().dims().end());
  shape.back() = dv;
  const Shape out_shape{std::span<const std::int64_t>(shape)};
  if (!given_out.is_null()) {
    check_out(given_out, q, out_shape, op);
    check_not_aliased(given_out, op, {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&mask, "mask"}});
  }
  params.batch = batch;
  params.heads = heads;
  params.kv_heads = kv_heads;
  params.sq = sq;
  params.sk = sk;
  params.d = d;
  params.dv = dv;
  params.scale = static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(d))));
  params.dtype = q.dtype();
  params.causal = causal;
  // q, k and v are read where they are when their rows are dense and the device's kernel takes
  // their strides (the CPU device's does); otherwise from dense copies. Every operand starts
  // with dense strides; attention_rows replaces an operand's only when it is read in place.
  set_dense_attention_strides(params);
  Tensor qd = q, kd = k, vd = v;
  auto read_as = [&](Tensor& t, std::int64_t (&strides)[3]) {
    if (!attention_rows(t, strides)) t = dense(t, queue);
  };
  read_as(qd, params.q_strides);
  read_as(kd, params.k_strides);
  read_as(vd, params.v_strides);
  if (!has_dense_attention_strides(params) &&
      q.device()->unsupported_reason(make_launch(op, params, {})) != nullptr) {
    qd = dense(q, queue);
    kd = dense(k, queue);
    vd = dense(v, queue);
    set_dense_attention_strides(params);
  }
  const Tensor out = given_out.is_null() ? empty_like(q, out_shape, op) : given_out;
  params.q = view_data(qd);
  params.k = view_data(kd);
  params.v = view_data(vd);
  params.out = view_data(out);
  std::vector<Buffer*> buffers{qd.buffer().get(), kd.buffer().get(), vd.buffer().get(),
                               out.buffer().get()};
  if (!mask.is_null()) buffers.push_back(mask.buffer().get());
  q.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({3})));
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, std::optional<double> scale,
                                    QueueId queue) {
  return attention(q, k, v, mask, scale, false, Tensor(), queue);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, std::optional<double> scale,
                                    Causal causal, QueueId queue) {
  return attention(q, k, v, mask, scale, causal == Causal::yes, Tensor(), queue);
}

void scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, std::optional<double> scale,
                                  const Tensor& out, QueueId queue) {
  RETRACE_CHECK(!out.is_null(), invalid_argument,
                "scaled_dot_product_attention: out is a null tensor");
  (void)attention(q, k, v, mask, scale, false, out, queue);
}

}  // namespace retrace::ops
