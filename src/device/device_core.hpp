// The state behind a Device: its backend, allocator, capture state machine and trace records.
// Private to the core (include/retrace/device.hpp shows users none of it).
#pragma once

#include "device/arena.hpp"
#include "retrace/backend.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace retrace::detail {

// A sealed trace (or the capture in progress): what the core knows of it, the backend's command
// list, and the buffers from outside its pool that it uses (kept alive until it is released).
struct TraceRecord {
  TraceInfo info;
  std::unique_ptr<BackendTrace> backend;
  std::vector<std::shared_ptr<Buffer>> retained;
};

struct DeviceCore {
  DeviceCore(std::unique_ptr<Backend> b, const MemoryRegion& r, const std::string& name,
             const DeviceOptions& options)
      : backend(std::move(b)),
        region(r),
        arena(name, r.base, r.bytes, options.trace_region_bytes, options.guard_bytes, r.alignment) {}

  std::unique_ptr<Backend> backend;  // declared first: destroyed last (it owns the region)
  MemoryRegion region;
  Arena arena;

  // Guards the capture state and the trace map. Never held while a backend hook runs.
  mutable std::mutex mutex;
  std::atomic<bool> capturing{false};
  std::optional<QueueId> capture_queue;
  TraceId capture_trace{};
  std::thread::id capture_thread;
  // The record being built; touched only by the capturing thread while capturing.
  std::shared_ptr<TraceRecord> capture;
  std::unordered_set<const Buffer*> capture_seen;
  std::unordered_map<std::uint64_t, std::shared_ptr<TraceRecord>> traces;

  std::atomic<std::uint64_t> commands_executed{0};
  std::atomic<std::uint64_t> traces_executed{0};

  // Guard damage found when a buffer was freed, reported by the next synchronize, read or replay.
  std::mutex damage_mutex;
  std::string damage;
};

}  // namespace retrace::detail
