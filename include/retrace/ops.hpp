// Device-neutral ops. Each op checks its inputs (null, host, device, dtype, layout, shape),
// infers the output shape, allocates outputs on the inputs' device and enqueues a backend kernel
// on a queue (default 0). Ops run eagerly or, inside a trace capture, are recorded for replay.
// float32, bfloat16 and float16 everywhere (16-bit storage, float32 arithmetic); int32/uint32/int64 for
// elementwise arithmetic and typecasts; bool for comparisons, where and masks (typecast and
// fill map any nonzero value, NaN included, to true). Optional tensor arguments are "absent" when null.
//
// Edges: a 0 extent broadcast against 1 gives 0; reductions over an empty last dimension give
// sum 0, mean NaN, max -inf; NaN propagates through relu, max, maximum and minimum (either
// operand), as in numpy; exp overflows to inf past ~88.72 and underflows through the
// subnormals to 0. Integer arithmetic is defined for every input: add, sub, mul and pow wrap
// modulo 2^32 (2^64 for int64); pow with a negative exponent gives 0 but for bases 1 and -1 (the integer part of
// the exact result); div truncates toward zero, x / 0 gives 0 and INT_MIN / -1 gives INT_MIN
// (true_divide promotes to float32 instead, as Python's `/`); a scalar for an integer tensor
// must be a whole number in the dtype's range (invalid_argument otherwise: use true_divide, or
// typecast the tensor to float32, for fractional arithmetic).
//
// Views: reshape, permute, transpose, slice, split, chunk and expand return views of their
// input's storage (Tensor::strides(), no command recorded). Every op takes views as inputs:
// binary ops, comparisons, where, gather and copies read them through their strides, and
// matmul reads a transposed view of a dense matrix in place; other kernels read a dense copy
// the op makes first (one strided-copy command). Results are always dense. An out= argument
// must be dense (contiguous; a slice along the first dimension is) and may be an input itself
// but not overlap one partly (invalid_argument); to write a strided view, copy() into it.
//
//   auto y = retrace::ops::add(x, bias);                      // numpy-style broadcasting
//   auto h = retrace::ops::gelu(retrace::ops::linear(x, w1, b1));
//   retrace::ops::mul(x, 0.5, /*out=*/x);                    // in place
//   auto o = retrace::ops::scaled_dot_product_attention(q, k, v);
#pragma once

#include "retrace/tensor.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace retrace::ops {

// --- creation and copies ------------------------------------------------------------------------

// A new device tensor with every element set to value.
[[nodiscard]] Tensor full(const Shape& shape, double value, Device& device,
                          DType dtype = DType::float32, Layout layout = Layout::row_major,
                          QueueId queue = kDefaultQueue);
// Sets every element of `tensor` (a strided view too, whose elements do not overlap).
void fill(const Tensor& tensor, double value, QueueId queue = kDefaultQueue);
// [start, start + step, ...) up to end (exclusive), numpy's count ceil((end - start) / step),
// empty when step points away from end. Floating dtypes: start + i * step computed in double
// and rounded once (as torch); integer dtypes: start and step whole numbers, every value in the
// dtype's range. A device op (traceable).
[[nodiscard]] Tensor arange(double start, double end, double step, Device& device,
                            DType dtype = DType::float32, QueueId queue = kDefaultQueue);

// dst <- src. src on dst's device: a device-to-device copy (traceable). src on the host: a
// host write (not allowed during a capture). Shapes, dtypes and layouts must match. Either may
// be a strided view (a slice of a cache, a transposed block); dst's elements must not overlap
// each other (an expand view cannot be written), and a src that overlaps dst is read whole
// before dst is written.
void copy(const Tensor& src, const Tensor& dst, QueueId queue = kDefaultQueue);

// Device-side check: a NaN or infinity in `tensor` fails the queue with a sticky device error
// naming this op, reported at the next synchronize, replay or read.
void assert_finite(const Tensor& tensor, QueueId queue = kDefaultQueue);

// --- elementwise --------------------------------------------------------------------------------

