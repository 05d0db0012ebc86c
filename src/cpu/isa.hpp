// Which kernel variant a CPU device runs: what this CPU (and its operating system) can execute,
// which variants this build has, and the preference between them.
//
// The choice, per device: CpuDeviceOptions::kernel_isa when set, else the environment variable
// RETRACE_CPU_ISA, else automatic: the widest variant the CPU runs, except where measurement
// says otherwise (the table in isa.cpp, documented in docs/devices.md).
#pragma once

#include "cpu/variant.hpp"

#include <span>
#include <string>
#include <string_view>

namespace retrace::cpu {

struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string brand;   // "AMD EPYC 9R14 96-Core Processor"
  unsigned family = 0;  // display family (0x19 for AMD Zen 3/4, 6 for Intel Core/Xeon)
  bool x86_64 = false;
  // What is missing for x86-64-v3 (AVX2 kernels) and x86-64-v4 (AVX-512 kernels), empty when
  // nothing is: CPU features by name, and "OS support for YMM/ZMM state" when the operating
  // system does not save the registers.
  std::string missing_v3 = "not an x86-64 CPU";
  std::string missing_v4 = "not an x86-64 CPU";
};

// This machine, detected once (cpuid and xgetbv).
[[nodiscard]] const CpuInfo& this_cpu();

struct VariantInfo {
  std::string_view name;   // "avx2"
  std::string_view march;  // "x86-64-v3" ("" for the generic build)
  const KernelVariant* (*entry)() noexcept;
};
// The variants this library was built with, narrowest first.
[[nodiscard]] std::span<const VariantInfo> built_variants() noexcept;

// Why `cpu` cannot run the variant, or "" when it can.
[[nodiscard]] std::string unsupported_reason(std::string_view variant, const CpuInfo& cpu);

struct VariantChoice {
  const KernelVariant* variant = nullptr;
  std::string how;  // "automatic", "RETRACE_CPU_ISA" or "requested"
};
// The preference table alone: which built variant `cpu` should run when nothing is forced.
[[nodiscard]] std::string_view preferred_variant(const CpuInfo& cpu);
// The full choice for a device: `requested` (the option; "" or "auto" for none), else
// `environment` (RETRACE_CPU_ISA's value, or nullptr), else preferred_variant. Throws
// invalid_argument for an unknown name and unimplemented for a variant `cpu` cannot run;
// `device` names the device in those messages.
[[nodiscard]] VariantChoice choose_variant(std::string_view requested, const char* environment,
                                           const CpuInfo& cpu, std::string_view device);
// The variant by name (aliases included), or nullptr when this build lacks it.
[[nodiscard]] const VariantInfo* find_variant(std::string_view name) noexcept;

}  // namespace retrace::cpu
