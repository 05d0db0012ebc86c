// Compiled once per CPU kernel variant (cmake/RetraceCpuVariants.cmake), like the kernels: the
// 16-lane forms that AVX-512 softmax rows and unary loops use (exp, sigmoid, silu, gelu_tanh)
// against the per-element ones, so the test can check them on the variant that has both.
#include "cpu/elementwise.hpp"

#include <cstdint>
#include <cstring>

#ifndef RETRACE_CPU_VARIANT_ENTRY
#error "compile this file through retrace_cpu_variants() (cmake/RetraceCpuVariants.cmake)"
#endif

namespace {

#ifdef __AVX512F__
template <class Lanes, class Scalar>
std::int64_t compare_forms(Lanes lanes_form, Scalar scalar_form, std::uint32_t first,
                           std::uint32_t step, std::uint64_t count, std::uint32_t* bad_input,
                           float* bad_scalar, float* bad_lanes) {
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
    const Lanes16 y = lanes_form(x);
    std::memcpy(lanes, &y, sizeof y);
    for (int l = 0; l < 16 && done + static_cast<std::uint64_t>(l) < count; ++l) {
      const float scalar = scalar_form(in[l]);
      if (std::memcmp(&scalar, &lanes[l], sizeof scalar) != 0 && differ++ == 0) {
        *bad_input = patterns[l];
        *bad_scalar = scalar;
        *bad_lanes = lanes[l];
      }
    }
  }
  return differ;
}
#endif

}  // namespace

// Compares op `op` (0 exp, 1 sigmoid, 2 silu, 3 gelu_tanh) in 16 lanes with the per-element form
// (op 4: the block rounding of float32 to bfloat16 with bfloat16::from_float, on every variant)
// on the float bit patterns first, first + step, ... (count of them, wrapping around 2^32).
// Returns how many differ (the first one's input and both results through *bad_*), or -1 when
// this variant has no 16-lane forms.
extern "C" std::int64_t RETRACE_CPU_VARIANT_ENTRY(int op, std::uint32_t first, std::uint32_t step,
                                                  std::uint64_t count, std::uint32_t* bad_input,
                                                  float* bad_scalar, float* bad_lanes) noexcept;

extern "C" std::int64_t RETRACE_CPU_VARIANT_ENTRY(int op, std::uint32_t first, std::uint32_t step,
                                                  std::uint64_t count, std::uint32_t* bad_input,
                                                  float* bad_scalar, float* bad_lanes) noexcept {
  if (op == 4) {  // narrow_block<bfloat16> (vectorised where the variant has AVX2) vs from_float
    std::int64_t differ = 0;
    std::uint32_t bits = first;
    // Blocks of 1 to 64 values in turn, so that each of the variant's paths (16 lanes at a
    // time, the scalar tail) meets every kind of value.
    for (std::uint64_t done = 0, block = 0; done < count; ++block) {
      float in[64];
      retrace::bfloat16 out[64];
      const std::uint64_t size = block % 64 + 1;
      const int n = static_cast<int>(count - done < size ? count - done : size);
      done += static_cast<std::uint64_t>(n);
      for (int l = 0; l < n; ++l, bits += step) std::memcpy(&in[l], &bits, sizeof bits);
      retrace::cpu::narrow_block(in, out, n);
      for (int l = 0; l < n; ++l) {
        const retrace::bfloat16 want = retrace::bfloat16::from_float(in[l]);
        if (want.bits != out[l].bits && differ++ == 0) {
          std::memcpy(bad_input, &in[l], sizeof *bad_input);
          *bad_scalar = want.to_float();
          *bad_lanes = out[l].to_float();
        }
      }
    }
    return differ;
  }
#ifdef __AVX512F__
  using retrace::UnaryOp;
  using retrace::cpu::Lanes16;
  auto compare = [&]<UnaryOp kOp>() {
    return compare_forms([](Lanes16 x) { return retrace::cpu::apply_unary_lanes<kOp>(x); },
                         [](float x) { return retrace::cpu::apply_unary<kOp>(x); }, first, step,
                         count, bad_input, bad_scalar, bad_lanes);
  };
  switch (op) {
    case 0: return compare.template operator()<UnaryOp::exp>();
    case 1: return compare.template operator()<UnaryOp::sigmoid>();
    case 2: return compare.template operator()<UnaryOp::silu>();
    case 3: return compare.template operator()<UnaryOp::gelu_tanh>();
    default: return -2;
  }
#else
  (void)op, (void)first, (void)step, (void)count, (void)bad_input, (void)bad_scalar,
      (void)bad_lanes;
  return -1;
#endif
}
