// CudaDevice: the Device interface on an NVIDIA GPU (see retrace/cuda.hpp).
//
// Lock order: a queue's mutex, then a trace's mutex; the device's own mutexes (sites, pools)
// are leaves. Nothing here calls a CUDA API that stream capture forbids on a capturing thread.
#include "core/arena.hpp"
#include "cuda/launch.hpp"
#include "retrace/cuda.hpp"
#include "retrace/error.hpp"
#include "retrace/log.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_set>

namespace retrace {
namespace cuda {
namespace {

constexpr std::size_t kAlignment = 256;
constexpr std::size_t kRetainEvery = 32;                      // eager commands per event
constexpr std::size_t kStagingChunk = std::size_t{16} << 20;  // largest pinned staging buffer

std::string describe(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

// Throws device_error naming `what` if `error` is not cudaSuccess.
void check(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();  // clear a non-sticky error so the device stays usable
    RETRACE_FAIL(device_error, "{}: {}", what, describe(error));
  }
}

// The GPU this device lives on is made current on every entry point (cheap when it already is).
void make_current(int ordinal) {
  check(cudaSetDevice(ordinal), "cudaSetDevice");
}

// Stream captures this thread has open (on any CUDA device).
thread_local int t_open_captures = 0;

// While this thread has a capture open, CUDA refuses calls it deems unsafe (waiting on a
// stream, allocating) and invalidates the capture, even when they concern other streams. The
// device's own bookkeeping (reaping finished work, reading or waiting on another queue or
// device, allocating staging memory) never touches the capturing stream, so it runs in the
// relaxed mode; kernel launches never do.
class RelaxedCapture {
 public:
  RelaxedCapture() noexcept {
    if (t_open_captures > 0) active_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
  }
  ~RelaxedCapture() {
    if (active_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool active_ = false;
};

// Failure records (device memory) with their host-mapped flags, in slabs.
struct Domain {
  FailureRecord* record = nullptr;  // device
  unsigned int* flag = nullptr;     // host view of the mapped flag
  unsigned int* flag_device = nullptr;

  [[nodiscard]] bool failed() const noexcept {
    return *reinterpret_cast<volatile const unsigned int*>(flag) != 0u;
  }
};

class DomainPool {
 public:
  ~DomainPool() {
    for (void* slab : record_slabs_) (void)cudaFree(slab);
    for (void* slab : flag_slabs_) (void)cudaFreeHost(slab);
  }

  Domain take() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) grow();
    Domain domain = free_.back();
    free_.pop_back();
    return domain;
  }

  // The record must already be clear (fresh, or cleared after a reported failure).
  void give_back(const Domain& domain) noexcept {
    std::lock_guard lock(mutex_);
    free_.push_back(domain);
  }

 private:
  static constexpr std::size_t kSlab = 256;

