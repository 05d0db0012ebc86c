// CpuDevice: the Device interface on the host CPU (see retrace/cpu.hpp).
#include "core/arena.hpp"
#include "cpu/queue.hpp"
#include "retrace/cpu.hpp"
#include "retrace/error.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace retrace {
namespace cpu {
namespace {

// The arena's backing: an anonymous mapping, so pages are only committed when touched.
class MappedRegion {
 public:
  MappedRegion(const std::string& device_name, std::size_t bytes)
      : bytes_(detail::Arena::round_capacity(std::max<std::size_t>(bytes, 1))) {
    RETRACE_CHECK(bytes > 0, invalid_argument, "{}: memory_bytes must be positive", device_name);
    void* mapped = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    RETRACE_CHECK(mapped != MAP_FAILED, out_of_memory,
                  "{}: cannot reserve {} bytes for the arena ({})", device_name, bytes_,
                  std::strerror(errno));
    base_ = static_cast<std::byte*>(mapped);
  }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { ::munmap(base_, bytes_); }

  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  std::size_t bytes_;
  std::byte* base_ = nullptr;
};

struct CpuTrace final : TraceBase {
  std::shared_ptr<const Program> program;
  std::mutex mutex;
  std::vector<std::uint64_t> last_submission;  // per queue: sequence number of the latest replay
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options)
      : Device("cpu", options.id, options.num_queues),
        options_(options),
        region_(name(), options.memory_bytes),
        memory_(name(), region_.base(), region_.size(), options.trace_region_bytes,
                options.guard_bytes) {
    queues_.reserve(options.num_queues);
    for (std::uint32_t q = 0; q < options.num_queues; ++q) {
      queues_.push_back(
          std::make_unique<CpuQueue>(queue_label(QueueId{q}), options, commands_executed_));
    }
  }

  ~CpuDevice() override {
    close();
    queues_.clear();  // joins the workers; buffers they still hold see a closed device
  }

  bool supports(Capability capability) const noexcept override {
    switch (capability) {
      case Capability::trace_capture:
      case Capability::events:
      case Capability::host_visible_memory: return true;
      case Capability::async_queues: return options_.execution == ExecutionMode::worker;
    }
    return false;
  }

 protected:
  BlockInfo do_allocate(std::size_t bytes, std::optional<TraceId> capture) override {
    return memory_.allocate(bytes, capture);
  }

  void do_free(const BlockInfo& block) noexcept override {
    if (auto damage = memory_.free(block)) {
      std::lock_guard lock(error_mutex_);
      if (memory_error_.empty()) memory_error_ = std::move(*damage);
    }
  }

  void do_write(QueueId queue, const Buffer& dst, std::size_t offset,
                std::span<const std::byte> src, Blocking blocking) override {
    if (blocking == Blocking::yes) {
      // After the queue's earlier work, straight from the caller's memory: no staging copy
      // (loading weights costs their size once, not twice).
      do_synchronize(queue);
      if (!src.empty()) std::memcpy(static_cast<std::byte*>(dst.data()) + offset, src.data(), src.size());
      return;
    }
    auto program = std::make_shared<Program>();
    auto staged = std::make_unique<std::byte[]>(std::max<std::size_t>(src.size(), 1));
    if (!src.empty()) std::memcpy(staged.get(), src.data(), src.size());
    CopyParams params{staged.get(), static_cast<std::byte*>(dst.data()) + offset,
                      static_cast<std::int64_t>(src.size())};
    Buffer* buffers[] = {const_cast<Buffer*>(&dst)};
    program->append(resolve_kernel(make_launch(KernelId::copy, "write", params, buffers)),
                    "write", &params, sizeof params);
    program->retained.push_back(const_cast<Buffer&>(dst).shared_from_this());
    program->staging.push_back(std::move(staged));
    queue_at(queue).submit(std::move(program), blocking);
  }

  void do_read(QueueId queue, const Buffer& src, std::size_t offset,
               std::span<std::byte> dst) override {
    do_synchronize(queue);
    if (!dst.empty()) {
      std::memcpy(dst.data(), static_cast<const std::byte*>(src.data()) + offset, dst.size());
    }
  }

  void do_enqueue(QueueId queue, const KernelLaunch& launch) override {
    queue_at(queue).enqueue(launch);
  }

  void do_synchronize(QueueId queue) override {
    queue_at(queue).wait_idle();
    report_errors(queue);
  }

  std::shared_ptr<detail::EventState> do_record_event(QueueId queue) override {
    auto event = std::make_shared<CpuEventState>();
    queue_at(queue).signal(event);
    return event;
  }

