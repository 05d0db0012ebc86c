// parallel_for: splits a loop across the CPU device's kernel threads (one per core), for kernels
// big enough that a cross-core hand-off (microseconds) pays. Small loops, nested calls and calls
// while another parallel loop runs execute on the calling thread. The calling thread and the
// helpers claim the loop's parts as they get to them, so a helper the operating system has not
// scheduled (a busy machine) never holds the loop up for a part it has not started.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

namespace retrace::cpu {

namespace detail {
using RangeFn = void (*)(void* context, std::int64_t begin, std::int64_t end);
void parallel_for_impl(std::int64_t n, std::int64_t min_chunk, RangeFn fn, void* context);
}  // namespace detail

// Calls body(begin, end) on disjoint ranges covering [0, n); ranges hold at least min_chunk
// iterations (except a last short one).
template <class Body>
void parallel_for(std::int64_t n, std::int64_t min_chunk, Body&& body) {
  using B = std::remove_reference_t<Body>;
  detail::parallel_for_impl(
      n, min_chunk,
      [](void* context, std::int64_t begin, std::int64_t end) {
        (*static_cast<B*>(context))(begin, end);
      },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// Threads parallel_for uses (the calling thread included).
[[nodiscard]] int kernel_threads() noexcept;
// The most kernel threads RETRACE_KERNEL_THREADS may ask for.
inline constexpr int kMaxKernelThreads = 4096;
// RETRACE_KERNEL_THREADS when set to a count the pool can take; otherwise nullopt, and with
// `error`, why a set value is refused (empty when unset).
[[nodiscard]] std::optional<int> kernel_threads_from_environment(std::string* error);
// How long a kernel thread spins (yielding) for the next loop, or for a helper's part, before it
// sleeps: RETRACE_KERNEL_SPIN_US, 0 to 1000000 microseconds, default 100. Shorter gives the
// cores back sooner on a busy machine; longer saves wake-ups between a replay's loops.
inline constexpr int kDefaultKernelSpinUs = 100;
inline constexpr int kMaxKernelSpinUs = 1000000;
// RETRACE_KERNEL_SPIN_US when set to a value the pool can take; otherwise nullopt, and with
// `error`, why a set value is refused (empty when unset).
[[nodiscard]] std::optional<int> kernel_spin_us_from_environment(std::string* error);
// While a KernelThreadCap scope is alive on a thread, the kernels it runs use at most `threads`
// kernel threads, that thread included (0: no cap). A CPU device runs its queues' work inside
// one with its kernel_threads option. With a cap of 1 (serial_kernels()) parallel_for runs
// serially and GEMMs take the single-threaded library, so several such devices (the members of
// a mesh) each keep to one core instead of contending for the shared helpers.
class KernelThreadCap {
 public:
  explicit KernelThreadCap(int threads) noexcept;
  ~KernelThreadCap();
  KernelThreadCap(const KernelThreadCap&) = delete;
  KernelThreadCap& operator=(const KernelThreadCap&) = delete;

 private:
  int previous_;
};
[[nodiscard]] bool serial_kernels() noexcept;

// Caps the threads parallel_for uses (at least 1; at most the cores); for benchmarks that
// compare thread counts in one process.
void set_kernel_thread_limit(int threads) noexcept;

}  // namespace retrace::cpu
