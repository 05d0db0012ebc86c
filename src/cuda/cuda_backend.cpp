#include "cuda/cuda_backend.hpp"

#include "cuda/check.hpp"
#include "cuda/collective.hpp"
#include "cuda/relaxed.hpp"
#include "retrace/log.hpp"

#include <algorithm>
#include <cstring>

namespace retrace::cuda {

namespace {

constexpr std::size_t kAlignment = 256;
constexpr std::size_t kRetainEvery = 32;                      // eager commands per event
constexpr std::size_t kStagingChunk = std::size_t{16} << 20;  // largest pinned staging buffer

bool uses_blas(KernelId kernel) noexcept {
  return kernel == KernelId::matmul || kernel == KernelId::attention;
}

class CudaEventState final : public detail::EventState {
 public:
  CudaEventState(cudaEvent_t event, int ordinal) : event_(event), ordinal_(ordinal) {}
  ~CudaEventState() override { RETRACE_CUDA_WARN(cudaEventDestroy(event_)); }
  CudaEventState(const CudaEventState&) = delete;
  CudaEventState& operator=(const CudaEventState&) = delete;

  [[nodiscard]] bool is_complete() const override {
    RelaxedCapture relaxed;
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    RETRACE_CUDA_CHECK(e, "Event::is_complete");
    return true;
  }
  void wait() const override {
    RelaxedCapture relaxed;
    RETRACE_CUDA_CHECK(cudaSetDevice(ordinal_), "waiting for an event on GPU {}", ordinal_);
    RETRACE_CUDA_CHECK(cudaEventSynchronize(event_), "waiting for an event");
  }
  [[nodiscard]] cudaEvent_t event() const noexcept { return event_; }

