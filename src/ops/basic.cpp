// Creation and copies: full/fill, arange, copy, assert_finite.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <cmath>

namespace retrace::ops {

using detail::check_dtype_in;
using detail::kFloatTypes;
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
  if (!tensor.is_contiguous()) {  // a strided view: filled through a dense temporary
    RETRACE_CHECK(!detail::has_internal_overlap(tensor), invalid_argument,
                  "fill: tensor is a view whose elements overlap ({}); fill the tensor it views",
                  tensor.to_string());
    copy(full(tensor.shape(), value, device, tensor.dtype(), tensor.layout(), queue), tensor,
         queue);
    return;
  }
  // bool: any nonzero value (NaN included) is true, as torch.
  if (tensor.dtype() == DType::bool_) value = value != 0.0 ? 1.0 : 0.0;
  FillParams params{data_of(tensor), storage_elements(tensor.shape(), tensor.layout()),
                    tensor.dtype(), value, 0.0};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch("fill", params, buffers));
}

Tensor arange(double start, double end, double step, Device& device, DType dtype,
              QueueId queue) {
  RETRACE_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
                invalid_argument, "arange: start, end and step must be finite, got {}, {}, {}",
                start, end, step);
  RETRACE_CHECK(step != 0.0, invalid_argument, "arange: step must not be 0");
  const double span = std::ceil((end - start) / step);
  RETRACE_CHECK(span <= 0x1p53, invalid_argument,
                "arange: [{}, {}) in steps of {} has {} elements, too many", start, end, step, span);
  const auto count = span > 0 ? static_cast<std::int64_t>(span) : std::int64_t{0};
  if (!dtype_info(dtype).is_floating) {
    const auto whole = [](double v) { return std::trunc(v) == v; };
    RETRACE_CHECK(whole(start) && whole(step), invalid_argument,
                  "arange: start ({}) and step ({}) must be whole numbers for {}", start, step,
                  dtype);
    const auto [lo, hi] = detail::integer_range(dtype);
    const double last = start + static_cast<double>(count > 0 ? count - 1 : 0) * step;
    RETRACE_CHECK(count == 0 || (start >= lo && start <= hi && last >= lo && last <= hi),
                  invalid_argument, "arange: values from {} to {} do not fit in {}", start, last,
                  dtype);
  }
  Tensor out = Tensor::empty({count}, dtype, device);
  if (count == 0) return out;
  FillParams params{data_of(out), count, dtype, start, step};
  Buffer* buffers[] = {out.buffer().get()};
  device.enqueue(queue, make_launch("arange", params, buffers, writes_only({0})));
  return out;
}

void copy(const Tensor& src, const Tensor& dst, QueueId queue) {
  src.check_not_null("copy", "src");
  Device& device = device_of(dst, "copy", "dst");
  RETRACE_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype() &&
                    src.layout() == dst.layout(),
                invalid_argument, "copy: src is {} {} {} but dst is {} {} {}", src.shape(),
                src.dtype(), src.layout(), dst.shape(), dst.dtype(), dst.layout());
  RETRACE_CHECK(!detail::has_internal_overlap(dst), invalid_argument,
                "copy: dst is a view whose elements overlap ({}); it cannot be written",
                dst.to_string());
  if (src.on_host()) {
    if (!dst.is_contiguous()) {
      copy(src.to_device(device, queue), dst, queue);
      return;
    }
    device.write(queue, *dst.buffer(), static_cast<std::size_t>(dst.storage_offset()) *
                                           dtype_size(dst.dtype()),
                 src.host_bytes());
    return;
  }
  check_matches(src, "src", dst, "dst", "copy");
  const bool same_elements = src.buffer() == dst.buffer() &&
                             src.storage_offset() == dst.storage_offset() &&
                             std::equal(src.strides().begin(), src.strides().end(),
                                        dst.strides().begin());
  if (same_elements || src.numel() == 0) return;
  if (detail::may_overlap(src, dst)) {
    // A shifted view of dst's own elements would be read after it was written: copy it out.
    copy(src.clone(queue), dst, queue);
    return;
  }
  if (!src.is_contiguous() || !dst.is_contiguous()) {
    const std::vector<std::int64_t> shape(src.shape().dims().begin(), src.shape().dims().end());
    detail::strided_copy("copy", src, 0, shape, detail::strides_of(src), dst, 0,
                         detail::strides_of(dst), queue);
    return;
  }
  CopyParams params{data_of(src), data_of(dst), static_cast<std::int64_t>(dst.nbytes())};
  Buffer* buffers[] = {src.buffer().get(), dst.buffer().get()};
  device.enqueue(queue, make_launch("copy", params, buffers, writes_only({1})));
}

void assert_finite(const Tensor& input, QueueId queue) {
  Device& device = device_of(input, "assert_finite", "tensor");
  check_dtype_in(input, "assert_finite", "tensor", kFloatTypes);
  const Tensor tensor = detail::dense(input, queue);
  AssertFiniteParams params{data_of(tensor), storage_elements(tensor.shape(), tensor.layout()),
                            tensor.dtype()};
  Buffer* buffers[] = {tensor.buffer().get()};
  device.enqueue(queue, make_launch("assert_finite", params, buffers, writes_only({})));
}

}  // namespace retrace::ops
