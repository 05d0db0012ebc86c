#include "ops/checks.hpp"
#include "retrace/ops.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace retrace::ops::detail {

Device& device_of(const Tensor& tensor, std::string_view op, std::string_view argument) {
  return tensor.require_device(op, argument);
}

void check_matches(const Tensor& a, std::string_view a_name, const Tensor& b,
                   std::string_view b_name, std::string_view op) {
  Device& da = device_of(a, op, a_name);
  Device& db = device_of(b, op, b_name);
  RETRACE_CHECK(&da == &db, invalid_argument, "{}: {} is on {} but {} is on {}", op, a_name,
                da.name(), b_name, db.name());
  RETRACE_CHECK(a.dtype() == b.dtype(), invalid_argument, "{}: {} has dtype {} but {} has {}",
                op, a_name, a.dtype(), b_name, b.dtype());
  RETRACE_CHECK(a.layout() == b.layout(), invalid_argument, "{}: {} has layout {} but {} has {}",
                op, a_name, a.layout(), b_name, b.layout());
  RETRACE_CHECK(a.shape() == b.shape(), invalid_argument, "{}: {} has shape {} but {} has {}", op,
                a_name, a.shape(), b_name, b.shape());
}

IntegerRange integer_range(DType dtype) {
  switch (dtype) {
    case DType::int32: return {-2147483648.0, 2147483647.0};
    case DType::uint32: return {0.0, 4294967295.0};
    // The doubles inside int64's range: -2^63 .. 2^63 - 1024 (2^63 - 1 is not a double).
    case DType::int64: return {-9223372036854775808.0, 9223372036854774784.0};
    case DType::uint8: return {0.0, 255.0};
    case DType::bool_: return {0.0, 1.0};
    case DType::float32:
    case DType::bfloat16:
    case DType::float16: break;
  }
  RETRACE_FAIL(invalid_argument, "{} is not an integer dtype", dtype);
}

void check_integer_scalar(DType dtype, double value, std::string_view op, std::string_view hint) {
  if (dtype_info(dtype).is_floating) return;
  const auto [lo, hi] = integer_range(dtype);
  RETRACE_CHECK(std::trunc(value) == value && value >= lo && value <= hi, invalid_argument,
                "{}: the scalar {} is not a whole number in the range of {} ([{}, {}]); {}", op,
                value, dtype, lo, hi, hint);
}

void check_dtype_in(const Tensor& tensor, std::string_view op, std::string_view argument,
                    std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), tensor.dtype()) != allowed.end()) return;
  std::vector<std::string_view> names;
  for (DType d : allowed) names.push_back(dtype_name(d));
  RETRACE_FAIL(invalid_argument, "{}: {} has dtype {}; supported: {}", op, argument,
               tensor.dtype(), fmt::join(names, ", "));
}

}  // namespace retrace::ops::detail

namespace retrace::ops::detail {

std::vector<std::int64_t> contiguous_strides(std::span<const std::int64_t> extents) {
  std::vector<std::int64_t> strides(extents.size());
  std::int64_t s = 1;
  for (std::size_t i = extents.size(); i-- > 0;) {
    strides[i] = s;
    s *= extents[i];
  }
  return strides;
}

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  return contiguous_strides(shape.dims());
}

std::int64_t normalize_dim(std::int64_t dim, std::size_t rank, std::string_view op) {
  const auto r = static_cast<std::int64_t>(rank);
  RETRACE_CHECK(dim >= -r && dim < r, invalid_argument,
                "{}: dimension {} is out of range for a tensor of rank {}", op, dim, rank);
  return dim < 0 ? dim + r : dim;
}