 private:
  cudaEvent_t event_;
  int ordinal_;
};

}  // namespace

// --- lifetime ---------------------------------------------------------------------------------

CudaBackend::CudaBackend(const CudaDeviceOptions& options, std::byte* region,
                         std::size_t region_bytes)
    : options_(options),
      region_(region),
      region_bytes_(region_bytes),
      staging_(std::make_shared<StagingPool>()) {
  RelaxedCapture relaxed;  // another device may be capturing on this thread
  try {
    create_queues();
  } catch (...) {
    destroy_queues();
    RETRACE_CUDA_WARN(cudaFree(region_));
    throw;
  }
}

CudaBackend::~CudaBackend() {
  RETRACE_CUDA_WARN(cudaSetDevice(options_.ordinal));
  RelaxedCapture relaxed;
  for (auto& queue : queues_) {
    queue->replayed.clear();
    queue->pending.clear();
    for (auto& batch : queue->in_flight) RETRACE_CUDA_WARN(cudaEventDestroy(batch.event));
    queue->in_flight.clear();
  }
  destroy_queues();
  RETRACE_CUDA_WARN(cudaFree(region_));
}

void CudaBackend::make_current() const {
  RETRACE_CUDA_CHECK(cudaSetDevice(options_.ordinal), "making GPU {} current", options_.ordinal);
}

void CudaBackend::create_queues() {
  queues_.reserve(options_.num_queues);
  for (std::uint32_t i = 0; i < options_.num_queues; ++i) {
    auto queue = std::make_unique<Queue>();
    queue->label = fmt::format("queue {} of cuda:{}", i, options_.id);
    Queue& q = *queue;
    queues_.push_back(std::move(queue));
    RETRACE_CUDA_CHECK(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking),
                       "creating the stream of {}", q.label);
    RETRACE_CUBLAS_CHECK(cublasCreate(&q.blas), "creating the cuBLAS handle of {}", q.label);
    RETRACE_CUBLAS_CHECK(cublasSetStream(q.blas, q.stream), "{}", q.label);
    RETRACE_CUBLAS_CHECK(cublasLtCreate(&q.blas_lt), "creating the cuBLASLt handle of {}",
                         q.label);
    // Split-K partial sums in float32 too: by default cuBLAS may reduce them in a half-precision
    // output's type, rounding every partial (PyTorch's allow_fp16_reduced_precision_reduction =
    // False sets the same flag).
    RETRACE_CUBLAS_CHECK(
        cublasSetMathMode(q.blas, static_cast<cublasMath_t>(
                                      CUBLAS_DEFAULT_MATH |
                                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
        "{}", q.label);
    if (options_.cublas_workspace_bytes > 0) {
      RETRACE_CUDA_CHECK(cudaMalloc(&q.blas_workspace, options_.cublas_workspace_bytes),
                         "allocating the cuBLAS workspace of {}", q.label);
      RETRACE_CUBLAS_CHECK(
          cublasSetWorkspace(q.blas, q.blas_workspace, options_.cublas_workspace_bytes), "{}",
          q.label);
    }
    q.domain = domains_.take();
  }
}

void CudaBackend::destroy_queues() noexcept {
  for (auto& queue : queues_) {
    for (cudaEvent_t event : queue->spare_events) RETRACE_CUDA_WARN(cudaEventDestroy(event));
    if (queue->capture_fence != nullptr) RETRACE_CUDA_WARN(cudaEventDestroy(queue->capture_fence));
    if (queue->blas != nullptr && cublasDestroy(queue->blas) != CUBLAS_STATUS_SUCCESS) {
      log(LogLevel::warning, "CUDA teardown: cublasDestroy failed for {}", queue->label);
    }
    if (queue->blas_lt != nullptr && cublasLtDestroy(queue->blas_lt) != CUBLAS_STATUS_SUCCESS) {
      log(LogLevel::warning, "CUDA teardown: cublasLtDestroy failed for {}", queue->label);
    }
    if (queue->blas_workspace != nullptr) RETRACE_CUDA_WARN(cudaFree(queue->blas_workspace));
    if (queue->gemm_scratch != nullptr) RETRACE_CUDA_WARN(cudaFree(queue->gemm_scratch));
    if (queue->stream != nullptr) RETRACE_CUDA_WARN(cudaStreamDestroy(queue->stream));
    if (queue->domain.record != nullptr) domains_.give_back(queue->domain);
  }
  queues_.clear();
}

// --- description ------------------------------------------------------------------------------

bool CudaBackend::supports(Capability capability) const noexcept {
  switch (capability) {
    case Capability::trace_capture:
    case Capability::events:
    case Capability::async_queues: return true;
    case Capability::host_visible_memory: return false;
  }
  return false;
}

bool CudaBackend::supports(KernelId kernel) const noexcept { return supports_kernel(kernel); }

const char* CudaBackend::unsupported_reason(const KernelLaunch& launch) const noexcept {
  return cuda::unsupported_reason(launch.kernel, launch.params);
}

MemoryRegion CudaBackend::region() { return {region_, region_bytes_, kAlignment, false}; }

// --- work ---------------------------------------------------------------------------------------

void CudaBackend::write(QueueId queue, const Buffer& dst, std::size_t offset,
                        std::span<const std::byte> src, Blocking blocking) {
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  reap(q);
  auto* target = static_cast<std::byte*>(dst.data()) + offset;
  for (std::size_t done = 0; done < src.size();) {
    const std::size_t n = std::min(kStagingChunk, src.size() - done);
    std::shared_ptr<void> staging = staging_->take(n, staging_);
    std::memcpy(staging.get(), src.data() + done, n);
    RETRACE_CUDA_CHECK(
        cudaMemcpyAsync(target + done, staging.get(), n, cudaMemcpyHostToDevice, q.stream),
        "write to {}", q.label);
    q.pending.push_back(std::move(staging));
    done += n;
  }
  q.pending.push_back(const_cast<Buffer&>(dst).shared_from_this());
  mark(q);
  if (blocking == Blocking::yes) drain_and_report(q);
}

void CudaBackend::read(QueueId queue, const Buffer& src, std::size_t offset,
                       std::span<std::byte> dst) {
  RelaxedCapture relaxed;  // another device (or queue) may be capturing on this thread
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  drain_and_report(q);
  if (dst.empty()) return;
  RETRACE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), static_cast<const std::byte*>(src.data()) + offset,
                                     dst.size(), cudaMemcpyDeviceToHost, q.stream),
                     "read from {}", q.label);
  RETRACE_CUDA_CHECK(cudaStreamSynchronize(q.stream), "read from {}", q.label);
}

