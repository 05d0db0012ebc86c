#include "cuda/staging.hpp"

#include "cuda/check.hpp"
#include "cuda/relaxed.hpp"

#include <algorithm>
#include <bit>

namespace retrace::cuda {

StagingPool::~StagingPool() {
  for (auto& [size, buffers] : free_) {
    for (void* p : buffers) RETRACE_CUDA_WARN(cudaFreeHost(p));
  }
}

std::shared_ptr<void> StagingPool::take(std::size_t bytes,
                                        const std::shared_ptr<StagingPool>& self) {
  const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 64 << 10));
  void* p = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto& buffers = free_[size];
    if (!buffers.empty()) {
      p = buffers.back();
      buffers.pop_back();
    }
  }
  if (p == nullptr) {
    RelaxedCapture relaxed;
    RETRACE_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocPortable),
                       "allocating {} bytes of pinned staging memory", size);
  }
  std::weak_ptr<StagingPool> weak = self;
  return std::shared_ptr<void>(p, [weak, size](void* q) {
    if (auto pool = weak.lock()) {
      pool->give_back(q, size);
    } else {
      RETRACE_CUDA_WARN(cudaFreeHost(q));
    }
  });
}

void StagingPool::give_back(void* p, std::size_t size) noexcept {
  {
    std::lock_guard lock(mutex_);
    auto& buffers = free_[size];
    if (buffers.size() < keep_for(size)) {
      buffers.push_back(p);
      return;
    }
  }
  RETRACE_CUDA_WARN(cudaFreeHost(p));
}

}  // namespace retrace::cuda
