// The CPU device's kernel threads: how many a parallel loop uses under a device's
// kernel_threads cap, and how many CPUs the process may use.
#include "cpu/parallel.hpp"
#include "support.hpp"
#include "util/cpus.hpp"

#include <retrace/cpu.hpp>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace retrace::cpu {
namespace {

// The ranges one parallel loop over n iterations (parts of at least 1024) was split into.
std::vector<std::pair<std::int64_t, std::int64_t>> ranges_of(std::int64_t n) {
  std::mutex mutex;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  parallel_for(n, 1024, [&](std::int64_t begin, std::int64_t end) {
    std::lock_guard lock(mutex);
    ranges.emplace_back(begin, end);
  });
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

void expect_cover(const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges,
                  std::int64_t n) {
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().first, 0);
  EXPECT_EQ(ranges.back().second, n);
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
  }
}

TEST(KernelThreads, ALoopUsesAtMostTheCapOfItsScope) {
  constexpr std::int64_t n = 1 << 20;
  const auto threads = static_cast<std::size_t>(kernel_threads());
  EXPECT_GE(threads, 1u);
  {
    const auto ranges = ranges_of(n);
    expect_cover(ranges, n);
    EXPECT_LE(ranges.size(), threads);
  }
  for (int cap : {1, 2, 3, 1000}) {
    const KernelThreadCap scope(cap);
    EXPECT_EQ(serial_kernels(), cap == 1);
    const auto ranges = ranges_of(n);
    expect_cover(ranges, n);
    EXPECT_LE(ranges.size(), std::min(threads, static_cast<std::size_t>(cap))) << cap;
    if (cap == 1) {
      EXPECT_EQ(ranges.size(), 1u);
    }
  }
  // Scopes nest and restore the cap they found.
  {
    const KernelThreadCap outer(1);
    {
      const KernelThreadCap inner(0);
      EXPECT_FALSE(serial_kernels());
    }
    EXPECT_TRUE(serial_kernels());
  }
  EXPECT_FALSE(serial_kernels());
}

TEST(KernelThreads, UsableCpusAreTheAffinityMasks) {
  const unsigned usable = util::usable_cpus(), host = util::host_cpus();
  EXPECT_GE(usable, 1u);
  EXPECT_LE(usable, host);
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(usable, static_cast<unsigned>(CPU_COUNT(&set)));
#endif
}

// RETRACE_KERNEL_THREADS takes a whole number of threads; anything else fails the device with
// the value named, instead of (as atoi would) a silent 0 or tens of thousands of threads.
TEST(KernelThreads, ABadEnvironmentCountFailsTheDevice) {
  const char* saved = std::getenv("RETRACE_KERNEL_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  for (const char* bad : {"abc", "0", "-2", "3x", " 2", "99999", "", "2147483648"}) {
    ::setenv("RETRACE_KERNEL_THREADS", bad, 1);
    EXPECT_RETRACE_ERROR(
        (void)open_cpu_device(), invalid_argument,
        fmt::format("cpu:0: RETRACE_KERNEL_THREADS='{}' is not a thread count", bad));
  }
  ::setenv("RETRACE_KERNEL_THREADS", "3", 1);
  std::string error;
  EXPECT_EQ(kernel_threads_from_environment(&error), 3);
  EXPECT_TRUE(error.empty());
  EXPECT_NO_THROW((void)open_cpu_device());
  ::unsetenv("RETRACE_KERNEL_THREADS");
  EXPECT_EQ(kernel_threads_from_environment(&error), std::nullopt);
  EXPECT_TRUE(error.empty());
  if (saved != nullptr) ::setenv("RETRACE_KERNEL_THREADS", restore.c_str(), 1);
}

// RETRACE_KERNEL_SPIN_US likewise: microseconds from 0 to 1000000, else the device fails naming
// the value.
TEST(KernelThreads, ABadEnvironmentSpinFailsTheDevice) {
  const char* saved = std::getenv("RETRACE_KERNEL_SPIN_US");
  const std::string restore = saved != nullptr ? saved : "";
  for (const char* bad : {"abc", "-1", "1000001", "5us", ""}) {
    ::setenv("RETRACE_KERNEL_SPIN_US", bad, 1);
    EXPECT_RETRACE_ERROR(
        (void)open_cpu_device(), invalid_argument,
        fmt::format("cpu:0: RETRACE_KERNEL_SPIN_US='{}' is not a spin time", bad));
  }
  for (const char* good : {"0", "250", "1000000"}) {
    ::setenv("RETRACE_KERNEL_SPIN_US", good, 1);
    std::string error;
    EXPECT_EQ(kernel_spin_us_from_environment(&error), std::stoi(good));
    EXPECT_TRUE(error.empty());
    EXPECT_NO_THROW((void)open_cpu_device());
  }
  ::unsetenv("RETRACE_KERNEL_SPIN_US");
  if (saved != nullptr) ::setenv("RETRACE_KERNEL_SPIN_US", restore.c_str(), 1);
}

}  // namespace
}  // namespace retrace::cpu
