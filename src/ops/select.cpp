// Comparisons (bool results), where and masked_fill: broadcasting like the binary ops.
#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <algorithm>

namespace retrace::ops {

using namespace detail;

namespace {

// The numpy broadcast of several shapes; the error names the op and every operand's shape.
Shape broadcast_of(std::initializer_list<std::pair<const Tensor*, std::string_view>> operands,
                   std::string_view op) {
  std::size_t rank = 0;
  for (const auto& [t, name] : operands) rank = std::max(rank, t->shape().rank());
  std::vector<std::int64_t> out(rank, 1);
  for (std::size_t i = 0; i < rank; ++i) {
    const auto axis = static_cast<std::int64_t>(i) - static_cast<std::int64_t>(rank);
    bool seen = false;
    for (const auto& [t, name] : operands) {
      if (i + t->shape().rank() < rank) continue;
      const std::int64_t d = t->shape()[axis];
      if (d == 1) continue;
      RETRACE_CHECK(!seen || d == out[i], invalid_argument,
                    "{}: {} of shape {} does not broadcast with the others (axis {}: {} vs {})",
                    op, name, t->shape(), axis, d, out[i]);
      out[i] = d;  // a 0 extent against 1 broadcasts to 0
      seen = true;
    }
  }
  return Shape(std::span<const std::int64_t>(out));
}

Device& same_device(std::initializer_list<std::pair<const Tensor*, std::string_view>> operands,
                    std::string_view op) {
  Device* device = nullptr;
  std::string_view first;
  for (const auto& [t, name] : operands) {
    Device& d = device_of(*t, op, name);
    RETRACE_CHECK(t->layout() == Layout::row_major, invalid_argument,
                  "{}: {} must be row-major, got {}", op, name, t->layout());
    if (device == nullptr) {
      device = &d;
      first = name;
    }
    RETRACE_CHECK(&d == device, invalid_argument, "{}: {} is on {} but {} is on {}", op, first,
                  device->name(), name, d.name());
  }
  return *device;
}

// A scalar operand as a one-element tensor of `like`'s dtype; for integer dtypes it must be a
// whole number in range (a comparison with 2.5 would otherwise compare with 2).
Tensor scalar_like(const Tensor& like, double value, std::string_view op) {
  check_integer_scalar(like.dtype(), value, op, "typecast the tensor to float32 first");
  return full({}, value, *like.device(), like.dtype());
}

void enqueue_compare(const char* op, CompareOp kind, const Tensor& a, const Tensor& b,
                     const Tensor& out, QueueId queue) {
  CompareParams params{};
  params.a = view_data(a);  // views are read through their strides
  params.b = view_data(b);
  params.out = static_cast<std::uint8_t*>(data_of(out));
  params.dtype = a.dtype();
  params.op = kind;
  const std::vector<std::int64_t> shape(out.shape().dims().begin(), out.shape().dims().end());
  fill_space(collapse(shape, {broadcast_strides(a, shape), broadcast_strides(b, shape)}),
             params.shape, {params.a_strides, params.b_strides}, params.rank, op);
  Buffer* buffers[] = {a.buffer().get(), b.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({2})));
}

void check_compare(const char* op, const Tensor& a, const Tensor& b) {
  same_device({{&a, "a"}, {&b, "b"}}, op);
  RETRACE_CHECK(a.dtype() == b.dtype(), invalid_argument, "{}: a has dtype {} but b has {}", op,
                a.dtype(), b.dtype());
}

Tensor compare(const char* op, CompareOp kind, const Tensor& a, const Tensor& b, QueueId queue) {
  check_compare(op, a, b);
  const Shape shape = broadcast_of({{&a, "a"}, {&b, "b"}}, op);
  Tensor out = Tensor::empty(shape, DType::bool_, *a.device());
  if (shape.numel() > 0) enqueue_compare(op, kind, a, b, out, queue);
  return out;
}

void compare_out(const char* op, CompareOp kind, const Tensor& a, const Tensor& b,
                 const Tensor& out, QueueId queue) {
  check_compare(op, a, b);
  const Shape shape = broadcast_of({{&a, "a"}, {&b, "b"}}, op);
  same_device({{&a, "a"}, {&out, "out"}}, op);
  RETRACE_CHECK(out.dtype() == DType::bool_ && out.shape() == shape, invalid_argument,
                "{}: out must be bool {}, got {} {}", op, shape, out.dtype(), out.shape());
  check_dense_out(out, op);
  if (shape.numel() > 0) enqueue_compare(op, kind, a, b, out, queue);
}

void enqueue_where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out,
                   QueueId queue) {
  WhereParams params{};
  params.cond = static_cast<const std::uint8_t*>(view_data(cond));
  params.a = view_data(a);  // views are read through their strides
  params.b = view_data(b);
  params.out = data_of(out);
  params.elem_size = static_cast<std::int32_t>(dtype_size(a.dtype()));
  const std::vector<std::int64_t> shape(out.shape().dims().begin(), out.shape().dims().end());
  fill_space(collapse(shape, {broadcast_strides(cond, shape), broadcast_strides(a, shape),
                              broadcast_strides(b, shape)}),
             params.shape, {params.cond_strides, params.a_strides, params.b_strides},
             params.rank, "where");
  Buffer* buffers[] = {cond.buffer().get(), a.buffer().get(), b.buffer().get(),
                       out.buffer().get()};
  a.device()->enqueue(queue, make_launch("where", params, buffers, writes_only({3})));
}