  void grow() {
    RelaxedCapture relaxed;
    void* records = nullptr;
    check(cudaMalloc(&records, kSlab * sizeof(FailureRecord)), "allocating failure records");
    void* flags = nullptr;
    if (const cudaError_t e = cudaHostAlloc(&flags, kSlab * sizeof(unsigned int),
                                            cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess) {
      (void)cudaFree(records);
      check(e, "allocating mapped failure flags");
    }
    void* flags_device = nullptr;
    std::vector<FailureRecord> clear(kSlab, FailureRecord{0u, 0u, ~0ULL});
    cudaError_t e = cudaHostGetDevicePointer(&flags_device, flags, 0);
    if (e == cudaSuccess) {
      e = cudaMemcpy(records, clear.data(), kSlab * sizeof(FailureRecord), cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) {
      (void)cudaFree(records);
      (void)cudaFreeHost(flags);
      check(e, "preparing failure records");
    }
    std::memset(flags, 0, kSlab * sizeof(unsigned int));
    record_slabs_.push_back(records);
    flag_slabs_.push_back(flags);
    for (std::size_t i = 0; i < kSlab; ++i) {
      free_.push_back(Domain{static_cast<FailureRecord*>(records) + i,
                             static_cast<unsigned int*>(flags) + i,
                             static_cast<unsigned int*>(flags_device) + i});
    }
  }

  std::mutex mutex_;
  std::vector<void*> record_slabs_;
  std::vector<void*> flag_slabs_;
  std::vector<Domain> free_;
};

// Pinned host buffers for staging writes, recycled by size class.
class StagingPool {
 public:
  ~StagingPool() {
    for (auto& [size, buffers] : free_) {
      for (void* p : buffers) (void)cudaFreeHost(p);
    }
  }

  // A pinned buffer of at least `bytes`, returned to the pool when the last owner drops it.
  std::shared_ptr<void> take(std::size_t bytes, const std::shared_ptr<StagingPool>& self) {
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
      check(cudaHostAlloc(&p, size, cudaHostAllocPortable), "pinned staging");
    }
    std::weak_ptr<StagingPool> weak = self;
    return std::shared_ptr<void>(p, [weak, size](void* q) {
      if (auto pool = weak.lock()) {
        pool->give_back(q, size);
      } else {
        (void)cudaFreeHost(q);
      }
    });
  }

 private:
  // Small buffers are kept in numbers (a loop of non-blocking writes of a few values each);
  // large ones only a few. Freeing pinned memory is slow, so the pool rarely does it.
  static std::size_t keep_for(std::size_t size) noexcept {
    return size <= (std::size_t{1} << 20) ? 64 : 4;
  }

  void give_back(void* p, std::size_t size) noexcept {
    {
      std::lock_guard lock(mutex_);
      auto& buffers = free_[size];
      if (buffers.size() < keep_for(size)) {
        buffers.push_back(p);
        return;
      }
    }
    (void)cudaFreeHost(p);
  }

  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
};

class CudaEventState final : public detail::EventState {
 public:
  CudaEventState(cudaEvent_t event, int ordinal) : event_(event), ordinal_(ordinal) {}
  ~CudaEventState() override { (void)cudaEventDestroy(event_); }
  CudaEventState(const CudaEventState&) = delete;
  CudaEventState& operator=(const CudaEventState&) = delete;

  [[nodiscard]] bool is_complete() const override {
    RelaxedCapture relaxed;
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    check(e, "is_complete");
    return true;
  }
  void wait() const override {
    RelaxedCapture relaxed;
    make_current(ordinal_);
    check(cudaEventSynchronize(event_), "waiting for an event");
  }
  [[nodiscard]] cudaEvent_t event() const noexcept { return event_; }

 private:
  cudaEvent_t event_;
  int ordinal_;
};

struct CudaTrace final : TraceBase {
  std::mutex mutex;
  cudaGraphExec_t exec = nullptr;
  Domain domain;
  bool has_asserts = false;
  bool released = false;
  std::uint64_t replayed_on = 0;  // bit per queue
  std::size_t graph_nodes = 0;
  // cuBLAS workspace of the trace's GEMMs (from its pool): a replay on any queue never shares
  // a workspace with eager work or with another trace.
  std::shared_ptr<Buffer> blas_workspace;
  // Buffers from outside the trace's pool that it uses, and its scratch memory.
  std::vector<std::shared_ptr<void>> retained;
  std::unordered_set<const Buffer*> seen;
};

// Work submitted since an event, kept alive until the event has passed.
struct Retained {
  cudaEvent_t event;
  std::vector<std::shared_ptr<void>> items;
};

struct Queue {
  std::mutex mutex;
  std::string label;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  Domain domain;
  std::vector<std::shared_ptr<void>> pending;  // used by work since the last event
  std::size_t pending_commands = 0;
  std::deque<Retained> in_flight;
  std::vector<cudaEvent_t> spare_events;
  // Replays of traces that can fail (assert_finite) since the queue last reported; a trace
  // removes itself from every queue's list when it is released.
  std::vector<CudaTrace*> replayed;
  std::string released_failure;        // failure of a trace released before it was reported
  std::shared_ptr<CudaTrace> capture;  // the trace being recorded on this queue
  std::thread::id capture_thread;
  cudaEvent_t capture_fence = nullptr;  // recorded just before the capture began
};

struct Site {
  const char* op;
  std::int64_t count;
  std::uint64_t trace;  // 0: eager
  std::size_t command;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(const CudaDeviceOptions& options, std::byte* region, std::size_t region_bytes)
      : Device("cuda", options.id, options.num_queues),
        options_(options),
        region_(region),
        arena_(name(), region, region_bytes, options.trace_region_bytes, 0, kAlignment),
        staging_(std::make_shared<StagingPool>()) {
    RelaxedCapture relaxed;  // another device may be capturing on this thread
    try {
      queues_.reserve(options.num_queues);
      for (std::uint32_t q = 0; q < options.num_queues; ++q) {
        auto queue = std::make_unique<Queue>();
        queue->label = queue_label(QueueId{q});
        check(cudaStreamCreateWithFlags(&queue->stream, cudaStreamNonBlocking),
              "creating a stream");
        queues_.push_back(std::move(queue));
        Queue& created = *queues_.back();
        check_blas(cublasCreate(&created.blas), "cublasCreate");
        check_blas(cublasSetStream(created.blas, created.stream), "cublasSetStream");
        if (options.cublas_workspace_bytes > 0) {
          check(cudaMalloc(&created.blas_workspace, options.cublas_workspace_bytes),
                "allocating the cuBLAS workspace");
          check_blas(cublasSetWorkspace(created.blas, created.blas_workspace,
                                        options.cublas_workspace_bytes),
                     "cublasSetWorkspace");
        }
        created.domain = domains_.take();
      }
    } catch (...) {
      destroy_queues();
      throw;
    }
  }