void CudaBackend::enqueue(QueueId queue, const KernelLaunch& launch) {
  make_current();
  // Scratch first, outside the queue's lock (allocation takes the device's lock); on the
  // capturing thread it comes from the trace's pool and stays with the trace.
  std::shared_ptr<Buffer> scratch;
  if (const std::size_t bytes = scratch_bytes(launch.kernel, launch.params); bytes > 0) {
    scratch = device().allocate(bytes);
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
  ctx.cublas_lt = q.blas_lt;
  if (trace != nullptr && trace->blas_workspace) {
    ctx.blas_workspace = trace->blas_workspace->data();
  } else {
    ctx.blas_workspace = q.blas_workspace;
  }
  ctx.blas_workspace_bytes = ctx.blas_workspace != nullptr ? options_.cublas_workspace_bytes : 0;
  const Domain& domain = trace != nullptr ? trace->domain : q.domain;
  ctx.record = domain.record;
  ctx.host_flag = domain.flag_device;
  if (scratch) ctx.scratch = scratch->data();
  if (needs_gemm_scratch(launch.kernel, launch.params)) ctx.gemm_scratch = gemm_scratch(q, trace);
  if (launch.kernel == KernelId::assert_finite) {
    const auto& p = *static_cast<const AssertFiniteParams*>(launch.params);
    ctx.site = sites_.add(Site{launch.op, p.count, trace ? trace->id.value : 0,
                               trace ? trace->commands : 0, 0});
    if (trace != nullptr) trace->has_asserts = true;
  } else if (launch.kernel == KernelId::gather) {  // fails like assert_finite on a bad index
    const auto& p = *static_cast<const GatherParams*>(launch.params);
    std::int64_t count = 1;
    for (int d = 0; d < p.rank; ++d) count *= p.shape[d];
    ctx.site = sites_.add(Site{launch.op, count, trace ? trace->id.value : 0,
                               trace ? trace->commands : 0, 0, p.dim_size});
    if (trace != nullptr) trace->has_asserts = true;
  } else if (launch.kernel == KernelId::collective) {  // fails when a peer failed before it
    const auto& p = *static_cast<const CollectiveParams*>(launch.params);
    CollectiveSiteInfo info = collective_site_info(p);
    const auto key = static_cast<std::int64_t>(std::hash<std::string>{}(info.label));
    ctx.site = sites_.add(Site{launch.op, key, trace ? trace->id.value : 0,
                               trace ? trace->commands : 0, 0, 0, std::move(info.label),
                               std::move(info.members)});
    if (trace != nullptr) trace->has_asserts = true;
  }
  if (trace == nullptr) {  // kept alive before launching: a failed launch may have run a part
    for (Buffer* buffer : launch.buffers) q.pending.push_back(buffer->shared_from_this());
    if (scratch) q.pending.push_back(scratch);
  }
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  if (const cudaError_t error = launch_command(launch.kernel, launch.params, ctx, &blas);
      error != cudaSuccess) {
    record_launch_failure(launch, q, trace, error, blas);
  }
  if (trace != nullptr) {
    if (scratch) trace->scratch.push_back(std::move(scratch));
    ++trace->commands;
    return;
  }
  // A collective's NCCL work starts after this returns (see cuda/collective.hpp): an event
  // recorded now would pass before it, so its buffers wait for the next mark.
  if (launch.kernel != KernelId::collective && ++q.pending_commands >= kRetainEvery) mark(q);
}

void CudaBackend::record_launch_failure(const KernelLaunch& launch, const Queue& q,
                                        const CudaTrace* trace, cudaError_t error,
                                        cublasStatus_t blas) {
  clear_last_error();
  if (blas != CUBLAS_STATUS_SUCCESS) {
    RETRACE_FAIL(device_error, "op '{}' failed on {}: cuBLAS {} ({})", launch.op, q.label,
                 cublasGetStatusName(blas), cublasGetStatusString(blas));
  }
  RETRACE_FAIL(device_error, "op '{}' failed on {}{}: launching its kernel: {}", launch.op,
               q.label, trace ? fmt::format(" while capturing trace {}", trace->id) : "",
               describe(error));
}

void CudaBackend::synchronize(QueueId queue) {
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  drain_and_report(q);
}

std::shared_ptr<detail::EventState> CudaBackend::record_event(QueueId queue) {
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  cudaEvent_t event = nullptr;
  RelaxedCapture relaxed;
  RETRACE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                     "record_event on {}", q.label);
  auto state = std::make_shared<CudaEventState>(event, options_.ordinal);
  RETRACE_CUDA_CHECK(cudaEventRecord(event, q.stream), "record_event on {}", q.label);
  return state;
}

