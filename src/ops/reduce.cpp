// Reductions, softmax and normalisations over the last dimension.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

namespace retrace::ops {

using namespace detail;

namespace {


struct Rows {
  std::int64_t rows;
  std::int64_t cols;
};

// Checks a row-wise op's input and splits it into rows of the last dimension.
Rows rows_of(const Tensor& a, std::string_view op) {
  device_of(a, op, "a");
  check_dtype_in(a, op, "a", kFloatTypes);
  RETRACE_CHECK(a.layout() == Layout::row_major, invalid_argument,
                "{}: a is in {} layout; reductions work on row_major tensors (to_layout first)",
                op, a.layout());
  RETRACE_CHECK(a.shape().rank() >= 1, invalid_argument, "{}: a is a scalar (rank 0)", op);
  const std::int64_t cols = a.shape()[-1];
  std::int64_t rows = 1;  // from the leading extents: an empty last dimension keeps its rows
  for (std::size_t d = 0; d + 1 < a.shape().rank(); ++d) rows *= a.shape().dims()[d];
  return {rows, cols};
}

void check_vector(const Tensor& v, const Tensor& a, std::int64_t cols, std::string_view op,
                  std::string_view name) {
  if (v.is_null()) return;
  device_of(v, op, name);
  RETRACE_CHECK(v.device() == a.device(), invalid_argument, "{}: {} is on {} but a is on {}", op,
                name, v.device()->name(), a.device()->name());
  RETRACE_CHECK(v.dtype() == a.dtype(), invalid_argument, "{}: {} has dtype {} but a has {}", op,
                name, v.dtype(), a.dtype());
  RETRACE_CHECK(v.numel() == cols && v.layout() == Layout::row_major, invalid_argument,
                "{}: {} must hold {} elements (the last dimension of a), got shape {}", op, name,
                cols, v.shape());
}

Tensor reduce(const char* op, ReduceOp kind, const Tensor& a_in, KeepDim keepdim,
              QueueId queue) {
  const Rows r = rows_of(a_in, op);
  const Tensor a = dense(a_in, queue);
  std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  if (keepdim == KeepDim::yes) {
    shape.back() = 1;
  } else {
    shape.pop_back();
  }
  Tensor out = empty_like(a, Shape(std::span<const std::int64_t>(shape)), op);
  ReduceParams params{data_of(a), data_of(out), r.rows, r.cols, a.dtype(), kind};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
  return out;
}

// out may be a itself (each row is read before it is written) but not the weight or bias.
void norm(const char* op, const Tensor& a_in, const Tensor& weight_in, const Tensor& bias_in,
          double eps, bool rms, const Tensor& out, QueueId queue) {
  const Rows r = rows_of(a_in, op);
  check_vector(weight_in, a_in, r.cols, op, "weight");
  check_vector(bias_in, a_in, r.cols, op, "bias");
  RETRACE_CHECK(eps >= 0.0, invalid_argument, "{}: eps must not be negative, got {}", op, eps);
  check_out(out, a_in, a_in.shape(), op);
  check_not_aliased(out, op, {{&weight_in, "weight"}, {&bias_in, "bias"}});
  const Tensor a = dense(a_in, queue), weight = dense(weight_in, queue),
               bias = dense(bias_in, queue);
  check_no_partial_overlap(out, op, {{&a, "a"}});
  NormParams params{data_of(a),
                    weight.is_null() ? nullptr : data_of(weight),
                    bias.is_null() ? nullptr : data_of(bias),
                    data_of(out),
                    r.rows,
                    r.cols,
                    static_cast<float>(eps),
                    a.dtype(),
                    rms};
  std::vector<Buffer*> buffers{a.buffer().get(), out.buffer().get()};
  if (!weight.is_null()) buffers.push_back(weight.buffer().get());
  if (!bias.is_null()) buffers.push_back(bias.buffer().get());
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
}

Tensor norm(const char* op, const Tensor& a, const Tensor& weight, const Tensor& bias,
            double eps, bool rms, QueueId queue) {
  rows_of(a, op);
  Tensor out = empty_like(a, a.shape(), op);
  norm(op, a, weight, bias, eps, rms, out, queue);
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, KeepDim keepdim, QueueId queue) {
  return reduce("sum", ReduceOp::sum, a, keepdim, queue);
}
Tensor mean(const Tensor& a, KeepDim keepdim, QueueId queue) {
  return reduce("mean", ReduceOp::mean, a, keepdim, queue);
}
Tensor max(const Tensor& a, KeepDim keepdim, QueueId queue) {
  return reduce("max", ReduceOp::max, a, keepdim, queue);
}

void softmax(const Tensor& a_in, const Tensor& out, QueueId queue) {
  const Rows r = rows_of(a_in, "softmax");
  check_out(out, a_in, a_in.shape(), "softmax");  // out may be a (in place)
  const Tensor a = dense(a_in, queue);
  check_no_partial_overlap(out, "softmax", {{&a, "a"}});
  SoftmaxParams params{data_of(a), data_of(out), r.rows, r.cols, a.dtype()};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch("softmax", params, buffers, writes_only({1})));
}

Tensor softmax(const Tensor& a, QueueId queue) {
  rows_of(a, "softmax");
  Tensor out = empty_like(a, a.shape(), "softmax");
  softmax(a, out, queue);
  return out;
}

Tensor layer_norm(const Tensor& a, const Tensor& weight, const Tensor& bias, double eps,
                  QueueId queue) {
  return norm("layer_norm", a, weight, bias, eps, false, queue);
}

Tensor rms_norm(const Tensor& a, const Tensor& weight, double eps, QueueId queue) {
  return norm("rms_norm", a, weight, Tensor(), eps, true, queue);
}

void layer_norm(const Tensor& a, const Tensor& weight, const Tensor& bias, double eps,
                const Tensor& out, QueueId queue) {
  norm("layer_norm", a, weight, bias, eps, false, out, queue);
}

void rms_norm(const Tensor& a, const Tensor& weight, double eps, const Tensor& out,
              QueueId queue) {
  norm("rms_norm", a, weight, Tensor(), eps, true, out, queue);
}

Tensor argmax(const Tensor& a, KeepDim keepdim, QueueId queue) {
  constexpr const char* op = "argmax";
  const Rows r = rows_of(a, op);
  RETRACE_CHECK(r.cols > 0 || r.rows == 0, invalid_argument,
                "argmax: the reduced dimension of {} is empty (no maximum to point at)",
                a.shape());
  RETRACE_CHECK(r.cols <= INT32_MAX, invalid_argument,
                "argmax: the reduced dimension has {} elements; int32 indices reach {}", r.cols,
                INT32_MAX);
  std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  if (keepdim == KeepDim::yes) {
    shape.back() = 1;
  } else {
    shape.pop_back();
  }
  Tensor out = Tensor::empty(Shape(std::span<const std::int64_t>(shape)), DType::int32,
                             *a.device());
  if (r.rows == 0) return out;
  const Tensor ad = dense(a, queue);
  ReduceParams params{data_of(ad), data_of(out), r.rows, r.cols, a.dtype(), ReduceOp::argmax};
  Buffer* buffers[] = {ad.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
  return out;
}

Tensor min(const Tensor& a, KeepDim keepdim, QueueId queue) {
  rows_of(a, "min");
  return neg(reduce("min", ReduceOp::max, neg(a, queue), keepdim, queue), queue);
}

namespace {

// `reduce_last` applied along `dim`: the dimension is moved last (a permute) unless it is last;
// with keepdim the reduced extent stays, as 1, where it was.
template <class ReduceLast>
Tensor along(const char* op, const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue,
             ReduceLast&& reduce_last) {
  device_of(a, op, "a");
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(rank >= 1, invalid_argument, "{}: a needs rank 1 or more, got {}", op, a.shape());
  const auto d = static_cast<std::size_t>(normalize_dim(dim, rank, op));
  if (d + 1 == rank) return reduce_last(a, keepdim);
  std::vector<std::int64_t> order;
  for (std::size_t i = 0; i < rank; ++i) {
    if (i != d) order.push_back(static_cast<std::int64_t>(i));
  }
  order.push_back(static_cast<std::int64_t>(d));
  const Tensor reduced = reduce_last(permute(a, order, queue), KeepDim::no);
  if (keepdim == KeepDim::no) return reduced;
  std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  shape[d] = 1;
  return reshape(reduced, shape);
}

}  // namespace

Tensor sum(const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue) {
  return along("sum", a, dim, keepdim, queue,
               [&](const Tensor& t, KeepDim k) { return sum(t, k, queue); });
}
Tensor mean(const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue) {
  return along("mean", a, dim, keepdim, queue,
               [&](const Tensor& t, KeepDim k) { return mean(t, k, queue); });
}
Tensor max(const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue) {
  return along("max", a, dim, keepdim, queue,
               [&](const Tensor& t, KeepDim k) { return max(t, k, queue); });
}
Tensor argmax(const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue) {
  return along("argmax", a, dim, keepdim, queue,
               [&](const Tensor& t, KeepDim k) { return argmax(t, k, queue); });
}
Tensor min(const Tensor& a, std::int64_t dim, KeepDim keepdim, QueueId queue) {
  return along("min", a, dim, keepdim, queue,
               [&](const Tensor& t, KeepDim k) { return min(t, k, queue); });
}

Tensor var(const Tensor& a, std::int64_t dim, double correction, KeepDim keepdim, QueueId queue) {
  device_of(a, "var", "a");
  check_dtype_in(a, "var", "a", kFloatTypes);
  RETRACE_CHECK(std::isfinite(correction) && correction >= 0.0, invalid_argument,
                "var: correction must be finite and not negative, got {}", correction);
  RETRACE_CHECK(a.shape().rank() >= 1, invalid_argument, "var: a needs rank 1 or more, got {}",
                a.shape());
  const std::int64_t n = a.shape()[normalize_dim(dim, a.shape().rank(), "var")];
  const Tensor centred = sub(a, mean(a, dim, KeepDim::yes, queue), queue);
  // As torch: the divisor stops at 0 (n <= correction: inf, or NaN for an empty or constant
  // row), never a negative variance.
  return div(sum(square(centred, queue), dim, keepdim, queue),
             std::max(0.0, static_cast<double>(n) - correction), queue);
}

Tensor std(const Tensor& a, std::int64_t dim, double correction, KeepDim keepdim, QueueId queue) {
  return sqrt(var(a, dim, correction, keepdim, queue), queue);
}

Tensor log_softmax(const Tensor& a, std::int64_t dim, QueueId queue) {
  device_of(a, "log_softmax", "a");
  check_dtype_in(a, "log_softmax", "a", kFloatTypes);
  const Tensor shifted = sub(a, max(a, dim, KeepDim::yes, queue), queue);
  return sub(shifted, log(sum(exp(shifted, queue), dim, KeepDim::yes, queue), queue), queue);
}

Tensor group_norm(const Tensor& x, std::int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps, QueueId queue) {
  constexpr const char* op = "group_norm";
  device_of(x, op, "x");
  const Shape& s = x.shape();
  RETRACE_CHECK(s.rank() >= 2, invalid_argument, "{}: x must be [N, C, ...], got {}", op, s);
  const std::int64_t channels = s[1];
  RETRACE_CHECK(groups >= 1 && channels % groups == 0, invalid_argument,
                "{}: {} channels do not split into {} groups", op, channels, groups);
  std::vector<std::int64_t> per_channel(s.rank() - 1, 1);  // [C, 1, ...] against [N, C, ...]
  per_channel[0] = channels;
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (t->is_null()) continue;
    device_of(*t, op, name);
    RETRACE_CHECK(t->numel() == channels && t->dtype() == x.dtype(), invalid_argument,
                  "{}: {} must hold {} values ({}), got {} {}", op, name, channels, x.dtype(),
                  t->shape(), t->dtype());
  }
  const Tensor grouped = reshape(x, {s[0], groups, -1});
  Tensor y = reshape(layer_norm(grouped, {}, {}, eps, queue), s.dims());
  if (!weight.is_null()) y = mul(y, reshape(weight, per_channel), queue);
  if (!bias.is_null()) y = add(y, reshape(bias, per_channel), queue);
  return y;
}

}  // namespace retrace::ops
