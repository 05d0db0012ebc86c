// Elementwise ops: binary (numpy broadcasting, or a scalar) and unary, each with an out= form.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <algorithm>
#include <cmath>

namespace retrace::ops {

using namespace detail;

namespace {


Shape broadcast_shape(const Tensor& a, const Tensor& b, std::string_view op) {
  const std::size_t rank = std::max(a.shape().rank(), b.shape().rank());
  std::vector<std::int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const auto axis = static_cast<std::int64_t>(i) - static_cast<std::int64_t>(rank);
    const std::int64_t da = i + a.shape().rank() >= rank ? a.shape()[axis] : 1;
    const std::int64_t db = i + b.shape().rank() >= rank ? b.shape()[axis] : 1;
    RETRACE_CHECK(da == db || da == 1 || db == 1, invalid_argument,
                  "{}: shapes {} and {} do not broadcast (axis {}: {} vs {})", op, a.shape(),
                  b.shape(), axis, da, db);
    out[i] = da == 1 ? db : da;  // a 0 extent against a 1 broadcasts to 0
  }
  return Shape(std::span<const std::int64_t>(out));
}

void check_binary(const Tensor& a, const Tensor& b, std::string_view op) {
  Device& da = device_of(a, op, "a");
  Device& db = device_of(b, op, "b");
  RETRACE_CHECK(&da == &db, invalid_argument, "{}: a is on {} but b is on {}", op, da.name(),
                db.name());
  RETRACE_CHECK(a.dtype() == b.dtype(), invalid_argument, "{}: a has dtype {} but b has {}", op,
                a.dtype(), b.dtype());
  RETRACE_CHECK(a.layout() == b.layout(), invalid_argument, "{}: a has layout {} but b has {}",
                op, a.layout(), b.layout());
  RETRACE_CHECK(a.layout() == Layout::row_major || a.shape() == b.shape(), invalid_argument,
                "{}: tile-layout operands must have equal shapes ({} vs {}); broadcast in "
                "row_major",
                op, a.shape(), b.shape());
  check_dtype_in(a, op, "a", kArithmeticTypes);
}



void enqueue_binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b,
                    const Tensor& out, QueueId queue) {
  BinaryParams params{};
  params.a = view_data(a);  // views are read through their strides
  params.b = view_data(b);
  params.out = data_of(out);
  params.dtype = a.dtype();
  params.op = kind;
  if (a.layout() == Layout::tile ||
      (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous())) {
    params.rank = 1;
    params.shape[0] = storage_elements(a.shape(), a.layout());
    params.a_strides[0] = params.b_strides[0] = 1;
  } else {
    const std::vector<std::int64_t> shape(out.shape().dims().begin(), out.shape().dims().end());
    fill_space(collapse(shape, {broadcast_strides(a, shape), broadcast_strides(b, shape)}),
               params.shape, {params.a_strides, params.b_strides}, params.rank, op);
  }
  Buffer* buffers[] = {a.buffer().get(), b.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({2})));
}

Tensor binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b, QueueId queue) {
  check_binary(a, b, op);
  Tensor out = empty_like(a, broadcast_shape(a, b, op), op);
  enqueue_binary(op, kind, a, b, out, queue);
  return out;
}

void binary_out(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b,
                const Tensor& out, QueueId queue) {
  check_binary(a, b, op);
  check_out(out, a, broadcast_shape(a, b, op), op);
  check_no_partial_overlap(out, op, {{&a, "a"}, {&b, "b"}});
  enqueue_binary(op, kind, a, b, out, queue);
}

void binary_scalar_out(const char* op, BinaryOp kind, const Tensor& a_in, double b,
                       const Tensor& out, QueueId queue) {
  Device& device = device_of(a_in, op, "a");
  check_dtype_in(a_in, op, "a", kArithmeticTypes);
  check_out(out, a_in, a_in.shape(), op);
  check_integer_scalar(a_in.dtype(), b, op,
                       "typecast the tensor to float32 for fractional arithmetic");
  const Tensor a = dense(a_in, queue);
  check_no_partial_overlap(out, op, {{&a, "a"}});
  BinaryScalarParams params{data_of(a), data_of(out), storage_elements(a.shape(), a.layout()),
                            a.dtype(), kind, b};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  device.enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
}

Tensor binary_scalar(const char* op, BinaryOp kind, const Tensor& a, double b, QueueId queue) {
  device_of(a, op, "a");
  check_dtype_in(a, op, "a", kArithmeticTypes);
  Tensor out = empty_like(a, a.shape(), op);
  binary_scalar_out(op, kind, a, b, out, queue);
  return out;
}