  ~CudaDevice() override {
    close();
    (void)cudaSetDevice(options_.ordinal);
    RelaxedCapture relaxed;
    for (auto& queue : queues_) {
      queue->replayed.clear();
      queue->pending.clear();
      for (auto& batch : queue->in_flight) (void)cudaEventDestroy(batch.event);
      queue->in_flight.clear();
    }
    destroy_queues();
    (void)cudaFree(region_);
  }

  bool supports(Capability capability) const noexcept override {
    switch (capability) {
      case Capability::trace_capture:
      case Capability::events:
      case Capability::async_queues:
        return true;
      case Capability::host_visible_memory:
        return false;
    }
    return false;
  }

  cudaStream_t stream(QueueId queue) const { return queues_.at(queue.value)->stream; }

  cudaGraphExec_t graph_exec(TraceId id) {
    std::lock_guard lock(traces_mutex_);
    auto found = captured_.find(id.value);
    RETRACE_CHECK(found != captured_.end(), invalid_argument,
                  "cuda_graph_exec: trace {} does not exist on {} (never captured, or released)",
                  id, name());
    return found->second->exec;
  }

 protected:
  BlockInfo do_allocate(std::size_t bytes, std::optional<TraceId> capture) override {
    return arena_.allocate(bytes, capture);
  }

  void do_free(const BlockInfo& block) noexcept override { (void)arena_.free(block); }

  void do_write(QueueId queue, const Buffer& dst, std::size_t offset,
                std::span<const std::byte> src, Blocking blocking) override {
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    reap(q);
    auto* target = static_cast<std::byte*>(dst.data()) + offset;
    for (std::size_t done = 0; done < src.size();) {
      const std::size_t n = std::min(kStagingChunk, src.size() - done);
      std::shared_ptr<void> staging = staging_->take(n, staging_);
      std::memcpy(staging.get(), src.data() + done, n);
      check(cudaMemcpyAsync(target + done, staging.get(), n, cudaMemcpyHostToDevice, q.stream),
            fmt::format("write to {}", q.label));
      q.pending.push_back(std::move(staging));
      done += n;
    }
    q.pending.push_back(const_cast<Buffer&>(dst).shared_from_this());
    mark(q);
    if (blocking == Blocking::yes) drain_and_report(q);
  }

  void do_read(QueueId queue, const Buffer& src, std::size_t offset,
               std::span<std::byte> dst) override {
    RelaxedCapture relaxed;  // another device (or queue) may be capturing on this thread
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    drain_and_report(q);
    if (dst.empty()) return;
    check(cudaMemcpyAsync(dst.data(), static_cast<const std::byte*>(src.data()) + offset,
                          dst.size(), cudaMemcpyDeviceToHost, q.stream),
          fmt::format("read from {}", q.label));
    check(cudaStreamSynchronize(q.stream), fmt::format("read from {}", q.label));
  }

