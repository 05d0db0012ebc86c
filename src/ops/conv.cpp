// Image ops for diffusion U-Nets and VAEs: constant padding, resizing and 2-D convolution. They
// are compositions of the strided-copy, fill, gather, elementwise and matmul kernels, so every
// device that has those runs them (and a trace records them like any other op): pad is a fill
// and a copy into the interior; nearest resizing by a whole ratio one strided copy (a source
// element read several times through a stride of 0), by any other ratio an index_select whose
// indices are computed on the device; bilinear resizing two index_selects and a weighted sum per
// resized dimension; conv2d an im2col strided copy and one matmul per group.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <vector>

namespace retrace::ops {

using namespace detail;

namespace {

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
  const Shape shape = shape_of(dims);
  RETRACE_CHECK(shape.numel() >= 0, invalid_argument, "pad: the padded shape overflows");
  Tensor out = full(shape, value, device, a.dtype(), Layout::row_major, queue);
  const std::vector<std::int64_t> out_strides = contiguous_strides(shape);
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < rank; ++d) offset += before[d] * out_strides[d];
  const std::vector<std::int64_t> src_dims(a.shape().dims().begin(), a.shape().dims().end());
  strided_copy(op, a, 0, src_dims, strides_of(a), out, offset, out_strides, queue);
  return out;
}

Tensor pad(const Tensor& a, std::initializer_list<std::int64_t> pads, double value,
           QueueId queue) {
  return pad(a, std::span<const std::int64_t>(pads.begin(), pads.size()), value, queue);
}

