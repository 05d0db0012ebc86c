// Device: the runtime-neutral interface every backend implements (DESIGN.md §2).
//
// A device owns memory (Buffers with stable addresses), runs work on in-order command queues
// asynchronously to the host, and can record the work enqueued on a queue into a trace that is
// replayed later without re-dispatching a single op:
//
//   auto device = retrace::open_cpu_device();
//   device->begin_trace_capture(retrace::QueueId{0});
//   auto y = retrace::ops::add(x, 1.0);            // recorded, not executed
//   retrace::TraceId trace = device->end_trace_capture(retrace::QueueId{0});
//   device->execute_trace(trace, retrace::QueueId{0}, retrace::Blocking::yes);  // y = x + 1
//   device->release_trace(trace);
//
// Public methods check their arguments and the device state, then call a protected hook that
// the backend implements. Rules every backend follows:
//  - Captures are thread-local: a capture is ended on the thread that began it. On the
//    capturing thread, host reads and writes, synchronize, blocking replays and events are
//    capture violations while the capture is in progress; the capture stays open and the device
//    usable. Other threads may keep using the device's other queues (their allocations never
//    come from the trace's pool), but not the capturing queue. One capture per device at a time.
//  - Buffers allocated during a capture belong to the trace's private pool: they stay reserved
//    until the trace is released (and, if a handle to one is still held then, until that handle
//    is dropped), so nothing allocated later can alias memory a replay writes.
//  - A failure inside queued work becomes a sticky error of its queue, reported (once) by the
//    next synchronize, execute_trace or read on that queue; work queued behind the failure on
//    that queue is skipped.
//
// Identity and lifetime:
//  - Each device has a process-unique id (uid()) that is never reused, and trace ids are unique
//    in the process: a trace id of one device given to another is an invalid_argument error.
//  - close() (or destroying the device) waits for queued work, releases every trace, drops a
//    capture in progress and detaches every handle that refers to the device: buffers, events,
//    tensors, tracers and traced wrappers. From then on each of them raises failed_precondition
//    naming the device ("cpu:0 was closed") instead of touching freed memory.
//
// Queues: kDefaultQueue stands for the queue this thread is capturing on (when it captures on
// this device), else the queue of the innermost DefaultQueueScope on this thread, else queue 0.
// So the ops of a traced function follow the capture's queue; an op sent explicitly to another
// queue of the device from the capturing thread is a capture violation (it would run outside
// the trace).
//
// Thread safety: every method may be called from several threads, except close(), which must
// not race with other calls on the device. Work enqueued on one queue from several threads runs
// in the order the calls took effect.
#pragma once

#include "retrace/kernels.hpp"
#include "retrace/types.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace retrace {

class Device;

namespace detail {
// Shared by a device and every handle that refers to it, so handles can outlive the device
// safely: the device clears `device` when it closes; the name and uid stay for messages.
struct DeviceLink {
  std::atomic<Device*> device{nullptr};
  std::uint64_t uid = 0;
  std::string name;

  // Throws failed_precondition "<what>: <name> was closed ..." once the device is closed.
  Device& require_open(std::string_view what) const;
};
}  // namespace detail

// Makes `queue` the queue kDefaultQueue stands for on this thread while the scope lives (a
// Tracer opens one around its prep run and capture). Scopes nest.
class DefaultQueueScope {
 public:
  explicit DefaultQueueScope(QueueId queue) noexcept;
  ~DefaultQueueScope();
  DefaultQueueScope(const DefaultQueueScope&) = delete;
  DefaultQueueScope& operator=(const DefaultQueueScope&) = delete;

 private:
  QueueId previous_;
};

// What a backend knows about one allocation.
struct BlockInfo {
  void* data = nullptr;          // pointer the backend's kernels use
  std::uint64_t address = 0;     // stable address a trace bakes in
  std::size_t size = 0;          // bytes usable by the caller
  std::optional<TraceId> trace;  // the trace pool the block came from, if any
};

// A block of device memory, shared by tensors through std::shared_ptr and returned to the
// device when the last owner drops it.
class Buffer : public std::enable_shared_from_this<Buffer> {
 public:
  Buffer(std::shared_ptr<detail::DeviceLink> link, BlockInfo block) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  // nullptr once the device has been closed.
  [[nodiscard]] Device* device() const noexcept { return link_->device.load(); }
  [[nodiscard]] const detail::DeviceLink& link() const noexcept { return *link_; }
  [[nodiscard]] std::uint64_t address() const noexcept { return block_.address; }
  [[nodiscard]] std::size_t size() const noexcept { return block_.size; }
  [[nodiscard]] void* data() const noexcept { return block_.data; }
  // The trace whose capture allocated the buffer (still set after that trace is released).
  [[nodiscard]] std::optional<TraceId> trace() const noexcept { return block_.trace; }
  [[nodiscard]] const BlockInfo& block() const noexcept { return block_; }

