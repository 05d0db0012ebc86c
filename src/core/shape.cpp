#include "retrace/shape.hpp"

#include "retrace/error.hpp"

#include <fmt/ranges.h>

namespace retrace {

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  RETRACE_CHECK(dims.size() <= kMaxRank, invalid_argument,
                "shape [{}] has rank {}, more than the maximum rank {}", fmt::join(dims, ", "),
                dims.size(), kMaxRank);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    RETRACE_CHECK(dims[i] >= 0, invalid_argument, "shape [{}] has a negative extent at axis {}",
                  fmt::join(dims, ", "), i);
    dims_[i] = dims[i];
  }
  // Every partial product of the extents then fits too, so element counts, strides and row
  // counts computed from a Shape never overflow.
  std::int64_t product = 1;
  for (std::int64_t d : dims) {
    if (d == 0) continue;
    RETRACE_CHECK(!__builtin_mul_overflow(product, d, &product), invalid_argument,
                  "shape [{}] has more than 2^63 - 1 elements (its element count overflows)",
                  fmt::join(dims, ", "));
  }
  rank_ = dims.size();
}

std::int64_t Shape::numel() const noexcept {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::int64_t Shape::operator[](std::int64_t axis) const {
  const auto rank = static_cast<std::int64_t>(rank_);
  RETRACE_CHECK(axis >= -rank && axis < rank, invalid_argument,
                "axis {} is out of range for shape {} of rank {}", axis, to_string(), rank);
  return dims_[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
}

std::string Shape::to_string() const { return fmt::format("[{}]", fmt::join(dims(), ", ")); }

bool operator==(const Shape& a, const Shape& b) noexcept {
  if (a.rank_ != b.rank_) return false;
  for (std::size_t i = 0; i < a.rank_; ++i) {
    if (a.dims_[i] != b.dims_[i]) return false;
  }
  return true;
}

}  // namespace retrace