  void do_enqueue(QueueId queue, const KernelLaunch& launch) override {
    make_current(options_.ordinal);
    if (const char* reason = unsupported_reason(launch.kernel, launch.params)) {
      RETRACE_FAIL(invalid_argument, "{}: the CUDA device has no kernel for {}", launch.op, reason);
    }
    // Scratch first, outside the queue's lock (allocation takes the base's lock); on the
    // capturing thread it comes from the trace's pool and stays with the trace.
    std::shared_ptr<Buffer> scratch;
    if (const std::size_t bytes = scratch_bytes(launch.kernel, launch.params); bytes > 0) {
      scratch = allocate(bytes);
    }
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    CudaTrace* trace = q.capture.get();
    if (trace == nullptr) reap(q);
    if (trace != nullptr && uses_blas(launch.kernel) && !trace->blas_workspace) {
      give_trace_workspace(q, *trace);
    }

    LaunchContext ctx;
    ctx.stream = q.stream;
    ctx.cublas = q.blas;
    const Domain& domain = trace != nullptr ? trace->domain : q.domain;
    ctx.record = domain.record;
    ctx.host_flag = domain.flag_device;
    if (scratch) ctx.scratch = scratch->data();
    if (launch.kernel == KernelId::assert_finite) {
      const auto& p = *static_cast<const AssertFiniteParams*>(launch.params);
      ctx.site = register_site(Site{launch.op, p.count, trace ? trace->info.id.value : 0,
                                    trace ? trace->info.commands : 0});
      if (trace != nullptr) trace->has_asserts = true;
    }

    if (trace == nullptr) {  // kept alive before launching: a failed launch may have run a part
      for (Buffer* buffer : launch.buffers) q.pending.push_back(buffer->shared_from_this());
      if (scratch) q.pending.push_back(scratch);
    }
    cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
    const cudaError_t error = launch_command(launch.kernel, launch.params, ctx, &blas);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      if (blas != CUBLAS_STATUS_SUCCESS) {
        RETRACE_FAIL(device_error, "op '{}' failed on {}: cuBLAS {} ({})", launch.op, q.label,
                     cublasGetStatusName(blas), cublasGetStatusString(blas));
      }
      RETRACE_FAIL(device_error, "op '{}' failed on {}{}: {}", launch.op, q.label,
                   trace ? fmt::format(" while capturing trace {}", trace->info.id) : "",
                   describe(error));
    }

    if (trace != nullptr) {
      std::vector<std::uint64_t> addresses;
      addresses.reserve(launch.buffers.size());
      for (Buffer* buffer : launch.buffers) {
        addresses.push_back(buffer->address());
        const bool own = buffer->trace() && *buffer->trace() == trace->info.id;
        if (!own && trace->seen.insert(buffer).second) {
          trace->retained.push_back(buffer->shared_from_this());
          ++trace->info.external_buffers;
        }
      }
      if (scratch) trace->retained.push_back(std::move(scratch));
      trace->info.ops.push_back(launch.op);
      trace->info.command_buffers.push_back(std::move(addresses));
      ++trace->info.commands;
      return;
    }
    commands_executed_.fetch_add(1, std::memory_order_relaxed);
    if (++q.pending_commands >= kRetainEvery) mark(q);
  }

  void do_synchronize(QueueId queue) override {
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    drain_and_report(q);
  }

  std::shared_ptr<detail::EventState> do_record_event(QueueId queue) override {
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    cudaEvent_t event = nullptr;
    RelaxedCapture relaxed;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "record_event");
    auto state = std::make_shared<CudaEventState>(event, options_.ordinal);
    check(cudaEventRecord(event, q.stream), fmt::format("record_event on {}", q.label));
    return state;
  }

  void do_wait_event(QueueId queue, const Event& event) override {
    make_current(options_.ordinal);
    const auto* state = dynamic_cast<const CudaEventState*>(event.state().get());
    RETRACE_CHECK(state != nullptr, invalid_argument,
                  "wait_event: the event was not recorded by a CUDA device");
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    check(cudaStreamWaitEvent(q.stream, state->event(), 0),
          fmt::format("wait_event on {}", q.label));
  }

  void do_begin_capture(QueueId queue, TraceId id) override {
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    mark(q);  // earlier eager work keeps its own event, recorded outside the capture
    if (q.capture_fence == nullptr) {
      RelaxedCapture relaxed;
      check(cudaEventCreateWithFlags(&q.capture_fence, cudaEventDisableTiming), "capture fence");
    }
    check(cudaEventRecord(q.capture_fence, q.stream), "begin_trace_capture: capture fence");
    auto trace = std::make_shared<CudaTrace>();
    trace->info.id = id;  // the base sets it again at the end; kernels' sites need it now
    trace->domain = domains_.take();
    arena_.begin_pool(id);
    if (const cudaError_t e = cudaStreamBeginCapture(q.stream, cudaStreamCaptureModeThreadLocal);
        e != cudaSuccess) {
      arena_.release_pool(id);
      domains_.give_back(trace->domain);
      check(e, fmt::format("begin_trace_capture on {}", q.label));
    }
    ++t_open_captures;
    q.capture = std::move(trace);
    q.capture_thread = std::this_thread::get_id();
  }

