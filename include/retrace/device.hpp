// Device: memory, in-order command queues, and traces of the work enqueued on a queue, replayed
// later without re-dispatching a single op. The same class for every backend (the CPU device,
// CUDA); open one by name with retrace::open_device (retrace/registry.hpp) or with a backend's
// own function (open_cpu_device, open_cuda_device):
//
//   auto device = retrace::open_device("cpu");
//   device->begin_trace_capture(retrace::kDefaultQueue);
//   auto y = retrace::ops::add(x, 1.0);            // recorded, not executed
//   retrace::TraceId trace = device->end_trace_capture(retrace::kDefaultQueue);
//   device->execute_trace(trace, retrace::kDefaultQueue, retrace::Blocking::yes);  // y = x + 1
//   device->release_trace(trace);
//
// Rules every backend follows (docs/contract.md has the whole contract):
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
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace retrace {

class Backend;
class BackendTrace;
class Device;

class Tensor;

namespace detail {
class EventState;
struct DeviceCore;
// Marks a tracer's output as written by replay `version` (the tracer calls it after replays).
void stamp_replay_version(Tensor& output, std::uint64_t version) noexcept;

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

// A block of device memory, shared by tensors through std::shared_ptr and returned to the
// device when the last owner drops it. Made only by Device::allocate.
class Buffer : public std::enable_shared_from_this<Buffer> {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  // nullptr once the device has been closed.
  [[nodiscard]] Device* device() const noexcept { return link_->device.load(); }
  [[nodiscard]] const detail::DeviceLink& link() const noexcept { return *link_; }
  // Stable address a trace bakes in.
  [[nodiscard]] std::uint64_t address() const noexcept { return address_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // The pointer the backend's kernels use (host memory only on host-visible devices).
  [[nodiscard]] void* data() const noexcept { return data_; }
  // The trace whose capture allocated the buffer (still set after that trace is released).
  [[nodiscard]] std::optional<TraceId> trace() const noexcept { return trace_; }
  // Which replay last overwrote the buffer as a tracer's output (0: none); see Tensor.
  [[nodiscard]] std::uint64_t replay_version() const noexcept {
    return replay_version_.load(std::memory_order_relaxed);
  }

  // How often the buffer has been written, as far as the device knows: on the CPU device, each
  // command that writes it (eager or replayed, counted as it runs), each Device::write into it,
  // and each mark_written(). A backend that keeps data derived from the contents (the CPU
  // device's packed copies of a weight) compares it with the count it derived them at.
  [[nodiscard]] std::uint64_t write_count() const noexcept {
    return writes_.load(std::memory_order_acquire);
  }
  // Host writes through data() are invisible to the device: call this after them (before the
  // next command that reads the buffer), or replays may multiply by a packed copy of the
  // weight as it was. Ops, Device::write and Tensor's host copies count by themselves.
  void mark_written() const noexcept { writes_.fetch_add(1, std::memory_order_acq_rel); }

  // Data a backend derives from the buffer's contents, under a key of its choosing, freed with
  // the buffer: stores `value` under `key` unless one is there already, and returns the stored
  // one. The backend checks write_count() itself.
  std::shared_ptr<void> add_derived(std::uint64_t key, std::shared_ptr<void> value) const;

 private:
  friend class Device;
  friend void detail::stamp_replay_version(Tensor& output, std::uint64_t version) noexcept;
  Buffer(std::shared_ptr<detail::DeviceLink> link, void* data, std::uint64_t address,
         std::size_t size, std::optional<TraceId> trace) noexcept;

  std::shared_ptr<detail::DeviceLink> link_;
  void* data_;
  std::uint64_t address_;
  std::size_t size_;
  std::optional<TraceId> trace_;
  std::atomic<std::uint64_t> replay_version_{0};
  mutable std::atomic<std::uint64_t> writes_{0};
  mutable std::mutex derived_mutex_;
  mutable std::vector<std::pair<std::uint64_t, std::shared_ptr<void>>> derived_;
};

// A point in a queue's work. Recorded with Device::record_event, waited on by another queue
// (Device::wait_event) or the host (synchronize).
class Event {
 public:
  Event() = default;

  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  [[nodiscard]] QueueId queue() const noexcept { return queue_; }
  [[nodiscard]] Device* device() const noexcept { return link_ ? link_->device.load() : nullptr; }
  // Both throw failed_precondition once the event's device is closed.
  [[nodiscard]] bool is_complete() const;
  // Host waits until the queue has passed the event. A capture violation during a capture.
  void synchronize() const;

 private:
  friend class Device;
  Event(std::shared_ptr<detail::EventState> state, std::shared_ptr<detail::DeviceLink> link,
        QueueId queue) noexcept;

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
  std::uint64_t commands_executed = 0;  // kernels submitted to run, eager and replayed
  std::uint64_t traces_executed = 0;
};

struct TraceInfo {
  TraceId id{};
  QueueId captured_on{};
  std::size_t commands = 0;
  std::size_t bytes = 0;             // private pool memory reserved by the trace
  std::size_t pool_buffers = 0;      // buffers allocated during the capture
  std::size_t external_buffers = 0;  // buffers from outside the pool that the trace uses
  std::vector<std::string_view> ops;  // op name of each command, in recorded order
  // Addresses of the buffers each command reads or writes (for listings and graphs).
  std::vector<std::vector<std::uint64_t>> command_buffers;
};

// Where a trace's replay spends its time: each command timed on its own over several replays
// (Device::profile_trace). Timing each command adds a clock read per command, so the sum of
// the commands' times is close to, not exactly, the time of an untimed replay.
struct TraceProfile {
  TraceId trace{};
  std::size_t replays = 0;
  std::vector<std::string_view> ops;  // op name of each command, in recorded order
  std::vector<double> command_ns;     // median time of each command over the replays
  double replay_ns = 0;               // median time of one whole timed replay
};

enum class Capability : std::uint8_t {
  trace_capture,        // begin/end/execute/release_trace
  events,               // record_event / wait_event
  async_queues,         // queues run on their own threads or streams
  host_visible_memory,  // Buffer::data() is readable by the host
};

// Options every device has (open_device takes them); backends' own option structs
// (CpuDeviceOptions, CudaDeviceOptions) carry them too.
// Checked by make_device: num_queues in [1, 64], memory_bytes > 0, guard_bytes <= a quarter of
// the memory (and 0 unless the backend's memory is host visible).
struct DeviceOptions {
  DeviceId id{0};  // the name is "<backend>:<id>"
  std::size_t memory_bytes = std::size_t{1} << 30;
  std::size_t trace_region_bytes = std::size_t{256} << 20;
  std::uint32_t num_queues = 2;
  std::size_t guard_bytes = 0;
  // Threads a device's kernels may use, the thread running its queue included: 0, the backend's
  // default (CPU: the process's kernel threads, one per CPU of its affinity mask, shared by
  // every CPU device); 1, that thread only (CPU: GEMMs single-threaded too, so devices working
  // side by side, like a mesh's members, each keep to a core); n > 1, at most n of the shared
  // kernel threads. Backends whose kernels run elsewhere (CUDA) ignore it.
  std::uint32_t kernel_threads = 0;
};

class Device final {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device();  // closes

  [[nodiscard]] DeviceId id() const noexcept { return id_; }
  // Unique in the process and never reused, unlike the address of the Device object.
  [[nodiscard]] std::uint64_t uid() const noexcept { return link_->uid; }
  [[nodiscard]] std::string_view backend() const noexcept { return backend_name_; }
  [[nodiscard]] const std::string& name() const noexcept { return link_->name; }  // "cpu:0"
  [[nodiscard]] std::uint32_t num_queues() const noexcept { return num_queues_; }
  [[nodiscard]] bool supports(Capability capability) const noexcept;
  // Whether the device has an implementation of the kernel. An op whose kernel (or dtype, or
  // size) a device lacks raises an `unimplemented` error naming the op and the device.
  [[nodiscard]] bool supports(KernelId kernel) const noexcept;
  // Why the device would refuse this launch (its kernel lacks the dtype, size or operand
  // layout), or nullptr when enqueue would take it. Ops use it to pick a form the device runs.
  [[nodiscard]] const char* unsupported_reason(const KernelLaunch& launch) const noexcept;
  // "queue 1 of cpu:0"
  [[nodiscard]] std::string queue_label(QueueId queue) const;
  // What the device runs on ("NVIDIA H200 (sm_90, 139.8 GiB)", "2 cores, AVX2 kernels"), or "".
  [[nodiscard]] std::string description() const;

  // --- memory -------------------------------------------------------------------------------
  // Size 0 is allowed and still yields a distinct address. On the capturing thread the buffer
  // comes from the trace's private pool.
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
  // Replays the trace `replays` times on `queue` (blocking, after the queue's earlier work) with
  // every command timed; a profile per command (see TraceProfile). unimplemented on backends
  // that cannot time single commands (CUDA runs a trace as one graph).
  [[nodiscard]] TraceProfile profile_trace(TraceId trace, QueueId queue, std::size_t replays = 10);
  [[nodiscard]] std::vector<TraceId> live_traces() const;
  [[nodiscard]] bool is_capturing() const noexcept;
  [[nodiscard]] std::optional<TraceId> capturing_trace(QueueId queue) const;
  // Whether this thread is capturing on the device (its ops are recorded, not run).
  [[nodiscard]] bool is_capturing_on_this_thread() const noexcept;
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

  // The backend behind the device (see retrace/backend.hpp: backend_of<B>(device)).
  [[nodiscard]] Backend& backend_impl() const noexcept;

 private:
  friend class Buffer;
  friend class Event;
  friend std::unique_ptr<Device> make_device(std::unique_ptr<Backend>, const DeviceOptions&);
  friend BackendTrace* backend_trace(Device&, TraceId);
  Device(std::unique_ptr<Backend> backend, const DeviceOptions& options);

  void free_buffer(const Buffer& buffer) noexcept;
  [[nodiscard]] std::shared_ptr<Buffer> allocate_block(std::size_t bytes,
                                                       std::optional<TraceId> capture);
  // The queue kDefaultQueue stands for, checked to exist; throws if the device is closed.
  QueueId resolve_queue(QueueId queue, std::string_view what) const;
  void require_open(std::string_view what) const;
  void check_own_buffer(const Buffer& buffer, std::string_view what) const;
  void record_command(const KernelLaunch& launch);
  void report_memory_damage();

  std::string backend_name_;
  DeviceId id_;
  std::uint32_t num_queues_;
  std::shared_ptr<detail::DeviceLink> link_;
  std::unique_ptr<detail::DeviceCore> core_;
};

}  // namespace retrace
