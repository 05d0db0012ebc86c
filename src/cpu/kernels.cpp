// CPU kernels for the device-neutral KernelIds. Each kernel is specialised by dtype and
// operation when the command is recorded, so replay calls the right loop directly. Loops are
// plain and contiguous so the compiler vectorises them; bfloat16 is computed in float32.
#include "cpu/elementwise.hpp"
#include "cpu/program.hpp"
#include "retrace/bfloat16.hpp"
#include "retrace/error.hpp"

#include <cmath>
#include <cstring>

namespace retrace::cpu {

namespace {

template <class P>
const P& params_as(const std::byte* params) {
  return *reinterpret_cast<const P*>(params);
}

template <class T>
void fill_kernel(const std::byte* raw) {
  const auto& p = params_as<FillParams>(raw);
  fill_loop<T>(static_cast<T*>(p.out), p.count, static_cast<typename Elem<T>::compute>(p.value));
}

void copy_kernel(const std::byte* raw) {
  const auto& p = params_as<CopyParams>(raw);
  if (p.src != p.dst) std::memmove(p.dst, p.src, static_cast<std::size_t>(p.bytes));
}

template <BinaryOp op, class T>
void binary_kernel(const std::byte* raw) {
  const auto& p = params_as<BinaryParams>(raw);
  binary_loop<op, T>(static_cast<const T*>(p.a), static_cast<const T*>(p.b), static_cast<T*>(p.out),
                     p.count);
}

template <BinaryOp op, class T>
void binary_scalar_kernel(const std::byte* raw) {
  const auto& p = params_as<BinaryScalarParams>(raw);
  binary_scalar_loop<op, T>(static_cast<const T*>(p.a), static_cast<T*>(p.out), p.count,
                            static_cast<typename Elem<T>::compute>(p.scalar));
}

template <class T>
void assert_finite_kernel(const std::byte* raw) {
  const auto& p = params_as<AssertFiniteParams>(raw);
  const T* data = static_cast<const T*>(p.data);
  for (std::int64_t i = 0; i < p.count; ++i) {
    const float v = Elem<T>::load(data, i);
    RETRACE_CHECK(std::isfinite(v), device_error, "element {} of {} is {}", i, p.count, v);
  }
}

// Picks fn<T> for a dtype from the list of supported ones.
template <template <class> class Kernel>
KernelFn by_dtype(DType dtype, std::string_view op) {
  switch (dtype) {
    case DType::float32: return &Kernel<float>::run;
    case DType::bfloat16: return &Kernel<bfloat16>::run;
    case DType::int32: return &Kernel<std::int32_t>::run;
    case DType::uint32: return &Kernel<std::uint32_t>::run;
    case DType::uint8: return &Kernel<std::uint8_t>::run;
  }
  RETRACE_FAIL(invalid_argument, "{}: unknown dtype", op);
}

template <class T>
struct Fill {
  static void run(const std::byte* p) { fill_kernel<T>(p); }
};
template <class T>
struct AddT {
  static void run(const std::byte* p) { binary_kernel<BinaryOp::add, T>(p); }
};
template <class T>
struct MulT {
  static void run(const std::byte* p) { binary_kernel<BinaryOp::mul, T>(p); }
};
template <class T>
struct AddScalarT {
  static void run(const std::byte* p) { binary_scalar_kernel<BinaryOp::add, T>(p); }
};
template <class T>
struct MulScalarT {
  static void run(const std::byte* p) { binary_scalar_kernel<BinaryOp::mul, T>(p); }
};

KernelFn resolve_assert_finite(DType dtype) {
  switch (dtype) {
    case DType::float32: return &assert_finite_kernel<float>;
    case DType::bfloat16: return &assert_finite_kernel<bfloat16>;
    default:
      RETRACE_FAIL(invalid_argument, "assert_finite: dtype {} is not a floating point type",
                   dtype);
  }
}

}  // namespace

KernelFn resolve_kernel(const KernelLaunch& launch) {
  const std::byte* raw = static_cast<const std::byte*>(launch.params);
  switch (launch.kernel) {
    case KernelId::fill:
      return by_dtype<Fill>(params_as<FillParams>(raw).dtype, launch.op);
    case KernelId::copy:
      return &copy_kernel;
    case KernelId::binary: {
      const auto& p = params_as<BinaryParams>(raw);
      return p.op == BinaryOp::add ? by_dtype<AddT>(p.dtype, launch.op)
                                   : by_dtype<MulT>(p.dtype, launch.op);
    }
    case KernelId::binary_scalar: {
      const auto& p = params_as<BinaryScalarParams>(raw);
      return p.op == BinaryOp::add ? by_dtype<AddScalarT>(p.dtype, launch.op)
                                   : by_dtype<MulScalarT>(p.dtype, launch.op);
    }
    case KernelId::assert_finite:
      return resolve_assert_finite(params_as<AssertFiniteParams>(raw).dtype);
    case KernelId::count_:
      break;
  }
  RETRACE_FAIL(invalid_argument, "{}: the CPU device has no kernel {}", launch.op,
               static_cast<int>(launch.kernel));
}

}  // namespace retrace::cpu
