#include "fma_peak.hpp"

#include "util/timing.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace retrace::bench {

namespace {

#if defined(__x86_64__)
// kChains independent accumulators (enough to cover the FMA latency on two pipes), `rounds`
// times kChains FMAs; returns a sum so the work cannot be dropped.
constexpr int kChains = 12;

__attribute__((target("avx2,fma"))) float fma_chains_avx2(long rounds) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}

__attribute__((target("avx512f"))) float fma_chains_avx512(long rounds) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}
#endif

}  // namespace

std::optional<FmaPeak> measure_fma_peak([[maybe_unused]] const std::string& variant) {
#if defined(__x86_64__)
  const bool wide = variant == "avx512";
  if (!(wide || variant == "avx2")) return std::nullopt;
  if (wide ? !__builtin_cpu_supports("avx512f")
           : !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    return std::nullopt;
  }
  const int lanes = wide ? 16 : 8;
  constexpr long kRounds = 2'000'000;
  volatile float sink = 0;
  // The best of five runs of ~10-30 ms: the peak, not an average over the host's noise.
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = timing::Clock::now();
    sink = sink + (wide ? fma_chains_avx512(kRounds) : fma_chains_avx2(kRounds));
    const double seconds = timing::milliseconds_since(t0) / 1e3;
    best = std::max(best, 2.0 * lanes * kChains * static_cast<double>(kRounds) / seconds / 1e9);
  }
  return FmaPeak{wide ? "avx512" : "avx2", best};
#else
  return std::nullopt;
#endif
}

}  // namespace retrace::bench
