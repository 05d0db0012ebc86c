// Shape and layout ops. reshape, permute/transpose, slice, split/chunk and expand return views
// of their input's storage (no command); concat, stack, repeat, flip, contiguous, typecast and
// to_layout copy. Data movement goes through one strided-copy kernel.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <cstdint>

#include <algorithm>
#include <numeric>
#include <optional>
#include <span>

namespace retrace::ops {

using namespace detail;

namespace {

void check_row_major(const Tensor& a, std::string_view op) {
  RETRACE_CHECK(a.layout() == Layout::row_major, invalid_argument,
                "{}: a is in {} layout; convert it to row_major with to_layout first", op,
                a.layout());
}

// For expand and repeat, which take one value per dimension of a row-major device tensor,
// extra values in front adding dimensions: how many dimensions `given` values add.
std::size_t new_leading_dims(const Tensor& a, std::size_t given, std::string_view values,
                             std::string_view op) {
  device_of(a, op, "a");
  check_row_major(a, op);
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(given >= rank, invalid_argument,
                "{}: {} {} given for a tensor of rank {} (give at least one per dimension; new "
                "ones go in front)",
                op, given, values, rank);
  return given - rank;
}

// The strides under which `dims` see the elements of a (non-empty) tensor with `old_dims` and
// `old_strides` in row-major order, or nothing when no strides do (torch's rule for reshape
// returning a view). The old dimensions fall into runs whose elements step evenly (each
// dimension's stride is the next one's stride times its extent); the new dimensions must split
// each run exactly, from the back. Dimensions of extent 1 hold no step and are skipped.
std::optional<std::vector<std::int64_t>> view_strides(std::span<const std::int64_t> old_dims,
                                                      std::span<const std::int64_t> old_strides,
                                                      const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> strides(dims.size(), 0);
  std::size_t next = dims.size();  // new dimensions not placed yet are [0, next)
  auto skip_ones = [&] {
    while (next > 0 && dims[next - 1] == 1) --next;
  };
  std::size_t end = old_dims.size();
  while (end > 0) {
    if (old_dims[end - 1] == 1) {
      --end;
      continue;
    }
    // The run ending at old dimension end - 1: its element count and innermost stride.
    const std::int64_t base = old_strides[end - 1];
    std::int64_t count = old_dims[end - 1], step = base * old_dims[end - 1];
    std::size_t begin = end - 1;
    while (begin > 0 && (old_dims[begin - 1] == 1 || old_strides[begin - 1] == step)) {
      --begin;
      count *= old_dims[begin];
      if (old_dims[begin] != 1) step = old_strides[begin] * old_dims[begin];
    }
    std::int64_t placed = 1;
    skip_ones();
    while (placed < count && next > 0) {
      --next;
      strides[next] = base * placed;
      placed *= dims[next];
      skip_ones();
    }
    if (placed != count) return std::nullopt;
    end = begin;
  }
  skip_ones();
  if (next != 0) return std::nullopt;
  // Extent-1 dimensions: the stride a contiguous layout would give them.
  for (std::size_t i = dims.size(); i-- > 0;) {
    if (dims[i] == 1) strides[i] = i + 1 < dims.size() ? strides[i + 1] * dims[i + 1] : 1;
  }
  return strides;
}

}  // namespace

namespace detail {

// dst[idx] = src[idx] over `shape`, with per-operand strides (elements) and a source offset.
void strided_copy(const char* op, const Tensor& src, std::int64_t src_offset,
                  const std::vector<std::int64_t>& shape,
                  const std::vector<std::int64_t>& src_strides, const Tensor& dst,
                  std::int64_t dst_offset, const std::vector<std::int64_t>& dst_strides,
                  QueueId queue) {
  const std::int64_t count = std::accumulate(shape.begin(), shape.end(), std::int64_t{1},
                                             std::multiplies<>());
  if (count == 0) return;
  const auto elem = static_cast<std::int64_t>(dtype_size(src.dtype()));
  StridedCopyParams params{};
  params.src = static_cast<const std::byte*>(view_data(src)) + src_offset * elem;
  params.dst = static_cast<std::byte*>(view_data(dst)) + dst_offset * elem;
  params.elem_size = static_cast<std::int32_t>(elem);
  fill_space(collapse(shape, {src_strides, dst_strides}), params.shape,
             {params.src_strides, params.dst_strides}, params.rank, op);
  Buffer* buffers[] = {src.buffer().get(), dst.buffer().get()};
  src.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({1})));
}

}  // namespace detail

