#include "cpu/parallel.hpp"

#include "util/cpus.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace retrace::cpu {

namespace {

thread_local bool in_parallel_region = false;
thread_local int region_cap = 0;  // KernelThreadCap: 0 none, 1 serial, n at most n
std::atomic<int> thread_limit{1 << 20};

// A fixed set of helper threads; one parallel loop at a time (others run serially). A helper
// that finished a part watches for the next loop for a short while (yielding the core to any
// other runnable thread) before it sleeps on the condition variable: the ops of a replay follow
// each other within microseconds, and waking a sleeping thread costs tens of microseconds on a
// virtual machine (a 256x256 layer_norm took 77 us, most of it waiting for its helper).
class KernelPool {
 public:
  KernelPool() {
    // One per CPU this process may use (its affinity mask), not per CPU of the host, unless
    // RETRACE_KERNEL_THREADS says (a value it cannot take is refused when a device opens).
    const std::optional<int> requested = kernel_threads_from_environment(nullptr);
    threads_ = requested ? *requested : static_cast<int>(util::usable_cpus());
    for (int i = 1; i < threads_; ++i) helpers_.emplace_back([this, i] { run(i); });
  }
  ~KernelPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  int threads() const noexcept { return threads_; }

  bool try_run(std::int64_t n, int parts, detail::RangeFn fn, void* context) {
    std::unique_lock busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard lock(mutex_);
      n_ = n;
      parts_ = parts;
      fn_ = fn;
      context_ = context;
      remaining_.store(parts - 1);
      generation_.fetch_add(1);
    }
    // A helper counts itself a sleeper before it takes the mutex to wait, and waits only if the
    // generation is unchanged under it: one that missed this notify sees the new generation.
    if (sleepers_.load() > 0) cv_.notify_all();
    run_part(0);
    while (remaining_.load() != 0) std::this_thread::yield();
    return true;
  }

 private:
  void run_part(int part) {
    const std::int64_t begin = n_ * part / parts_;
    const std::int64_t end = n_ * (part + 1) / parts_;
    in_parallel_region = true;
    if (begin < end) fn_(context_, begin, end);
    in_parallel_region = false;
  }

  // Whether the generation moved past `seen` within the spin budget.
  bool watch(std::uint64_t seen) const {
    constexpr auto kSpin = std::chrono::microseconds(100);
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen) return true;
      if (i % 64 == 63 && std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();
    }
  }

  void run(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const bool woke = watch(seen);
      {
        if (!woke) sleepers_.fetch_add(1);
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || generation_.load() != seen; });
        if (!woke) sleepers_.fetch_sub(1);
        if (stopping_) return;
        seen = generation_.load();
        if (index >= parts_) continue;
      }
      run_part(index);
      remaining_.fetch_sub(1);
    }
  }

  int threads_ = 1;
  std::vector<std::thread> helpers_;
  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> generation_{0};  // written under mutex_
  std::atomic<int> sleepers_{0};
  std::int64_t n_ = 0;
  int parts_ = 1;
  detail::RangeFn fn_ = nullptr;
  void* context_ = nullptr;
  std::atomic<int> remaining_{0};
};

KernelPool& pool() {
  static KernelPool instance;
  return instance;
}

}  // namespace

std::optional<int> kernel_threads_from_environment(std::string* error) {
  const char* env = std::getenv("RETRACE_KERNEL_THREADS");
  if (env == nullptr) return std::nullopt;
  const std::string_view text(env);
  int value = 0;
  const auto [end, code] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (code == std::errc() && end == text.data() + text.size() && value >= 1 &&
      value <= kMaxKernelThreads) {
    return value;
  }
  if (error != nullptr) {
    *error = fmt::format(
        "RETRACE_KERNEL_THREADS='{}' is not a thread count (a whole number "
        "from 1 to {}; unset it for one thread per usable CPU)",
        text, kMaxKernelThreads);
  }
  return std::nullopt;
}

int kernel_threads() noexcept { return std::min(pool().threads(), thread_limit.load()); }

void set_kernel_thread_limit(int threads) noexcept { thread_limit.store(std::max(1, threads)); }

KernelThreadCap::KernelThreadCap(int threads) noexcept : previous_(region_cap) {
  region_cap = std::max(threads, 0);
}
KernelThreadCap::~KernelThreadCap() {
  region_cap = previous_;
}
bool serial_kernels() noexcept {
  return region_cap == 1;
}

namespace detail {
void parallel_for_impl(std::int64_t n, std::int64_t min_chunk, RangeFn fn, void* context) {
  if (n <= 0) return;
  const int threads = in_parallel_region ? 1
                      : region_cap > 0   ? std::min(region_cap, kernel_threads())
                                         : kernel_threads();
  const auto parts = static_cast<int>(
      std::min<std::int64_t>(threads, n / std::max<std::int64_t>(min_chunk, 1)));
  if (parts <= 1 || !pool().try_run(n, parts, fn, context)) fn(context, 0, n);
}
}  // namespace detail

}  // namespace retrace::cpu