  std::shared_ptr<TraceBase> do_end_capture(QueueId queue) override {
    make_current(options_.ordinal);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    std::shared_ptr<CudaTrace> trace = std::move(q.capture);
    --t_open_captures;
    restore_workspace(q, *trace);
    const TraceId id = trace->info.id;
    cudaGraph_t graph = nullptr;
    cudaError_t error = cudaStreamEndCapture(q.stream, &graph);
    if (error == cudaSuccess && graph == nullptr) error = cudaErrorStreamCaptureInvalidated;
    if (error == cudaSuccess) {
      std::size_t nodes = 0;
      (void)cudaGraphGetNodes(graph, nullptr, &nodes);
      trace->graph_nodes = nodes;
      error = cudaGraphInstantiate(&trace->exec, graph, 0);
      (void)cudaGraphDestroy(graph);
      if (error == cudaSuccess) error = cudaGraphUpload(trace->exec, q.stream);
    }
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      if (trace->exec != nullptr) (void)cudaGraphExecDestroy(trace->exec);
      trace->retained.clear();
      trace->blas_workspace.reset();
      arena_.release_pool(id);
      domains_.give_back(trace->domain);
      RETRACE_FAIL(device_error,
                   "end_trace_capture on {}: CUDA could not build the graph of trace {} ({}); "
                   "the trace was discarded and the queue records no more",
                   q.label, id, describe(error));
    }
    const auto [bytes, blocks] = arena_.seal_pool(id);
    trace->info.bytes = bytes;
    trace->info.pool_buffers = blocks;
    trace->seen.clear();
    {
      std::lock_guard traces_lock(traces_mutex_);
      captured_[id.value] = trace.get();
    }
    log(LogLevel::debug, "{}: trace {} captured: {} commands, {} graph nodes, {} bytes of pool",
        name(), id, trace->info.commands, trace->graph_nodes, bytes);
    return trace;
  }

  void do_execute_trace(TraceBase& base, QueueId queue, Blocking blocking) override {
    make_current(options_.ordinal);
    auto& trace = static_cast<CudaTrace&>(base);
    Queue& q = queue_at(queue);
    std::lock_guard lock(q.mutex);
    // An earlier failure is reported before the replay (not on a capturing thread, which must
    // not wait: the next synchronize reports it).
    if (t_open_captures == 0 && any_failure(q)) drain_and_report(q);
    {
      std::lock_guard trace_lock(trace.mutex);
      RETRACE_CHECK(!trace.released, failed_precondition,
                    "execute_trace: trace {} on {} was released while this call was starting",
                    trace.info.id, name());
      check(cudaGraphLaunch(trace.exec, q.stream),
            fmt::format("execute_trace: launching trace {} on {}", trace.info.id, q.label));
      trace.replayed_on |= std::uint64_t{1} << queue.value;
    }
    if (trace.has_asserts &&
        std::find(q.replayed.begin(), q.replayed.end(), &trace) == q.replayed.end()) {
      q.replayed.push_back(&trace);
    }
    commands_executed_.fetch_add(trace.info.commands, std::memory_order_relaxed);
    traces_executed_.fetch_add(1, std::memory_order_relaxed);
    if (blocking == Blocking::yes) drain_and_report(q);
  }

  void do_release_trace(TraceBase& base) noexcept override {
    (void)cudaSetDevice(options_.ordinal);
    auto& trace = static_cast<CudaTrace&>(base);
    std::uint64_t queues = 0;
    {
      std::lock_guard lock(trace.mutex);
      trace.released = true;  // no replay starts after this
      queues = trace.replayed_on;
    }
    for (std::size_t i = 0; i < queues_.size(); ++i) {
      Queue& q = *queues_[i];
      if ((queues >> i & 1u) == 0) continue;
      std::lock_guard lock(q.mutex);
      RelaxedCapture relaxed;
      // No replay may touch freed memory. A queue capturing now cannot be waited on; its
      // replays all came before the capture began, which recorded the fence after them.
      if (q.capture) {
        (void)cudaEventSynchronize(q.capture_fence);
      } else {
        (void)cudaStreamSynchronize(q.stream);
      }
      // A failure of this trace not reported yet is reported with the queue's next report.
      if (trace.domain.failed()) {
        try {
          if (q.released_failure.empty()) q.released_failure = describe_failure(q, trace.domain);
        } catch (...) {
          q.released_failure = "a command of a released trace failed";
        }
        (void)clear_record(trace.domain.record, q.stream);
        *trace.domain.flag = 0;
      }
      std::erase(q.replayed, &trace);
    }
    {
      std::lock_guard traces_lock(traces_mutex_);
      captured_.erase(trace.info.id.value);
    }
    if (trace.exec != nullptr) (void)cudaGraphExecDestroy(trace.exec);
    trace.exec = nullptr;
    trace.retained.clear();
    trace.blas_workspace.reset();
    arena_.release_pool(trace.info.id);
    domains_.give_back(trace.domain);
  }

