// The core's measured float32 multiply-add peak, for the bench's GFLOP/s figures: one thread
// running independent FMA chains in registers (no memory traffic), at a vector width.
#pragma once

#include <optional>
#include <string>

namespace retrace::bench {

struct FmaPeak {
  std::string isa;  // "avx512" (16 lanes), "avx2" (8 lanes)
  double gflops = 0;  // one thread: 2 flops per lane per FMA
};

// The peak at the widest vector the kernel variant `variant` uses ("avx512", "avx2"); nullopt
// for variants without FMA instructions (x86-64, generic) or a CPU that lacks them.
[[nodiscard]] std::optional<FmaPeak> measure_fma_peak(const std::string& variant);

}  // namespace retrace::bench