namespace {

// How one output coordinate maps to the input along one resized dimension, as torch computes it
// (float32 arithmetic throughout, so the indices and weights are torch's bit for bit): output i
// reads position (i + offset) * scale - shift.
struct AxisMap {
  std::int64_t in = 0, out = 0;
  float scale = 0.0f;   // torch's area_pixel scale: in / out, or (in - 1) / (out - 1) aligned
  float offset = 0.0f;  // 0.5: pixel centres (nearest-exact; bilinear, bicubic unaligned)
  float shift = 0.0f;   // 0.5 for bilinear and bicubic without align_corners
  bool clamp_at_zero = false;  // bilinear's positions stop at 0 (bicubic's go below)
};

bool is_linear_or_cubic(InterpolateMode mode) {
  return mode == InterpolateMode::bilinear || mode == InterpolateMode::bicubic;
}

// `scale_factor`: the user's factor (interpolate_scaled), 0 when the output size was given.
AxisMap axis_map(std::int64_t in, std::int64_t out, const InterpolateOptions& o,
                 double scale_factor) {
  AxisMap m{in, out};
  const bool weighted = is_linear_or_cubic(o.mode);
  if (weighted && o.align_corners) {
    m.scale = out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  } else if (scale_factor > 0.0) {
    m.scale = static_cast<float>(1.0 / scale_factor);  // torch's compute_scales_value
  } else {
    m.scale = static_cast<float>(in) / static_cast<float>(out);
  }
  const bool centres = o.mode == InterpolateMode::nearest_exact || (weighted && !o.align_corners);
  m.offset = centres ? 0.5f : 0.0f;
  m.shift = weighted && !o.align_corners ? 0.5f : 0.0f;
  m.clamp_at_zero = o.mode == InterpolateMode::bilinear && !o.align_corners;
  return m;
}

// The nearest source index of output i (torch's nearest_idx / nearest_exact_idx; an unchanged
// extent never gets here).
std::int64_t nearest_source(const AxisMap& m, std::int64_t i) {
  if (m.offset == 0.0f && m.out == 2 * m.in) return i >> 1;
  const float at = (static_cast<float>(i) + m.offset) * m.scale;
  return std::min(static_cast<std::int64_t>(std::floor(at)), m.in - 1);
}

// The source positions as a float32 device tensor [out], made by arange so a trace records
// them (no host write during a capture). arange computes start + i * step in double and rounds
// once, which is what torch's kernels compute: `scale * (i + 0.5) - 0.5` is one fused
// multiply-add there (and exact in double for every size that fits an int32 index).
Tensor source_positions(const AxisMap& m, Device& device, QueueId queue) {
  const auto scale = static_cast<double>(m.scale);
  const double start = static_cast<double>(m.offset) * scale - static_cast<double>(m.shift);
  Tensor at = scale == 0.0 ? full({m.out}, start, device, DType::float32, Layout::row_major, queue)
                           : arange(start, start + (static_cast<double>(m.out) - 0.5) * scale,
                                    scale, device, DType::float32, queue);
  return m.clamp_at_zero ? maximum(at, 0.0, queue) : at;
}

Tensor floor_index(const Tensor& positions, std::int64_t in, QueueId queue) {
  // Positions are >= 0, so truncation is floor.
  return minimum(typecast(positions, DType::int32, queue), static_cast<double>(in - 1), queue);
}

const char* mode_name(InterpolateMode mode) {
  switch (mode) {
    case InterpolateMode::nearest: return "nearest";
    case InterpolateMode::nearest_exact: return "nearest-exact";
    case InterpolateMode::bilinear: return "bilinear";
    case InterpolateMode::bicubic: return "bicubic";
    case InterpolateMode::area: return "area";
  }
  return "?";
}

// Nearest resizing of dimension `dim` (-2 or -1): one strided copy when every output reads
// source i / k or i * k (whole ratios), an index_select otherwise.
Tensor resize_nearest(const Tensor& a_in, int dim, const AxisMap& m, const char* op,
                      QueueId queue) {
  const Tensor a = dense(a_in, queue);  // the strides below are a dense tensor's
  const std::size_t rank = a.shape().rank();
  const auto d = static_cast<std::size_t>(static_cast<int>(rank) + dim);
  bool up = m.out % m.in == 0, down = m.in % m.out == 0;
  for (std::int64_t i = 0; i < m.out && (up || down); ++i) {
    const std::int64_t src = nearest_source(m, i);
    up = up && src == i / (m.out / m.in);
    down = down && src == i * (m.in / m.out);
  }
  if (!up && !down) {
    Device& device = *a.device();
    const Tensor index = floor_index(source_positions(m, device, queue), m.in, queue);
    return index_select(a, dim, index, queue);
  }
  const auto dims = a.shape().dims();
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < d; ++i) outer *= dims[i];
  for (std::size_t i = d + 1; i < rank; ++i) inner *= dims[i];
  std::vector<std::int64_t> shape{outer}, src_strides{m.in * inner};
  if (up) {  // each source element k times
    shape.insert(shape.end(), {m.in, m.out / m.in, inner});
    src_strides.insert(src_strides.end(), {inner, 0, 1});
  } else {  // every k-th source element
    shape.insert(shape.end(), {m.out, inner});
    src_strides.insert(src_strides.end(), {inner * (m.in / m.out), 1});
  }
  std::vector<std::int64_t> out_dims(dims.begin(), dims.end());
  out_dims[d] = m.out;
  Tensor out = empty_like(a, shape_of(out_dims), op);
  const std::vector<std::int64_t> dst_strides = contiguous_strides(shape);
  strided_copy(op, a, 0, shape, src_strides, out, 0, dst_strides, queue);
  return out;
}

// 1 - t for a float32 weight vector t (rounded once, as torch's 1 - t).
Tensor one_minus(const Tensor& t, QueueId queue) {
  return sub(full(t.shape(), 1.0, *t.device(), DType::float32, Layout::row_major, queue), t,
             queue);
}

// Linear resizing of dimension `dim` of a float32 tensor: lambda0 * a[i0] + lambda1 * a[i1].
Tensor resize_linear(const Tensor& a, int dim, const AxisMap& m, QueueId queue) {
  Device& device = *a.device();
  const Tensor positions = source_positions(m, device, queue);
  const Tensor i0 = floor_index(positions, m.in, queue);
  const Tensor i1 = minimum(add(i0, 1.0, queue), static_cast<double>(m.in - 1), queue);
  Tensor lambda1 =
      clamp(sub(positions, typecast(i0, DType::float32, queue), queue), 0.0, 1.0, queue);
  Tensor lambda0 = one_minus(lambda1, queue);
  if (dim == -2) {  // weights per row: [out, 1]
    lambda0 = reshape(lambda0, {m.out, 1});
    lambda1 = reshape(lambda1, {m.out, 1});
  }
  return add(mul(index_select(a, dim, i0, queue), lambda0, queue),
             mul(index_select(a, dim, i1, queue), lambda1, queue), queue);
}