void CudaBackend::wait_event(QueueId queue, std::shared_ptr<const detail::EventState> event) {
  make_current();
  const auto* state = dynamic_cast<const CudaEventState*>(event.get());
  RETRACE_CHECK(state != nullptr, invalid_argument,
                "wait_event: the event was not recorded by a CUDA device");
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  RETRACE_CUDA_CHECK(cudaStreamWaitEvent(q.stream, state->event(), 0), "wait_event on {}",
                     q.label);
}

// --- traces -----------------------------------------------------------------------------------

void CudaBackend::begin_capture(QueueId queue, TraceId id) {
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  mark(q);  // earlier eager work keeps its own event, recorded outside the capture
  if (q.capture_fence == nullptr) {
    RelaxedCapture relaxed;
    RETRACE_CUDA_CHECK(cudaEventCreateWithFlags(&q.capture_fence, cudaEventDisableTiming),
                       "creating the capture fence of {}", q.label);
  }
  RETRACE_CUDA_CHECK(cudaEventRecord(q.capture_fence, q.stream),
                     "begin_trace_capture on {}: recording the capture fence", q.label);
  auto trace = std::make_unique<CudaTrace>();
  trace->id = id;
  trace->domain = domains_.take();
  if (const cudaError_t e = cudaStreamBeginCapture(q.stream, cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    domains_.give_back(trace->domain);
    RETRACE_CUDA_CHECK(e, "begin_trace_capture on {}", q.label);
  }
  ++t_open_captures;
  q.capture = std::move(trace);
  q.capture_thread = std::this_thread::get_id();
}

std::unique_ptr<BackendTrace> CudaBackend::end_capture(QueueId queue) {
  make_current();
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  std::unique_ptr<CudaTrace> trace = std::move(q.capture);
  --t_open_captures;
  restore_workspace(q, *trace);
  cudaGraph_t graph = nullptr;
  cudaError_t error = cudaStreamEndCapture(q.stream, &graph);
  if (error == cudaSuccess && graph == nullptr) error = cudaErrorStreamCaptureInvalidated;
  if (error == cudaSuccess) {
    // Another stream of this thread may still be capturing (a Tracer over several devices ends
    // their captures one by one): in the thread-local mode CUDA refuses to instantiate then.
    RelaxedCapture relaxed;
    std::size_t nodes = 0;
    error = cudaGraphGetNodes(graph, nullptr, &nodes);
    trace->graph_nodes = nodes;
    if (error == cudaSuccess) error = cudaGraphInstantiate(&trace->exec, graph, 0);
    RETRACE_CUDA_WARN(cudaGraphDestroy(graph));
    if (error == cudaSuccess) error = cudaGraphUpload(trace->exec, q.stream);
  }
  if (error != cudaSuccess) {
    clear_last_error();
    if (trace->exec != nullptr) RETRACE_CUDA_WARN(cudaGraphExecDestroy(trace->exec));
    domains_.give_back(trace->domain);
    RETRACE_FAIL(device_error,
                 "end_trace_capture on {}: CUDA could not build the graph of trace {} ({}); "
                 "the trace was discarded and the queue records no more",
                 q.label, trace->id, describe(error));
  }
  sites_.set_trace_commands(trace->id.value, trace->commands);
  log(LogLevel::debug, "{}: trace {} captured: {} commands, {} graph nodes", q.label, trace->id,
      trace->commands, trace->graph_nodes);
  return trace;
}

void CudaBackend::abort_capture(QueueId queue) noexcept {
  RETRACE_CUDA_WARN(cudaSetDevice(options_.ordinal));
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  if (!q.capture) return;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(q.stream, &graph);
  if (ended != cudaSuccess && ended != cudaErrorStreamCaptureInvalidated) RETRACE_CUDA_WARN(ended);
  if (graph != nullptr) {
    RelaxedCapture relaxed;  // as in end_capture: other captures of this thread may be open
    RETRACE_CUDA_WARN(cudaGraphDestroy(graph));
  }
  clear_last_error();
  if (q.capture_thread == std::this_thread::get_id()) --t_open_captures;
  restore_workspace(q, *q.capture);
  domains_.give_back(q.capture->domain);
  q.capture.reset();
}

void CudaBackend::execute(BackendTrace& base, TraceId id, QueueId queue, Blocking blocking) {
  make_current();
  auto& trace = static_cast<CudaTrace&>(base);
  Queue& q = queue_at(queue);
  std::lock_guard lock(q.mutex);
  // An earlier failure is reported before the replay (not on a capturing thread, which must
  // not wait: the next synchronize reports it).
  if (t_open_captures == 0 && any_failure(q)) drain_and_report(q);
  {
    std::lock_guard trace_lock(trace.mutex);
    RETRACE_CHECK(!trace.released, failed_precondition,
                  "execute_trace: trace {} on {} was released while this call was starting", id,
                  device().name());
    RETRACE_CUDA_CHECK(cudaGraphLaunch(trace.exec, q.stream),
                       "execute_trace: launching trace {} on {}", id, q.label);
    trace.replayed_on |= std::uint64_t{1} << queue.value;
  }
  if (trace.has_asserts &&
      std::find(q.replayed.begin(), q.replayed.end(), &trace) == q.replayed.end()) {
    q.replayed.push_back(&trace);
  }
  if (blocking == Blocking::yes) drain_and_report(q);
}

void CudaBackend::release(BackendTrace& base, TraceId) noexcept {
  RETRACE_CUDA_WARN(cudaSetDevice(options_.ordinal));
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
      RETRACE_CUDA_WARN(cudaEventSynchronize(q.capture_fence));
    } else {
      RETRACE_CUDA_WARN(cudaStreamSynchronize(q.stream));
    }
    // A failure of this trace not reported yet is reported with the queue's next report.
    if (trace.domain.failed()) {
      try {
        if (q.released_failure.empty()) {
          q.released_failure = describe_failure(q.label, trace.domain, sites_);
        }
      } catch (...) {
        q.released_failure = "a command of a released trace failed";
      }
      RETRACE_CUDA_WARN(clear_record(trace.domain.record, q.stream));
      *trace.domain.flag = 0;
    }
    std::erase(q.replayed, &trace);
  }
  if (trace.exec != nullptr) {
    RelaxedCapture relaxed;  // a trace may be released while another device captures
    RETRACE_CUDA_WARN(cudaGraphExecDestroy(trace.exec));
  }
  trace.exec = nullptr;
  trace.scratch.clear();
  trace.gemm_scratch.reset();
  trace.blas_workspace.reset();
  domains_.give_back(trace.domain);
}

