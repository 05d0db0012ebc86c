// The backend interface: what a new device type implements (users of retrace never need it).
//
// A Device (retrace/device.hpp) owns the whole protocol every backend shares: argument and state
// checks, the capture state machine, the allocator and its per-trace private pools, the trace
// records (command counts, op names, buffer addresses, outside buffers kept alive), counters,
// option validation and closing. A backend only moves bytes and runs kernels:
//
//   class MyBackend final : public retrace::Backend {
//     // region(), enqueue(), begin_capture() ... as below
//   };
//   auto device = retrace::make_device(std::make_unique<MyBackend>(), options);
//
// and registers itself so open_device("my") finds it (see retrace/registry.hpp). The CPU
// backend (src/cpu/) is the reference to start from; the conformance suite (tests/conformance/)
// runs against every registered backend.
//
// Threads and locks, for every hook below: hooks are called by the Device after it checked the
// arguments and its state; no lock of the Device is held during a hook, so hooks may call the
// Device's public methods (allocate, name, queue_label). Hooks on one queue may be called from
// several threads at once (work enqueued from several threads runs in the order the calls took
// effect); hooks that must not throw say `noexcept`. Throwing from any other hook leaves the
// queue usable and the error propagates to the caller.
#pragma once

#include "retrace/device.hpp"
#include "retrace/kernels.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace retrace {

// The device memory the core's allocator hands out buffers from: `bytes` bytes at `base`,
// owned by the backend and alive as long as it is.
struct MemoryRegion {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::size_t alignment = 64;  // power of two, at least 64: every buffer address is a multiple
  bool host_visible = false;   // the host may read and write it (guard bytes need this)
};

// A recorded command list (a sealed trace), owned by the core's trace record.
class BackendTrace {
 public:
  virtual ~BackendTrace() = default;
};

namespace detail {
// What an Event refers to: a point in one queue's work.
class EventState {
 public:
  virtual ~EventState() = default;
  [[nodiscard]] virtual bool is_complete() const = 0;
  // Host wait. Called on any thread, never while the event's device is capturing on it.
  virtual void wait() const = 0;
};
}  // namespace detail

class Backend {
 public:
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;

  // --- description (any thread, never throws) ---------------------------------------------
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;  // "cpu"
  [[nodiscard]] virtual bool supports(Capability capability) const noexcept = 0;
  // False for a kernel this backend has no implementation of (its table says so explicitly).
  [[nodiscard]] virtual bool supports(KernelId kernel) const noexcept = 0;
  // Why this launch cannot run here although its kernel is supported (a dtype or size the
  // backend lacks), or nullptr. Reported as an `unimplemented` error.
  [[nodiscard]] virtual const char* unsupported_reason(const KernelLaunch& launch) const noexcept {
    (void)launch;
    return nullptr;
  }
  // What the device runs on, for people ("NVIDIA H200 (sm_90, 139.8 GiB)"); "" if nothing to add.
  [[nodiscard]] virtual std::string description() const { return {}; }
  // Called once, when the device opens; the region must stay valid while the backend lives.
  [[nodiscard]] virtual MemoryRegion region() = 0;

  // --- work -----------------------------------------------------------------------------
  // Host bytes into dst (dst.data() + offset), in order with the queue's other work.
  // Blocking::no returns once the data is staged. Never called on a recording queue.
  virtual void write(QueueId queue, const Buffer& dst, std::size_t offset,
                     std::span<const std::byte> src, Blocking blocking) = 0;
  // Waits for the queue's earlier work, then copies to the host. Throws the queue's failure.
  virtual void read(QueueId queue, const Buffer& src, std::size_t offset,
                    std::span<std::byte> dst) = 0;
  // Runs the kernel after the queue's earlier work, or, between begin_capture and end_capture
  // on this queue (always on the capturing thread), records it into the trace. The backend
  // keeps launch.buffers alive until eager work has run; a trace's outside buffers are kept
  // alive by the core.
  virtual void enqueue(QueueId queue, const KernelLaunch& launch) = 0;
  // Waits for the queue's work; throws its sticky failure (once) as device_error.
  virtual void synchronize(QueueId queue) = 0;
  [[nodiscard]] virtual std::shared_ptr<detail::EventState> record_event(QueueId queue) = 0;
  // The queue's later work waits for the event (an event of this device).
  virtual void wait_event(QueueId queue, std::shared_ptr<const detail::EventState> event) = 0;