  void do_wait_event(QueueId queue, const Event& event) override {
    queue_at(queue).wait(event.state());
  }

  void do_begin_capture(QueueId queue, TraceId trace) override {
    memory_.begin_pool(trace);
    queue_at(queue).begin_capture(trace);
    capture_queue_ = queue;
  }

  std::shared_ptr<TraceBase> do_end_capture(QueueId queue) override {
    auto trace = std::make_shared<CpuTrace>();
    std::shared_ptr<Program> program = queue_at(queue).end_capture();
    const auto [bytes, blocks] = memory_.seal_pool(*program->trace);
    trace->info.commands = program->size();
    trace->info.bytes = bytes;
    trace->info.pool_buffers = blocks;
    trace->info.external_buffers = program->retained.size();
    trace->info.ops.assign(program->ops.begin(), program->ops.end());
    trace->info.command_buffers = std::move(program->command_buffers);
    trace->program = std::move(program);
    trace->last_submission.assign(queues_.size(), 0);
    capture_queue_.reset();
    return trace;
  }

  void do_execute_trace(TraceBase& base, QueueId queue, Blocking blocking) override {
    auto& trace = static_cast<CpuTrace&>(base);
    report_errors(queue);
    std::lock_guard lock(trace.mutex);
    RETRACE_CHECK(trace.program, failed_precondition,
                  "execute_trace: trace {} on {} was released while this call was starting",
                  trace.info.id, name());
    trace.last_submission[queue.value] = queue_at(queue).submit(trace.program, blocking);
    traces_executed_.fetch_add(1, std::memory_order_relaxed);
    if (blocking == Blocking::yes) report_errors(queue);
  }

  void do_release_trace(TraceBase& base) noexcept override {
    auto& trace = static_cast<CpuTrace&>(base);
    std::lock_guard lock(trace.mutex);
    for (std::size_t q = 0; q < trace.last_submission.size(); ++q) {
      queues_[q]->wait_for(trace.last_submission[q]);  // no replay may touch freed memory
    }
    memory_.release_pool(trace.info.id);
    trace.program.reset();
  }

  // A capturing queue records into its trace: waiting for it only waits for the work it ran
  // before the capture began.
  void do_reclaim() noexcept override {
    for (auto& queue : queues_) queue->wait_idle();
  }

  void do_shutdown() noexcept override {
    do_reclaim();
    abandon_capture();
  }

  void do_fill_stats(DeviceStats& stats) const override {
    memory_.fill_stats(stats);
    stats.commands_executed = commands_executed_.load(std::memory_order_relaxed);
    stats.traces_executed = traces_executed_.load(std::memory_order_relaxed);
  }

 private:
  CpuQueue& queue_at(QueueId queue) { return *queues_[queue.value]; }

  // Throws the queue's sticky error, or a guard violation found when a buffer was freed.
  void report_errors(QueueId queue) {
    if (auto error = queue_at(queue).take_error()) RETRACE_FAIL(device_error, "{}", *error);
    std::string memory_error;
    {
      std::lock_guard lock(error_mutex_);
      memory_error.swap(memory_error_);
    }
    RETRACE_CHECK(memory_error.empty(), device_error, "{}", memory_error);
  }

  // A capture still open when the device closes is dropped with its pool.
  void abandon_capture() noexcept {
    if (!capture_queue_) return;
    std::shared_ptr<Program> program = queue_at(*capture_queue_).end_capture();
    if (program && program->trace) memory_.release_pool(*program->trace);
    capture_queue_.reset();
  }

  CpuDeviceOptions options_;
  MappedRegion region_;
  detail::Arena memory_;
  std::vector<std::unique_ptr<CpuQueue>> queues_;
  std::optional<QueueId> capture_queue_;  // guarded by the base's capture protocol
  std::atomic<std::uint64_t> commands_executed_{0};
  std::atomic<std::uint64_t> traces_executed_{0};
  std::mutex error_mutex_;
  std::string memory_error_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Device> open_cpu_device(const CpuDeviceOptions& options) {
  return std::make_unique<cpu::CpuDevice>(options);
}

std::vector<std::unique_ptr<Device>> open_cpu_devices(std::size_t count,
                                                      CpuDeviceOptions options) {
  std::vector<std::unique_ptr<Device>> devices;
  devices.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    options.id = DeviceId{static_cast<std::uint32_t>(i)};
    devices.push_back(open_cpu_device(options));
  }
  return devices;
}

}  // namespace retrace
