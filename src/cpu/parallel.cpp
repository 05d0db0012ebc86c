#include "cpu/parallel.hpp"

#include "util/cpus.hpp"
#include "util/spin.hpp"
#include "util/thread_name.hpp"

#include <fmt/format.h>

#include <sched.h>
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

// A fixed set of helper threads and one parallel loop at a time (others run serially).
//
// Parts are claimed, not assigned: the calling thread and every awake helper take the next
// unclaimed part until none is left, so a loop never waits for a part that no running thread
// took. A helper that the operating system has descheduled (the machine is busy) delays only a
// part it already claimed; the caller runs the rest itself. Which thread runs a part never
// changes its bits: the parts' boundaries depend only on the loop and the thread count.
//
// Waiting spins for a bounded time, then sleeps (cpu/spin.hpp). A helper that finished watches
// for the next loop for RETRACE_KERNEL_SPIN_US, then sleeps on a condition variable: the ops of
// a replay follow each other within microseconds, and waking a sleeping thread costs tens of
// microseconds on a virtual machine (a 256x256 layer_norm took 77 us, most of it waiting for its
// helper). A caller waiting for a helper's part spins as long, then sleeps until the part is
// done. On a busy machine both stop spinning at once. Neither spins in the way of the thread it
// waits for when that one was last seen on its own CPU (the scheduler put both on one core, or
// the machine is busy), where it could not run until the spin ends: the caller then sleeps at
// once, and a helper yields to the caller at every turn, staying runnable so that an idle CPU
// can take it. Spinning there had cost every loop up to the whole spin: with two kernel threads
// on one CPU, a DiT step at M took 1.23x the time of one thread, and at S sometimes 3.5x the
// unloaded time on two CPUs.
class KernelPool {
 public:
  KernelPool() {
    // One per CPU this process may use (its affinity mask), not per CPU of the host, unless
    // RETRACE_KERNEL_THREADS says (a value it cannot take is refused when a device opens).
    const std::optional<int> requested = kernel_threads_from_environment(nullptr);
    threads_ = requested ? *requested : static_cast<int>(util::usable_cpus());
    spin_ = std::chrono::microseconds(
        kernel_spin_us_from_environment(nullptr).value_or(kDefaultKernelSpinUs));
    part_cpu_ = std::vector<std::atomic<int>>(static_cast<std::size_t>(threads_));
    for (auto& cpu : part_cpu_) cpu.store(-1, std::memory_order_relaxed);
    for (int i = 1; i < threads_; ++i) {
      helpers_.emplace_back([this, i] {
        util::name_this_thread(fmt::format("rt kernel {}", i));
        run(i);
      });
    }
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
    n_ = n;
    parts_ = parts;
    caller_cpu_.store(util::current_cpu(), std::memory_order_relaxed);
    fn_ = fn;
    context_ = context;
    done_.store(0, std::memory_order_relaxed);
    // Publishes the loop: a claim that succeeds against this word sees the fields above.
    const std::uint64_t region = (claims_.load(std::memory_order_relaxed) >> 32) + 1;
    claims_.store(region << 32 | static_cast<std::uint32_t>(parts), std::memory_order_release);
    {
      // A helper counts itself a sleeper before it takes the mutex to wait, and waits only if
      // the generation is unchanged under it: one that missed this notify sees the new one.
      std::lock_guard lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleepers_.load() > 0) cv_.notify_all();
    run_claimed_parts(0);
    wait_until_done();
    return true;
  }

 private:
  // Claims parts of the current loop one by one (the last unclaimed first) and runs them, until
  // none is left. Reading the loop's fields is safe once a claim succeeded: the caller does not
  // return, nor publish another loop, before every part is done.
  // `self`: 0 for the caller, i for helper i (whose CPU part_cpu_[i] shows while it runs a part).
  void run_claimed_parts(int self) {
    std::atomic<int>& cpu = part_cpu_[static_cast<std::size_t>(self)];
    std::uint64_t word = claims_.load(std::memory_order_acquire);
    while (static_cast<std::uint32_t>(word) != 0) {
      if (!claims_.compare_exchange_weak(word, word - 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        continue;  // another thread claimed one (or a new loop began): look again
      }
      // Read before the part counts as done: from then on the caller may begin another loop.
      const int parts = parts_;
      if (self != 0) cpu.store(util::current_cpu(), std::memory_order_relaxed);
      run_part(static_cast<int>(static_cast<std::uint32_t>(word)) - 1);
      if (self != 0) cpu.store(-1, std::memory_order_relaxed);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) done_.notify_one();
      word = claims_.load(std::memory_order_acquire);
    }
  }

