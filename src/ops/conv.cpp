// Image ops for diffusion U-Nets and VAEs: constant padding, nearest-neighbour resizing and 2-D
// convolution. They are compositions of the strided-copy, fill and matmul kernels, so every
// device that has those runs them (and a trace records them like any other op): pad is a fill
// and a copy into the interior, nearest resizing one strided copy (a source element read
// several times through a stride of 0), conv2d an im2col strided copy and one matmul per group.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <numeric>

namespace retrace::ops {

using namespace detail;

namespace {

Shape make_shape(const std::vector<std::int64_t>& dims) {
  return Shape(std::span<const std::int64_t>(dims));
}

void check_image_dtype(const Tensor& t, std::string_view op, std::string_view argument) {
  check_dtype_in(t, op, argument, kFloatTypes);
}

}  // namespace

Tensor pad(const Tensor& a, std::span<const std::int64_t> pads, double value, QueueId queue) {
  constexpr const char* op = "pad";
  Device& device = device_of(a, op, "a");
  RETRACE_CHECK(a.layout() == Layout::row_major, invalid_argument,
                "pad: a is in {} layout; pad row-major tensors", a.layout());
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(pads.size() % 2 == 0 && pads.size() / 2 <= rank, invalid_argument,
                "pad: {} padding values for a tensor of rank {} (give (before, after) pairs, "
                "last dimension first, for at most {} dimensions)",
                pads.size(), rank, rank);
  if (!dtype_info(a.dtype()).is_floating) {
    check_integer_scalar(a.dtype(), value, op, "pad an integer tensor with a whole number");
  }
  std::vector<std::int64_t> dims(a.shape().dims().begin(), a.shape().dims().end());
  std::vector<std::int64_t> before(rank, 0);
  for (std::size_t k = 0; k < pads.size() / 2; ++k) {
    const std::size_t d = rank - 1 - k;
    const std::int64_t lo = pads[2 * k], hi = pads[2 * k + 1];
    RETRACE_CHECK(lo >= 0 && hi >= 0, invalid_argument,
                  "pad: padding of dimension {} is ({}, {}); padding is >= 0 (use slice to crop)",
                  d, lo, hi);
    RETRACE_CHECK(lo <= INT64_MAX / 4 - dims[d] && hi <= INT64_MAX / 4 - dims[d] - lo,
                  invalid_argument, "pad: the padded extent of dimension {} overflows", d);
    before[d] = lo;
    dims[d] += lo + hi;
  }
  const Shape shape = make_shape(dims);
  RETRACE_CHECK(shape.numel() >= 0, invalid_argument, "pad: the padded shape overflows");
  Tensor out = full(shape, value, device, a.dtype(), Layout::row_major, queue);
  const std::vector<std::int64_t> out_strides = contiguous_strides(shape);
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < rank; ++d) offset += before[d] * out_strides[d];
  const std::vector<std::int64_t> src_dims(a.shape().dims().begin(), a.shape().dims().end());
  strided_copy(op, a, 0, src_dims, contiguous_strides(a.shape()), out, offset, out_strides, queue);
  return out;
}

Tensor pad(const Tensor& a, std::initializer_list<std::int64_t> pads, double value,
           QueueId queue) {
  return pad(a, std::span<const std::int64_t>(pads.begin(), pads.size()), value, queue);
}

