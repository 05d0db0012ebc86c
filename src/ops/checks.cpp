#include "ops/checks.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace retrace::ops::detail {

Device& device_of(const Tensor& tensor, std::string_view op, std::string_view argument) {
  tensor.check_not_null(op, argument);
  RETRACE_CHECK(tensor.on_device(), invalid_argument,
                "{}: {} is a host tensor; move it to a device with to_device() first", op,
                argument);
  Device* device = tensor.device();
  RETRACE_CHECK(device != nullptr, failed_precondition, "{}: {} lives on a device that was closed",
                op, argument);
  return *device;
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

void check_dtype_in(const Tensor& tensor, std::string_view op, std::string_view argument,
                    std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), tensor.dtype()) != allowed.end()) return;
  std::vector<std::string_view> names;
  for (DType d : allowed) names.push_back(dtype_name(d));
  RETRACE_FAIL(invalid_argument, "{}: {} has dtype {}; supported: {}", op, argument,
               tensor.dtype(), fmt::join(names, ", "));
}

}  // namespace retrace::ops::detail