// --- memory and lifetime ----------------------------------------------------------------------

void CudaBackend::reclaim() noexcept {
  RETRACE_CUDA_WARN(cudaSetDevice(options_.ordinal));
  RelaxedCapture relaxed;
  for (auto& queue : queues_) {
    std::lock_guard lock(queue->mutex);
    if (queue->capture) continue;  // a capturing stream cannot be waited on
    if (const cudaError_t e = cudaStreamSynchronize(queue->stream); e != cudaSuccess) {
      clear_last_error();  // the queue's next synchronize reports it
      continue;
    }
    queue->pending.clear();
    queue->pending_commands = 0;
    for (auto& batch : queue->in_flight) queue->spare_events.push_back(batch.event);
    queue->in_flight.clear();
  }
}

void CudaBackend::shutdown() noexcept {
  RETRACE_CUDA_WARN(cudaSetDevice(options_.ordinal));
  RelaxedCapture relaxed;
  for (auto& queue : queues_) RETRACE_CUDA_WARN(cudaStreamSynchronize(queue->stream));
}

// --- private ------------------------------------------------------------------------------------

// The capture's first GEMM: the queue's handle gets a workspace from the trace's pool, of the
// queue's workspace size (same size, same cuBLAS algorithms, so replays equal eager runs bit
// for bit).
void CudaBackend::give_trace_workspace(Queue& q, CudaTrace& trace) {
  const std::size_t bytes = options_.cublas_workspace_bytes;
  if (bytes == 0) return;
  trace.blas_workspace = device().allocate(bytes);  // the capturing thread: the trace's pool
  RETRACE_CUBLAS_CHECK(cublasSetWorkspace(q.blas, trace.blas_workspace->data(), bytes),
                       "giving trace {} its cuBLAS workspace", trace.id);
}

