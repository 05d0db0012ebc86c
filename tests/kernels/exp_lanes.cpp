// Compiled once per CPU kernel variant (cmake/RetraceCpuVariants.cmake), like the kernels: the
// 16-lane exp that AVX-512 softmax rows use against the per-element exp that every other
// kernel uses, so the test can check them on the variant that has both.
#include "cpu/elementwise.hpp"

#include <cstdint>
#include <cstring>

#ifndef RETRACE_CPU_VARIANT_ENTRY
#error "compile this file through retrace_cpu_variants() (cmake/RetraceCpuVariants.cmake)"
#endif

// Compares vector_exp16 with vector_exp on the float bit patterns first, first + step, ...
// (count of them, wrapping around 2^32). Returns how many differ (the first one's input and
// both results through *bad_*), or -1 when this variant has no 16-lane exp.
extern "C" std::int64_t RETRACE_CPU_VARIANT_ENTRY(std::uint32_t first, std::uint32_t step,
                                                  std::uint64_t count, std::uint32_t* bad_input,
                                                  float* bad_scalar, float* bad_lanes) noexcept;

extern "C" std::int64_t RETRACE_CPU_VARIANT_ENTRY(std::uint32_t first, std::uint32_t step,
                                                  std::uint64_t count, std::uint32_t* bad_input,
                                                  float* bad_scalar, float* bad_lanes) noexcept {
#ifdef __AVX512F__
  using retrace::cpu::Lanes16;
  std::int64_t differ = 0;
  std::uint32_t bits = first;
  for (std::uint64_t done = 0; done < count; done += 16) {
    float in[16], lanes[16];
    std::uint32_t patterns[16];
    for (int l = 0; l < 16; ++l, bits += step) {
      patterns[l] = bits;
      std::memcpy(&in[l], &bits, sizeof bits);
    }
    Lanes16 x;
    std::memcpy(&x, in, sizeof x);
    const Lanes16 y = retrace::cpu::vector_exp16(x);
    std::memcpy(lanes, &y, sizeof y);
    for (int l = 0; l < 16 && done + static_cast<std::uint64_t>(l) < count; ++l) {
      const float scalar = retrace::cpu::vector_exp(in[l]);
      if (std::memcmp(&scalar, &lanes[l], sizeof scalar) != 0) {
        if (differ++ == 0) {
          *bad_input = patterns[l];
          *bad_scalar = scalar;
          *bad_lanes = lanes[l];
        }
      }
    }
  }
  return differ;
#else
  (void)first, (void)step, (void)count, (void)bad_input, (void)bad_scalar, (void)bad_lanes;
  return -1;
#endif
}
