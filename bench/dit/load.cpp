#include "load.hpp"

#include <retrace/error.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace retrace::bench {

namespace {

// The child: only async-signal-safe calls after fork (the parent has other threads).
[[noreturn]] void spin(pid_t parent, unsigned limit_seconds) {
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // the parent died before prctl took effect
  (void)alarm(limit_seconds);         // SIGALRM's default action ends the process
  volatile unsigned long counter = 0;
  for (;;) counter = counter + 1;
}

}  // namespace

Load::Load(int processes, std::chrono::seconds limit) {
  const pid_t parent = getpid();
  const auto seconds = static_cast<unsigned>(std::max<std::chrono::seconds::rep>(limit.count(), 1));
  children_.reserve(static_cast<std::size_t>(std::max(processes, 0)));
  for (int i = 0; i < processes; ++i) {
    const pid_t child = fork();
    if (child == 0) spin(parent, seconds);
    if (child < 0) {
      const int error = errno;
      stop();
      RETRACE_FAIL(device_error, "bench: --load: cannot start competitor {} of {} ({})", i + 1,
                   processes, std::strerror(error));
    }
    children_.push_back(child);
  }
}

Load::~Load() {
  stop();
}

void Load::stop() noexcept {
  for (pid_t child : children_) (void)kill(child, SIGKILL);
  for (pid_t child : children_) {
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  children_.clear();
}

}  // namespace retrace::bench