// Binary ops broadcast numpy-style; operands share dtype and layout (tile layout: equal shapes).
// The out= forms write into an existing tensor of the result's shape, dtype and layout (it may
// be one of the inputs).
#define RETRACE_DECLARE_BINARY(name)                                                        \
  [[nodiscard]] Tensor name(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue); \
  [[nodiscard]] Tensor name(const Tensor& a, double b, QueueId queue = kDefaultQueue);      \
  void name(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue = kDefaultQueue); \
  void name(const Tensor& a, double b, const Tensor& out, QueueId queue = kDefaultQueue);
RETRACE_DECLARE_BINARY(add)
RETRACE_DECLARE_BINARY(sub)
RETRACE_DECLARE_BINARY(mul)
RETRACE_DECLARE_BINARY(div)
RETRACE_DECLARE_BINARY(maximum)
RETRACE_DECLARE_BINARY(minimum)
RETRACE_DECLARE_BINARY(pow)  // a ** b (C's powf for floats; integers: see the header comment)
// Floor division and the two remainders, as torch.floor_divide (Python's `//`), torch.fmod and
// torch.remainder (Python's `%`): floor_divide rounds the quotient toward -inf (floats as
// Python's float `//`: x // 0 is +-inf or NaN); fmod's result has the sign of a (C's fmodf),
// remainder's the sign of b, and a == floor_divide(a, b) * b + remainder(a, b) up to rounding.
// Floats: remainder(x, 0) and fmod(x, 0) are NaN. Integers: a zero divisor gives 0 (as numpy),
// and INT_MIN by -1 gives INT_MIN (floor_divide) and 0 (fmod, remainder).
RETRACE_DECLARE_BINARY(floor_divide)
RETRACE_DECLARE_BINARY(fmod)
RETRACE_DECLARE_BINARY(remainder)
// Division that always gives a float, as torch.true_divide and Python's `/`: an integer or bool
// operand is converted to the other operand's floating dtype, or to float32 when neither is
// floating (an integer beyond 2^24 rounds on the way, as in torch), then divided (x / 0 is
// +-inf, 0 / 0 NaN). Any scalar divisor, fractional included. The out= tensor has that dtype.
RETRACE_DECLARE_BINARY(true_divide)
#undef RETRACE_DECLARE_BINARY

// min(max(a, lo), hi) as torch.clamp: a NaN stays NaN; lo > hi gives hi; either bound may be
// absent. float32, bfloat16, float16, int32, uint32 (bounds must then be whole numbers in range).
[[nodiscard]] Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi,
                           QueueId queue = kDefaultQueue);
void clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi, const Tensor& out,
           QueueId queue = kDefaultQueue);

// Comparisons: bool results (DType::bool_, 1 or 0) with numpy broadcasting; operands of one
// dtype (any), or a scalar (rounded to a floating dtype; for integer dtypes a whole number in
// range). A NaN is unequal to everything: ne is true, eq, lt, le, gt, ge false.
#define RETRACE_DECLARE_COMPARE(name)                                                       \
  [[nodiscard]] Tensor name(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue); \
  [[nodiscard]] Tensor name(const Tensor& a, double b, QueueId queue = kDefaultQueue);      \
  void name(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue = kDefaultQueue);
RETRACE_DECLARE_COMPARE(eq)
RETRACE_DECLARE_COMPARE(ne)
RETRACE_DECLARE_COMPARE(lt)
RETRACE_DECLARE_COMPARE(le)
RETRACE_DECLARE_COMPARE(gt)
RETRACE_DECLARE_COMPARE(ge)
#undef RETRACE_DECLARE_COMPARE

// cond ? a : b elementwise; cond bool, a and b of one dtype; the three broadcast together.
// Values are moved, not computed: NaN payloads and -0 come through unchanged.
[[nodiscard]] Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b,
                           QueueId queue = kDefaultQueue);
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out,
           QueueId queue = kDefaultQueue);
// a with `value` where mask (bool, broadcasting to a's shape) is true, as torch.masked_fill:
// e.g. masked_fill(scores, padding, -inf). The value follows the scalar rule above.
[[nodiscard]] Tensor masked_fill(const Tensor& a, const Tensor& mask, double value,
                                 QueueId queue = kDefaultQueue);

