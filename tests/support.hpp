// Helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>
#include <retrace/retrace.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

// Expects `statement` to throw retrace::Error of `category` whose message contains `fragment`.
#define EXPECT_RETRACE_ERROR(statement, category_, fragment)                                 \
  do {                                                                                       \
    bool thrown_ = false;                                                                    \
    try {                                                                                    \
      statement;                                                                             \
    } catch (const ::retrace::Error& e_) {                                                   \
      thrown_ = true;                                                                        \
      EXPECT_EQ(e_.category(), ::retrace::ErrorCategory::category_)                          \
          << "message: " << e_.message();                                                    \
      EXPECT_NE(e_.message().find(fragment), std::string::npos)                              \
          << "expected fragment \"" << (fragment) << "\" in: " << e_.message();              \
    }                                                                                        \
    EXPECT_TRUE(thrown_) << "expected " #statement " to throw";                              \
  } while (false)

namespace retrace::testing {

// Seed for random inputs: RETRACE_TEST_SEED overrides it; the seed is logged so any failure
// can be replayed.
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    const char* env = std::getenv("RETRACE_TEST_SEED");
    const std::uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : 20261202u;
    std::printf("[retrace] random seed %llu (set RETRACE_TEST_SEED to override)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t salt = 0, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(test_seed() + salt);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline Tensor device_tensor(Device& device, const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::float32, Layout layout = Layout::row_major) {
  return Tensor::from_vector<float>(values, shape, dtype, layout).to_device(device);
}

}  // namespace retrace::testing