  void do_reclaim() noexcept override {
    (void)cudaSetDevice(options_.ordinal);
    RelaxedCapture relaxed;
    for (auto& queue : queues_) {
      std::lock_guard lock(queue->mutex);
      if (queue->capture) continue;  // a capturing stream cannot be waited on
      if (cudaStreamSynchronize(queue->stream) != cudaSuccess) {
        (void)cudaGetLastError();  // reported by the queue's next synchronize
        continue;
      }
      queue->pending.clear();
      queue->pending_commands = 0;
      for (auto& batch : queue->in_flight) queue->spare_events.push_back(batch.event);
      queue->in_flight.clear();
    }
  }

  void do_shutdown() noexcept override {
    (void)cudaSetDevice(options_.ordinal);
    RelaxedCapture relaxed;
    abandon_capture();  // before anything waits on the capturing stream
    for (auto& queue : queues_) (void)cudaStreamSynchronize(queue->stream);
  }

  void do_fill_stats(DeviceStats& stats) const override {
    arena_.fill_stats(stats);
    stats.commands_executed = commands_executed_.load(std::memory_order_relaxed);
    stats.traces_executed = traces_executed_.load(std::memory_order_relaxed);
  }

 private:
  Queue& queue_at(QueueId queue) { return *queues_[queue.value]; }

  static void check_blas(cublasStatus_t status, std::string_view what) {
    RETRACE_CHECK(status == CUBLAS_STATUS_SUCCESS, device_error, "{}: cuBLAS {} ({})", what,
                  cublasGetStatusName(status), cublasGetStatusString(status));
  }

  static bool uses_blas(KernelId kernel) noexcept {
    return kernel == KernelId::matmul || kernel == KernelId::attention;
  }

  // The capture's first GEMM: the queue's handle gets a workspace from the trace's pool, of the
  // queue's workspace size (same size, same cuBLAS algorithms, so replays equal eager runs bit
  // for bit).
  void give_trace_workspace(Queue& q, CudaTrace& trace) {
    const std::size_t bytes = options_.cublas_workspace_bytes;
    if (bytes == 0) return;
    trace.blas_workspace = std::make_shared<Buffer>(link(), arena_.allocate(bytes, trace.info.id));
    check_blas(cublasSetWorkspace(q.blas, trace.blas_workspace->data(), bytes),
               "cublasSetWorkspace (trace)");
  }

  // Back to the queue's own workspace once a capture ends.
  void restore_workspace(Queue& q, CudaTrace& trace) noexcept {
    if (!trace.blas_workspace) return;
    (void)cublasSetWorkspace(q.blas, q.blas_workspace, options_.cublas_workspace_bytes);
    trace.retained.push_back(trace.blas_workspace);
  }

  // Closes the current batch of retained objects with an event.
  void mark(Queue& q) {
    if (q.pending.empty()) return;
    cudaEvent_t event = nullptr;
    if (!q.spare_events.empty()) {
      event = q.spare_events.back();
      q.spare_events.pop_back();
    } else {
      RelaxedCapture relaxed;
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating an event");
    }
    if (const cudaError_t e = cudaEventRecord(event, q.stream); e != cudaSuccess) {
      q.spare_events.push_back(event);
      check(e, fmt::format("{}: recording an event", q.label));
    }
    q.in_flight.push_back(Retained{event, std::move(q.pending)});
    q.pending.clear();
    q.pending_commands = 0;
  }

  // Drops what finished work no longer needs.
  void reap(Queue& q) {
    RelaxedCapture relaxed;
    while (!q.in_flight.empty() && cudaEventQuery(q.in_flight.front().event) == cudaSuccess) {
      q.spare_events.push_back(q.in_flight.front().event);
      q.in_flight.pop_front();
    }
  }

