// Elementwise CPU kernels: binary with broadcasting, binary with a scalar, unary. Large
// contiguous loops are split across cores; each piece is a plain loop the compiler vectorises.
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/error.hpp"

namespace retrace::cpu {

namespace {

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
    parallel_for(inner, kMinTaskElements, [&](std::int64_t begin, std::int64_t end) {
      binary_loop<op, T>(a + begin, b + begin, out + begin, end - begin);
    });
    return;
  }
  using E = Elem<T>;
  parallel_for(outer, rows_per_task(inner, kMinTaskElements),
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
  parallel_for(p.count, kMinTaskElements, [&](std::int64_t begin, std::int64_t end) {
    binary_scalar_loop<op, T>(a + begin, out + begin, end - begin, s);
  });
}

template <UnaryOp op, class T>
void unary_kernel(const std::byte* raw) {
  const auto& p = params_as<UnaryParams>(raw);
  const T* a = static_cast<const T*>(p.a);
  T* out = static_cast<T*>(p.out);
  parallel_for(p.count, kMinTaskElements, [&](std::int64_t begin, std::int64_t end) {
    unary_loop<op, T>(a + begin, out + begin, end - begin);
  });
}

template <CompareOp op, class V>
bool compare_values(V a, V b) {
  if constexpr (op == CompareOp::eq) return a == b;
  if constexpr (op == CompareOp::ne) return a != b;
  if constexpr (op == CompareOp::lt) return a < b;
  if constexpr (op == CompareOp::le) return a <= b;
  if constexpr (op == CompareOp::gt) return a > b;
  if constexpr (op == CompareOp::ge) return a >= b;
}

template <CompareOp op, class T>
void compare_kernel(const std::byte* raw) {
  const auto& p = params_as<CompareParams>(raw);
  using E = Elem<T>;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const int last = p.rank - 1;
  const std::int64_t inner = p.shape[last];
  const std::int64_t as = p.a_strides[last], bs = p.b_strides[last];
  parallel_for(outer_rows(p.shape, p.rank), rows_per_task(inner, kMinTaskElements),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::int64_t offsets[2];
                   row_offsets(row, p.shape, last, {p.a_strides, p.b_strides}, offsets);
                   const T* ar = a + offsets[0];
                   const T* br = b + offsets[1];
                   std::uint8_t* o = p.out + row * inner;
                   for (std::int64_t j = 0; j < inner; ++j) {
                     o[j] = compare_values<op>(E::load(ar, j * as), E::load(br, j * bs)) ? 1 : 0;
                   }
                 }
               });
}

template <class U>  // an unsigned type of the element size: elements are moved, not computed
void where_kernel(const std::byte* raw) {
  const auto& p = params_as<WhereParams>(raw);
  const U* a = static_cast<const U*>(p.a);
  const U* b = static_cast<const U*>(p.b);
  U* out = static_cast<U*>(p.out);
  const int last = p.rank - 1;
  const std::int64_t inner = p.shape[last];
  const std::int64_t cs = p.cond_strides[last], as = p.a_strides[last], bs = p.b_strides[last];
  parallel_for(outer_rows(p.shape, p.rank), rows_per_task(inner, kMinTaskElements),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::int64_t offsets[3];
                   row_offsets(row, p.shape, last, {p.cond_strides, p.a_strides, p.b_strides},
                               offsets);
                   const std::uint8_t* c = p.cond + offsets[0];
                   const U* ar = a + offsets[1];
                   const U* br = b + offsets[2];
                   U* o = out + row * inner;
                   for (std::int64_t j = 0; j < inner; ++j) {
                     o[j] = c[j * cs] != 0 ? ar[j * as] : br[j * bs];
                   }
                 }
               });
}

template <CompareOp op>
KernelFn compare_for_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32: return [](const std::byte* p) { compare_kernel<op, float>(p); };
    case DType::bfloat16: return [](const std::byte* p) { compare_kernel<op, bfloat16>(p); };
    case DType::float16: return [](const std::byte* p) { compare_kernel<op, float16>(p); };
    case DType::int32: return [](const std::byte* p) { compare_kernel<op, std::int32_t>(p); };
    case DType::uint32: return [](const std::byte* p) { compare_kernel<op, std::uint32_t>(p); };
    case DType::int64: return [](const std::byte* p) { compare_kernel<op, std::int64_t>(p); };
    case DType::uint8:
    case DType::bool_: return [](const std::byte* p) { compare_kernel<op, std::uint8_t>(p); };
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no compare kernel for {}", dtype);
}

template <template <BinaryOp, class> class K, BinaryOp op>
KernelFn binary_for_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return &K<op, float>::run;
    case DType::bfloat16:
      return &K<op, bfloat16>::run;
    case DType::float16:
      return &K<op, float16>::run;
    case DType::int32:
      return &K<op, std::int32_t>::run;
    case DType::uint32:
      return &K<op, std::uint32_t>::run;
    case DType::int64:
      return &K<op, std::int64_t>::run;
    case DType::uint8:
    case DType::bool_:
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
    case BinaryOp::floor_divide:
      return binary_for_dtype<K, BinaryOp::floor_divide>(dtype);
    case BinaryOp::fmod:
      return binary_for_dtype<K, BinaryOp::fmod>(dtype);
    case BinaryOp::remainder:
      return binary_for_dtype<K, BinaryOp::remainder>(dtype);
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
    case DType::float16:
      return [](const std::byte* p) { unary_kernel<op, float16>(p); };
    default:
      break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no unary kernel for {}", dtype);
}

}  // namespace

KernelFn resolve(const CompareParams& p) {
  switch (p.op) {
    case CompareOp::eq: return compare_for_dtype<CompareOp::eq>(p.dtype);
    case CompareOp::ne: return compare_for_dtype<CompareOp::ne>(p.dtype);
    case CompareOp::lt: return compare_for_dtype<CompareOp::lt>(p.dtype);
    case CompareOp::le: return compare_for_dtype<CompareOp::le>(p.dtype);
    case CompareOp::gt: return compare_for_dtype<CompareOp::gt>(p.dtype);
    case CompareOp::ge: return compare_for_dtype<CompareOp::ge>(p.dtype);
  }
  RETRACE_FAIL(invalid_argument, "unknown comparison");
}

KernelFn resolve(const WhereParams& p) {
  return by_elem_size(p.elem_size, "where",
                      []<class T>(T) -> KernelFn { return &where_kernel<T>; });
}

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
    case UnaryOp::floor:
      return unary_for_dtype<UnaryOp::floor>(p.dtype);
    case UnaryOp::ceil:
      return unary_for_dtype<UnaryOp::ceil>(p.dtype);
    case UnaryOp::round:
      return unary_for_dtype<UnaryOp::round>(p.dtype);
    case UnaryOp::trunc:
      return unary_for_dtype<UnaryOp::trunc>(p.dtype);
  }
  RETRACE_FAIL(invalid_argument, "unknown unary op");
}

}  // namespace retrace::cpu