// Keys' cubic convolution weights with A = -0.75, as torch's bicubic: for |x| <= 1,
// ((A + 2) x - (A + 3)) x x + 1; for 1 < |x| < 2, ((A x - 5 A) x + 8 A) x - 4 A.
constexpr double kCubicA = -0.75;
Tensor cubic_near(const Tensor& x, QueueId queue) {
  return add(mul(mul(sub(mul(x, kCubicA + 2, queue), kCubicA + 3, queue), x, queue), x, queue),
             1.0, queue);
}
Tensor cubic_far(const Tensor& x, QueueId queue) {
  return sub(mul(add(mul(sub(mul(x, kCubicA, queue), 5 * kCubicA, queue), x, queue),
                     8 * kCubicA, queue),
                 x, queue),
             4 * kCubicA, queue);
}

// Bicubic resizing of dimension `dim` of a float32 tensor: four taps at floor(position) - 1 ..
// + 2 (clamped to the edges), weighted as torch weighs them (t = position - floor(position);
// the weights of t + 1, t, 1 - t and (1 - t) + 1), summed in tap order.
Tensor resize_cubic(const Tensor& a, int dim, const AxisMap& m, QueueId queue) {
  Device& device = *a.device();
  const Tensor positions = source_positions(m, device, queue);
  const Tensor whole = floor(positions, queue);
  const Tensor t = sub(positions, whole, queue);
  const Tensor base = typecast(whole, DType::int32, queue);
  const Tensor one_minus_t = one_minus(t, queue);
  Tensor weights[4] = {cubic_far(add(t, 1.0, queue), queue), cubic_near(t, queue),
                       cubic_near(one_minus_t, queue),
                       cubic_far(add(one_minus_t, 1.0, queue), queue)};
  Tensor sum;
  for (int j = 0; j < 4; ++j) {
    const Tensor index = clamp(add(base, static_cast<double>(j - 1), queue), 0.0,
                               static_cast<double>(m.in - 1), queue);
    if (dim == -2) weights[j] = reshape(weights[j], {m.out, 1});  // weights per row
    const Tensor term = mul(index_select(a, dim, index, queue), weights[j], queue);
    sum = j == 0 ? term : add(sum, term, queue);
  }
  return sum;
}

// Area resizing of dimension `dim` of a float32 tensor, before the division: output i sums
// input [floor(i * in / out), ceil((i + 1) * in / out)) (torch's adaptive average pooling
// windows), in order, as a sum over the longest window's taps with the taps past a shorter
// window's end replaced by 0 (so an infinity elsewhere in the row cannot make NaN). Returns the
// sums; *count gets each window's length as float32 [out].
Tensor area_sums(const Tensor& a, int dim, std::int64_t in, std::int64_t out, Tensor* count,
                 QueueId queue) {
  Device& device = *a.device();
  const Tensor i = arange(0.0, static_cast<double>(out), 1.0, device, DType::int64, queue);
  const auto in_d = static_cast<double>(in), out_d = static_cast<double>(out);
  const Tensor start = floor_divide(mul(i, in_d, queue), out_d, queue);
  const Tensor end = floor_divide(add(mul(add(i, 1.0, queue), in_d, queue), out_d - 1, queue),
                                  out_d, queue);
  *count = typecast(sub(end, start, queue), DType::float32, queue);
  // The longest window: in / out taps when out divides in, else at most two more.
  const std::int64_t taps = in % out == 0 ? in / out : std::min(in, in / out + 2);
  const Tensor zero = full({1}, 0.0, device, DType::float32, Layout::row_major, queue);
  Tensor sum;
  for (std::int64_t j = 0; j < taps; ++j) {
    const Tensor at = add(start, static_cast<double>(j), queue);
    const Tensor index =
        typecast(minimum(at, static_cast<double>(in - 1), queue), DType::int32, queue);
    Tensor term = index_select(a, dim, index, queue);
    if (j > 0) {  // the first tap is in every window
      Tensor inside = lt(at, end, queue);
      if (dim == -2) inside = reshape(inside, {out, 1});
      term = where(inside, term, zero, queue);
    }
    sum = j == 0 ? term : add(sum, term, queue);
  }
  return sum;
}