Shape check_where(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b,
                  std::string_view cond_name, std::string_view a_name) {
  same_device({{&cond, cond_name}, {&a, a_name}, {&b, "b"}}, op);
  RETRACE_CHECK(cond.dtype() == DType::bool_, invalid_argument,
                "{}: {} must be a bool tensor (a comparison's result, or typecast to bool), got "
                "{}",
                op, cond_name, cond.dtype());
  RETRACE_CHECK(a.dtype() == b.dtype(), invalid_argument, "{}: {} has dtype {} but b has {}", op,
                a_name, a.dtype(), b.dtype());
  return broadcast_of({{&cond, cond_name}, {&a, a_name}, {&b, "b"}}, op);
}

}  // namespace

#define RETRACE_DEFINE_COMPARE(name)                                                       \
  Tensor name(const Tensor& a, const Tensor& b, QueueId queue) {                           \
    return compare(#name, CompareOp::name, a, b, queue);                                   \
  }                                                                                        \
  Tensor name(const Tensor& a, double b, QueueId queue) {                                  \
    device_of(a, #name, "a");                                                              \
    return compare(#name, CompareOp::name, a, scalar_like(a, b, #name), queue);            \
  }                                                                                        \
  void name(const Tensor& a, const Tensor& b, const Tensor& out, QueueId queue) {          \
    compare_out(#name, CompareOp::name, a, b, out, queue);                                 \
  }
RETRACE_DEFINE_COMPARE(eq)
RETRACE_DEFINE_COMPARE(ne)
RETRACE_DEFINE_COMPARE(lt)
RETRACE_DEFINE_COMPARE(le)
RETRACE_DEFINE_COMPARE(gt)
RETRACE_DEFINE_COMPARE(ge)
#undef RETRACE_DEFINE_COMPARE

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, QueueId queue) {
  const Shape shape = check_where("where", cond, a, b, "cond", "a");
  Tensor out = Tensor::empty(shape, a.dtype(), *a.device());
  if (shape.numel() > 0) enqueue_where(cond, a, b, out, queue);
  return out;
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out,
           QueueId queue) {
  const Shape shape = check_where("where", cond, a, b, "cond", "a");
  same_device({{&a, "a"}, {&out, "out"}}, "where");
  RETRACE_CHECK(out.dtype() == a.dtype() && out.shape() == shape, invalid_argument,
                "where: out must be {} {}, got {} {}", a.dtype(), shape, out.dtype(),
                out.shape());
  check_dense_out(out, "where");
  check_no_partial_overlap(out, "where", {{&a, "a"}, {&b, "b"}});
  if (shape.numel() > 0) enqueue_where(cond, a, b, out, queue);
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value, QueueId queue) {
  device_of(a, "masked_fill", "a");
  const Tensor fill_value = scalar_like(a, value, "masked_fill");
  const Shape shape = check_where("masked_fill", mask, fill_value, a, "mask", "value");
  RETRACE_CHECK(shape == a.shape(), invalid_argument,
                "masked_fill: mask {} must broadcast to a's shape {} (the result would be {})",
                mask.shape(), a.shape(), shape);
  Tensor out = Tensor::empty(shape, a.dtype(), *a.device());
  if (shape.numel() > 0) enqueue_where(mask, fill_value, a, out, queue);
  return out;
}

// --- logical ops ---------------------------------------------------------------------------------

namespace {

// a as bool: itself, or typecast (nonzero, NaN included, is true).
Tensor truth(const Tensor& a, QueueId queue) {
  return a.dtype() == DType::bool_ ? a : typecast(a, DType::bool_, queue);
}

enum class Logical { and_, or_, xor_ };

Tensor logical(const char* op, Logical kind, const Tensor& a, const Tensor& b, QueueId queue) {
  same_device({{&a, "a"}, {&b, "b"}}, op);
  const Shape shape = broadcast_of({{&a, "a"}, {&b, "b"}}, op);
  Tensor out = Tensor::empty(shape, DType::bool_, *a.device());
  if (shape.numel() == 0) return out;
  const Tensor ta = truth(a, queue), tb = truth(b, queue);
  switch (kind) {
    case Logical::and_:  // a ? b : false
      enqueue_where(ta, tb, full({}, 0.0, *a.device(), DType::bool_, Layout::row_major, queue),
                    out, queue);
      break;
    case Logical::or_:  // a ? true : b
      enqueue_where(ta, full({}, 1.0, *a.device(), DType::bool_, Layout::row_major, queue), tb,
                    out, queue);
      break;
    case Logical::xor_:
      enqueue_compare(op, CompareOp::ne, ta, tb, out, queue);
      break;
  }
  return out;
}

}  // namespace

Tensor logical_and(const Tensor& a, const Tensor& b, QueueId queue) {
  return logical("logical_and", Logical::and_, a, b, queue);
}
Tensor logical_or(const Tensor& a, const Tensor& b, QueueId queue) {
  return logical("logical_or", Logical::or_, a, b, queue);
}
Tensor logical_xor(const Tensor& a, const Tensor& b, QueueId queue) {
  return logical("logical_xor", Logical::xor_, a, b, queue);
}
Tensor logical_not(const Tensor& a, QueueId queue) {
  same_device({{&a, "a"}}, "logical_not");
  Tensor out = Tensor::empty(a.shape(), DType::bool_, *a.device());
  if (a.numel() == 0) return out;
  const Tensor ta = truth(a, queue);
  enqueue_compare("logical_not", CompareOp::eq, ta,
                  full({}, 0.0, *a.device(), DType::bool_, Layout::row_major, queue), out, queue);
  return out;
}

// --- indexed reads ---------------------------------------------------------------------------

namespace {

// Both on one device, row-major; index int32 or int64.
void check_index_operands(const char* op, const Tensor& a, const char* a_name,
                          const Tensor& index) {
  same_device({{&a, a_name}, {&index, "index"}}, op);
  RETRACE_CHECK(index.dtype() == DType::int32 || index.dtype() == DType::int64, invalid_argument,
                "{}: index must be int32 or int64, got {} (typecast it)", op, index.dtype());
}

// out[idx] = a[idx . src_strides + index[idx . index_strides] * a.stride(dim)] over out's shape.
Tensor enqueue_gather(const char* op, const Tensor& a, std::size_t dim, const Tensor& index,
                      const Shape& out_shape, std::vector<std::int64_t> src_strides,
                      std::vector<std::int64_t> index_strides, QueueId queue) {
  Tensor out = Tensor::empty(out_shape, a.dtype(), *a.device());
  if (out_shape.numel() == 0) return out;
  const std::vector<std::int64_t> a_strides = strides_of(a);
  GatherParams params{};
  params.src = view_data(a);  // a and index are read through their strides
  params.index = view_data(index);
  params.index_size = static_cast<std::int32_t>(dtype_size(index.dtype()));
  params.out = data_of(out);
  params.rank = static_cast<std::int32_t>(out_shape.rank());
  for (std::size_t d = 0; d < out_shape.rank(); ++d) {
    params.shape[d] = out_shape[d];
    params.src_strides[d] = src_strides[d];
    params.index_strides[d] = index_strides[d];
  }
  params.dim_stride = a_strides[dim];
  params.dim_size = a.shape()[dim];
  params.elem_size = static_cast<std::int32_t>(dtype_size(a.dtype()));
  Buffer* buffers[] = {a.buffer().get(), index.buffer().get(), out.buffer().get()};
  a.device()->enqueue(queue, make_launch(op, params, buffers, writes_only({2})));
  return out;
}

Tensor select_rows(const char* op, const Tensor& a, std::size_t dim, const Tensor& index,
                   QueueId queue) {
  // index is the one-dimensional reshape its callers make, a view or not: read along `dim`
  // through its stride, repeated along the other dimensions.
  std::vector<std::int64_t> dims(a.shape().dims().begin(), a.shape().dims().end());
  dims[dim] = index.numel();
  std::vector<std::int64_t> src_strides = strides_of(a);
  src_strides[dim] = 0;
  std::vector<std::int64_t> index_strides(dims.size(), 0);
  index_strides[dim] = index.numel() > 1 ? index.strides()[0] : 0;
  return enqueue_gather(op, a, dim, index, Shape(std::span<const std::int64_t>(dims)),
                        std::move(src_strides), std::move(index_strides), queue);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, QueueId queue) {
  check_index_operands("embedding", weight, "weight", indices);
  RETRACE_CHECK(weight.shape().rank() == 2, invalid_argument,
                "embedding: weight must be [num_embeddings, embedding_dim], got {}",
                weight.shape());
  RETRACE_CHECK(indices.shape().rank() < Shape::kMaxRank, invalid_argument,
                "embedding: indices of rank {} would give a result of rank {} (at most {})",
                indices.shape().rank(), indices.shape().rank() + 1, Shape::kMaxRank);
  std::vector<std::int64_t> dims(indices.shape().dims().begin(), indices.shape().dims().end());
  dims.push_back(weight.shape()[1]);
  const Tensor rows = select_rows("embedding", weight, 0, reshape(indices, {indices.numel()}), queue);
  return reshape(rows, std::span<const std::int64_t>(dims));
}

Tensor index_select(const Tensor& a, std::int64_t dim, const Tensor& index, QueueId queue) {
  check_index_operands("index_select", a, "a", index);
  RETRACE_CHECK(a.shape().rank() >= 1, invalid_argument,
                "index_select: a needs rank 1 or more, got {}", a.shape());
  RETRACE_CHECK(index.shape().rank() <= 1, invalid_argument,
                "index_select: index must be one-dimensional, got {}", index.shape());
  const std::int64_t d = normalize_dim(dim, a.shape().rank(), "index_select");
  return select_rows("index_select", a, static_cast<std::size_t>(d),
                     reshape(index, {index.numel()}), queue);
}

Tensor gather(const Tensor& a, std::int64_t dim, const Tensor& index, QueueId queue) {
  check_index_operands("gather", a, "a", index);
  const std::size_t rank = a.shape().rank();
  RETRACE_CHECK(rank >= 1 && index.shape().rank() == rank, invalid_argument,
                "gather: index must have a's rank ({}), got {} for a {}", rank, index.shape(),
                a.shape());
  const auto d = static_cast<std::size_t>(normalize_dim(dim, rank, "gather"));
  for (std::size_t k = 0; k < rank; ++k) {
    RETRACE_CHECK(k == d || index.shape()[k] <= a.shape()[k], invalid_argument,
                  "gather: index {} is larger than a {} along dimension {} (only dimension {} "
                  "may differ)",
                  index.shape(), a.shape(), k, d);
  }
  std::vector<std::int64_t> src_strides = strides_of(a);
  src_strides[d] = 0;
  return enqueue_gather("gather", a, d, index, index.shape(), std::move(src_strides),
                        strides_of(index), queue);
}

}  // namespace retrace::ops