// The unary ops torch also runs on integers, composed there of integer arithmetic (so on every
// device): neg (wrapping, as torch: -INT_MIN is INT_MIN, unsigned values wrap), abs (the same
// INT_MIN; unsigned values unchanged), relu, square (wrapping), and floor, ceil, round and trunc
// (the values unchanged). Others take floats only.
bool integer_form(UnaryOp kind, DType dtype) {
  if (dtype != DType::int32 && dtype != DType::uint32 && dtype != DType::int64) return false;
  switch (kind) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::relu: case UnaryOp::square:
    case UnaryOp::floor: case UnaryOp::ceil: case UnaryOp::round: case UnaryOp::trunc:
      return true;
    default:
      return false;
  }
}

void integer_unary_out(const char* op, UnaryOp kind, const Tensor& a, const Tensor& out,
                       QueueId queue) {
  check_out(out, a, a.shape(), op);
  auto zero = [&] { return full(Shape{}, 0.0, *a.device(), a.dtype(), Layout::row_major, queue); };
  switch (kind) {
    case UnaryOp::neg: binary_out(op, BinaryOp::sub, zero(), a, out, queue); return;
    case UnaryOp::abs:
      if (a.dtype() == DType::uint32) break;  // its values unchanged
      binary_out(op, BinaryOp::maximum, a, binary(op, BinaryOp::sub, zero(), a, queue), out,
                 queue);
      return;
    case UnaryOp::relu: binary_scalar_out(op, BinaryOp::maximum, a, 0.0, out, queue); return;
    case UnaryOp::square: binary_out(op, BinaryOp::mul, a, a, out, queue); return;
    default: break;
  }
  // The values unchanged: a copy, unless out is a itself.
  if (out.buffer() != a.buffer() || out.storage_offset() != a.storage_offset()) {
    copy(a, out, queue);
  }
}

void unary_out(const char* op, UnaryOp kind, const Tensor& a_in, const Tensor& out,
               QueueId queue) {
  Device& device = device_of(a_in, op, "a");
  if (integer_form(kind, a_in.dtype())) {
    integer_unary_out(op, kind, a_in, out, queue);
    return;
  }
  check_dtype_in(a_in, op, "a", kFloatTypes);
  check_out(out, a_in, a_in.shape(), op);
  const Tensor a = dense(a_in, queue);
  check_no_partial_overlap(out, op, {{&a, "a"}});
  UnaryParams params{data_of(a), data_of(out), storage_elements(a.shape(), a.layout()), a.dtype(),
                     kind};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  device.enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
}

Tensor unary(const char* op, UnaryOp kind, const Tensor& a, QueueId queue) {
  device_of(a, op, "a");
  if (!integer_form(kind, a.dtype())) check_dtype_in(a, op, "a", kFloatTypes);
  Tensor out = empty_like(a, a.shape(), op);
  unary_out(op, kind, a, out, queue);
  return out;
}

}  // namespace