// `scale_factors` (height, width): the user's factors (interpolate_scaled), or null.
Tensor resize(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
              const InterpolateOptions& options, const char* op, QueueId queue,
              const double* scale_factors = nullptr) {
  device_of(a, op, "a");
  RETRACE_CHECK(a.layout() == Layout::row_major, invalid_argument,
                "{}: a is in {} layout; resize row-major tensors", op, a.layout());
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(rank >= 2, invalid_argument,
                "{}: a has rank {}; it resizes the last two dimensions [..., H, W]", op,
                rank);
  const bool weighted = is_linear_or_cubic(options.mode);
  RETRACE_CHECK(weighted || !options.align_corners, invalid_argument,
                "{}: align_corners applies to modes bilinear and bicubic, not {}", op,
                mode_name(options.mode));
  const bool area = options.mode == InterpolateMode::area;
  if (weighted || area) check_dtype_in(a, op, "a", kFloatTypes);
  const auto dims = a.shape().dims();
  const std::int64_t in[2] = {dims[rank - 2], dims[rank - 1]}, out[2] = {out_h, out_w};
  for (int i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "height" : "width";
    RETRACE_CHECK(out[i] >= 0 && out[i] <= (std::int64_t{1} << 40), invalid_argument,
                  "{}: output {} is {}", op, name, out[i]);
    RETRACE_CHECK(in[i] > 0 || out[i] == 0, invalid_argument,
                  "{}: cannot resize an empty {} of 0 to {}", op, name, out[i]);
    RETRACE_CHECK(in[i] <= INT32_MAX, invalid_argument,
                  "{}: input {} {} is beyond 2^31 - 1", op, name, in[i]);
  }
  std::vector<std::int64_t> out_dims(dims.begin(), dims.end());
  out_dims[rank - 2] = out_h;
  out_dims[rank - 1] = out_w;
  const Shape out_shape = result_shape(out_dims, op);
  if (out_shape.numel() == 0) return empty_like(a, out_shape, op);
  // Width first, then height (torch's order of the separable sums).
  const bool narrow = (weighted || area) && a.dtype() != DType::float32;
  Tensor x = narrow ? typecast(a, DType::float32, queue) : a;
  Tensor window_sizes[2];  // area: each resized axis's window lengths
  for (int i = 1; i >= 0; --i) {
    const double factor = scale_factors == nullptr ? 0.0 : scale_factors[i];
    const AxisMap m = axis_map(in[i], out[i], options, factor);
    // torch copies an unchanged extent, except that given a factor other than 1 its
    // nearest-exact and bicubic kernels read it through 1 / factor (10 at 1.09 stays 10, read
    // at steps of 0.917); nearest, bilinear and area copy it whatever the factor.
    const bool resampled = options.mode == InterpolateMode::nearest_exact ||
                           options.mode == InterpolateMode::bicubic;
    const bool through_factor = factor != 0.0 && m.scale != 1.0f && resampled;
    if (in[i] == out[i] && !through_factor) continue;
    const int dim = i == 0 ? -2 : -1;
    switch (options.mode) {
      case InterpolateMode::bilinear: x = resize_linear(x, dim, m, queue); break;
      case InterpolateMode::bicubic: x = resize_cubic(x, dim, m, queue); break;
      case InterpolateMode::area:
        // Window bounds are computed as (i * in) // out in int64.
        RETRACE_CHECK(in[i] < (std::int64_t{1} << 62) / out[i], invalid_argument,
                      "{}: mode area: {} -> {} is too large", op, in[i], out[i]);
        x = area_sums(x, dim, in[i], out[i], &window_sizes[i], queue);
        break;
      default: x = resize_nearest(x, dim, m, op, queue); break;
    }
  }
  // Area: the window sums divided once by the 2-D window's element count, as torch's
  // adaptive_avg_pool2d (which sums each window in one running sum: the order of the additions
  // differs, within a rounding or two).
  if (!window_sizes[0].is_null()) {
    Tensor count = reshape(window_sizes[0], {out[0], 1});
    if (!window_sizes[1].is_null()) count = mul(count, window_sizes[1], queue);
    x = div(x, count, queue);
  } else if (!window_sizes[1].is_null()) {
    x = div(x, window_sizes[1], queue);
  }
  if (narrow) return typecast(x, a.dtype(), queue);
  return x.buffer() == a.buffer() ? a.clone(queue) : x;
}

}  // namespace