 private:
  std::shared_ptr<detail::DeviceLink> link_;
  BlockInfo block_;
};

namespace detail {
class EventState {
 public:
  virtual ~EventState() = default;
  [[nodiscard]] virtual bool is_complete() const = 0;
  virtual void wait() const = 0;
};
}  // namespace detail

// A point in a queue's work. Recorded with Device::record_event, waited on by another queue
// (Device::wait_event) or the host (synchronize).
class Event {
 public:
  Event() = default;
  Event(std::shared_ptr<detail::EventState> state, std::shared_ptr<detail::DeviceLink> link,
        QueueId queue) noexcept;

  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  [[nodiscard]] QueueId queue() const noexcept { return queue_; }
  [[nodiscard]] Device* device() const noexcept { return link_ ? link_->device.load() : nullptr; }
  // Both throw failed_precondition once the event's device is closed.
  [[nodiscard]] bool is_complete() const;
  // Host waits until the queue has passed the event. A capture violation during a capture.
  void synchronize() const;
  [[nodiscard]] const std::shared_ptr<detail::EventState>& state() const noexcept {
    return state_;
  }

 private:
  std::shared_ptr<detail::EventState> state_;
  std::shared_ptr<detail::DeviceLink> link_;
  QueueId queue_{};
};

struct DeviceStats {
  std::size_t capacity_bytes = 0;       // device memory managed by the allocator
  std::size_t bytes_in_use = 0;         // allocated, including trace memory
  std::size_t peak_bytes_in_use = 0;
  std::size_t trace_bytes = 0;          // reserved by live traces and the capture in progress
  std::size_t trace_region_bytes = 0;   // limit on trace_bytes
  std::size_t live_buffers = 0;
  std::size_t live_traces = 0;
  std::uint64_t commands_executed = 0;  // kernels run, eager and replayed
  std::uint64_t traces_executed = 0;
};

struct TraceInfo {
  TraceId id{};
  QueueId captured_on{};
  std::size_t commands = 0;
  std::size_t bytes = 0;          // private pool memory reserved by the trace
  std::size_t pool_buffers = 0;   // buffers allocated during the capture
  std::size_t external_buffers = 0;  // buffers from outside the pool that the trace uses
  std::vector<std::string_view> ops;  // op name of each command, in recorded order
  // Addresses of the buffers each command reads or writes (for listings and graphs).
  std::vector<std::vector<std::uint64_t>> command_buffers;
};

enum class Capability : std::uint8_t {
  trace_capture,        // begin/end/execute/release_trace
  events,               // record_event / wait_event
  async_queues,         // queues run on their own threads or streams
  host_visible_memory,  // Buffer::data() is readable by the host
};

// Backend-owned trace object; the device base keeps the registry.
class TraceBase {
 public:
  virtual ~TraceBase() = default;
  TraceInfo info;
};