IterationSpace collapse(const std::vector<std::int64_t>& shape,
                        const std::vector<std::vector<std::int64_t>>& strides) {
  IterationSpace space;
  space.strides.resize(strides.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !space.shape.empty();
    for (std::size_t o = 0; o < strides.size() && merge; ++o) {
      merge = space.strides[o].back() == strides[o][d] * shape[d];
    }
    if (merge) {
      space.shape.back() *= shape[d];
      for (std::size_t o = 0; o < strides.size(); ++o) space.strides[o].back() = strides[o][d];
      continue;
    }
    space.shape.push_back(shape[d]);
    for (std::size_t o = 0; o < strides.size(); ++o) space.strides[o].push_back(strides[o][d]);
  }
  if (space.shape.empty()) {  // a single element
    space.shape.push_back(1);
    for (auto& s : space.strides) s.push_back(1);
  }
  return space;
}

static_assert(kMaxKernelRank == static_cast<int>(Shape::kMaxRank),
              "kernels must take every rank a Shape can have");

void fill_space(const IterationSpace& space, std::int64_t* shape,
                std::initializer_list<std::int64_t*> strides, std::int32_t& rank,
                std::string_view op) {
  RETRACE_CHECK(space.shape.size() <= static_cast<std::size_t>(kMaxKernelRank), invalid_argument,
                "{}: the operands' layout needs {} dimensions after merging contiguous ones; "
                "kernels take at most {}",
                op, space.shape.size(), kMaxKernelRank);
  rank = static_cast<std::int32_t>(space.shape.size());
  std::size_t o = 0;
  for (std::int64_t* out : strides) {
    for (std::size_t d = 0; d < space.shape.size(); ++d) out[d] = space.strides[o][d];
    ++o;
  }
  for (std::size_t d = 0; d < space.shape.size(); ++d) shape[d] = space.shape[d];
}

Tensor empty_like(const Tensor& a, const Shape& shape, std::string_view op) {
  return Tensor::empty(shape, a.dtype(), device_of(a, op, "a"), a.layout());
}

Shape result_shape(const std::vector<std::int64_t>& dims, std::string_view op) {
  RETRACE_CHECK(dims.size() <= Shape::kMaxRank, invalid_argument,
                "{}: the result would have rank {}; ranks go up to {}", op, dims.size(),
                Shape::kMaxRank);
  std::int64_t product = 1;
  for (std::int64_t d : dims) {
    RETRACE_CHECK(d == 0 || !__builtin_mul_overflow(product, d, &product), invalid_argument,
                  "{}: the result's shape [{}] has more than 2^63 - 1 elements", op,
                  fmt::join(dims, ", "));
  }
  return Shape(std::span<const std::int64_t>(dims));
}

}  // namespace retrace::ops::detail

namespace retrace::ops::detail {
void check_matches_except(const Tensor& a, const Tensor& b, std::size_t except,
                          std::string_view op, std::string_view b_name) {
  Device& db = device_of(b, op, b_name);
  RETRACE_CHECK(&db == a.device(), invalid_argument, "{}: {} is on {} but the first is on {}", op,
                b_name, db.name(), a.device()->name());
  RETRACE_CHECK(b.dtype() == a.dtype() && b.layout() == a.layout(), invalid_argument,
                "{}: {} is {} {} but the first is {} {}", op, b_name, b.dtype(), b.layout(),
                a.dtype(), a.layout());
  bool same = b.shape().rank() == a.shape().rank();
  for (std::size_t i = 0; same && i < a.shape().rank(); ++i) {
    same = i == except || a.shape().dims()[i] == b.shape().dims()[i];
  }
  RETRACE_CHECK(same, invalid_argument,
                "{}: {} has shape {}, which differs from {} outside dimension {}", op, b_name,
                b.shape(), a.shape(), except);
}
void* data_of(const Tensor& t) {
  RETRACE_CHECK(t.is_contiguous(), unimplemented,
                "this kernel reads and writes dense tensors, and {} is a strided view; "
                "ops::contiguous() makes a dense copy",
                t.to_string());
  return view_data(t);
}

void* view_data(const Tensor& t) {
  return static_cast<std::byte*>(t.buffer()->data()) +
         t.storage_offset() * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

std::vector<std::int64_t> strides_of(const Tensor& t) {
  return {t.strides().begin(), t.strides().end()};
}

Tensor dense(const Tensor& t, QueueId queue) {
  return t.is_null() || t.is_contiguous() ? t : contiguous(t, queue);
}

std::vector<std::int64_t> broadcast_strides(const Tensor& t, const std::vector<std::int64_t>& out) {
  const Shape& shape = t.shape();
  std::vector<std::int64_t> strides(out.size(), 0);
  const std::size_t offset = out.size() - shape.rank();
  for (std::size_t i = 0; i < shape.rank(); ++i) {
    strides[offset + i] = shape.dims()[i] == 1 && out[offset + i] != 1 ? 0 : t.strides()[i];
  }
  return strides;
}

namespace {
// [first, last] element indices (into the storage) a tensor reaches; numel() > 0.
std::pair<std::int64_t, std::int64_t> element_range(const Tensor& t) {
  std::int64_t last = t.storage_offset();
  for (std::size_t i = 0; i < t.shape().rank(); ++i) {
    last += (t.shape().dims()[i] - 1) * t.strides()[i];
  }
  return {t.storage_offset(), last};
}
}  // namespace

bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.buffer() != b.buffer() || a.numel() == 0 || b.numel() == 0) return false;
  const auto [a_first, a_last] = element_range(a);
  const auto [b_first, b_last] = element_range(b);
  return a_first <= b_last && b_first <= a_last;
}