  // --- traces (the core runs the state machine; one capture per device at a time) ----------
  // The queue records from now on. Called on the capturing thread.
  virtual void begin_capture(QueueId queue, TraceId trace) = 0;
  // Seals the recording. If it throws, the backend has discarded the capture.
  [[nodiscard]] virtual std::unique_ptr<BackendTrace> end_capture(QueueId queue) = 0;
  // Discards the recording (the device closes during a capture).
  virtual void abort_capture(QueueId queue) noexcept = 0;
  // Replays after the queue's earlier work. Blocking::yes returns once it ran and throws the
  // queue's failure. Several threads may replay one trace on different queues at once.
  virtual void execute(BackendTrace& trace, TraceId id, QueueId queue, Blocking blocking) = 0;
  // One blocking replay with each command timed: command_ns[i] gets the nanoseconds command i
  // took (command_ns has one entry per command). Backends that cannot time single commands
  // keep this default, which reports that.
  virtual void execute_timed(BackendTrace& trace, TraceId id, QueueId queue,
                             std::span<std::uint64_t> command_ns);
  // Waits for the trace's replays in flight, then frees what it holds. No replay starts after.
  virtual void release(BackendTrace& trace, TraceId id) noexcept = 0;

  // --- memory and lifetime ------------------------------------------------------------------
  // Waits for queued eager work (not a recording queue) and drops what finished work held, so
  // buffers whose handles are gone return to the allocator. Failures stay sticky.
  virtual void reclaim() noexcept = 0;
  // The device closes: wait for all work. Captures were aborted and traces are released after.
  virtual void shutdown() noexcept = 0;

  // The device this backend serves (set by make_device before any hook runs).
  [[nodiscard]] Device& device() const noexcept { return *device_; }

 private:
  friend class Device;
  Device* device_ = nullptr;
};

// The bytes of memory a device of `bytes` manages with this allocation alignment: what the
// backend's region should hold (rounded as the device's allocator rounds it).
[[nodiscard]] std::size_t device_memory_capacity(std::size_t bytes, std::size_t alignment);

// A device on a backend (the backends' open_* functions call this).
[[nodiscard]] std::unique_ptr<Device> make_device(std::unique_ptr<Backend> backend,
                                                  const DeviceOptions& options);

// The backend of a device, for backend-specific functions (cuda_stream); null if the device is
// not of type B.
template <class B>
[[nodiscard]] B* backend_of(Device& device) noexcept {
  return dynamic_cast<B*>(&device.backend_impl());
}

namespace detail {
// "1.50 MiB": byte counts in messages.
[[nodiscard]] std::string human_bytes(std::size_t bytes);

// Collectives on host-visible memory (CollectiveParams, the kernel `collective`), for backends
// whose kernels run on host threads (the CPU device). A backend runs each member's part on the
// queue the collective was enqueued on, never on a thread that enqueues or waits for the
// member's peers (the members meet inside: see retrace/mesh.hpp), and flushes any work it
// batches before it. run_host_collective throws device_error when the collective fails on any
// member. A queue that skips a collective (its earlier work failed) calls
// skip_host_collective instead, with its failure as the reason: the peers then fail naming it,
// instead of waiting for it.
void run_host_collective(const CollectiveParams& params);
void skip_host_collective(const CollectiveParams& params, std::string_view reason) noexcept;
}  // namespace detail

// The backend's record of a trace (null if the trace does not exist on the device).
[[nodiscard]] BackendTrace* backend_trace(Device& device, TraceId trace);

}  // namespace retrace