// Logical ops, as torch's: any dtypes (nonzero, NaN included, is true; each operand converted
// to bool first), numpy broadcasting, bool results.
[[nodiscard]] Tensor logical_and(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor logical_or(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor logical_xor(const Tensor& a, const Tensor& b, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor logical_not(const Tensor& a, QueueId queue = kDefaultQueue);

// Indexed reads, as torch's (any dtype; indices int32 or int64, each in [0, size of the indexed
// dimension): a bad index fails the queue with a device_error naming the op, the index element
// and its value, reported at the next synchronisation, as assert_finite's; negative indices are
// not wrapped). Row-major tensors.
//   embedding(weight [V, D], indices [...]) -> [..., D]: rows of a table (token or class
//     embeddings), torch.nn.functional.embedding.
//   index_select(a, dim, index [M]) -> a's shape with dimension dim of size M: torch.index_select.
//   gather(a, dim, index) -> index's shape: out[i][j][k] = a[index[i][j][k]][j][k] for dim 0
//     (likewise for the others), as torch.gather; index has a's rank and no larger extent than
//     a's in the other dimensions.
[[nodiscard]] Tensor embedding(const Tensor& weight, const Tensor& indices,
                               QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor index_select(const Tensor& a, std::int64_t dim, const Tensor& index,
                                  QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor gather(const Tensor& a, std::int64_t dim, const Tensor& index,
                            QueueId queue = kDefaultQueue);

// Unary ops (float32, bfloat16, float16). neg, abs, relu, square, floor, ceil, round and trunc
// also take int32, uint32 and int64, as torch's: neg and square wrap (-INT_MIN is INT_MIN, an
// unsigned value negates modulo 2^32), abs(INT_MIN) is INT_MIN, abs of an unsigned value and the
// four roundings give the values unchanged.
#define RETRACE_DECLARE_UNARY(name)                                                  \
  [[nodiscard]] Tensor name(const Tensor& a, QueueId queue = kDefaultQueue);         \
  void name(const Tensor& a, const Tensor& out, QueueId queue = kDefaultQueue);
RETRACE_DECLARE_UNARY(neg)
RETRACE_DECLARE_UNARY(abs)
RETRACE_DECLARE_UNARY(exp)
RETRACE_DECLARE_UNARY(log)
RETRACE_DECLARE_UNARY(sqrt)
RETRACE_DECLARE_UNARY(rsqrt)
RETRACE_DECLARE_UNARY(tanh)
RETRACE_DECLARE_UNARY(sigmoid)
RETRACE_DECLARE_UNARY(relu)
RETRACE_DECLARE_UNARY(silu)
RETRACE_DECLARE_UNARY(gelu)       // exact (erf) form
RETRACE_DECLARE_UNARY(gelu_tanh)  // tanh approximation
RETRACE_DECLARE_UNARY(sin)
RETRACE_DECLARE_UNARY(cos)
RETRACE_DECLARE_UNARY(square)
RETRACE_DECLARE_UNARY(erf)
RETRACE_DECLARE_UNARY(floor)
RETRACE_DECLARE_UNARY(ceil)
RETRACE_DECLARE_UNARY(round)  // halves to even, as torch.round and numpy.round
RETRACE_DECLARE_UNARY(trunc)
#undef RETRACE_DECLARE_UNARY

// --- reductions and normalisations over the last dimension (row-major) ---------------------------

enum class KeepDim : bool { no = false, yes = true };
[[nodiscard]] Tensor sum(const Tensor& a, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor mean(const Tensor& a, KeepDim keepdim = KeepDim::no,
                          QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor max(const Tensor& a, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
// min(a) = -max(-a): NaN wins, an empty row gives +inf.
[[nodiscard]] Tensor min(const Tensor& a, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
// The int32 index of the first maximum (of the first NaN if there is one, as torch); an empty
// reduced dimension is invalid_argument.
[[nodiscard]] Tensor argmax(const Tensor& a, KeepDim keepdim = KeepDim::no,
                            QueueId queue = kDefaultQueue);
// Numerically stable (subtracts the row maximum).
[[nodiscard]] Tensor softmax(const Tensor& a, QueueId queue = kDefaultQueue);
// weight and bias: [last dim] or null.
[[nodiscard]] Tensor layer_norm(const Tensor& a, const Tensor& weight = {},
                                const Tensor& bias = {}, double eps = 1e-5,
                                QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor rms_norm(const Tensor& a, const Tensor& weight = {}, double eps = 1e-6,
                              QueueId queue = kDefaultQueue);
// out= forms: out has a's shape, dtype and layout and may be a itself (in place), but not the
// weight or bias.
void softmax(const Tensor& a, const Tensor& out, QueueId queue = kDefaultQueue);
void layer_norm(const Tensor& a, const Tensor& weight, const Tensor& bias, double eps,
                const Tensor& out, QueueId queue = kDefaultQueue);
void rms_norm(const Tensor& a, const Tensor& weight, double eps, const Tensor& out,
              QueueId queue = kDefaultQueue);

// --- reductions and normalisations along any dimension -------------------------------------------
// (Composed of the last-dimension kernels: a dimension other than the last is first moved last
// by a permute, and the kernel reads a dense copy of that view.)

[[nodiscard]] Tensor sum(const Tensor& a, std::int64_t dim, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor mean(const Tensor& a, std::int64_t dim, KeepDim keepdim = KeepDim::no,
                          QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor max(const Tensor& a, std::int64_t dim, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor min(const Tensor& a, std::int64_t dim, KeepDim keepdim = KeepDim::no,
                         QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor argmax(const Tensor& a, std::int64_t dim, KeepDim keepdim = KeepDim::no,
                            QueueId queue = kDefaultQueue);
// Variance sum((x - mean)^2) / max(0, n - correction) (torch's default correction 1: unbiased;
// n <= correction gives inf, or NaN where the sum is 0: an empty or constant row, as torch);
// std is its square root. Two passes, in the input's precision (float32 for float32: squares
// past 3.4e38 overflow to inf, where torch, summing in double, returns a finite std).
[[nodiscard]] Tensor var(const Tensor& a, std::int64_t dim = -1, double correction = 1.0,
                         KeepDim keepdim = KeepDim::no, QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor std(const Tensor& a, std::int64_t dim = -1, double correction = 1.0,
                         KeepDim keepdim = KeepDim::no, QueueId queue = kDefaultQueue);
// x - max - log(sum(exp(x - max))) along dim (stable for large inputs).
[[nodiscard]] Tensor log_softmax(const Tensor& a, std::int64_t dim = -1,
                                 QueueId queue = kDefaultQueue);
// Group normalisation of x [N, C, ...] (diffusion U-Nets, VAEs): each of `groups` groups of C /
// groups channels (with every spatial position) normalised to mean 0, variance 1 (biased, + eps),
// then weight[c] * y + bias[c] per channel (weight and bias [C] or null).
[[nodiscard]] Tensor group_norm(const Tensor& x, std::int64_t groups, const Tensor& weight = {},
                                const Tensor& bias = {}, double eps = 1e-5,
                                QueueId queue = kDefaultQueue);

// --- matrix products ----------------------------------------------------------------------------

enum class Transpose : bool { no = false, yes = true };
// a [..., M, K] x b [..., K, N] -> [..., M, N]; batch dimensions broadcast; either operand may
// be transposed in its last two dimensions. A rank-1 operand follows numpy: a [K] is a row, b [K]
// a column, and that dimension is dropped from the result ([K] x [K] -> [], [K] x [K, N] -> [N]).
[[nodiscard]] Tensor matmul(const Tensor& a, const Tensor& b, Transpose transpose_a = Transpose::no,
                            Transpose transpose_b = Transpose::no, QueueId queue = kDefaultQueue);
// x [..., in] . weight[out, in]^T + bias[out] -> [..., out].
[[nodiscard]] Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                            QueueId queue = kDefaultQueue);
// out= forms of the products: out has the result's shape and the operands' dtype, and must not
// share storage with an operand (invalid_argument).
void matmul(const Tensor& a, const Tensor& b, const Tensor& out,
            Transpose transpose_a = Transpose::no, Transpose transpose_b = Transpose::no,
            QueueId queue = kDefaultQueue);
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
            QueueId queue = kDefaultQueue);
// softmax(q k^T * scale + mask) v. q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (or
// rank 3 without B), Hkv = H or, for grouped-query attention, a divisor of H (query head h uses
// key/value head h / (H / Hkv), as torch's enable_gqa); mask (optional: additive in q's dtype,
// or bool, true where a key takes part, as torch's) broadcasts to [B, H, Sq, Sk] from [Sk], [Sq or 1, Sk],
// [H or 1, Sq or 1, Sk] or [B or 1, H or 1, Sq or 1, Sk] (e.g. a key-padding mask [B, 1, 1, Sk]);
// scale defaults to 1/sqrt(D). q, k and v may be views: where each head's [S, D] rows are dense
// (a key/value cache sliced along S, heads repeated by expand, every other head) the CPU
// device reads them in place; other views, and views on devices whose kernel takes only dense
// operands (CUDA), are copied dense first. The result is the same either way, bit for bit. A
// query row whose keys are all masked out (every score -inf) gives zeros, as torch's attention
// does (not the NaNs of 0 / 0); a NaN score still gives NaN.
[[nodiscard]] Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k,
                                                  const Tensor& v, const Tensor& mask = {},
                                                  std::optional<double> scale = std::nullopt,
                                                  QueueId queue = kDefaultQueue);
void scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& mask, std::optional<double> scale,
                                  const Tensor& out, QueueId queue = kDefaultQueue);
// Causal attention (torch's is_causal, top-left aligned: query i sees keys 0 .. i), with an
// optional additive mask on top.
enum class Causal : bool { no = false, yes = true };
[[nodiscard]] Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k,
                                                  const Tensor& v, const Tensor& mask,
                                                  std::optional<double> scale, Causal causal,
                                                  QueueId queue = kDefaultQueue);

// --- shapes and layouts -------------------------------------------------------------------------

// A view (same storage) for row-major tensors; one extent may be -1 (inferred). As torch's
// reshape: a strided view stays a view when strides can express the new shape (dimensions
// merged only where their elements step evenly, such as dropping or adding extent-1 dimensions,
// or splitting one), and is copied dense first otherwise.
[[nodiscard]] Tensor reshape(const Tensor& a, std::span<const std::int64_t> shape);
[[nodiscard]] Tensor reshape(const Tensor& a, std::initializer_list<std::int64_t> shape);
// Views (no copy): the dimensions reordered, two swapped.
[[nodiscard]] Tensor permute(const Tensor& a, std::span<const std::int64_t> dims,
                             QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor permute(const Tensor& a, std::initializer_list<std::int64_t> dims,
                             QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor transpose(const Tensor& a, std::int64_t dim0, std::int64_t dim1,
                               QueueId queue = kDefaultQueue);
// A view of elements [start, end) with a step along one dimension (negative indices count from
// the end).
[[nodiscard]] Tensor slice(const Tensor& a, std::int64_t dim, std::int64_t start,
                           std::int64_t end, std::int64_t step = 1, QueueId queue = kDefaultQueue);
// Views: pieces of the given sizes along dim (they must add up to its extent).
[[nodiscard]] std::vector<Tensor> split(const Tensor& a, std::span<const std::int64_t> sizes,
                                        std::int64_t dim, QueueId queue = kDefaultQueue);
// Views: pieces of `size` along dim, the last possibly smaller (torch.split with an integer:
// 5 by 2 gives 2, 2, 1); an empty extent gives one empty piece. size > 0 (or 0 for an empty
// extent, as torch).
[[nodiscard]] std::vector<Tensor> split(const Tensor& a, std::int64_t size, std::int64_t dim,
                                        QueueId queue = kDefaultQueue);
// Views: pieces of ceil(extent / chunks) along dim, the last possibly smaller, so fewer than
// `chunks` where they run out (torch.chunk's rule: 5 in 4 chunks gives 2, 2, 1); an empty
// extent gives `chunks` empty pieces.
[[nodiscard]] std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim,
                                        QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor concat(std::span<const Tensor> tensors, std::int64_t dim,
                            QueueId queue = kDefaultQueue);
// torch.stack: the tensors (one shape and dtype) along a new dimension `dim` (in [-(rank + 1),
// rank]).
[[nodiscard]] Tensor stack(std::span<const Tensor> tensors, std::int64_t dim,
                           QueueId queue = kDefaultQueue);
// torch's expand, a view: extents of 1 broadcast to `shape` with stride 0 (-1 keeps an extent;
// extra leading dimensions are new). Its elements overlap, so it cannot be written (copy()
// and fill() refuse it); clone() or contiguous() gives it storage of its own.
[[nodiscard]] Tensor expand(const Tensor& a, std::span<const std::int64_t> shape,
                            QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor expand(const Tensor& a, std::initializer_list<std::int64_t> shape,
                            QueueId queue = kDefaultQueue);
// torch's Tensor.repeat: the tensor tiled repeats[i] times along dimension i (extra leading
// repeats add dimensions; 0 gives an empty extent).
[[nodiscard]] Tensor repeat(const Tensor& a, std::span<const std::int64_t> repeats,
                            QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor repeat(const Tensor& a, std::initializer_list<std::int64_t> repeats,
                            QueueId queue = kDefaultQueue);
// torch.flip: the order of the elements reversed along each of `dims`.
[[nodiscard]] Tensor flip(const Tensor& a, std::span<const std::int64_t> dims,
                          QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor flip(const Tensor& a, std::initializer_list<std::int64_t> dims,
                          QueueId queue = kDefaultQueue);
// `a` itself when it is contiguous, else a dense copy of the view (one strided-copy command).
[[nodiscard]] Tensor contiguous(const Tensor& a, QueueId queue = kDefaultQueue);
// Floats to integers truncate toward zero; values outside the integer's range saturate to its
// lowest or highest value (infinities too) and NaN becomes 0. Integers to narrower or unsigned
// integers wrap (modulo 2^bits); to bool, any nonzero value (NaN included) is true.
[[nodiscard]] Tensor typecast(const Tensor& a, DType dtype, QueueId queue = kDefaultQueue);
// Row-major <-> tile (32x32, padded with zeros). The same layout returns `a` itself.
[[nodiscard]] Tensor to_layout(const Tensor& a, Layout layout, QueueId queue = kDefaultQueue);

// --- images: padding, resizing, convolution -----------------------------------------------------

// Constant padding, torch.nn.functional.pad's order: (before, after) pairs starting from the last
// dimension ({1, 1} pads the last dimension by one on each side, {1, 1, 2, 2} also the one
// before it by two). Pads are >= 0; integer tensors take a whole-number value in range.
[[nodiscard]] Tensor pad(const Tensor& a, std::span<const std::int64_t> pads, double value = 0.0,
                         QueueId queue = kDefaultQueue);
[[nodiscard]] Tensor pad(const Tensor& a, std::initializer_list<std::int64_t> pads,
                         double value = 0.0, QueueId queue = kDefaultQueue);
// Resizing of the last two dimensions [..., H, W] -> [..., out_h, out_w], as torch's
// interpolate(size=(out_h, out_w), mode=...) computes it (source coordinates in float32 with
// torch's formulas, so nearest picks torch's elements for every size):
//   nearest        output i reads input min(floor(i * (in / out)), in - 1); any dtype.
//   nearest_exact  ... min(floor((i + 0.5) * (in / out)), in - 1) (torch's "nearest-exact").
//   bilinear       two-tap linear interpolation along W then H; align_corners as torch's
//                  (false: half-pixel centres, sources clamped at 0; true: the corner samples
//                  line up). float32, bfloat16, float16 (computed in float32, rounded once).
//   bicubic        four-tap cubic convolution (Keys, A = -0.75) along W then H, taps clamped
//                  to the edges, align_corners as bilinear (positions not clamped at 0), as
//                  torch's bicubic (no antialiasing); overshoots the input's range as torch's
//                  does. Dtypes as bilinear.
//   area           output i averages input [floor(i * in / out), ceil((i + 1) * in / out)),
//                  as torch's mode="area" (adaptive average pooling); dtypes as bilinear.
// An unchanged extent is copied as it is. align_corners with a nearest or area mode is
// invalid_argument.
enum class InterpolateMode { nearest, nearest_exact, bilinear, bicubic, area };
struct InterpolateOptions {
  InterpolateMode mode = InterpolateMode::nearest;
  bool align_corners = false;
  // interpolate_scaled only: read the positions through the sizes floor(in * scale) gives, as
  // if they had been given (torch's recompute_scale_factor=True).
  bool recompute_scale_factor = false;
};
[[nodiscard]] Tensor interpolate(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
                                 const InterpolateOptions& options = {},
                                 QueueId queue = kDefaultQueue);
// torch's interpolate(scale_factor=(scale_h, scale_w)) (recompute_scale_factor unset): the
// output is floor(in * scale) along each dimension (in double), and nearest, nearest-exact,
// and bilinear and bicubic without align_corners, read output i through 1 / scale rounded to
// float32, as torch's kernels do, not through in / out (they differ where in * scale is not
// whole: 5 scaled by 1.5 gives 7 outputs read at steps of 0.6667, not 0.7143; and 10 scaled by
// 1.09 stays 10, copied by nearest and bilinear but resampled by nearest-exact and bicubic, as
// torch's kernels do).
// align_corners and area use the sizes, as torch's. Factors are finite and > 0.
[[nodiscard]] Tensor interpolate_scaled(const Tensor& a, double scale_h, double scale_w,
                                        const InterpolateOptions& options = {},
                                        QueueId queue = kDefaultQueue);
// interpolate with mode nearest.
[[nodiscard]] Tensor interpolate_nearest(const Tensor& a, std::int64_t out_h, std::int64_t out_w,
                                         QueueId queue = kDefaultQueue);
struct Conv2dOptions {
  std::array<std::int64_t, 2> stride{1, 1};
  std::array<std::int64_t, 2> padding{0, 0};  // zeros on both sides of H and of W
  std::array<std::int64_t, 2> dilation{1, 1};
  std::int64_t groups = 1;
};
// 2-D convolution (cross-correlation, as torch's conv2d): x [N, C, H, W], weight [O, C / groups,
// kh, kw], bias [O] (optional) -> [N, O, Ho, Wo], Ho = (H + 2 pad - dilation (kh - 1) - 1) /
// stride + 1. float32, bfloat16, float16 (float32 accumulation). Computed as im2col then one matmul
// per group, on any device that has those kernels; the im2col columns are made a chunk of at
// most conv2d_column_bytes() at a time (whole images, or blocks of output rows), so a large
// image needs no 9x copy of itself. A given chunk size gives the same bits every time (eager and
// traced); another may change the last bits (the GEMM library blocks a shorter product
// differently).
[[nodiscard]] Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                            const Conv2dOptions& options = {}, QueueId queue = kDefaultQueue);
// The most bytes of im2col columns conv2d makes at once (default 32 MiB); set it (at least 1
// byte: then one output row at a time) before the ops that should use it, e.g. before a capture.
[[nodiscard]] std::size_t conv2d_column_bytes() noexcept;
void set_conv2d_column_bytes(std::size_t bytes) noexcept;
// Whether conv2d computes float32 3x3 convolutions with stride 1, no dilation and one group (at
// least 16 input and output channels) by Winograd's F(4x4, 3x3) where the device has that kernel
// (the CPU device; default on): about 4x fewer multiply-adds, the transformed input and products
// made conv2d_column_bytes() at a time. Its rounding differs from the im2col product's (errors
// against a float64 reference about 1.5x those of the direct sum, measured on random data);
// set false (before a capture) for the im2col path's bits.
[[nodiscard]] bool conv2d_winograd() noexcept;
void set_conv2d_winograd(bool enabled) noexcept;

}  // namespace retrace::ops