class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual ~Device();

  [[nodiscard]] DeviceId id() const noexcept { return id_; }
  // Unique in the process and never reused, unlike the address of the Device object.
  [[nodiscard]] std::uint64_t uid() const noexcept { return link_->uid; }
  [[nodiscard]] std::string_view backend() const noexcept { return backend_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }  // "cpu:0"
  [[nodiscard]] std::uint32_t num_queues() const noexcept { return num_queues_; }
  [[nodiscard]] virtual bool supports(Capability capability) const noexcept = 0;

  // --- memory -------------------------------------------------------------------------------
  // Size 0 is allowed and still yields a distinct address.
  [[nodiscard]] std::shared_ptr<Buffer> allocate(std::size_t bytes);

  // --- work ---------------------------------------------------------------------------------
  // Copies host data into a buffer, in order with the queue's other work. Blocking::no returns
  // once the data has been staged.
  void write(QueueId queue, const Buffer& dst, std::size_t offset, std::span<const std::byte> src,
             Blocking blocking = Blocking::yes);
  // Waits for the queue's earlier work, then copies buffer contents to the host.
  void read(QueueId queue, const Buffer& src, std::size_t offset, std::span<std::byte> dst);
  void enqueue(QueueId queue, const KernelLaunch& launch);
  void synchronize(QueueId queue);
  void synchronize();  // every queue
  [[nodiscard]] Event record_event(QueueId queue);
  void wait_event(QueueId queue, const Event& event);

  // --- traces -------------------------------------------------------------------------------
  void begin_trace_capture(QueueId queue);
  [[nodiscard]] TraceId end_trace_capture(QueueId queue);
  void execute_trace(TraceId trace, QueueId queue, Blocking blocking);
  // Waits for replays in flight, then frees the trace and its pool. Unknown ids are an error.
  void release_trace(TraceId trace);
  [[nodiscard]] bool has_trace(TraceId trace) const;
  [[nodiscard]] TraceInfo trace_info(TraceId trace) const;
  [[nodiscard]] std::vector<TraceId> live_traces() const;
  [[nodiscard]] bool is_capturing() const noexcept { return capturing_.load(); }
  [[nodiscard]] std::optional<TraceId> capturing_trace(QueueId queue) const;
  // Throws a capture violation naming `what` if this thread is capturing on this device.
  void check_not_capturing(std::string_view what) const;
  // The same, and also if another thread is capturing on `queue`.
  void check_queue_not_capturing(QueueId queue, std::string_view what) const;

  [[nodiscard]] DeviceStats stats() const;

  // Waits for queued work (failures it had are dropped), drops a capture in progress, releases
  // every trace and detaches every handle (see "Identity and lifetime" above). Idempotent; the
  // destructor calls it.
  void close() noexcept;
  [[nodiscard]] bool is_closed() const noexcept { return link_->device.load() == nullptr; }

  // Shared with every handle that refers to the device, so it can tell whether it is still open.
  [[nodiscard]] const std::shared_ptr<detail::DeviceLink>& link() const noexcept { return link_; }

 protected:
  Device(std::string_view backend, DeviceId id, std::uint32_t num_queues);

  // Hooks. Arguments are validated before they are called; the capture in progress (if any)
  // is passed where it matters.
  virtual BlockInfo do_allocate(std::size_t bytes, std::optional<TraceId> capture) = 0;
  virtual void do_free(const BlockInfo& block) noexcept = 0;
  virtual void do_write(QueueId queue, const Buffer& dst, std::size_t offset,
                        std::span<const std::byte> src, Blocking blocking) = 0;
  virtual void do_read(QueueId queue, const Buffer& src, std::size_t offset,
                       std::span<std::byte> dst) = 0;
  virtual void do_enqueue(QueueId queue, const KernelLaunch& launch) = 0;
  virtual void do_synchronize(QueueId queue) = 0;
  virtual std::shared_ptr<detail::EventState> do_record_event(QueueId queue) = 0;
  virtual void do_wait_event(QueueId queue, const Event& event) = 0;
  virtual void do_begin_capture(QueueId queue, TraceId trace) = 0;
  // If it throws, the backend has discarded the capture (and its pool); the queue is free again.
  virtual std::shared_ptr<TraceBase> do_end_capture(QueueId queue) = 0;
  virtual void do_execute_trace(TraceBase& trace, QueueId queue, Blocking blocking) = 0;
  virtual void do_release_trace(TraceBase& trace) noexcept = 0;
  virtual void do_fill_stats(DeviceStats& stats) const = 0;
  // Waits for all queued work and drops finished work's references, so buffers whose handles
  // are gone return to the allocator; called before an allocation reports out_of_memory. Skips
  // a queue that is capturing. Failures stay sticky for the next report.
  virtual void do_reclaim() noexcept = 0;
  // First step of close(): waits for queued work and drops a capture in progress (with its
  // pool). The base releases the traces afterwards.
  virtual void do_shutdown() noexcept = 0;

  [[nodiscard]] std::string queue_label(QueueId queue) const;  // "queue 1 of cpu:0"

 private:
  friend class Buffer;
  // The queue kDefaultQueue stands for, checked to exist; throws if the device is closed.
  QueueId resolve_queue(QueueId queue, std::string_view what) const;
  void require_open(std::string_view what) const;
  void check_queue(QueueId queue, std::string_view what) const;
  void check_own_buffer(const Buffer& buffer, std::string_view what) const;
  std::shared_ptr<TraceBase> find_trace(TraceId trace, std::string_view what) const;

  std::string backend_;
  DeviceId id_;
  std::string name_;
  std::uint32_t num_queues_;
  std::shared_ptr<detail::DeviceLink> link_;

  mutable std::mutex mutex_;  // guards the fields below
  std::atomic<bool> capturing_{false};
  std::optional<QueueId> capture_queue_;
  TraceId capture_trace_{};
  std::thread::id capture_thread_;
  std::unordered_map<std::uint64_t, std::shared_ptr<TraceBase>> traces_;
};

}  // namespace retrace
