// Waiting threads (the CPU device's queues and kernel helpers, MPI meshes): spin briefly,
// then sleep, and stop spinning at once on a busy machine.
//
// The device's threads hand work to each other within microseconds (a queue's worker, the
// kernel helpers), and waking a sleeping thread costs tens of microseconds on a virtual machine,
// so a thread that waits spins first. But a spinning thread is runnable: on a machine whose
// cores are taken by other programs it uses up the share the scheduler would give the thread it
// waits for, while a thread that sleeps until it is woken is scheduled promptly (the scheduler
// credits sleepers). So the spin does not yield to other programs (a yield can hand the core to
// one for a whole time slice), and gives up as soon as a turn took long: the thread was
// preempted, another runnable thread wants the core, the machine is busy. Nor does it spin in
// the way of the very thread it waits for: a waiter that finds that thread last seen on its own
// CPU (on_this_cpu) stops, or yields to it (the kernel pool's helpers, cpu/parallel.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <utility>

#ifdef __linux__
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace retrace::util {

// A turn of the spin longer than this means another thread ran on the core in between.
inline constexpr std::chrono::microseconds kDescheduledTurn{30};

// A hint to the core that this thread spins (x86 pause).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// The CPU the calling thread runs on (glibc reads it from the kernel's rseq area: a load), or
// -1 where unknown.
inline int current_cpu() noexcept {
#ifdef __linux__
  return sched_getcpu();
#else
  return -1;
#endif
}

// Whether the calling thread runs on the CPU `cpu` holds (-1: none) - a thread that published
// its CPU there and cannot run while this one spins on it.
inline bool on_this_cpu(const std::atomic<int>& cpu) noexcept {
  const int here = current_cpu();
  return here >= 0 && here == cpu.load(std::memory_order_relaxed);
}

// Spins until ready() holds, `budget` is spent, a turn was descheduled, or futile() holds (the
// thread it waits for cannot run while it spins: it is runnable on this very CPU, so the wait
// should sleep at once and let it); returns ready().
template <class Ready, class Futile>
bool spin_while_idle(Ready&& ready, std::chrono::microseconds budget, Futile&& futile) {
  using SteadyClock = std::chrono::steady_clock;
  const auto until = SteadyClock::now() + budget;
  for (;;) {
    if (ready()) return true;
    const auto before = SteadyClock::now();
    if (before >= until || futile()) return ready();
    for (int i = 0; i < 16; ++i) cpu_relax();
    if (SteadyClock::now() - before > kDescheduledTurn) return ready();
  }
}

// The same without futile().
template <class Ready>
bool spin_while_idle(Ready&& ready, std::chrono::microseconds budget) {
  return spin_while_idle(std::forward<Ready>(ready), budget, [] { return false; });
}

}  // namespace retrace::util
