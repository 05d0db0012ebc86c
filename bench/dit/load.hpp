// Busy competitors for `retrace bench --load N`: N child processes that spin on the CPUs this
// process may use (they inherit its affinity mask), as other programs on a shared machine would.
// They are started by the constructor and killed by the destructor; each also ends by itself
// after `limit`, and when the bench's process dies, so none outlives the measurement.
#pragma once

#include <chrono>
#include <vector>

#include <sys/types.h>

namespace retrace::bench {

class Load {
 public:
  Load(int processes, std::chrono::seconds limit);
  ~Load();
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

  [[nodiscard]] int processes() const noexcept { return static_cast<int>(children_.size()); }

 private:
  void stop() noexcept;  // kills and reaps the children

  std::vector<pid_t> children_;
};

}  // namespace retrace::bench
