// CPU kernels for fill, copy and assert_finite, and the resolver that maps every KernelId to the
// CPU kernel specialised for its dtype and operation (so a replay calls the right loop directly).
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "retrace/error.hpp"

#include <cmath>
#include <cstring>

namespace retrace::cpu {

namespace {

template <class T>
void fill_kernel(const std::byte* raw) {
  const auto& p = params_as<FillParams>(raw);
  fill_loop<T>(static_cast<T*>(p.out), p.count, static_cast<typename Elem<T>::compute>(p.value));
}

void copy_kernel(const std::byte* raw) {
  const auto& p = params_as<CopyParams>(raw);
  if (p.src != p.dst) std::memmove(p.dst, p.src, static_cast<std::size_t>(p.bytes));
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

KernelFn resolve_fill(DType dtype) {
  return dispatch_dtype(dtype, []<class T>(T) -> KernelFn { return &fill_kernel<T>; });
}

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
  const auto* raw = static_cast<const std::byte*>(launch.params);
  switch (launch.kernel) {
    case KernelId::fill: return resolve_fill(params_as<FillParams>(raw).dtype);
    case KernelId::copy: return &copy_kernel;
    case KernelId::binary: return resolve_binary(params_as<BinaryParams>(raw));
    case KernelId::binary_scalar: return resolve_binary_scalar(params_as<BinaryScalarParams>(raw));
    case KernelId::assert_finite:
      return resolve_assert_finite(params_as<AssertFiniteParams>(raw).dtype);
    case KernelId::unary: return resolve_unary(params_as<UnaryParams>(raw));
    case KernelId::reduce: return resolve_reduce(params_as<ReduceParams>(raw));
    case KernelId::softmax: return resolve_softmax(params_as<SoftmaxParams>(raw));
    case KernelId::norm: return resolve_norm(params_as<NormParams>(raw));
    case KernelId::matmul: return resolve_matmul(params_as<MatmulParams>(raw));
    case KernelId::strided_copy: return resolve_strided_copy(params_as<StridedCopyParams>(raw));
    case KernelId::typecast: return resolve_typecast(params_as<TypecastParams>(raw));
    case KernelId::tilize: return resolve_tilize(params_as<TilizeParams>(raw));
    case KernelId::attention: return resolve_attention(params_as<AttentionParams>(raw));
    case KernelId::count_: break;
  }
  RETRACE_FAIL(invalid_argument, "{}: the CPU device has no kernel {}", launch.op,
               static_cast<int>(launch.kernel));
}

}  // namespace retrace::cpu