Tensor interpolate(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
                   const InterpolateOptions& options, QueueId queue) {
  return resize(a, out_h, out_w, options, "interpolate", queue);
}

Tensor interpolate_scaled(const Tensor& a, double scale_h, double scale_w,
                          const InterpolateOptions& options, QueueId queue) {
  constexpr const char* op = "interpolate";
  device_of(a, op, "a");
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(rank >= 2, invalid_argument,
                "{}: a has rank {}; it resizes the last two dimensions [..., H, W]", op, rank);
  const double factors[2] = {scale_h, scale_w};
  std::int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "height" : "width";
    RETRACE_CHECK(std::isfinite(factors[i]) && factors[i] > 0.0, invalid_argument,
                  "{}: scale_factor for the {} is {}; factors are finite and > 0", op, name,
                  factors[i]);
    // torch's output size: floor(in * factor) in double.
    const double size = std::floor(static_cast<double>(a.shape()[-2 + i]) * factors[i]);
    RETRACE_CHECK(size <= static_cast<double>(std::int64_t{1} << 40), invalid_argument,
                  "{}: the {} {} scaled by {} is too large", op, name, a.shape()[-2 + i],
                  factors[i]);
    out[i] = static_cast<std::int64_t>(size);
  }
  return resize(a, out[0], out[1], options, op, queue,
                options.recompute_scale_factor ? nullptr : factors);
}

Tensor interpolate_nearest(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
                           QueueId queue) {
  return resize(a, out_h, out_w, InterpolateOptions{}, "interpolate_nearest", queue);
}

namespace {
std::atomic<std::size_t> column_bytes{std::size_t{32} << 20};
std::atomic<bool> winograd{true};

// Fewer input or output channels than this: the transforms cost more than the products save
// (a VAE's first convolution has 4 input channels, its last 3 outputs).
constexpr std::int64_t kWinogradMinChannels = 16;

// conv2d by the device's Winograd kernel (3x3, stride 1, float32, one group); a null tensor when
// the device has none (conv2d then takes its im2col path). The transformed input and products of
// a chunk of tiles take at most conv2d_column_bytes() (at least one row of tiles).
Tensor winograd_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t n,
                       std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t o,
                       std::int64_t ho, std::int64_t wo, std::int64_t ph, std::int64_t pw,
                       QueueId queue) {
  constexpr const char* op = "conv2d";
  const std::int64_t tw = (wo + kWinogradTile - 1) / kWinogradTile;
  const std::int64_t per_tile =
      kWinogradPoints * (c + o) * static_cast<std::int64_t>(sizeof(float));
  const auto budget = static_cast<std::int64_t>(
      std::min<std::size_t>(conv2d_column_bytes(), std::size_t{1} << 40));
  const std::int64_t tiles = n * ((ho + kWinogradTile - 1) / kWinogradTile) * tw;
  const std::int64_t chunk_tiles =
      std::min(tiles, std::max(tw, budget / per_tile / tw * tw));
  WinogradParams params{};
  params.n = n;
  params.c = c;
  params.h = h;
  params.w = w;
  params.o = o;
  params.ho = ho;
  params.wo = wo;
  params.pad_h = ph;
  params.pad_w = pw;
  params.chunk_tiles = chunk_tiles;
  params.dtype = DType::float32;
  if (x.device()->unsupported_reason(make_launch(op, params, {})) != nullptr) return {};
  const Tensor xd = dense(x, queue);
  const Tensor wd = dense(weight, queue);
  const Tensor bd = dense(bias, queue);
  Tensor out = empty_like(x, Shape{n, o, ho, wo}, op);
  const Tensor scratch =
      empty_like(x, Shape{winograd_scratch_elements(c, o, chunk_tiles)}, op);
  params.x = data_of(xd);
  params.weight = data_of(wd);
  params.bias = bd.is_null() ? nullptr : data_of(bd);
  params.out = data_of(out);
  params.scratch = data_of(scratch);
  std::vector<Buffer*> buffers{xd.buffer().get(), wd.buffer().get(), out.buffer().get(),
                               scratch.buffer().get()};
  if (!bd.is_null()) buffers.push_back(bd.buffer().get());
  x.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({2, 3})));
  return out;
}
}  // namespace