#define RETRACE_DEFINE_BINARY(name)                                                        \
  Tensor name(const Tensor& a, const Tensor& b, QueueId queue) {                           \
    return binary(#name, BinaryOp::name, a, b, queue);                                     \
  }                                                                                        \
  Tensor name(const Tensor& a, double b, QueueId queue) {                                  \
    return binary_scalar(#name, BinaryOp::name, a, b, queue);                              \
  }                                                                                        \
  void name(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue) {          \
    binary_out(#name, BinaryOp::name, a, b, out, queue);                                   \
  }                                                                                        \
  void name(const Tensor& a, double b, const Tensor& out, QueueId queue) {                 \
    binary_scalar_out(#name, BinaryOp::name, a, b, out, queue);                            \
  }
RETRACE_DEFINE_BINARY(add)
RETRACE_DEFINE_BINARY(sub)
RETRACE_DEFINE_BINARY(mul)
RETRACE_DEFINE_BINARY(div)
RETRACE_DEFINE_BINARY(maximum)
RETRACE_DEFINE_BINARY(minimum)
RETRACE_DEFINE_BINARY(pow)
RETRACE_DEFINE_BINARY(floor_divide)
RETRACE_DEFINE_BINARY(fmod)
RETRACE_DEFINE_BINARY(remainder)
#undef RETRACE_DEFINE_BINARY

// true_divide: operands promoted as torch.true_divide does, then div.
namespace {

bool is_floating(DType dtype) { return dtype_info(dtype).is_floating; }

// The dtype both operands are divided in: the floating one's, or float32 when neither floats.
DType true_divide_dtype(DType a, DType b) {
  if (is_floating(a)) return a;
  if (is_floating(b)) return b;
  return DType::float32;
}

Tensor promoted(const Tensor& t, DType dtype, QueueId queue) {
  return t.dtype() == dtype ? t : typecast(t, dtype, queue);
}

}  // namespace

Tensor true_divide(const Tensor& a, const Tensor& b, QueueId queue) {
  device_of(a, "true_divide", "a");
  device_of(b, "true_divide", "b");
  const DType dtype = true_divide_dtype(a.dtype(), b.dtype());
  return binary("true_divide", BinaryOp::div, promoted(a, dtype, queue), promoted(b, dtype, queue),
                queue);
}

Tensor true_divide(const Tensor& a, double b, QueueId queue) {
  device_of(a, "true_divide", "a");
  const DType dtype = true_divide_dtype(a.dtype(), a.dtype());
  return binary_scalar("true_divide", BinaryOp::div, promoted(a, dtype, queue), b, queue);
}

void true_divide(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue) {
  device_of(a, "true_divide", "a");
  device_of(b, "true_divide", "b");
  const DType dtype = true_divide_dtype(a.dtype(), b.dtype());
  binary_out("true_divide", BinaryOp::div, promoted(a, dtype, queue), promoted(b, dtype, queue),
             out, queue);
}

void true_divide(const Tensor& a, double b, const Tensor& out, QueueId queue) {
  device_of(a, "true_divide", "a");
  const DType dtype = true_divide_dtype(a.dtype(), a.dtype());
  binary_scalar_out("true_divide", BinaryOp::div, promoted(a, dtype, queue), b, out, queue);
}

// Two scalar passes (maximum, then minimum): NaN propagates through both, and lo > hi gives hi.
void clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi, const Tensor& out,
           QueueId queue) {
  device_of(a, "clamp", "a");
  check_dtype_in(a, "clamp", "a", kArithmeticTypes);
  check_out(out, a, a.shape(), "clamp");
  for (const auto& [name, bound] : {std::pair{"lo", lo}, std::pair{"hi", hi}}) {
    RETRACE_CHECK(!bound || !std::isnan(*bound), invalid_argument,
                  "clamp: the bound {} is NaN (leave it out for no bound)", name);
  }
  if (!lo && !hi) {
    copy(a, out, queue);  // nothing when out is a itself
    return;
  }
  const Tensor* source = &a;
  if (lo) {
    binary_scalar_out("clamp", BinaryOp::maximum, a, *lo, out, queue);
    source = &out;
  }
  if (hi) binary_scalar_out("clamp", BinaryOp::minimum, *source, *hi, out, queue);
}

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi, QueueId queue) {
  device_of(a, "clamp", "a");
  check_dtype_in(a, "clamp", "a", kArithmeticTypes);
  Tensor out = empty_like(a, a.shape(), "clamp");
  clamp(a, lo, hi, out, queue);
  return out;
}

#define RETRACE_DEFINE_UNARY(name)                                                         \
  Tensor name(const Tensor& a, QueueId queue) { return unary(#name, UnaryOp::name, a, queue); } \
  void name(const Tensor& a, const Tensor& out, QueueId queue) {                           \
    unary_out(#name, UnaryOp::name, a, out, queue);                                        \
  }
RETRACE_DEFINE_UNARY(neg)
RETRACE_DEFINE_UNARY(abs)
RETRACE_DEFINE_UNARY(exp)
RETRACE_DEFINE_UNARY(log)
RETRACE_DEFINE_UNARY(sqrt)
RETRACE_DEFINE_UNARY(rsqrt)
RETRACE_DEFINE_UNARY(tanh)
RETRACE_DEFINE_UNARY(sigmoid)
RETRACE_DEFINE_UNARY(relu)
RETRACE_DEFINE_UNARY(silu)
RETRACE_DEFINE_UNARY(gelu)
RETRACE_DEFINE_UNARY(gelu_tanh)
RETRACE_DEFINE_UNARY(sin)
RETRACE_DEFINE_UNARY(cos)
RETRACE_DEFINE_UNARY(square)
RETRACE_DEFINE_UNARY(erf)
RETRACE_DEFINE_UNARY(floor)
RETRACE_DEFINE_UNARY(ceil)
RETRACE_DEFINE_UNARY(round)
RETRACE_DEFINE_UNARY(trunc)
#undef RETRACE_DEFINE_UNARY

}  // namespace retrace::ops
