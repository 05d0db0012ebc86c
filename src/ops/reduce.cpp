// Reductions, softmax and normalisations over the last dimension.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

namespace retrace::ops {

using namespace detail;

namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::float32, DType::bfloat16};

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

Tensor reduce(const char* op, ReduceOp kind, const Tensor& a, KeepDim keepdim, QueueId queue) {
  const Rows r = rows_of(a, op);
  std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  if (keepdim == KeepDim::yes) {
    shape.back() = 1;
  } else {
    shape.pop_back();
  }
  Tensor out = empty_like(a, Shape(std::span<const std::int64_t>(shape)), op);
  ReduceParams params{data_of(a), data_of(out), r.rows, r.cols, a.dtype(), kind};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers));
  return out;
}

// out may be a itself (each row is read before it is written) but not the weight or bias.
void norm(const char* op, const Tensor& a, const Tensor& weight, const Tensor& bias, double eps,
          bool rms, const Tensor& out, QueueId queue) {
  const Rows r = rows_of(a, op);
  check_vector(weight, a, r.cols, op, "weight");
  check_vector(bias, a, r.cols, op, "bias");
  RETRACE_CHECK(eps >= 0.0, invalid_argument, "{}: eps must not be negative, got {}", op, eps);
  check_out(out, a, a.shape(), op);
  check_not_aliased(out, op, {{&weight, "weight"}, {&bias, "bias"}});
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
  a.device()->enqueue(queue, make_launch(op, params, buffers));
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

void softmax(const Tensor& a, const Tensor& out, QueueId queue) {
  const Rows r = rows_of(a, "softmax");
  check_out(out, a, a.shape(), "softmax");  // out may be a (in place)
  SoftmaxParams params{data_of(a), data_of(out), r.rows, r.cols, a.dtype()};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch("softmax", params, buffers));
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

}  // namespace retrace::ops