Tensor reshape(const Tensor& a, std::span<const std::int64_t> shape) {
  device_of(a, "reshape", "a");
  check_row_major(a, "reshape");
  std::vector<std::int64_t> dims(shape.begin(), shape.end());
  std::int64_t known = 1;
  int inferred = -1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      RETRACE_CHECK(inferred < 0, invalid_argument, "reshape: only one extent may be -1");
      inferred = static_cast<int>(i);
    } else {
      RETRACE_CHECK(dims[i] >= 0, invalid_argument,
                    "reshape: extent {} of the new shape is {}; extents are >= 0 (or one -1)", i,
                    dims[i]);
      RETRACE_CHECK(dims[i] == 0 || known <= INT64_MAX / dims[i], invalid_argument,
                    "reshape: the new shape's element count overflows 64 bits");
      known *= dims[i];
    }
  }
  if (inferred >= 0) {
    RETRACE_CHECK(known != 0 && a.numel() % known == 0, invalid_argument,
                  "reshape: cannot infer the -1 extent: {} elements do not divide into {}",
                  a.numel(), known);
    dims[static_cast<std::size_t>(inferred)] = a.numel() / known;
  }
  const Shape target = shape_of(dims);
  RETRACE_CHECK(target.numel() == a.numel(), invalid_argument,
                "reshape: shape {} ({} elements) does not match the tensor's shape {} ({} "
                "elements)",
                target, target.numel(), a.shape(), a.numel());
  if (!a.is_contiguous()) {
    if (auto strides = view_strides(a.shape().dims(), a.strides(), dims)) {
      return a.as_strided(target, *strides, a.storage_offset());
    }
  }
  return dense(a, kDefaultQueue).with_shape(target);
}

Tensor reshape(const Tensor& a, std::initializer_list<std::int64_t> shape) {
  return reshape(a, std::span<const std::int64_t>(shape.begin(), shape.size()));
}

Tensor permute(const Tensor& a, std::span<const std::int64_t> dims, QueueId /*queue*/) {
  constexpr const char* op = "permute";
  device_of(a, op, "a");
  check_row_major(a, op);
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(dims.size() == rank, invalid_argument,
                "permute: {} dimensions given for a tensor of rank {}", dims.size(), rank);
  std::vector<bool> seen(rank, false);
  std::vector<std::int64_t> shape(rank), strides(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const auto d = static_cast<std::size_t>(normalize_dim(dims[i], rank, op));
    RETRACE_CHECK(!seen[d], invalid_argument, "permute: dimension {} appears twice", d);
    seen[d] = true;
    shape[i] = a.shape().dims()[d];
    strides[i] = a.strides()[d];
  }
  return a.as_strided(shape_of(shape), strides, a.storage_offset());
}

Tensor permute(const Tensor& a, std::initializer_list<std::int64_t> dims, QueueId queue) {
  return permute(a, std::span<const std::int64_t>(dims.begin(), dims.size()), queue);
}

Tensor transpose(const Tensor& a, std::int64_t dim0, std::int64_t dim1, QueueId queue) {
  device_of(a, "transpose", "a");
  const std::size_t rank = a.shape().rank();
  std::vector<std::int64_t> dims(rank);
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<std::size_t>(normalize_dim(dim0, rank, "transpose"))],
            dims[static_cast<std::size_t>(normalize_dim(dim1, rank, "transpose"))]);
  return permute(a, dims, queue);
}

