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

}  // namespace retrace::ops::detail