  // Waits for the queue, frees what its work held, and throws its first failure.
  void drain_and_report(Queue& q) {
    RelaxedCapture relaxed;
    const cudaError_t error = cudaStreamSynchronize(q.stream);
    q.pending.clear();
    q.pending_commands = 0;
    for (auto& batch : q.in_flight) q.spare_events.push_back(batch.event);
    q.in_flight.clear();
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      RETRACE_FAIL(device_error,
                   "work on {} failed: {}; errors of this kind leave the CUDA context unusable, "
                   "reopen the device (or restart the process)",
                   q.label, describe(error));
    }
    std::string message = std::exchange(q.released_failure, std::string());
    auto take = [&](const Domain& domain) {
      if (!domain.failed()) return;
      std::string found = describe_failure(q, domain);
      check(clear_record(domain.record, q.stream), "clearing a failure record");
      *domain.flag = 0;
      if (message.empty()) message = std::move(found);
    };
    take(q.domain);
    for (const CudaTrace* trace : q.replayed) take(trace->domain);
    q.replayed.clear();
    RETRACE_CHECK(message.empty(), device_error, "{}", message);
  }

  [[nodiscard]] bool any_failure(const Queue& q) const {
    if (q.domain.failed() || !q.released_failure.empty()) return true;
    return std::any_of(q.replayed.begin(), q.replayed.end(),
                       [](const CudaTrace* t) { return t->domain.failed(); });
  }

  // "op 'assert_finite' failed on queue 0 of cuda:0 (eager): element 1 of 3 is nan"
  std::string describe_failure(const Queue& q, const Domain& domain) {
    FailureRecord record{};
    if (cudaMemcpy(&record, domain.record, sizeof record, cudaMemcpyDeviceToHost) != cudaSuccess) {
      (void)cudaGetLastError();
      return fmt::format("a command failed on {} (its failure record could not be read)", q.label);
    }
    const unsigned int site_id = record.site != 0 ? record.site : *domain.flag;
    Site site{"assert_finite", 0, 0, 0};
    std::size_t trace_commands = 0;
    {
      std::lock_guard lock(sites_mutex_);
      if (site_id >= 1 && site_id <= sites_.size()) site = sites_[site_id - 1];
    }
    if (site.trace != 0) {
      std::lock_guard lock(traces_mutex_);
      auto found = captured_.find(site.trace);
      if (found != captured_.end()) trace_commands = found->second->info.commands;
    }
    const std::string where =
        site.trace == 0
            ? std::string("eager")
            : fmt::format("command {} of {} in trace {}", site.command, trace_commands, site.trace);
    const auto index = static_cast<std::int64_t>(record.element >> 32);
    const float value = std::bit_cast<float>(static_cast<std::uint32_t>(record.element));
    return fmt::format("op '{}' failed on {} ({}): element {} of {} is {}", site.op, q.label, where,
                       index, site.count, value);
  }

  unsigned int register_site(const Site& site) {
    std::lock_guard lock(sites_mutex_);
    const auto key = std::make_tuple(site.op, site.count, site.trace, site.command);
    auto [it, inserted] = site_ids_.try_emplace(key, 0u);
    if (inserted) {
      sites_.push_back(site);
      it->second = static_cast<unsigned int>(sites_.size());
    }
    return it->second;
  }

