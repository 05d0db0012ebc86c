#include "retrace/kernels.hpp"

#include <array>

namespace retrace {

std::string_view kernel_name(KernelId id) noexcept {
  static constexpr std::array<std::string_view, static_cast<std::size_t>(KernelId::count_)>
      kNames{"fill",   "copy",   "binary",       "binary_scalar", "assert_finite",
             "unary",  "reduce", "softmax",      "norm",          "matmul",
             "strided_copy", "typecast", "tilize", "attention"};
  const auto index = static_cast<std::size_t>(id);
  return index < kNames.size() ? kNames[index] : "unknown";
}

}  // namespace retrace