Tensor slice(const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t end,
             std::int64_t step, QueueId /*queue*/) {
  constexpr const char* op = "slice";
  device_of(a, op, "a");
  check_row_major(a, op);
  const auto d = static_cast<std::size_t>(normalize_dim(dim, a.shape().rank(), op));
  const std::int64_t extent = a.shape().dims()[d];
  RETRACE_CHECK(step >= 1, invalid_argument, "slice: step must be positive, got {}", step);
  auto clamp = [&](std::int64_t i) {
    return std::clamp(i < 0 ? i + extent : i, std::int64_t{0}, extent);
  };
  const std::int64_t from = clamp(start), to = std::max(clamp(end), from);
  std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  shape[d] = (to - from + step - 1) / step;
  std::vector<std::int64_t> strides = strides_of(a);
  const std::int64_t offset = a.storage_offset() + from * strides[d];
  // A step past the extent (one element taken) keeps the stride in range.
  if (shape[d] > 1) strides[d] *= step;
  return a.as_strided(shape_of(shape), strides, offset);
}

std::vector<Tensor> split(const Tensor& a, std::span<const std::int64_t> sizes, std::int64_t dim,
                          QueueId queue) {
  device_of(a, "split", "a");
  const auto d = static_cast<std::size_t>(normalize_dim(dim, a.shape().rank(), "split"));
  const std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  RETRACE_CHECK(total == a.shape().dims()[d], invalid_argument,
                "split: sizes add up to {} but dimension {} of {} has {}", total, d, a.shape(),
                a.shape().dims()[d]);
  std::vector<Tensor> pieces;
  std::int64_t start = 0;
  for (std::int64_t size : sizes) {
    RETRACE_CHECK(size >= 0, invalid_argument, "split: negative size {}", size);
    pieces.push_back(slice(a, static_cast<std::int64_t>(d), start, start + size, 1, queue));
    start += size;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& a, std::int64_t size, std::int64_t dim, QueueId queue) {
  device_of(a, "split", "a");
  const auto d = static_cast<std::size_t>(normalize_dim(dim, a.shape().rank(), "split"));
  const std::int64_t extent = a.shape().dims()[d];
  RETRACE_CHECK(size > 0 || (size == 0 && extent == 0), invalid_argument,
                "split: size {} along dimension {} of {}; a size is > 0 (0 only for an empty "
                "dimension)",
                size, d, a.shape());
  std::vector<std::int64_t> sizes;
  if (extent == 0) sizes.push_back(0);
  for (std::int64_t at = 0; at < extent; at += size) sizes.push_back(std::min(size, extent - at));
  return split(a, std::span<const std::int64_t>(sizes), static_cast<std::int64_t>(d), queue);
}

std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim, QueueId queue) {
  device_of(a, "chunk", "a");
  RETRACE_CHECK(chunks >= 1, invalid_argument, "chunk: chunks must be positive, got {}", chunks);
  const auto d = static_cast<std::size_t>(normalize_dim(dim, a.shape().rank(), "chunk"));
  const std::int64_t extent = a.shape().dims()[d];
  // As torch.chunk: pieces of ceil(extent / chunks), so fewer than `chunks` where they run out
  // (5 in 4 chunks: 2, 2, 1), and `chunks` empty pieces of an empty extent (so `q, k, v =
  // chunk(x, 3, d)` holds for an empty batch too).
  if (extent == 0) {
    const std::vector<std::int64_t> empty(static_cast<std::size_t>(chunks), 0);
    return split(a, empty, static_cast<std::int64_t>(d), queue);
  }
  return split(a, extent / chunks + (extent % chunks != 0 ? 1 : 0), static_cast<std::int64_t>(d),
               queue);
}

Tensor concat(std::span<const Tensor> tensors, std::int64_t dim, QueueId queue) {
  constexpr const char* op = "concat";
  RETRACE_CHECK(!tensors.empty(), invalid_argument, "concat: no tensors given");
  const Tensor& first = tensors.front();
  device_of(first, op, "tensors[0]");
  check_row_major(first, op);
  const auto d = static_cast<std::size_t>(normalize_dim(dim, first.shape().rank(), op));
  std::vector<std::int64_t> shape(first.shape().dims().begin(), first.shape().dims().end());
  shape[d] = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string name = fmt::format("tensors[{}]", i);
    check_matches_except(first, t, d, op, name);
    shape[d] += t.shape().dims()[d];
  }
  Tensor out = empty_like(first, shape_of(shape), op);
  const std::vector<std::int64_t> out_strides = contiguous_strides(out.shape());
  std::int64_t at = 0;
  for (const Tensor& t : tensors) {
    const std::vector<std::int64_t> piece(t.shape().dims().begin(), t.shape().dims().end());
    strided_copy(op, t, 0, piece, strides_of(t), out, at * out_strides[d],
                 out_strides, queue);
    at += t.shape().dims()[d];
  }
  return out;
}