  // A capture still open when the device closes is dropped with its pool.
  void abandon_capture() noexcept {
    for (auto& queue : queues_) {
      if (!queue->capture) continue;
      cudaGraph_t graph = nullptr;
      (void)cudaStreamEndCapture(queue->stream, &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      if (queue->capture_thread == std::this_thread::get_id()) --t_open_captures;
      restore_workspace(*queue, *queue->capture);
      queue->capture->retained.clear();
      queue->capture->blas_workspace.reset();
      arena_.release_pool(queue->capture->info.id);
      domains_.give_back(queue->capture->domain);
      queue->capture.reset();
    }
  }

  void destroy_queues() noexcept {
    for (auto& queue : queues_) {
      for (cudaEvent_t event : queue->spare_events) (void)cudaEventDestroy(event);
      if (queue->capture_fence != nullptr) (void)cudaEventDestroy(queue->capture_fence);
      if (queue->blas != nullptr) (void)cublasDestroy(queue->blas);
      if (queue->blas_workspace != nullptr) (void)cudaFree(queue->blas_workspace);
      if (queue->stream != nullptr) (void)cudaStreamDestroy(queue->stream);
      if (queue->domain.record != nullptr) domains_.give_back(queue->domain);
    }
    queues_.clear();
  }

 private:
  CudaDeviceOptions options_;
  std::byte* region_;
  DomainPool domains_;  // outlives arena users below it in destruction order
  detail::Arena arena_;
  std::shared_ptr<StagingPool> staging_;
  std::vector<std::unique_ptr<Queue>> queues_;

  std::mutex sites_mutex_;
  std::vector<Site> sites_;
  std::map<std::tuple<const char*, std::int64_t, std::uint64_t, std::size_t>, unsigned int>
      site_ids_;

  mutable std::mutex traces_mutex_;
  // Traces captured and not yet released (their graphs and command counts are read by id).
  std::unordered_map<std::uint64_t, const CudaTrace*> captured_;

  std::atomic<std::uint64_t> commands_executed_{0};
  std::atomic<std::uint64_t> traces_executed_{0};
};

}  // namespace
}  // namespace cuda

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda::describe(error);
  }
  return count > 0 ? std::string() : std::string("no CUDA GPU is visible");
}

std::string cuda_device_description(int ordinal) {
  const int count = cuda_device_count();
  RETRACE_CHECK(ordinal >= 0 && ordinal < count, invalid_argument,
                "CUDA device ordinal {} does not exist ({} GPUs visible)", ordinal, count);
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  return fmt::format("{} (sm_{}{}, {})", prop.name, prop.major, prop.minor,
                     detail::human_bytes(prop.totalGlobalMem));
}

std::unique_ptr<Device> open_cuda_device(const CudaDeviceOptions& options) {
  const std::string reason = cuda_unavailable_reason();
  RETRACE_CHECK(reason.empty(), failed_precondition,
                "open_cuda_device: no usable CUDA GPU on this machine: {}", reason);
  const int count = cuda_device_count();
  RETRACE_CHECK(options.ordinal >= 0 && options.ordinal < count, invalid_argument,
                "open_cuda_device: ordinal {} does not exist ({} GPUs visible)", options.ordinal,
                count);
  RETRACE_CHECK(options.num_queues >= 2 && options.num_queues <= 64, invalid_argument,
                "open_cuda_device: num_queues must be in [2, 64], got {}", options.num_queues);
  RETRACE_CHECK(options.memory_bytes > 0, invalid_argument,
                "open_cuda_device: memory_bytes must be positive");
  cuda::make_current(options.ordinal);
  const std::size_t bytes = detail::Arena::round_capacity(options.memory_bytes, cuda::kAlignment);
  void* region = nullptr;
  cuda::RelaxedCapture relaxed;  // another device may be capturing on this thread
  if (const cudaError_t e = cudaMalloc(&region, bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    std::size_t free_bytes = 0, total = 0;
    (void)cudaMemGetInfo(&free_bytes, &total);
    RETRACE_FAIL(out_of_memory,
                 "open_cuda_device: cannot allocate the {} arena on GPU {} ({}); {} of {} free; "
                 "lower CudaDeviceOptions::memory_bytes",
                 detail::human_bytes(bytes), options.ordinal, cuda::describe(e),
                 detail::human_bytes(free_bytes), detail::human_bytes(total));
  }
  try {
    return std::make_unique<cuda::CudaDevice>(options, static_cast<std::byte*>(region), bytes);
  } catch (...) {
    (void)cudaFree(region);
    throw;
  }
}

namespace {
cuda::CudaDevice& as_cuda(Device& device, std::string_view what) {
  auto* cuda_device = dynamic_cast<cuda::CudaDevice*>(&device);
  RETRACE_CHECK(cuda_device != nullptr, invalid_argument, "{}: {} is not a CUDA device", what,
                device.name());
  return *cuda_device;
}
}  // namespace

CUstream_st* cuda_stream(Device& device, QueueId queue) {
  RETRACE_CHECK(queue.value < device.num_queues(), invalid_argument,
                "cuda_stream: {} has no queue {}", device.name(), queue.value);
  return as_cuda(device, "cuda_stream").stream(queue);
}

CUgraphExec_st* cuda_graph_exec(Device& device, TraceId trace) {
  return as_cuda(device, "cuda_graph_exec").graph_exec(trace);
}

}  // namespace retrace
