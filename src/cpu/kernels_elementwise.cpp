// Elementwise CPU kernels: binary with broadcasting, binary with a scalar, unary. Large
// contiguous loops are split across cores; each piece is a plain loop the compiler vectorises.
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/error.hpp"

namespace retrace::cpu {

namespace {

constexpr std::int64_t kParallelChunk = 1 << 16;  // elements per task, at least

template <BinaryOp op, class T>
void binary_kernel(const std::byte* raw) {
  const auto& p = params_as<BinaryParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const int last = p.rank - 1;
  const std::int64_t inner = p.shape[last];
  const std::int64_t as = p.a_strides[last], bs = p.b_strides[last];
  const std::int64_t outer = outer_rows(p.shape, p.rank);
  if (outer == 1 && as == 1 && bs == 1) {  // same shapes: one contiguous loop
    parallel_for(inner, kParallelChunk, [&](std::int64_t begin, std::int64_t end) {
      binary_loop<op, T>(a + begin, b + begin, out + begin, end - begin);
    });
    return;
  }
  using E = Elem<T>;
  parallel_for(outer, rows_per_task(inner, kParallelChunk),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::int64_t offsets[2];
                   row_offsets(row, p.shape, last, {p.a_strides, p.b_strides}, offsets);
                   const T* ar = a + offsets[0];
                   const T* br = b + offsets[1];
                   T* o = out + row * inner;
                   if (as == 1 && bs == 1) {
                     binary_loop<op, T>(ar, br, o, inner);
                   } else if (as == 1 && bs == 0) {
                     binary_scalar_loop<op, T>(ar, o, inner, E::load(br, 0));
                   } else {
                     for (std::int64_t j = 0; j < inner; ++j) {
                       E::store(o, j, apply_binary<op>(E::load(ar, j * as), E::load(br, j * bs)));
                     }
                   }
                 }
               });
}

template <BinaryOp op, class T>
void binary_scalar_kernel(const std::byte* raw) {
  const auto& p = params_as<BinaryScalarParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  const auto s = static_cast<typename Elem<T>::compute>(p.scalar);
  parallel_for(p.count, kParallelChunk, [&](std::int64_t begin, std::int64_t end) {
    binary_scalar_loop<op, T>(a + begin, out + begin, end - begin, s);
  });
}

template <UnaryOp op, class T>
void unary_kernel(const std::byte* raw) {
  const auto& p = params_as<UnaryParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  parallel_for(p.count, kParallelChunk / 8, [&](std::int64_t begin, std::int64_t end) {
    unary_loop<op, T>(a + begin, out + begin, end - begin);
  });
}

template <template <BinaryOp, class> class K, BinaryOp op>
KernelFn binary_for_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return &K<op, float>::run;
    case DType::bfloat16:
      return &K<op, bfloat16>::run;
    case DType::int32:
      return &K<op, std::int32_t>::run;
    case DType::uint32:
      return &K<op, std::uint32_t>::run;
    case DType::uint8:
      break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no binary kernel for {}", dtype);
}

template <BinaryOp op, class T>
struct BinaryK {
  static void run(const std::byte* p) { binary_kernel<op, T>(p); }
};
template <BinaryOp op, class T>
struct BinaryScalarK {
  static void run(const std::byte* p) { binary_scalar_kernel<op, T>(p); }
};

template <template <BinaryOp, class> class K>
KernelFn binary_for(BinaryOp op, DType dtype) {
  switch (op) {
    case BinaryOp::add:
      return binary_for_dtype<K, BinaryOp::add>(dtype);
    case BinaryOp::sub:
      return binary_for_dtype<K, BinaryOp::sub>(dtype);
    case BinaryOp::mul:
      return binary_for_dtype<K, BinaryOp::mul>(dtype);
    case BinaryOp::div:
      return binary_for_dtype<K, BinaryOp::div>(dtype);
    case BinaryOp::maximum:
      return binary_for_dtype<K, BinaryOp::maximum>(dtype);
    case BinaryOp::minimum:
      return binary_for_dtype<K, BinaryOp::minimum>(dtype);
    case BinaryOp::pow:
      return binary_for_dtype<K, BinaryOp::pow>(dtype);
  }
  RETRACE_FAIL(invalid_argument, "unknown binary op");
}

template <UnaryOp op>
KernelFn unary_for_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return [](const std::byte* p) { unary_kernel<op, float>(p); };
    case DType::bfloat16:
      return [](const std::byte* p) { unary_kernel<op, bfloat16>(p); };
    default:
      break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no unary kernel for {}", dtype);
}

}  // namespace

KernelFn resolve(const BinaryParams& p) {
  return binary_for<BinaryK>(p.op, p.dtype);
}

KernelFn resolve(const BinaryScalarParams& p) {
  return binary_for<BinaryScalarK>(p.op, p.dtype);
}

KernelFn resolve(const UnaryParams& p) {
  switch (p.op) {
    case UnaryOp::neg:
      return unary_for_dtype<UnaryOp::neg>(p.dtype);
    case UnaryOp::abs:
      return unary_for_dtype<UnaryOp::abs>(p.dtype);
    case UnaryOp::exp:
      return unary_for_dtype<UnaryOp::exp>(p.dtype);
    case UnaryOp::log:
      return unary_for_dtype<UnaryOp::log>(p.dtype);
    case UnaryOp::sqrt:
      return unary_for_dtype<UnaryOp::sqrt>(p.dtype);
    case UnaryOp::rsqrt:
      return unary_for_dtype<UnaryOp::rsqrt>(p.dtype);
    case UnaryOp::tanh:
      return unary_for_dtype<UnaryOp::tanh>(p.dtype);
    case UnaryOp::sigmoid:
      return unary_for_dtype<UnaryOp::sigmoid>(p.dtype);
    case UnaryOp::relu:
      return unary_for_dtype<UnaryOp::relu>(p.dtype);
    case UnaryOp::silu:
      return unary_for_dtype<UnaryOp::silu>(p.dtype);
    case UnaryOp::gelu:
      return unary_for_dtype<UnaryOp::gelu>(p.dtype);
    case UnaryOp::gelu_tanh:
      return unary_for_dtype<UnaryOp::gelu_tanh>(p.dtype);
    case UnaryOp::sin:
      return unary_for_dtype<UnaryOp::sin>(p.dtype);
    case UnaryOp::cos:
      return unary_for_dtype<UnaryOp::cos>(p.dtype);
    case UnaryOp::square:
      return unary_for_dtype<UnaryOp::square>(p.dtype);
    case UnaryOp::erf:
      return unary_for_dtype<UnaryOp::erf>(p.dtype);
  }
  RETRACE_FAIL(invalid_argument, "unknown unary op");
}

}  // namespace retrace::cpu
