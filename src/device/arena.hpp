// Arena: a device's memory allocator and its per-trace private pools, owned by the device core.
//
// The backend hands over one region (the CPU device: an mmap'd range; the CUDA device: one
// cudaMalloc); blocks are carved first-fit from an ordered free list and coalesced on free, so
// addresses are real, stable and aligned. The arena never touches the region's bytes unless
// guard bytes are asked for (host-visible memory only). Blocks allocated while a
// capture is in progress belong to that trace's pool:
//  - during the capture, a pool block whose handle is dropped can be reused by the same capture
//    (the queue runs in order, so the reuse is what eager execution would do);
//  - after the capture, pool blocks stay reserved until the trace is released;
//  - at release, blocks nobody holds go back to the arena; blocks still held by a Buffer become
//    ordinary allocations, freed when that Buffer dies.
// All methods are thread-safe.
#pragma once

#include "retrace/backend.hpp"
#include "retrace/device.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace retrace::detail {

// What the allocator knows about one allocation.
struct BlockInfo {
  void* data = nullptr;          // pointer the backend's kernels use
  std::uint64_t address = 0;     // stable address a trace bakes in
  std::size_t size = 0;          // bytes usable by the caller
  std::optional<TraceId> trace;  // the trace pool the block came from, if any
};

class Arena {
 public:
  // `base` is `capacity` bytes the caller owns and keeps alive while the arena lives; addresses
  // handed out are multiples of `alignment` (a power of two, at least 64) from base.
  Arena(std::string device_name, std::byte* base, std::size_t capacity, std::size_t trace_region,
        std::size_t guard_bytes, std::size_t alignment = 64);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Rounds a capacity request to what an arena with this alignment manages.
  [[nodiscard]] static std::size_t round_capacity(std::size_t bytes, std::size_t alignment = 64);

  [[nodiscard]] BlockInfo allocate(std::size_t bytes, std::optional<TraceId> capture);
  // Returns a description of guard damage if the block's guard bytes were overwritten.
  [[nodiscard]] std::optional<std::string> free(const BlockInfo& block) noexcept;

  void begin_pool(TraceId trace);
  // Seals the pool: its blocks stay reserved until release_pool. Returns (bytes, blocks).
  std::pair<std::size_t, std::size_t> seal_pool(TraceId trace);
  void release_pool(TraceId trace) noexcept;

  void fill_stats(DeviceStats& stats) const;

 private:
  struct Block {
    std::size_t span;  // bytes reserved, guards included
    std::size_t size;  // bytes requested
    // Bytes that kernels may legitimately write: the largest size the block had within its
    // trace (a capture may reuse a freed temporary for a smaller one, and replays still write
    // the earlier, larger tensor there). The tail guard starts after it.
    std::size_t extent;
    std::optional<TraceId> pool;
    bool held;  // a Buffer handle refers to it
  };
  struct Pool {
    std::vector<std::size_t> offsets;
    std::multimap<std::size_t, std::size_t> reusable;  // span -> offset, while capturing
    std::size_t bytes = 0;
    bool sealed = false;
  };

  std::size_t span_for(std::size_t bytes) const noexcept;
  std::optional<std::size_t> reuse_from_pool(Pool& pool, std::size_t span);
  std::size_t carve(std::size_t span, std::size_t request);  // throws out_of_memory
  void give_back(std::size_t offset, std::size_t span) noexcept;
  BlockInfo describe(std::size_t offset, const Block& block) const noexcept;
  void write_guards(std::size_t offset, const Block& block) noexcept;
  std::optional<std::string> check_guards(std::size_t offset, const Block& block) const noexcept;
  std::size_t largest_free_locked() const noexcept;

  std::string device_name_;
  std::size_t capacity_;
  std::size_t trace_region_;
  std::size_t guard_;
  std::size_t alignment_;
  std::byte* base_ = nullptr;

  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_;  // offset -> span, coalesced
  std::map<std::size_t, Block> blocks_;      // offset -> live block
  std::unordered_map<std::uint64_t, Pool> pools_;
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::size_t trace_bytes_ = 0;
};

}  // namespace retrace::detail
