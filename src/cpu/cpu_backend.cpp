// CpuBackend: the backend of the CPU device (see retrace/cpu.hpp), the reference a new backend
// starts from. Memory is an anonymous mapping; each queue is a CpuQueue (a worker thread or the
// calling thread); a trace is a Program of plain {kernel, parameters} commands.
#include "cpu/isa.hpp"
#include "cpu/parallel.hpp"
#include "cpu/queue.hpp"
#include "retrace/backend.hpp"
#include "retrace/cpu.hpp"
#include "retrace/error.hpp"
#include "retrace/registry.hpp"
#include "util/cpus.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace retrace {
namespace cpu {
namespace {

// The device memory: an anonymous mapping, so pages are only committed when touched.
class MappedRegion {
 public:
  MappedRegion(const std::string& device_name, std::size_t bytes)
      : bytes_(round_up(std::max<std::size_t>(bytes, 1))) {
    RETRACE_CHECK(bytes > 0, invalid_argument, "{}: memory_bytes must be positive", device_name);
    void* mapped = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    RETRACE_CHECK(mapped != MAP_FAILED, out_of_memory,
                  "{}: cannot reserve {} bytes for the device memory ({})", device_name, bytes_,
                  std::strerror(errno));
    base_ = static_cast<std::byte*>(mapped);
  }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { ::munmap(base_, bytes_); }

  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  static constexpr std::size_t kAlignment = 64;
  // Rounds down near the top of the range instead of wrapping to a tiny size.
  static std::size_t round_up(std::size_t n) noexcept {
    return n > SIZE_MAX - kAlignment ? n / kAlignment * kAlignment
                                     : (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  std::size_t bytes_;
  std::byte* base_ = nullptr;
};

struct CpuTrace final : BackendTrace {
  std::shared_ptr<const Program> program;
  std::mutex mutex;
  std::vector<std::uint64_t> last_submission;  // per queue: sequence number of the latest replay
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuDeviceOptions& options)
      : options_(options),
        choice_(choose_variant(options.kernel_isa, std::getenv("RETRACE_CPU_ISA"), this_cpu(),
                               fmt::format("cpu:{}", options.id))),
        kernels_(*choice_.variant),
        region_(fmt::format("cpu:{}", options.id), options.memory_bytes) {
    queues_.reserve(options.num_queues);
    for (std::uint32_t q = 0; q < options.num_queues; ++q) {
      queues_.push_back(std::make_unique<CpuQueue>(
          fmt::format("queue {} of cpu:{}", q, options.id), fmt::format("rt cpu:{} q{}", options.id, q),
          options, kernels_));
    }
  }

  [[nodiscard]] const KernelVariant& kernels() const noexcept { return kernels_; }

  ~CpuBackend() override {
    queues_.clear();  // joins the workers; buffers they still hold see a closed device
  }

  std::string_view name() const noexcept override { return "cpu"; }

  bool supports(Capability capability) const noexcept override {
    switch (capability) {
      case Capability::trace_capture:
      case Capability::events:
      case Capability::host_visible_memory: return true;
      case Capability::async_queues: return options_.execution == ExecutionMode::worker;
    }
    return false;
  }

  bool supports(KernelId kernel) const noexcept override { return kernels_.supports(kernel); }

  std::string description() const override {
    const unsigned usable = util::usable_cpus(), host = util::host_cpus();
    const std::string cpus = usable == host
                                 ? fmt::format("{} hardware threads", host)
                                 : fmt::format("{} of {} hardware threads usable", usable, host);
    return fmt::format(
        "{}, {} queues ({}), {} kernels ({}), bfloat16 products on {}{}", cpus, queues_.size(),
        options_.execution == ExecutionMode::worker ? "worker threads" : "inline", kernels_.name,
        choice_.how, kernels_.bfloat16_gemm_path(),
        options_.kernel_threads == 1 ? ", each on its queue's thread"
        : options_.kernel_threads > 1
            ? fmt::format(", kernels split over at most {} threads", options_.kernel_threads)
            : std::string());
  }

  MemoryRegion region() override { return {region_.base(), region_.size(), 64, true}; }

  void write(QueueId queue, const Buffer& dst, std::size_t offset, std::span<const std::byte> src,
             Blocking blocking) override {
    auto* target = static_cast<std::byte*>(dst.data()) + offset;
    if (blocking == Blocking::yes) {
      // After the queue's earlier work, straight from the caller's memory: no staging copy
      // (loading weights costs their size once, not twice).
      synchronize(queue);
      dst.mark_written();
      if (!src.empty()) std::memcpy(target, src.data(), src.size());
      return;
    }
    auto program = std::make_shared<Program>();
    auto staged = std::make_unique<std::byte[]>(std::max<std::size_t>(src.size(), 1));
    if (!src.empty()) std::memcpy(staged.get(), src.data(), src.size());
    CopyParams params{staged.get(), target, static_cast<std::int64_t>(src.size())};
    Buffer* buffers[] = {const_cast<Buffer*>(&dst)};
    const Buffer* marks[] = {&dst};
    program->append(kernels_.resolve(make_launch("write", params, buffers)), "write", &params,
                    sizeof params, marks);
    program->retained.push_back(const_cast<Buffer&>(dst).shared_from_this());
    program->staging.push_back(std::move(staged));
    queue_at(queue).submit(std::move(program), blocking);
  }

  void read(QueueId queue, const Buffer& src, std::size_t offset,
            std::span<std::byte> dst) override {
    synchronize(queue);
    if (!dst.empty()) {
      std::memcpy(dst.data(), static_cast<const std::byte*>(src.data()) + offset, dst.size());
    }
  }

  void enqueue(QueueId queue, const KernelLaunch& launch) override {
    queue_at(queue).enqueue(launch);
  }

  void synchronize(QueueId queue) override {
    queue_at(queue).wait_idle();
    report_errors(queue);
  }

  std::shared_ptr<retrace::detail::EventState> record_event(QueueId queue) override {
    auto event = std::make_shared<CpuEventState>();
    queue_at(queue).signal(event);
    return event;
  }

  void wait_event(QueueId queue,
                  std::shared_ptr<const retrace::detail::EventState> event) override {
    RETRACE_CHECK(dynamic_cast<const CpuEventState*>(event.get()) != nullptr, invalid_argument,
                  "wait_event: the event was not recorded by a CPU device");
    queue_at(queue).wait(std::move(event));
  }

  void begin_capture(QueueId queue, TraceId trace) override { queue_at(queue).begin_capture(trace); }

  std::unique_ptr<BackendTrace> end_capture(QueueId queue) override {
    auto trace = std::make_unique<CpuTrace>();
    trace->program = queue_at(queue).end_capture();
    trace->last_submission.assign(queues_.size(), 0);
    return trace;
  }

  void abort_capture(QueueId queue) noexcept override { (void)queue_at(queue).end_capture(); }

  void execute(BackendTrace& base, TraceId id, QueueId queue, Blocking blocking) override {
    replay(static_cast<CpuTrace&>(base), id, queue, blocking, {}, "execute_trace");
  }

  void execute_timed(BackendTrace& base, TraceId id, QueueId queue,
                     std::span<std::uint64_t> command_ns) override {
    replay(static_cast<CpuTrace&>(base), id, queue, Blocking::yes, command_ns, "profile_trace");
  }

  void release(BackendTrace& base, TraceId) noexcept override {
    auto& trace = static_cast<CpuTrace&>(base);
    std::lock_guard lock(trace.mutex);
    for (std::size_t q = 0; q < trace.last_submission.size(); ++q) {
      queues_[q]->finish_through(trace.last_submission[q]);  // no replay may touch freed memory
    }
    trace.program.reset();
  }

  // A capturing queue records into its trace: waiting for it only waits for the work it ran
  // before the capture began.
  void reclaim() noexcept override {
    for (auto& queue : queues_) queue->wait_idle();
  }

  void shutdown() noexcept override { reclaim(); }

 private:
  CpuQueue& queue_at(QueueId queue) { return *queues_[queue.value]; }

  // A replay of the trace on the queue; a non-empty command_ns (one entry per command, blocking
  // replays only) gets each command's time.
  void replay(CpuTrace& trace, TraceId id, QueueId queue, Blocking blocking,
              std::span<std::uint64_t> command_ns, std::string_view what) {
    report_errors(queue);
    {
      std::lock_guard lock(trace.mutex);
      RETRACE_CHECK(trace.program, failed_precondition,
                    "{}: trace {} on {} was released while this call was starting", what, id,
                    device().name());
      RETRACE_ASSERT(command_ns.empty() || (blocking == Blocking::yes &&
                                            command_ns.size() == trace.program->size()),
                     "a blocking replay with one time per command");
      trace.last_submission[queue.value] = queue_at(queue).submit(
          trace.program, blocking, command_ns.empty() ? nullptr : command_ns.data());
    }
    if (blocking == Blocking::yes) report_errors(queue);
  }

  // Throws the queue's sticky error.
  void report_errors(QueueId queue) {
    if (auto error = queue_at(queue).take_error()) RETRACE_FAIL(device_error, "{}", *error);
  }

  CpuDeviceOptions options_;
  VariantChoice choice_;
  const KernelVariant& kernels_;
  MappedRegion region_;
  std::vector<std::unique_ptr<CpuQueue>> queues_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Device> open_cpu_device(const CpuDeviceOptions& options) {
  DeviceOptions common{options.id,         options.memory_bytes, options.trace_region_bytes,
                       options.num_queues, options.guard_bytes,  options.kernel_threads};
  RETRACE_CHECK(options.num_queues >= 1 && options.num_queues <= 64, invalid_argument,
                "cpu:{}: num_queues must be in [1, 64], got {}", options.id, options.num_queues);
  std::string threads_error, spin_error;
  (void)cpu::kernel_threads_from_environment(&threads_error);
  RETRACE_CHECK(threads_error.empty(), invalid_argument, "cpu:{}: {}", options.id, threads_error);
  (void)cpu::kernel_spin_us_from_environment(&spin_error);
  RETRACE_CHECK(spin_error.empty(), invalid_argument, "cpu:{}: {}", options.id, spin_error);
  return make_device(std::make_unique<cpu::CpuBackend>(options), common);
}

std::vector<CpuKernelIsa> cpu_kernel_isas() {
  std::vector<CpuKernelIsa> out;
  for (const cpu::VariantInfo& v : cpu::built_variants()) {
    out.push_back({std::string(v.name), std::string(v.march),
                   cpu::unsupported_reason(v.name, cpu::this_cpu())});
  }
  return out;
}

std::pair<std::string, std::string> default_cpu_kernel_isa() {
  const cpu::VariantChoice choice =
      cpu::choose_variant("", std::getenv("RETRACE_CPU_ISA"), cpu::this_cpu(), "cpu");
  return {choice.variant->name, choice.how};
}

std::string cpu_kernel_isa(Device& device) {
  const auto* backend = backend_of<cpu::CpuBackend>(device);
  return backend == nullptr ? std::string() : std::string(backend->kernels().name);
}

std::string cpu_bfloat16_products(Device& device) {
  const auto* backend = backend_of<cpu::CpuBackend>(device);
  return backend == nullptr ? std::string() : std::string(backend->kernels().bfloat16_gemm_path());
}

std::int64_t cpu_packed_weight_bytes(Device& device) {
  const auto* backend = backend_of<cpu::CpuBackend>(device);
  return backend == nullptr ? 0 : backend->kernels().packed_weight_bytes();
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