Tensor stack(std::span<const Tensor> tensors, std::int64_t dim, QueueId queue) {
  constexpr const char* op = "stack";
  RETRACE_CHECK(!tensors.empty(), invalid_argument, "stack: no tensors given");
  const Tensor& first = tensors.front();
  device_of(first, op, "tensors[0]");
  check_row_major(first, op);
  const std::size_t rank = first.shape().rank();
  RETRACE_CHECK(rank < Shape::kMaxRank, invalid_argument,
                "stack: the tensors have rank {}; stacking adds a dimension and ranks go up to {}",
                rank, Shape::kMaxRank);
  const auto d = static_cast<std::size_t>(normalize_dim(dim, rank + 1, op));
  std::vector<Tensor> pieces;
  pieces.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string name = fmt::format("tensors[{}]", i);
    device_of(t, op, name);
    RETRACE_CHECK(t.shape() == first.shape() && t.dtype() == first.dtype(), invalid_argument,
                  "stack: {} is {} {}; tensors[0] is {} {} (stacked tensors have one shape and "
                  "dtype)",
                  name, t.shape(), t.dtype(), first.shape(), first.dtype());
    std::vector<std::int64_t> dims(t.shape().dims().begin(), t.shape().dims().end());
    std::vector<std::int64_t> strides = strides_of(t);
    dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(d), 1);
    strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(d), 1);  // any: extent 1
    pieces.push_back(t.as_strided(shape_of(dims), strides, t.storage_offset()));
  }
  return concat(pieces, static_cast<std::int64_t>(d), queue);
}

Tensor expand(const Tensor& a, std::span<const std::int64_t> shape, QueueId /*queue*/) {
  constexpr const char* op = "expand";
  const std::size_t lead = new_leading_dims(a, shape.size(), "extents", op);
  const std::vector<std::int64_t> strides = strides_of(a);
  std::vector<std::int64_t> dims(shape.size()), src_strides(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t want = shape[i];
    if (i < lead) {
      RETRACE_CHECK(want >= 0, invalid_argument,
                    "expand: new leading dimension {} is {}; it needs an extent >= 0", i, want);
      dims[i] = want;
      continue;
    }
    const std::int64_t have = a.shape().dims()[i - lead];
    if (want == -1 || want == have) {
      dims[i] = have;
      src_strides[i] = strides[i - lead];
    } else {
      RETRACE_CHECK(have == 1 && want >= 0, invalid_argument,
                    "expand: dimension {} of {} has extent {}; only extent 1 expands (to {})",
                    i - lead, a.shape(), have, want);
      dims[i] = want;
    }
  }
  return a.as_strided(result_shape(dims, op), src_strides, a.storage_offset());
}

Tensor expand(const Tensor& a, std::initializer_list<std::int64_t> shape, QueueId queue) {
  return expand(a, std::span<const std::int64_t>(shape.begin(), shape.size()), queue);
}

Tensor repeat(const Tensor& a, std::span<const std::int64_t> repeats, QueueId queue) {
  constexpr const char* op = "repeat";
  const std::size_t lead = new_leading_dims(a, repeats.size(), "repeats", op);
  const std::vector<std::int64_t> strides = strides_of(a);
  // The output seen as [r0, d0, r1, d1, ...]: each copy of the input reads it with stride 0
  // along the repeat dimensions.
  std::vector<std::int64_t> dims, copy_shape, src_strides;
  for (std::size_t i = 0; i < repeats.size(); ++i) {
    const std::int64_t r = repeats[i];
    RETRACE_CHECK(r >= 0, invalid_argument, "repeat: repeats[{}] is {}; repeats are >= 0", i, r);
    const std::int64_t extent = i < lead ? 1 : a.shape().dims()[i - lead];
    std::int64_t total = 0;
    RETRACE_CHECK(!__builtin_mul_overflow(r, extent, &total), invalid_argument,
                  "repeat: dimension {} of extent {} repeated {} times overflows", i, extent, r);
    dims.push_back(total);
    copy_shape.insert(copy_shape.end(), {r, extent});
    src_strides.insert(src_strides.end(), {0, i < lead ? 0 : strides[i - lead]});
  }
  const Shape target = result_shape(dims, op);
  Tensor out = empty_like(a, target, op);
  const std::vector<std::int64_t> dst_strides = contiguous_strides(copy_shape);
  strided_copy(op, a, 0, copy_shape, src_strides, out, 0, dst_strides, queue);
  return out;
}

