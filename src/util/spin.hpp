// Waiting threads (the CPU device's queues and kernel helpers, MPI meshes): spin briefly,
// then sleep, and stop spinning at once on a busy machine.
//
// The device's threads hand work to each other within microseconds (a queue's worker, the
// kernel helpers), and waking a sleeping thread costs tens of microseconds on a virtual machine,
// so a thread that waits spins first. But a spinning thread is runnable: on a machine whose
// cores are taken by other programs it uses up the share the scheduler would give the thread it
// waits for, while a thread that sleeps until it is woken is scheduled promptly (the scheduler
// credits sleepers). So the spin never yields (a yield hands the core to another program for a
// whole time slice), and gives up as soon as a turn took long: the thread was preempted,
// another runnable thread wants the core, the machine is busy.
#pragma once

#include <chrono>

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

// Spins until ready() holds, `budget` is spent, or a turn was descheduled; returns ready().
template <class Ready>
bool spin_while_idle(Ready&& ready, std::chrono::microseconds budget) {
  using SteadyClock = std::chrono::steady_clock;
  const auto until = SteadyClock::now() + budget;
  for (;;) {
    if (ready()) return true;
    const auto before = SteadyClock::now();
    if (before >= until) return ready();
    for (int i = 0; i < 16; ++i) cpu_relax();
    if (SteadyClock::now() - before > kDescheduledTurn) return ready();
  }
}

}  // namespace retrace::util
