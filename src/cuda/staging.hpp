// Pinned host buffers for staging writes, recycled by size class, so a non-blocking write
// returns once its data is staged.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace retrace::cuda {

class StagingPool {
 public:
  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool();

  // A pinned buffer of at least `bytes`, returned to the pool when the last owner drops it
  // (or freed, if the pool is gone by then).
  [[nodiscard]] std::shared_ptr<void> take(std::size_t bytes,
                                           const std::shared_ptr<StagingPool>& self);

 private:
  // Small buffers are kept in numbers (a loop of non-blocking writes of a few values each);
  // large ones only a few. Freeing pinned memory is slow, so the pool rarely does it.
  static std::size_t keep_for(std::size_t size) noexcept {
    return size <= (std::size_t{1} << 20) ? 64 : 4;
  }
  void give_back(void* p, std::size_t size) noexcept;

  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
};

}  // namespace retrace::cuda
