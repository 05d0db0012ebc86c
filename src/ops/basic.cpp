// The minimal ops: full/fill, copy, add and mul (tensor or scalar), assert_finite.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

namespace retrace::ops {

using detail::check_dtype_in;
using detail::check_matches;
using detail::device_of;

namespace {

constexpr std::initializer_list<DType> kArithmeticTypes = {DType::float32, DType::bfloat16,
                                                           DType::int32, DType::uint32};

void* data(const Tensor& t) { return t.buffer()->data(); }

void enqueue_binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b,
                    const Tensor& out, QueueId queue) {
  check_matches(a, "a", b, "b", op);
  check_matches(a, "a", out, "out", op);
  check_dtype_in(a, op, "a", kArithmeticTypes);
  BinaryParams params{data(a), data(b), data(out), storage_elements(a.shape(), a.layout()),
                      a.dtype(), kind};
  Buffer* buffers[] = {a.buffer().get(), b.buffer().get(), out.buffer().get()};
  device_of(a, op, "a").enqueue(queue, make_launch(KernelId::binary, op, params, buffers));
}

void enqueue_binary_scalar(const char* op, BinaryOp kind, const Tensor& a, double b,
                           const Tensor& out, QueueId queue) {
  check_matches(a, "a", out, "out", op);
  check_dtype_in(a, op, "a", kArithmeticTypes);
  BinaryScalarParams params{data(a), data(out), storage_elements(a.shape(), a.layout()),
                            a.dtype(), kind, b};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  device_of(a, op, "a").enqueue(queue, make_launch(KernelId::binary_scalar, op, params, buffers));
}

Tensor like(const Tensor& a, const char* op) {
  return Tensor::empty(a.shape(), a.dtype(), device_of(a, op, "a"), a.layout());
}

}  // namespace

Tensor full(const Shape& shape, double value, Device& device, DType dtype, Layout layout,
            QueueId queue) {
  Tensor out = Tensor::empty(shape, dtype, device, layout);
  fill(out, value, queue);
  return out;
}

void fill(const Tensor& tensor, double value, QueueId queue) {
  Device& device = device_of(tensor, "fill", "tensor");
  FillParams params{data(tensor), storage_elements(tensor.shape(), tensor.layout()),
                    tensor.dtype(), value};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch(KernelId::fill, "fill", params, buffers));
}

void copy(const Tensor& src, const Tensor& dst, QueueId queue) {
  src.check_not_null("copy", "src");
  Device& device = device_of(dst, "copy", "dst");
  RETRACE_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype() &&
                    src.layout() == dst.layout(),
                invalid_argument, "copy: src is {} {} {} but dst is {} {} {}", src.shape(),
                src.dtype(), src.layout(), dst.shape(), dst.dtype(), dst.layout());
  if (src.on_host()) {
    device.write(queue, *dst.buffer(), 0, src.host_bytes());
    return;
  }
  check_matches(src, "src", dst, "dst", "copy");
  if (src.address() == dst.address()) return;
  CopyParams params{data(src), data(dst), static_cast<std::int64_t>(dst.nbytes())};
  Buffer* buffers[] = {src.buffer().get(), dst.buffer().get()};
  device.enqueue(queue, make_launch(KernelId::copy, "copy", params, buffers));
}

Tensor add(const Tensor& a, const Tensor& b, QueueId queue) {
  Tensor out = like(a, "add");
  add(a, b, out, queue);
  return out;
}
Tensor add(const Tensor& a, double b, QueueId queue) {
  Tensor out = like(a, "add");
  add(a, b, out, queue);
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b, QueueId queue) {
  Tensor out = like(a, "mul");
  mul(a, b, out, queue);
  return out;
}
Tensor mul(const Tensor& a, double b, QueueId queue) {
  Tensor out = like(a, "mul");
  mul(a, b, out, queue);
  return out;
}
void add(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue) {
  enqueue_binary("add", BinaryOp::add, a, b, out, queue);
}
void add(const Tensor& a, double b, const Tensor& out, QueueId queue) {
  enqueue_binary_scalar("add", BinaryOp::add, a, b, out, queue);
}
void mul(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue) {
  enqueue_binary("mul", BinaryOp::mul, a, b, out, queue);
}
void mul(const Tensor& a, double b, const Tensor& out, QueueId queue) {
  enqueue_binary_scalar("mul", BinaryOp::mul, a, b, out, queue);
}

void assert_finite(const Tensor& tensor, QueueId queue) {
  Device& device = device_of(tensor, "assert_finite", "tensor");
  check_dtype_in(tensor, "assert_finite", "tensor", {DType::float32, DType::bfloat16});
  AssertFiniteParams params{data(tensor), storage_elements(tensor.shape(), tensor.layout()),
                            tensor.dtype()};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch(KernelId::assert_finite, "assert_finite", params, buffers));
}

}  // namespace retrace::ops