Tensor repeat(const Tensor& a, std::initializer_list<std::int64_t> repeats, QueueId queue) {
  return repeat(a, std::span<const std::int64_t>(repeats.begin(), repeats.size()), queue);
}

Tensor flip(const Tensor& a, std::span<const std::int64_t> dims, QueueId queue) {
  constexpr const char* op = "flip";
  device_of(a, op, "a");
  check_row_major(a, op);
  const std::size_t rank = a.shape().rank();
  std::vector<std::int64_t> src_strides = strides_of(a);
  std::vector<bool> seen(rank, false);
  std::int64_t offset = 0;
  for (std::int64_t dim : dims) {
    const auto d = static_cast<std::size_t>(normalize_dim(dim, rank, op));
    RETRACE_CHECK(!seen[d], invalid_argument, "flip: dimension {} appears twice", d);
    seen[d] = true;
    const std::int64_t extent = a.shape().dims()[d];
    if (extent > 0) offset += (extent - 1) * src_strides[d];
    src_strides[d] = -src_strides[d];
  }
  Tensor out = empty_like(a, a.shape(), op);
  const std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  strided_copy(op, a, offset, shape, src_strides, out, 0, contiguous_strides(a.shape()), queue);
  return out;
}

Tensor flip(const Tensor& a, std::initializer_list<std::int64_t> dims, QueueId queue) {
  return flip(a, std::span<const std::int64_t>(dims.begin(), dims.size()), queue);
}

Tensor contiguous(const Tensor& a, QueueId queue) {
  constexpr const char* op = "contiguous";
  device_of(a, op, "a");
  if (a.is_contiguous()) return a;
  Tensor out = empty_like(a, a.shape(), op);
  const std::vector<std::int64_t> shape(a.shape().dims().begin(), a.shape().dims().end());
  strided_copy(op, a, 0, shape, strides_of(a), out, 0, contiguous_strides(a.shape()), queue);
  return out;
}

Tensor typecast(const Tensor& a_in, DType dtype, QueueId queue) {
  Device& device = device_of(a_in, "typecast", "a");
  const Tensor a = dense(a_in, queue);
  Tensor out = Tensor::empty(a.shape(), dtype, device, a.layout());
  TypecastParams params{data_of(a), data_of(out), storage_elements(a.shape(), a.layout()),
                        a.dtype(), dtype};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  device.enqueue(queue, make_launch("typecast", params, buffers, writes_only({1})));
  return out;
}

Tensor to_layout(const Tensor& a_in, Layout layout, QueueId queue) {
  Device& device = device_of(a_in, "to_layout", "a");
  if (a_in.layout() == layout) return a_in;
  const Tensor a = dense(a_in, queue);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), device, layout);
  const Shape& s = a.shape();
  const std::int64_t cols = s.rank() >= 1 ? s[-1] : 1, rows = s.rank() >= 2 ? s[-2] : 1;
  TilizeParams params{data_of(a),
                      data_of(out),
                      rows * cols == 0 ? 0 : a.numel() / (rows * cols),
                      rows,
                      cols,
                      static_cast<std::int32_t>(dtype_size(a.dtype())),
                      layout == Layout::tile};
  Buffer* buffers[] = {a.buffer().get(), out.buffer().get()};
  device.enqueue(queue, make_launch("to_layout", params, buffers, writes_only({1})));
  return out;
}

}  // namespace retrace::ops
