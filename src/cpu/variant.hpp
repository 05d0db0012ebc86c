// Kernel variants: the CPU kernels are compiled once per instruction set (see
// cmake/RetraceCpuVariants.cmake) and each build of them is a KernelVariant, reached through one
// exported entry function per variant. Everything else in a variant's object is local to it, so
// an inline function or template compiled for AVX-512 can never be picked by the linker for the
// baseline build, and a device only ever runs the variant it chose (see isa.hpp).
#pragma once

#include "cpu/gemm.hpp"
#include "cpu/program.hpp"

#include <cstdint>

namespace retrace::cpu {

struct KernelVariant {
  const char* name;  // "x86-64", "avx2", "avx512" or "generic"
  KernelFn (*resolve)(const KernelLaunch& launch);
  bool (*supports)(KernelId kernel) noexcept;
  void (*sgemm)(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                float alpha, const float* a, const float* b, float beta, float* c,
                GemmLibrary library, const float* bias);
  const char* (*bfloat16_gemm_path)() noexcept;  // what its bfloat16 products run on
  std::int64_t (*packed_weight_bytes)() noexcept;  // held by its packed weights
};

}  // namespace retrace::cpu

// Inside a variant's sources, RETRACE_CPU_VARIANT_ENTRY is the name of its exported entry
// (retrace_cpu_kernels_avx2, ...) and RETRACE_CPU_VARIANT_NAME its name ("avx2").
