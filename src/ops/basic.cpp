// Creation and copies: full/fill, copy, assert_finite.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

namespace retrace::ops {

using detail::check_dtype_in;
using detail::check_matches;
using detail::data_of;
using detail::device_of;

Tensor full(const Shape& shape, double value, Device& device, DType dtype, Layout layout,
            QueueId queue) {
  Tensor out = Tensor::empty(shape, dtype, device, layout);
  fill(out, value, queue);
  return out;
}

void fill(const Tensor& tensor, double value, QueueId queue) {
  Device& device = device_of(tensor, "fill", "tensor");
  FillParams params{data_of(tensor), storage_elements(tensor.shape(), tensor.layout()),
                    tensor.dtype(), value};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch("fill", params, buffers));
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
  CopyParams params{data_of(src), data_of(dst), static_cast<std::int64_t>(dst.nbytes())};
  Buffer* buffers[] = {src.buffer().get(), dst.buffer().get()};
  device.enqueue(queue, make_launch("copy", params, buffers));
}

void assert_finite(const Tensor& tensor, QueueId queue) {
  Device& device = device_of(tensor, "assert_finite", "tensor");
  check_dtype_in(tensor, "assert_finite", "tensor", {DType::float32, DType::bfloat16});
  AssertFiniteParams params{data_of(tensor), storage_elements(tensor.shape(), tensor.layout()),
                            tensor.dtype()};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch("assert_finite", params, buffers));
}

}  // namespace retrace::ops
