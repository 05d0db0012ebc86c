// Timing helpers shared by the benchmarks and the CLI's demo and bench: a steady clock,
// elapsed times and medians.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace retrace::timing {

using Clock = std::chrono::steady_clock;

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

inline double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

inline double milliseconds_since(Clock::time_point from) {
  return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
}

}  // namespace retrace::timing