  // Whether a helper is running a part on the caller's CPU (so it waits for the caller to stop).
  bool helper_on_this_cpu() const noexcept {
    const int here = util::current_cpu();
    if (here < 0) return false;
    for (std::size_t i = 1; i < part_cpu_.size(); ++i) {
      if (part_cpu_[i].load(std::memory_order_relaxed) == here) return true;
    }
    return false;
  }

  void run_part(int part) {
    const std::int64_t begin = n_ * part / parts_;
    const std::int64_t end = n_ * (part + 1) / parts_;
    in_parallel_region = true;
    if (begin < end) fn_(context_, begin, end);
    in_parallel_region = false;
  }

  // The caller, once every part is claimed: until the helpers' parts are done.
  void wait_until_done() {
    if (util::spin_while_idle([this] { return done_.load(std::memory_order_acquire) == parts_; },
                              spin_, [this] { return helper_on_this_cpu(); })) {
      return;
    }
    for (int done = done_.load(std::memory_order_acquire); done != parts_;
         done = done_.load(std::memory_order_acquire)) {
      done_.wait(done, std::memory_order_acquire);
    }
  }

  void run(int self) {
    std::uint64_t seen = 0;
    for (;;) {
      // The next loop comes from the caller of the last: on its CPU, yield to it while spinning.
      const bool woke = util::spin_while_idle(
          [&] { return generation_.load(std::memory_order_acquire) != seen; }, spin_,
          [this] {
            if (util::on_this_cpu(caller_cpu_)) sched_yield();
            return false;
          });
      {
        if (!woke) sleepers_.fetch_add(1);
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || generation_.load() != seen; });
        if (!woke) sleepers_.fetch_sub(1);
        if (stopping_) return;
        seen = generation_.load();
      }
      run_claimed_parts(self);
    }
  }

  int threads_ = 1;
  std::chrono::microseconds spin_{kDefaultKernelSpinUs};
  std::vector<std::thread> helpers_;
  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> generation_{0};  // written under mutex_
  std::atomic<int> sleepers_{0};
  // The current loop's claims: its number (high 32 bits) and how many of its parts are still
  // unclaimed (low 32 bits).
  std::atomic<std::uint64_t> claims_{0};
  std::atomic<int> done_{0};  // parts of the current loop that finished
  // The CPU the current (or last) loop's caller published it from, and each helper's CPU while
  // it runs a part (-1 otherwise; index 0, the caller, unused): where spinning is futile.
  std::atomic<int> caller_cpu_{-1};
  std::vector<std::atomic<int>> part_cpu_;
  std::int64_t n_ = 0;
  int parts_ = 1;
  detail::RangeFn fn_ = nullptr;
  void* context_ = nullptr;
};

KernelPool& pool() {
  static KernelPool instance;
  return instance;
}

}  // namespace

namespace {

// A whole number from `lo` to `hi` in the environment variable `name`: nullopt when unset or
// not such a number, and then with `error`, why the value is refused ("RETRACE_X='abc' is not
// <what> (a whole number <unit>from lo to hi; unset it for <otherwise>)").
std::optional<int> whole_number_from_environment(const char* name, int lo, int hi,
                                                 std::string_view what, std::string_view unit,
                                                 std::string_view otherwise, std::string* error) {
  const char* env = std::getenv(name);
  if (env == nullptr) return std::nullopt;
  const std::string_view text(env);
  int value = 0;
  const auto [end, code] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (code == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi) {
    return value;
  }
  if (error != nullptr) {
    *error = fmt::format("{}='{}' is not {} (a whole number {}from {} to {}; unset it for {})",
                         name, text, what, unit, lo, hi, otherwise);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> kernel_threads_from_environment(std::string* error) {
  return whole_number_from_environment("RETRACE_KERNEL_THREADS", 1, kMaxKernelThreads,
                                       "a thread count", "", "one thread per usable CPU", error);
}

std::optional<int> kernel_spin_us_from_environment(std::string* error) {
  return whole_number_from_environment("RETRACE_KERNEL_SPIN_US", 0, kMaxKernelSpinUs, "a spin time",
                                       "of microseconds ", fmt::format("{}", kDefaultKernelSpinUs),
                                       error);
}

int kernel_threads() noexcept {
  return std::min(pool().threads(), thread_limit.load());
}

void set_kernel_thread_limit(int threads) noexcept {
  thread_limit.store(std::max(1, threads));
}

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
  const auto parts =
      static_cast<int>(std::min<std::int64_t>(threads, n / std::max<std::int64_t>(min_chunk, 1)));
  if (parts <= 1 || !pool().try_run(n, parts, fn, context)) fn(context, 0, n);
}
}  // namespace detail

}  // namespace retrace::cpu