bool conv2d_winograd() noexcept { return winograd.load(std::memory_order_relaxed); }

void set_conv2d_winograd(bool enabled) noexcept {
  winograd.store(enabled, std::memory_order_relaxed);
}

std::size_t conv2d_column_bytes() noexcept { return column_bytes.load(std::memory_order_relaxed); }

void set_conv2d_column_bytes(std::size_t bytes) noexcept {
  column_bytes.store(std::max<std::size_t>(bytes, 1), std::memory_order_relaxed);
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
    RETRACE_CHECK(&device_of(bias, op, "bias") == &device, invalid_argument,
                  "conv2d: x and bias are on different devices");
  }
  const std::int64_t hp = h + 2 * ph, wp = w + 2 * pw;
  const std::int64_t span_h = dh * (kh - 1) + 1, span_w = dw * (kw - 1) + 1;
  RETRACE_CHECK(hp >= span_h && wp >= span_w, invalid_argument,
                "conv2d: the kernel spans {}x{} (dilation {}x{}) but the padded input is only "
                "{}x{}",
                span_h, span_w, dh, dw, hp, wp);
  const std::int64_t ho = (hp - span_h) / sh + 1, wo = (wp - span_w) / sw + 1;

  if (kh == 3 && kw == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 && groups == 1 &&
      x.dtype() == DType::float32 && conv2d_winograd() && c >= kWinogradMinChannels &&
      o >= kWinogradMinChannels && n > 0 && ho * wo >= 16) {
    if (Tensor out = winograd_conv2d(x, weight, bias, n, c, h, w, o, ho, wo, ph, pw, queue);
        !out.is_null()) {
      return out;
    }
  }
  const Tensor padded = (ph > 0 || pw > 0) ? pad(x, {pw, pw, ph, ph}, 0.0, queue) : x;
  const std::int64_t k = cg * kh * kw;
  const std::int64_t og = o / groups;
  const std::int64_t pixels = ho * wo;
  const Tensor w2d = reshape(weight, {o, k});
  // The columns of each output pixel's receptive field, pixels innermost (cols[c, a, b, i, j] =
  // padded[g*cg + c, i*sh + a*dh, j*sw + b*dw], copied a row of wo pixels at a time), made a
  // chunk of at most conv2d_column_bytes() at a time (whole images, or blocks of output rows of
  // one image), so a large image never holds its whole im2col matrix (9x the input for a 3x3
  // kernel). Then one product per chunk:
  //  - float32: out[o, pixel] = W cols, written in NCHW order directly, then + bias (added to
  //    the float32 sums, as a bias inside the product would be).
  //  - 16-bit: rows[pixel, o] = cols^T W^T + bias (linear's kernel, reading the columns
  //    transposed: the bias added in float32 before the one rounding), then to NCHW.
  // A given chunk size gives the same bits every time, eager or traced; another may change the
  // last bits (a GEMM library blocks a shorter product differently).
  const auto row_bytes = static_cast<double>(wo) * static_cast<double>(k) *
                         static_cast<double>(dtype_info(x.dtype()).size);
  const auto budget = static_cast<double>(conv2d_column_bytes());
  const double image_bytes = row_bytes * static_cast<double>(ho);
  const std::int64_t images_per_chunk =
      image_bytes * static_cast<double>(n) <= budget
          ? n
          : std::max<std::int64_t>(1, static_cast<std::int64_t>(budget / std::max(image_bytes, 1.0)));
  const std::int64_t rows_per_chunk =
      image_bytes <= budget
          ? ho
          : std::max<std::int64_t>(1, static_cast<std::int64_t>(budget / std::max(row_bytes, 1.0)));
  const std::int64_t image_stride = c * hp * wp;
  const bool pixels_last = x.dtype() == DType::float32;
  std::vector<Tensor> per_group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const Tensor wg = dense(groups == 1 ? w2d : slice(w2d, 0, g * og, (g + 1) * og, 1, queue), queue);
    const Tensor bg = dense(
        bias.is_null() || groups == 1 ? bias : slice(bias, 0, g * og, (g + 1) * og, 1, queue),
        queue);
    // float32: [n, og, pixels]; 16-bit: [n * pixels, og].
    Tensor result = empty_like(x, pixels_last ? Shape{n, og, pixels} : Shape{n * pixels, og}, op);
    for (std::int64_t first = 0; first < n; first += images_per_chunk) {
      const std::int64_t images = std::min(images_per_chunk, n - first);
      for (std::int64_t i0 = 0; i0 < ho; i0 += rows_per_chunk) {
        const std::int64_t count = std::min(rows_per_chunk, ho - i0);
        const std::int64_t offset = first * image_stride + g * cg * hp * wp + i0 * sh * wp;
        if (pixels_last) {
          // [images, k, count * wo]: each image's columns, then W times each.
          Tensor cols = empty_like(x, Shape{images, k, count * wo}, op);
          strided_copy(op, padded, offset, {images, cg, kh, kw, count, wo},
                       {image_stride, hp * wp, dh * wp, dw, sh * wp, sw}, cols, 0,
                       contiguous_strides({images, cg, kh, kw, count, wo}), queue);
          if (count == ho) {
            matmul(wg, cols, slice(result, 0, first, first + images, 1, queue), Transpose::no,
                   Transpose::no, queue);
          } else {  // a block of rows of one image: its place in the output is strided
            const Tensor part = matmul(wg, reshape(cols, {k, count * wo}), Transpose::no,
                                       Transpose::no, queue);
            strided_copy(op, part, 0, {og, count * wo}, {count * wo, 1}, result,
                         first * og * pixels + i0 * wo, {pixels, 1}, queue);
          }
          continue;
        }
        // [k, images * count * wo], then rows = cols^T W^T + bias.
        const std::int64_t width = images * count * wo;
        Tensor cols = empty_like(x, Shape{k, width}, op);
        strided_copy(op, padded, offset, {cg, kh, kw, images, count, wo},
                     {hp * wp, dh * wp, dw, image_stride, sh * wp, sw}, cols, 0,
                     contiguous_strides({cg, kh, kw, images, count, wo}), queue);
        const Tensor out_rows = slice(result, 0, (first * ho + i0) * wo,
                                      (first * ho + i0) * wo + width, 1, queue);
        MatmulParams params{};
        params.a = data_of(cols);
        params.b = data_of(wg);
        params.bias = bg.is_null() ? nullptr : data_of(bg);
        params.out = data_of(out_rows);
        params.m = width;
        params.n = og;
        params.k = k;
        params.alpha = 1.0f;
        params.dtype = x.dtype();
        params.trans_a = true;
        params.trans_b = true;
        std::vector<Buffer*> buffers{cols.buffer().get(), wg.buffer().get(),
                                     result.buffer().get()};
        if (!bg.is_null()) buffers.push_back(bg.buffer().get());
        x.device()->enqueue(queue, make_launch("linear", params, buffers, writes_only({2})));
      }
    }
    if (pixels_last && !bg.is_null()) add(result, reshape(bg, {og, 1}), result, queue);
    per_group.push_back(result);
  }
  if (pixels_last) {
    const Tensor out = groups == 1 ? per_group[0] : concat(per_group, 1, queue);
    return reshape(out, {n, o, ho, wo});
  }
  const Tensor rows = groups == 1 ? per_group[0] : concat(per_group, 1, queue);
  return contiguous(permute(reshape(rows, {n, ho, wo, o}), {0, 3, 1, 2}, queue), queue);
}

}  // namespace retrace::ops