// The float32 scratch of a command that needs one: the trace's, from its pool, while
// capturing; else the queue's own.
void* CudaBackend::gemm_scratch(Queue& q, CudaTrace* trace) {
  if (trace != nullptr) {
    if (!trace->gemm_scratch) trace->gemm_scratch = device().allocate(kGemmScratchBytes);
    return trace->gemm_scratch->data();
  }
  if (q.gemm_scratch == nullptr) {
    RelaxedCapture relaxed;  // another device may be capturing on this thread
    RETRACE_CUDA_CHECK(cudaMalloc(&q.gemm_scratch, kGemmScratchBytes),
                       "allocating the float32 product scratch of {}", q.label);
  }
  return q.gemm_scratch;
}

// Back to the queue's own workspace once a capture ends.
void CudaBackend::restore_workspace(Queue& q, CudaTrace& trace) noexcept {
  if (!trace.blas_workspace) return;
  if (cublasSetWorkspace(q.blas, q.blas_workspace, options_.cublas_workspace_bytes) !=
      CUBLAS_STATUS_SUCCESS) {
    log(LogLevel::warning, "{}: restoring the queue's cuBLAS workspace failed", q.label);
  }
}

// Closes the current batch of retained objects with an event.
void CudaBackend::mark(Queue& q) {
  if (q.pending.empty()) return;
  cudaEvent_t event = nullptr;
  if (!q.spare_events.empty()) {
    event = q.spare_events.back();
    q.spare_events.pop_back();
  } else {
    RelaxedCapture relaxed;
    RETRACE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                       "creating an event on {}", q.label);
  }
  if (const cudaError_t e = cudaEventRecord(event, q.stream); e != cudaSuccess) {
    q.spare_events.push_back(event);
    RETRACE_CUDA_CHECK(e, "{}: recording an event", q.label);
  }
  q.in_flight.push_back(Retained{event, std::move(q.pending)});
  q.pending.clear();
  q.pending_commands = 0;
}

// Drops what finished work no longer needs.
void CudaBackend::reap(Queue& q) {
  RelaxedCapture relaxed;
  while (!q.in_flight.empty()) {
    const cudaError_t e = cudaEventQuery(q.in_flight.front().event);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      clear_last_error();  // a failed stream: the queue's next synchronize reports it
      break;
    }
    q.spare_events.push_back(q.in_flight.front().event);
    q.in_flight.pop_front();
  }
}

// Waits for the queue, frees what its work held, and throws its first failure.
void CudaBackend::drain_and_report(Queue& q) {
  RelaxedCapture relaxed;
  const cudaError_t error = cudaStreamSynchronize(q.stream);
  q.pending.clear();
  q.pending_commands = 0;
  for (auto& batch : q.in_flight) q.spare_events.push_back(batch.event);
  q.in_flight.clear();
  if (error != cudaSuccess) {
    clear_last_error();
    RETRACE_FAIL(device_error,
                 "work on {} failed: {}; errors of this kind leave the CUDA context unusable, "
                 "reopen the device (or restart the process)",
                 q.label, describe(error));
  }
  std::string message = std::exchange(q.released_failure, std::string());
  auto take = [&](const Domain& domain) {
    if (!domain.failed()) return;
    std::string found = describe_failure(q.label, domain, sites_);
    RETRACE_CUDA_CHECK(clear_record(domain.record, q.stream), "clearing a failure record of {}",
                       q.label);
    *domain.flag = 0;
    if (message.empty()) message = std::move(found);
  };
  take(q.domain);
  for (const CudaTrace* trace : q.replayed) take(trace->domain);
  q.replayed.clear();
  RETRACE_CHECK(message.empty(), device_error, "{}", message);
}

bool CudaBackend::any_failure(const Queue& q) const {
  if (q.domain.failed() || !q.released_failure.empty()) return true;
  return std::any_of(q.replayed.begin(), q.replayed.end(),
                     [](const CudaTrace* t) { return t->domain.failed(); });
}

}  // namespace retrace::cuda
