// The exported entry of one kernel variant (compiled once per instruction set, like the kernels).
#include "cpu/variant.hpp"

#ifndef RETRACE_CPU_VARIANT_ENTRY
#error "compile this file through retrace_cpu_variants() (cmake/RetraceCpuVariants.cmake)"
#endif

extern "C" const retrace::cpu::KernelVariant* RETRACE_CPU_VARIANT_ENTRY() noexcept;

extern "C" const retrace::cpu::KernelVariant* RETRACE_CPU_VARIANT_ENTRY() noexcept {
  static constexpr retrace::cpu::KernelVariant variant{
      RETRACE_CPU_VARIANT_NAME, &retrace::cpu::resolve_kernel,
      &retrace::cpu::cpu_supports, &retrace::cpu::sgemm,
      &retrace::cpu::bfloat16_gemm_path, &retrace::cpu::packed_weight_bytes};
  return &variant;
}
