// Argument checks shared by the ops: every op names itself and the offending argument.
#pragma once

#include "retrace/error.hpp"
#include "retrace/tensor.hpp"

#include <string_view>

namespace retrace::ops::detail {

// The device a tensor argument lives on; rejects null, host and closed-device tensors.
Device& device_of(const Tensor& tensor, std::string_view op, std::string_view argument);

// b must match a in device, dtype, layout and shape.
void check_matches(const Tensor& a, std::string_view a_name, const Tensor& b,
                   std::string_view b_name, std::string_view op);

void check_dtype_in(const Tensor& tensor, std::string_view op, std::string_view argument,
                    std::initializer_list<DType> allowed);

// The floating-point dtypes: every op that computes in float takes them.
inline constexpr std::initializer_list<DType> kFloatTypes = {DType::float32, DType::bfloat16,
                                                             DType::float16};
// Elementwise arithmetic: the floats, int32, uint32 and int64.
inline constexpr std::initializer_list<DType> kArithmeticTypes = {
    DType::float32, DType::bfloat16, DType::float16, DType::int32, DType::uint32, DType::int64};

// The values an integer dtype holds, [lo, hi] (as doubles: every bound is exact).
struct IntegerRange {
  double lo, hi;
};
IntegerRange integer_range(DType dtype);
// A scalar operand of a tensor of `dtype`: for integer dtypes it must be a whole number in the
// dtype's range (invalid_argument naming op and value, then `hint`); floating dtypes take any.
void check_integer_scalar(DType dtype, double value, std::string_view op, std::string_view hint);

}  // namespace retrace::ops::detail

#include <array>
#include <vector>

namespace retrace::ops::detail {

// Row-major strides (in elements) of a shape.
std::vector<std::int64_t> contiguous_strides(const Shape& shape);
// The same for a list of extents of any length (a copy's iteration space before merging).
std::vector<std::int64_t> contiguous_strides(std::span<const std::int64_t> extents);

// Resolves a possibly negative dimension index; throws naming the op.
std::int64_t normalize_dim(std::int64_t dim, std::size_t rank, std::string_view op);

// An iteration space for kernels: extents and, per operand, strides in elements. Dimensions of
// extent 1 are dropped and neighbours that are contiguous for every operand are merged, so the
// result fits the kernels' rank limit in all practical cases.
struct IterationSpace {
  std::vector<std::int64_t> shape;
  std::vector<std::vector<std::int64_t>> strides;  // one vector per operand
};
IterationSpace collapse(const std::vector<std::int64_t>& shape,
                        const std::vector<std::vector<std::int64_t>>& strides);

// Copies an iteration space into a kernel's fixed arrays (throws if it is too deep).
void fill_space(const IterationSpace& space, std::int64_t* shape,
                std::initializer_list<std::int64_t*> strides, std::int32_t& rank,
                std::string_view op);

// The allocating op: a new tensor of the given shape on a's device, a's dtype and layout.
Tensor empty_like(const Tensor& a, const Shape& shape, std::string_view op);
// The Shape of an op's result whose extents the caller chose: the limits Shape enforces (rank,
// element count) checked first, so the error names the op.
Shape result_shape(const std::vector<std::int64_t>& dims, std::string_view op);
// The Shape of dims an op has already checked (Shape still enforces its limits).
inline Shape shape_of(const std::vector<std::int64_t>& dims) {
  return Shape(std::span<const std::int64_t>(dims));
}

// The first element of a tensor that a kernel reads or writes densely (row-major, no gaps):
// throws unimplemented for a strided view, which such kernels get through dense() first.
void* data_of(const Tensor& t);
// The first element of any view, for kernels that take its strides (strides_of).
void* view_data(const Tensor& t);
// A tensor's element strides, as kernels' iteration spaces take them.
std::vector<std::int64_t> strides_of(const Tensor& t);
// `t` itself when contiguous, else a contiguous copy (one strided_copy command on `queue`).
Tensor dense(const Tensor& t, QueueId queue);
// The strides (elements) of `t`, a view or not, seen from a broadcast output `out` (numpy
// alignment; 0 where broadcast).
std::vector<std::int64_t> broadcast_strides(const Tensor& t, const std::vector<std::int64_t>& out);
// Whether two tensors may reach a common element: one storage and intersecting element ranges.
bool may_overlap(const Tensor& a, const Tensor& b);
// Whether two distinct index tuples of `t` can reach one storage element (a 0 stride along an
// extent > 1, or strides that interleave): such a view cannot be written.
bool has_internal_overlap(const Tensor& t);
// Elementwise out= arguments: an input may be `out` itself (the same elements, read and
// written in place) or lie elsewhere in memory, but not overlap it partly (a shifted view of the
// same storage would be read after it was written).
void check_no_partial_overlap(
    const Tensor& out, std::string_view op,
    std::initializer_list<std::pair<const Tensor*, std::string_view>> inputs);
// dst[idx] = src[idx] over `shape`, with per-operand strides and offsets (in elements, from each
// tensor's first element, so either may be a view); the strides may be 0 (a source element read
// several times). Enqueues one strided_copy kernel.
void strided_copy(const char* op, const Tensor& src, std::int64_t src_offset,
                  const std::vector<std::int64_t>& shape,
                  const std::vector<std::int64_t>& src_strides, const Tensor& dst,
                  std::int64_t dst_offset, const std::vector<std::int64_t>& dst_strides,
                  QueueId queue);

}  // namespace retrace::ops::detail

namespace retrace::ops::detail {
// An out= argument must be dense (contiguous): kernels write their outputs densely.
void check_dense_out(const Tensor& out, std::string_view op);
// An out= argument: dense, on a's device, with the result's shape and a's dtype and layout.
void check_out(const Tensor& out, const Tensor& a, const Shape& shape, std::string_view op);
// An out= argument of an op whose kernel reads these inputs while it writes (a product, a
// norm's weight): it must not share storage with any of them.
void check_not_aliased(const Tensor& out, std::string_view op,
                       std::initializer_list<std::pair<const Tensor*, std::string_view>> inputs);
// b must match a in device, dtype, layout and every extent but dimension `except`.
void check_matches_except(const Tensor& a, const Tensor& b, std::size_t except,
                          std::string_view op, std::string_view b_name);
}  // namespace retrace::ops::detail
