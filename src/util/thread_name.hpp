// Names the calling thread as tools show it (top -H, gdb, perf, /proc/PID/task/TID/comm), so a
// user can tell retrace's threads apart: "rt cpu:0 q1" is queue 1's worker of device cpu:0,
// "rt kernel 1" the first kernel helper. Linux keeps 15 characters; longer names are cut.
#pragma once

#include <string>

#if defined(__linux__)
#include <pthread.h>
#endif

namespace retrace::util {

inline void name_this_thread(std::string name) noexcept {
#if defined(__linux__)
  if (name.size() > 15) name.resize(15);
  (void)pthread_setname_np(pthread_self(), name.c_str());
#else
  (void)name;
#endif
}

}  // namespace retrace::util
