// How many CPUs this process may run on: the CPUs of its affinity mask (what taskset, a
// container's cpuset, or mpirun's binding of a rank to a core leave it), not the host's count.
// Running more spinning kernel threads than that on fewer cores makes every parallel loop wait
// for a thread that is not scheduled.
#pragma once

#include <algorithm>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace retrace::util {

// The host's hardware threads (at least 1).
inline unsigned host_cpus() noexcept {
  return std::max(1u, std::thread::hardware_concurrency());
}

// The CPUs of the calling thread's affinity mask (at least 1); the host's count where the mask
// cannot be read.
inline unsigned usable_cpus() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return static_cast<unsigned>(count);
  }
#endif
  return host_cpus();
}

}  // namespace retrace::util
