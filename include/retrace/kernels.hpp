// The device-neutral kernel interface between ops and backends.
//
// An op checks its inputs, allocates its outputs and then describes the work as a KernelLaunch:
// a kernel id plus a plain parameter struct holding resolved buffer pointers and sizes. The
// backend turns it into its own command (the CPU device: a function pointer and a copy of the
// parameters; the CUDA device: a kernel launch on a stream). Parameter structs are trivially
// copyable and at most kMaxKernelParamsBytes big, so a recorded command needs no heap memory.
#pragma once

#include "retrace/types.hpp"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <type_traits>

namespace retrace {

class Buffer;

// Every kernel, once: its id and its parameter struct. The KernelId enum, kernel_name(), the
// params-to-kernel mapping of make_launch and each backend's kernel table are generated from
// this list, so a kernel cannot lack a name, and a backend that lacks an entry for it does not
// compile (a backend that does not implement one says so explicitly in its table).
#define RETRACE_KERNEL_LIST(X)          \
  X(fill, FillParams)                   \
  X(copy, CopyParams)                   \
  X(binary, BinaryParams)               \
  X(binary_scalar, BinaryScalarParams)  \
  X(assert_finite, AssertFiniteParams)  \
  X(unary, UnaryParams)                 \
  X(reduce, ReduceParams)               \
  X(softmax, SoftmaxParams)             \
  X(norm, NormParams)                   \
  X(matmul, MatmulParams)               \
  X(strided_copy, StridedCopyParams)    \
  X(typecast, TypecastParams)           \
  X(tilize, TilizeParams)               \
  X(attention, AttentionParams)         \
  X(collective, CollectiveParams)       \
  X(random, RandomParams)               \
  X(compare, CompareParams)             \
  X(where, WhereParams)                 \
  X(gather, GatherParams)               \
  X(winograd, WinogradParams)

enum class KernelId : std::uint16_t {
#define RETRACE_KERNEL_ENUM(name, params) name,
  RETRACE_KERNEL_LIST(RETRACE_KERNEL_ENUM)
#undef RETRACE_KERNEL_ENUM
  count_,
};
inline constexpr std::size_t kKernelCount = static_cast<std::size_t>(KernelId::count_);

[[nodiscard]] constexpr std::string_view kernel_name(KernelId id) noexcept {
  switch (id) {
#define RETRACE_KERNEL_NAME(name, params) \
  case KernelId::name:                    \
    return #name;
    RETRACE_KERNEL_LIST(RETRACE_KERNEL_NAME)
#undef RETRACE_KERNEL_NAME
    case KernelId::count_: break;
  }
  return "unknown";
}

inline constexpr std::size_t kMaxKernelParamsBytes = 320;
// Iteration spaces handed to kernels are collapsed, and never need more dimensions than a
// Shape has: every op takes tensors of any rank Shape allows (one limit, Shape::kMaxRank).
inline constexpr int kMaxKernelRank = 8;  // == Shape::kMaxRank (checked in src/ops/checks.cpp)
inline constexpr int kMaxBatchRank = kMaxKernelRank - 2;  // matmul: [batch..., M, N]

enum class BinaryOp : std::uint8_t {
  add, sub, mul, div, maximum, minimum, pow, floor_divide, fmod, remainder
};
enum class UnaryOp : std::uint8_t {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, silu, gelu, gelu_tanh, sin, cos, square, erf,
  floor, ceil, round, trunc
};
// argmax writes int32 indices (the first maximum; the first NaN, as torch) to out.
enum class ReduceOp : std::uint8_t { sum, mean, max, argmax };

// out[i] = value + i * step (step 0: a fill). Floating dtypes compute value + i * step in
// double and round once to the dtype; integer dtypes compute in 64-bit integers (value and step
// are whole numbers) and wrap to the dtype's width.
struct FillParams {
  void* out;
  std::int64_t count;  // elements
  DType dtype;
  double value;
  double step = 0.0;
};

struct CopyParams {
  const void* src;
  void* dst;
  std::int64_t bytes;
};

// out[i] = a[ia] op b[ib] over a (collapsed) broadcast iteration space; strides in elements,
// 0 along broadcast dimensions. out is contiguous.
struct BinaryParams {
  const void* a;
  const void* b;
  void* out;
  std::int64_t shape[kMaxKernelRank];
  std::int64_t a_strides[kMaxKernelRank];
  std::int64_t b_strides[kMaxKernelRank];
  std::int32_t rank;
  DType dtype;
  BinaryOp op;
};

struct BinaryScalarParams {
  const void* a;
  void* out;
  std::int64_t count;
  DType dtype;
  BinaryOp op;
  double scalar;
};

// Fails the queue (a sticky device error naming the op) if any element is NaN or infinite.
struct AssertFiniteParams {
  const void* data;
  std::int64_t count;
  DType dtype;
};

struct UnaryParams {
  const void* a;
  void* out;
  std::int64_t count;
  DType dtype;
  UnaryOp op;
};

// Reduces each row of `cols` elements to one.
struct ReduceParams {
  const void* a;
  void* out;
  std::int64_t rows;
  std::int64_t cols;
  DType dtype;
  ReduceOp op;
};

struct SoftmaxParams {
  const void* a;
  void* out;
  std::int64_t rows;
  std::int64_t cols;
  DType dtype;
};

// layer_norm (rms == false): (x - mean) / sqrt(var + eps) * weight + bias;
// rms_norm (rms == true): x / sqrt(mean(x^2) + eps) * weight. weight and bias may be null.
struct NormParams {
  const void* a;
  const void* weight;
  const void* bias;
  void* out;
  std::int64_t rows;
  std::int64_t cols;
  float eps;
  DType dtype;
  bool rms;
};

// out[batch] = alpha * op(a[batch]) * op(b[batch]) (+ bias along N), row-major matrices.
// Batch offsets (elements) come from the batch index and per-operand batch strides (0 where an
// operand is broadcast); out is contiguous.
struct MatmulParams {
  const void* a;
  const void* b;
  const void* bias;  // [N] or null
  void* out;
  std::int64_t m, n, k;
  std::int64_t batch_shape[kMaxBatchRank];
  std::int64_t a_batch_strides[kMaxBatchRank];
  std::int64_t b_batch_strides[kMaxBatchRank];
  std::int32_t batch_rank;
  float alpha;
  DType dtype;
  bool trans_a;
  bool trans_b;
  // The buffer b lies in, where b is a whole operand read by every batch alike (a linear's
  // weight) from a buffer no capture allocated (one that outlives every command using it):
  // devices may keep a copy of it in their library's preferred layout while its write_count()
  // stays the same. Null: b is read as it is on every call.
  const Buffer* b_buffer;
};

// A 3x3 convolution with stride 1, no dilation and one group, by Winograd's F(4x4, 3x3): each
// 4x4 block of output pixels from a 6x6 block of input by 36 products over the input channels
// instead of 144 multiply-adds. out[n, o, ho, wo] = conv(x[n, c, h, w], weight[o, c, 3, 3]) +
// bias, x read with pad_h / pad_w rows / columns of zeros around it (ho = h + 2 pad_h - 2). All
// float32 and dense. scratch holds winograd_scratch_elements(...) floats: the transformed
// weights, then the transformed input and the products of chunk_tiles tiles at a time. Where an
// output is not finite (a NaN or infinity in x or weight, or an overflow in the transforms,
// which spread one across a 4x4 block) the kernel computes the whole output again directly, so
// non-finite values land where a direct convolution puts them.
struct WinogradParams {
  const void* x;
  const void* weight;
  const void* bias;  // [o] or null
  void* out;
  void* scratch;
  std::int64_t n, c, h, w, o, ho, wo;
  std::int64_t pad_h, pad_w;
  std::int64_t chunk_tiles;  // tiles transformed and multiplied at a time (>= one row of tiles)
  DType dtype;               // float32
};
// F(4x4, 3x3): 4x4 output tiles, 36 products per tile and channel pair.
inline constexpr std::int64_t kWinogradTile = 4;
inline constexpr std::int64_t kWinogradPoints = 36;
// The floats WinogradParams::scratch holds: 36 * o * c for the weights, 36 * (c + o) per tile of
// a chunk.
[[nodiscard]] constexpr std::int64_t winograd_scratch_elements(std::int64_t c, std::int64_t o,
                                                               std::int64_t chunk_tiles) noexcept {
  return kWinogradPoints * (o * c + (c + o) * chunk_tiles);
}

// dst[idx . dst_strides] = src[idx . src_strides] over `shape` (elements of elem_size bytes).
struct StridedCopyParams {
  const void* src;
  void* dst;
  std::int64_t shape[kMaxKernelRank];
  std::int64_t src_strides[kMaxKernelRank];
  std::int64_t dst_strides[kMaxKernelRank];
  std::int32_t rank;
  std::int32_t elem_size;
};

// Indexed reads (embedding, index_select, gather): over `shape` (the output's, out contiguous),
// out[idx] = src[idx . src_strides + index[idx . index_strides] * dim_stride], where index is
// int32 or int64 (index_size 4 or 8) and every index value must lie in [0, dim_size): otherwise
// the queue fails with a device error naming the op, the element and the value (nothing is read
// out of bounds).
struct GatherParams {
  const void* src;
  const void* index;
  void* out;
  std::int64_t shape[kMaxKernelRank];
  std::int64_t src_strides[kMaxKernelRank];  // 0 along the indexed dimension
  std::int64_t index_strides[kMaxKernelRank];
  std::int64_t dim_stride;  // src's stride along the indexed dimension
  std::int64_t dim_size;
  std::int32_t rank;
  std::int32_t elem_size;
  std::int32_t index_size;
};

struct TypecastParams {
  const void* src;
  void* dst;
  std::int64_t count;
  DType from;
  DType to;
};

// Row-major [batch, rows, cols] <-> tile layout with padded rows/cols (padding written as 0).
struct TilizeParams {
  const void* src;
  void* dst;
  std::int64_t batch;
  std::int64_t rows;
  std::int64_t cols;
  std::int32_t elem_size;
  bool to_tile;
};

// out = softmax(q k^T * scale + mask) v per (batch, head); q [B,H,Sq,D], k [B,Hkv,Sk,D],
// v [B,Hkv,Sk,Dv] with Hkv = kv_heads dividing H (grouped-query attention: query head h reads
// key/value head h / (H / Hkv); 0 means H), mask broadcast to [B,H,Sq,Sk] with the given
// batch/head/row strides (elements; 0 where the mask broadcasts). q, k, v and out are addressed
// through their (batch, head, row) element strides, each row's D (Dv) elements contiguous:
// set_dense_attention_strides gives the strides of dense [B,H,S,D] arrays, and backends that
// only take those refuse others (Backend::unsupported_reason), so the op copies the operands
// densely first there.
struct AttentionParams {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;  // null: none
  void* out;
  std::int64_t batch, heads, sq, sk, d, dv;
  std::int64_t kv_heads;
  std::int64_t mask_batch_stride;
  std::int64_t mask_head_stride;
  std::int64_t mask_row_stride;
  std::int64_t q_strides[3];  // batch, head, row
  std::int64_t k_strides[3];
  std::int64_t v_strides[3];
  std::int64_t out_strides[3];
  float scale;
  DType dtype;
  bool causal;  // key j is masked out for query i when j > i (top-left aligned, as torch)
};

// The strides of dense [B,H,Sq,D] q, [B,Hkv,Sk,D] k, [B,Hkv,Sk,Dv] v and [B,H,Sq,Dv] out, from
// the sizes already set.
struct AttentionStrides {
  std::int64_t q[3], k[3], v[3], out[3];
};
[[nodiscard]] constexpr AttentionStrides dense_attention_strides(const AttentionParams& p) noexcept {
  const std::int64_t kv = p.kv_heads > 0 ? p.kv_heads : p.heads;
  return {{p.heads * p.sq * p.d, p.sq * p.d, p.d},
          {kv * p.sk * p.d, p.sk * p.d, p.d},
          {kv * p.sk * p.dv, p.sk * p.dv, p.dv},
          {p.heads * p.sq * p.dv, p.sq * p.dv, p.dv}};
}
constexpr void set_dense_attention_strides(AttentionParams& p) noexcept {
  const AttentionStrides s = dense_attention_strides(p);
  for (int i = 0; i < 3; ++i) {
    p.q_strides[i] = s.q[i];
    p.k_strides[i] = s.k[i];
    p.v_strides[i] = s.v[i];
    p.out_strides[i] = s.out[i];
  }
}
// Whether every operand has the strides set_dense_attention_strides gives.
[[nodiscard]] constexpr bool has_dense_attention_strides(const AttentionParams& p) noexcept {
  const AttentionStrides s = dense_attention_strides(p);
  for (int i = 0; i < 3; ++i) {
    if (p.q_strides[i] != s.q[i] || p.k_strides[i] != s.k[i] || p.v_strides[i] != s.v[i] ||
        p.out_strides[i] != s.out[i]) {
      return false;
    }
  }
  return true;
}

// The key/value head (batch included) that query head `bh` (batch * heads + head) reads.
[[nodiscard]] constexpr std::int64_t attention_kv_index(const AttentionParams& p,
                                                        std::int64_t bh) noexcept {
  const std::int64_t kv = p.kv_heads > 0 ? p.kv_heads : p.heads;
  if (kv == p.heads) return bh;
  return (bh / p.heads) * kv + (bh % p.heads) / (p.heads / kv);
}

// One member's part of a collective over a group of devices (retrace/mesh.hpp). Every member of
// the group enqueues the same collective with its own rank, src and dst; the group (owned by the
// mesh, opaque here) pairs the members' calls up in order and runs them as one operation.
//  - all_reduce:     dst[i] = sum over ranks of src[i], i < outer * chunk
//  - all_gather:     dst[o, r*chunk + j] = src_r[o, j] (src [outer, chunk], dst [outer, n*chunk])
//  - reduce_scatter: dst[o, j] = sum over ranks of src_r[o, rank*chunk + j]
// Sums run over the ranks in rank order (floats accumulate in float32, rounded once), so every
// member gets the same bits.
enum class CollectiveOp : std::uint8_t { all_reduce, all_gather, reduce_scatter };
struct CollectiveParams {
  const void* group;  // the group's runtime (a detail::CollectiveGroup)
  const void* src;
  void* dst;
  std::int64_t outer;
  std::int64_t chunk;
  DType dtype;
  CollectiveOp op;
  std::uint32_t rank;
};

// Random numbers from a counter-based generator (Philox4x32-10) whose state lives on the device:
// state = {seed low, seed high, offset low, offset high} (uint32). Element i of the draw is a
// function of (seed, offset, i) only; the kernel then advances the offset by one (unless
// `advance` is false: a tracer's prep run), so every draw, eager or replayed, gets new numbers
// and the same sequence follows from the same seed.
//  - uniform: [0, 1) (24 random bits for float32, 11 for float16, 8 for bfloat16)
//  - normal:  standard normal (Box-Muller on pairs of words, computed in double)
enum class RandomDist : std::uint8_t { uniform, normal };
struct RandomParams {
  std::uint32_t* state;
  void* out;
  std::int64_t count;
  DType dtype;
  RandomDist dist;
  bool advance;
};

// out[i] = a[ia] op b[ib] as bool_ (1 or 0) over a broadcast iteration space (as BinaryParams);
// a NaN compares unequal to everything (ne true, the others false), as IEEE 754 and numpy.
enum class CompareOp : std::uint8_t { eq, ne, lt, le, gt, ge };
struct CompareParams {
  const void* a;
  const void* b;
  std::uint8_t* out;
  std::int64_t shape[kMaxKernelRank];
  std::int64_t a_strides[kMaxKernelRank];
  std::int64_t b_strides[kMaxKernelRank];
  std::int32_t rank;
  DType dtype;  // of a and b
  CompareOp op;
};

// out[i] = cond[ic] ? a[ia] : b[ib] over a broadcast iteration space; cond is bool_ (any
// nonzero byte is true), a, b and out of `dtype`; out contiguous.
struct WhereParams {
  const std::uint8_t* cond;
  const void* a;
  const void* b;
  void* out;
  std::int64_t shape[kMaxKernelRank];
  std::int64_t cond_strides[kMaxKernelRank];
  std::int64_t a_strides[kMaxKernelRank];
  std::int64_t b_strides[kMaxKernelRank];
  std::int32_t rank;
  std::int32_t elem_size;  // bytes per element of a, b and out
};

// The kernel that takes each parameter struct (and the struct of each kernel).
template <class Params>
struct KernelOf;
template <KernelId K>
struct KernelParams;
#define RETRACE_KERNEL_PARAMS(name, params)                                 \
  template <>                                                               \
  struct KernelOf<params> {                                                 \
    static constexpr KernelId value = KernelId::name;                       \
  };                                                                        \
  template <>                                                               \
  struct KernelParams<KernelId::name> {                                     \
    using type = params;                                                    \
  };
RETRACE_KERNEL_LIST(RETRACE_KERNEL_PARAMS)
#undef RETRACE_KERNEL_PARAMS
template <KernelId K>
using KernelParamsOf = typename KernelParams<K>::type;

struct KernelLaunch {
  KernelId kernel;
  const char* op;  // the op's name ("add"), a string literal; errors and trace listings use it
  const void* params;
  std::size_t params_size;
  // Every buffer the kernel reads or writes. The device keeps them alive until the work has run
  // (and, for a trace, until the trace is released), so no queued work can see freed memory.
  std::span<Buffer* const> buffers;
  // Which of `buffers` the kernel writes: bit i for buffers[i] (every buffer past the 64th
  // counts as written). Devices count these writes (Buffer::write_count); a buffer marked
  // written that the kernel only reads costs only a missed reuse of data derived from it (a
  // packed weight), never a wrong result, so the default is all.
  std::uint64_t written = ~std::uint64_t{0};