bool has_internal_overlap(const Tensor& t) {
  if (t.is_contiguous()) return false;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, extent), extents > 1
  for (std::size_t i = 0; i < t.shape().rank(); ++i) {
    if (t.shape().dims()[i] > 1) dims.emplace_back(t.strides()[i], t.shape().dims()[i]);
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t reach = 0;  // the furthest offset the dimensions with smaller strides reach
  for (const auto& [stride, extent] : dims) {
    if (stride <= reach) return true;
    reach += stride * (extent - 1);
  }
  return false;
}

void check_no_partial_overlap(
    const Tensor& out, std::string_view op,
    std::initializer_list<std::pair<const Tensor*, std::string_view>> inputs) {
  for (const auto& [input, name] : inputs) {
    if (input->is_null()) continue;
    const bool same = input->buffer() == out.buffer() &&
                      input->storage_offset() == out.storage_offset() &&
                      input->is_contiguous() && input->numel() == out.numel();
    RETRACE_CHECK(same || !may_overlap(*input, out), invalid_argument,
                  "{}: out and {} overlap in memory without being the same elements (a view "
                  "shifted against out would be read after it was written); write to a new "
                  "tensor, or clone() {} first",
                  op, name, name);
  }
}

void check_dense_out(const Tensor& out, std::string_view op) {
  RETRACE_CHECK(out.is_null() || out.is_contiguous(), invalid_argument,
                "{}: out is a strided view ({}); ops write dense outputs: compute into a new "
                "tensor and ops::copy() it into the view",
                op, out.to_string());
}

void check_out(const Tensor& out, const Tensor& a, const Shape& shape, std::string_view op) {
  device_of(out, op, "out");
  check_dense_out(out, op);
  RETRACE_CHECK(out.device() == a.device(), invalid_argument, "{}: out is on {} but a is on {}",
                op, out.device()->name(), a.device()->name());
  RETRACE_CHECK(out.shape() == shape && out.dtype() == a.dtype() && out.layout() == a.layout(),
                invalid_argument, "{}: out is {} {} {} but the result is {} {} {}", op,
                out.shape(), out.dtype(), out.layout(), shape, a.dtype(), a.layout());
}

void check_not_aliased(const Tensor& out, std::string_view op,
                       std::initializer_list<std::pair<const Tensor*, std::string_view>> inputs) {
  for (const auto& [input, name] : inputs) {
    RETRACE_CHECK(input->is_null() || input->buffer() != out.buffer(), invalid_argument,
                  "{}: out shares storage with {}, which the kernel reads while writing out; "
                  "use a separate output tensor",
                  op, name);
  }
}

}  // namespace retrace::ops::detail
