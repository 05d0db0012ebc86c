// The arithmetic of each BinaryOp, shared by the CPU kernels and the CUDA kernels (so both
// devices agree on, e.g., which operand maximum returns when they compare equal).
#pragma once

#include "retrace/kernels.hpp"

#ifdef __CUDACC__
#define RETRACE_HOST_DEVICE __host__ __device__
#else
#define RETRACE_HOST_DEVICE
#endif

namespace retrace {

template <BinaryOp op, class C>
RETRACE_HOST_DEVICE inline C apply_binary(C a, C b) {
  if constexpr (op == BinaryOp::add) {
    return a + b;
  } else if constexpr (op == BinaryOp::sub) {
    return a - b;
  } else if constexpr (op == BinaryOp::mul) {
    return a * b;
  } else if constexpr (op == BinaryOp::div) {
    return a / b;
  } else if constexpr (op == BinaryOp::maximum) {
    return a > b ? a : b;
  } else {
    return a < b ? a : b;
  }
}

}  // namespace retrace
