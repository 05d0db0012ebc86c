// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so element i of a draw is a pure function of (key, counter) and any
// thread can compute any element. Shared by the CPU kernels and the CUDA kernels (host and
// device functions), so both backends draw the same bits.
//
// retrace's layout: key = the generator's 64-bit seed (low word, high word); counter = (block
// index low, block index high, draw offset low, draw offset high). A block gives 4 words, so
// elements 4b .. 4b+3 of a draw come from block b of that draw's offset.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define RETRACE_PHILOX_FN __host__ __device__ inline
#else
#define RETRACE_PHILOX_FN inline
#endif

namespace retrace::philox {

struct Words {
  std::uint32_t w[4];
};

RETRACE_PHILOX_FN Words philox4x32_10(Words counter, std::uint32_t key0, std::uint32_t key1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  Words c = counter;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c.w[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c.w[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = Words{{hi1 ^ c.w[1] ^ key0, lo1, hi0 ^ c.w[3] ^ key1, lo0}};
  }
  return c;
}

// Block `block` of the draw at `offset` for a generator seeded with `seed`.
RETRACE_PHILOX_FN Words block_words(std::uint64_t seed, std::uint64_t offset, std::uint64_t block) {
  const Words counter{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                       static_cast<std::uint32_t>(offset),
                       static_cast<std::uint32_t>(offset >> 32)}};
  return philox4x32_10(counter, static_cast<std::uint32_t>(seed),
                       static_cast<std::uint32_t>(seed >> 32));
}

// A uniform value in [0, 1) with `bits` significant bits (the dtype's significand: 24 for
// float32, 11 for float16, 8 for bfloat16, see uniform_bits; so rounding to the dtype can never
// reach 1): exact in the dtype.
template <class T>
constexpr int uniform_bits_of() {
  if constexpr (std::is_same_v<T, float>) {
    return 24;
  } else {
    return T::kSignificandBits;  // bfloat16, float16
  }
}
template <class T>
inline constexpr int uniform_bits = uniform_bits_of<T>();

RETRACE_PHILOX_FN float uniform(std::uint32_t word, int bits) {
  const std::uint32_t kept = word >> (32 - bits);
  return static_cast<float>(kept) * (1.0f / static_cast<float>(1u << bits));
}

// Two standard normal values from two words (Box-Muller in double, then rounded once):
// u1 in (0, 1] so the logarithm is finite, u2 in [0, 1).
RETRACE_PHILOX_FN void normal_pair(std::uint32_t w0, std::uint32_t w1, float& z0, float& z1) {
  constexpr double kInv32 = 1.0 / 4294967296.0;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = (static_cast<double>(w0) + 1.0) * kInv32;
  const double u2 = static_cast<double>(w1) * kInv32;
  const double r = ::sqrt(-2.0 * ::log(u1));
  const double angle = kTwoPi * u2;
  z0 = static_cast<float>(r * ::cos(angle));
  z1 = static_cast<float>(r * ::sin(angle));
}

// The 4 values of block `block` of a draw: normals (two Box-Muller pairs) or uniforms with
// `bits` random bits each.
RETRACE_PHILOX_FN void block_values(std::uint64_t seed, std::uint64_t offset, std::uint64_t block,
                                    bool normal, int bits, float (&v)[4]) {
  const Words words = block_words(seed, offset, block);
  if (normal) {
    normal_pair(words.w[0], words.w[1], v[0], v[1]);
    normal_pair(words.w[2], words.w[3], v[2], v[3]);
  } else {
    for (int j = 0; j < 4; ++j) v[j] = uniform(words.w[j], bits);
  }
}

}  // namespace retrace::philox
