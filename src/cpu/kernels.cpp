// CPU kernels for fill, copy, assert_finite and collectives, and the resolver that maps every
// KernelId to the CPU kernel specialised for its dtype and operation (so a replay calls the
// right loop directly).
#include "cpu/elementwise.hpp"
#include "cpu/kernels_internal.hpp"
#include "cpu/parallel.hpp"
#include "retrace/backend.hpp"
#include "retrace/error.hpp"
#include "retrace/backend/philox.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace retrace::cpu {

namespace {

template <class T>
void fill_kernel(const std::byte* raw) {
  const auto& p = params_as<FillParams>(raw);
  std::fill_n(static_cast<T*>(p.out), p.count, retrace::detail::narrow_from_double<T>(p.value));
}

template <class T>
void arange_kernel(const std::byte* raw) {
  const auto& p = params_as<FillParams>(raw);
  T* out = static_cast<T*>(p.out);
  if constexpr (std::is_integral_v<T>) {
    const auto start = static_cast<std::int64_t>(p.value);
    const auto step = static_cast<std::int64_t>(p.step);
    for (std::int64_t i = 0; i < p.count; ++i) {
      const auto v = static_cast<std::uint64_t>(start) +
                     static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(step);
      out[i] = static_cast<T>(v);  // modulo 2^bits
    }
  } else {
    for (std::int64_t i = 0; i < p.count; ++i) {
      out[i] = retrace::detail::narrow_from_double<T>(p.value + static_cast<double>(i) * p.step);
    }
  }
}

// A draw of p.count values from the generator state (see RandomParams), then the offset + 1.
// Blocks of 4 elements are independent, so the loop splits across threads with the same bits.
template <class T, RandomDist dist>
void random_kernel(const std::byte* raw) {
  const auto& p = params_as<RandomParams>(raw);
  const std::uint64_t seed = p.state[0] | (std::uint64_t{p.state[1]} << 32);
  const std::uint64_t offset = p.state[2] | (std::uint64_t{p.state[3]} << 32);
  T* out = static_cast<T*>(p.out);
  const std::int64_t blocks = (p.count + 3) / 4;
  parallel_for(blocks, 1024, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      float v[4];
      philox::block_values(seed, offset, static_cast<std::uint64_t>(b),
                           dist == RandomDist::normal, philox::uniform_bits<T>, v);
      const std::int64_t first = 4 * b;
      const std::int64_t n = std::min<std::int64_t>(4, p.count - first);
      for (std::int64_t j = 0; j < n; ++j) Elem<T>::store(out, first + j, v[j]);
    }
  });
  if (!p.advance) return;
  const std::uint64_t next = offset + 1;
  p.state[2] = static_cast<std::uint32_t>(next);
  p.state[3] = static_cast<std::uint32_t>(next >> 32);
}

// This member's part of a collective: meets its peers inside (see retrace/mesh.hpp).
void collective_kernel(const std::byte* raw) {
  retrace::detail::run_host_collective(params_as<CollectiveParams>(raw));
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

}  // namespace

KernelFn resolve(const FillParams& p) {
  if (p.step != 0.0) {
    return dispatch_dtype(p.dtype, []<class T>(T) -> KernelFn { return &arange_kernel<T>; });
  }
  return resolve_fill(p.dtype);
}
KernelFn resolve(const CopyParams&) { return &copy_kernel; }
KernelFn resolve(const RandomParams& p) {
  const bool normal = p.dist == RandomDist::normal;
  switch (p.dtype) {
    case DType::float32:
      return normal ? &random_kernel<float, RandomDist::normal>
                    : &random_kernel<float, RandomDist::uniform>;
    case DType::bfloat16:
      return normal ? &random_kernel<bfloat16, RandomDist::normal>
                    : &random_kernel<bfloat16, RandomDist::uniform>;
    case DType::float16:
      return normal ? &random_kernel<float16, RandomDist::normal>
                    : &random_kernel<float16, RandomDist::uniform>;
    default: break;
  }
  RETRACE_FAIL(unimplemented, "the CPU device has no random kernel for {}", p.dtype);
}
KernelFn resolve(const CollectiveParams& p) {
  RETRACE_CHECK(p.group != nullptr, invalid_argument, "collective: no group");
  return &collective_kernel;
}
KernelFn resolve(const AssertFiniteParams& p) {
  switch (p.dtype) {
    case DType::float32: return &assert_finite_kernel<float>;
    case DType::bfloat16: return &assert_finite_kernel<bfloat16>;
    case DType::float16: return &assert_finite_kernel<float16>;
    default:
      RETRACE_FAIL(invalid_argument, "assert_finite: dtype {} is not a floating point type",
                   p.dtype);
  }
}

namespace {

using Resolver = KernelFn (*)(const std::byte* params);

template <KernelId K>
KernelFn resolve_entry(const std::byte* params) {
  return resolve(params_as<KernelParamsOf<K>>(params));
}

// One entry per kernel of RETRACE_KERNEL_LIST (the array has exactly kKernelCount entries): a
// kernel without a `resolve` overload for its parameters does not compile. The CPU device, the
// reference, implements every kernel.
constexpr std::array<Resolver, kKernelCount> kKernels = {
#define RETRACE_CPU_KERNEL(name, params) &resolve_entry<KernelId::name>,
    RETRACE_KERNEL_LIST(RETRACE_CPU_KERNEL)
#undef RETRACE_CPU_KERNEL
};

}  // namespace

bool cpu_supports(KernelId kernel) noexcept {
  const auto index = static_cast<std::size_t>(kernel);
  return index < kKernelCount && kKernels[index] != nullptr;
}

KernelFn resolve_kernel(const KernelLaunch& launch) {
  const auto index = static_cast<std::size_t>(launch.kernel);
  RETRACE_CHECK(index < kKernelCount, unimplemented, "{}: the CPU device has no kernel {}",
                launch.op, index);
  return kKernels[index](static_cast<const std::byte*>(launch.params));
}

}  // namespace retrace::cpu