Tensor interpolate_nearest(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
                           QueueId queue) {
  constexpr const char* op = "interpolate_nearest";
  device_of(a, op, "a");
  RETRACE_CHECK(a.layout() == Layout::row_major, invalid_argument,
                "interpolate_nearest: a is in {} layout; resize row-major tensors", a.layout());
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(rank >= 2, invalid_argument,
                "interpolate_nearest: a has rank {}; it resizes the last two dimensions [..., H, "
                "W]",
                rank);
  const auto dims = a.shape().dims();
  const std::int64_t in_h = dims[rank - 2], in_w = dims[rank - 1];
  const std::int64_t outer = in_h * in_w == 0 ? 0 : a.numel() / (in_h * in_w);
  // One resized dimension: (extents, source strides) of the copy that makes it.
  std::vector<std::int64_t> shape{outer}, src_strides{in_h * in_w};
  const auto add = [&](std::int64_t in, std::int64_t out, std::int64_t stride, char name) {
    RETRACE_CHECK(out >= 0 && out <= (std::int64_t{1} << 40), invalid_argument,
                  "interpolate_nearest: output {} is {}", name, out);
    RETRACE_CHECK(in > 0 || out == 0, invalid_argument,
                  "interpolate_nearest: cannot resize an empty {} of 0 to {}", name, out);
    if (out == 0 || in == 0) {
      shape.push_back(0);
      src_strides.push_back(stride);
    } else if (out % in == 0) {  // up by k: each source element k times (source i / k)
      shape.push_back(in);
      src_strides.push_back(stride);
      shape.push_back(out / in);
      src_strides.push_back(0);
    } else if (in % out == 0) {  // down by k: every k-th source element (source i * k)
      shape.push_back(out);
      src_strides.push_back(stride * (in / out));
    } else {
      RETRACE_FAIL(unimplemented,
                   "interpolate_nearest: {} {} -> {}: nearest resizing takes output sizes that "
                   "are whole multiples or divisors of the input's",
                   name == 'h' ? "height" : "width", in, out);
    }
  };
  add(in_h, out_h, in_w, 'h');
  add(in_w, out_w, 1, 'w');
  std::vector<std::int64_t> out_dims(dims.begin(), dims.end());
  out_dims[rank - 2] = out_h;
  out_dims[rank - 1] = out_w;
  Tensor out = empty_like(a, make_shape(out_dims), op);
  std::vector<std::int64_t> dst_strides(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    dst_strides[i] = acc;
    acc *= shape[i];
  }
  strided_copy(op, a, 0, shape, src_strides, out, 0, dst_strides, queue);
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options, QueueId queue) {
  constexpr const char* op = "conv2d";
  Device& device = device_of(x, op, "x");
  RETRACE_CHECK(&device_of(weight, op, "weight") == &device, invalid_argument,
                "conv2d: x and weight are on different devices");
  check_image_dtype(x, op, "x");
  RETRACE_CHECK(weight.dtype() == x.dtype(), invalid_argument,
                "conv2d: weight is {} but x is {}", weight.dtype(), x.dtype());
  RETRACE_CHECK(x.layout() == Layout::row_major && weight.layout() == Layout::row_major,
                invalid_argument, "conv2d: x and weight must be row-major");
  RETRACE_CHECK(x.shape().rank() == 4, invalid_argument,
                "conv2d: x has shape {}; it is [N, C, H, W]", x.shape());
  RETRACE_CHECK(weight.shape().rank() == 4, invalid_argument,
                "conv2d: weight has shape {}; it is [out_channels, in_channels / groups, kh, kw]",
                weight.shape());
  const std::int64_t groups = options.groups;
  const auto [sh, sw] = options.stride;
  const auto [ph, pw] = options.padding;
  const auto [dh, dw] = options.dilation;
  RETRACE_CHECK(groups >= 1, invalid_argument, "conv2d: groups is {}; it is >= 1", groups);
  RETRACE_CHECK(sh >= 1 && sw >= 1, invalid_argument, "conv2d: stride ({}, {}) must be >= 1",
                sh, sw);
  RETRACE_CHECK(dh >= 1 && dw >= 1, invalid_argument, "conv2d: dilation ({}, {}) must be >= 1",
                dh, dw);
  RETRACE_CHECK(ph >= 0 && pw >= 0, invalid_argument, "conv2d: padding ({}, {}) must be >= 0",
                ph, pw);
  const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const std::int64_t o = weight.shape()[0], cg = weight.shape()[1];
  const std::int64_t kh = weight.shape()[2], kw = weight.shape()[3];
  RETRACE_CHECK(c % groups == 0 && o % groups == 0, invalid_argument,
                "conv2d: {} input and {} output channels do not split into {} groups", c, o,
                groups);
  RETRACE_CHECK(cg * groups == c, invalid_argument,
                "conv2d: weight {} expects {} input channels ({} per group x {} groups), x has {}",
                weight.shape(), cg * groups, cg, groups, c);
  RETRACE_CHECK(kh >= 1 && kw >= 1, invalid_argument, "conv2d: the kernel is {}x{}", kh, kw);
  if (!bias.is_null()) {
    RETRACE_CHECK(bias.shape() == Shape({o}) && bias.dtype() == x.dtype(), invalid_argument,
                  "conv2d: bias is {} {}; expected [{}] {}", bias.shape(), bias.dtype(), o,
                  x.dtype());
  }
  const std::int64_t hp = h + 2 * ph, wp = w + 2 * pw;
  const std::int64_t span_h = dh * (kh - 1) + 1, span_w = dw * (kw - 1) + 1;
  RETRACE_CHECK(hp >= span_h && wp >= span_w, invalid_argument,
                "conv2d: the kernel spans {}x{} (dilation {}x{}) but the padded input is only "
                "{}x{}",
                span_h, span_w, dh, dw, hp, wp);
  const std::int64_t ho = (hp - span_h) / sh + 1, wo = (wp - span_w) / sw + 1;

  const Tensor padded = (ph > 0 || pw > 0) ? pad(x, {pw, pw, ph, ph}, 0.0, queue) : x;
  const std::int64_t k = cg * kh * kw;
  const std::int64_t og = o / groups;
  const Tensor w2d = reshape(weight, {o, k});
  std::vector<Tensor> per_group;
  for (std::int64_t g = 0; g < groups; ++g) {
    // im2col: cols[n, i, j, c, a, b] = padded[n, g*cg + c, i*sh + a*dh, j*sw + b*dw].
    Tensor cols = empty_like(x, Shape{n, ho, wo, cg, kh, kw}, op);
    strided_copy(op, padded, g * cg * hp * wp, {n, ho, wo, cg, kh, kw},
                 {c * hp * wp, sh * wp, sw, hp * wp, dh * wp, dw}, cols, 0,
                 contiguous_strides(cols.shape()), queue);
    const Tensor wg = groups == 1 ? w2d : slice(w2d, 0, g * og, (g + 1) * og, 1, queue);
    const Tensor bg =
        bias.is_null() || groups == 1 ? bias : slice(bias, 0, g * og, (g + 1) * og, 1, queue);
    per_group.push_back(linear(reshape(cols, {n * ho * wo, k}), wg, bg, queue));
  }
  const Tensor rows = groups == 1 ? per_group[0] : concat(per_group, 1, queue);
  return permute(reshape(rows, {n, ho, wo, o}), {0, 3, 1, 2}, queue);
}

}  // namespace retrace::ops
