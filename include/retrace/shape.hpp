// Shape: the extents of a tensor, rank 0 to 8, printable as "[1, 32, 64]".
//
// Extents are non-negative and the product of the non-zero extents fits in a signed 64-bit
// integer (so no element count, stride or row count derived from a Shape overflows); anything
// else is an invalid_argument error when the Shape is made.
//
//   retrace::Shape s{1, 32, 64};
//   s.rank() == 3; s.numel() == 2048; s[-1] == 64; fmt::format("{}", s) == "[1, 32, 64]";
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace retrace {

class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;

  Shape() = default;  // rank 0: a scalar with one element
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::int64_t numel() const noexcept;
  // Negative indices count from the end; out of range throws invalid_argument.
  [[nodiscard]] std::int64_t operator[](std::int64_t axis) const;
  [[nodiscard]] std::span<const std::int64_t> dims() const noexcept { return {dims_.data(), rank_}; }
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) noexcept;

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace retrace

template <>
struct fmt::formatter<retrace::Shape> : fmt::formatter<std::string> {
  auto format(const retrace::Shape& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