  [[nodiscard]] bool writes(std::size_t i) const noexcept {
    return i >= 64 || (written >> i & 1u) != 0;
  }
};

// The `written` mask of a launch that writes only buffers[i] for each i given.
[[nodiscard]] constexpr std::uint64_t writes_only(
    std::initializer_list<std::size_t> indices) noexcept {
  std::uint64_t mask = 0;
  for (std::size_t i : indices) mask |= std::uint64_t{1} << i;
  return mask;
}

// The launch of the kernel that takes `Params` (the kernel follows from the params type).
template <class Params>
[[nodiscard]] KernelLaunch make_launch(const char* op, const Params& params,
                                       std::span<Buffer* const> buffers) noexcept {
  static_assert(std::is_trivially_copyable_v<Params>, "kernel params must be trivially copyable");
  static_assert(sizeof(Params) <= kMaxKernelParamsBytes, "kernel params too large");
  return KernelLaunch{KernelOf<Params>::value, op, &params, sizeof(Params), buffers};
}
// The same, naming which buffers the kernel writes (see KernelLaunch::written).
template <class Params>
[[nodiscard]] KernelLaunch make_launch(const char* op, const Params& params,
                                       std::span<Buffer* const> buffers,
                                       std::uint64_t written) noexcept {
  KernelLaunch launch = make_launch(op, params, buffers);
  launch.written = written;
  return launch;
}

}  // namespace retrace