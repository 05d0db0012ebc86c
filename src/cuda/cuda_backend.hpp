// CudaBackend: the backend of the CUDA device (see retrace/cuda.hpp). Queues are non-blocking
// streams with a cuBLAS handle each; traces are CUDA graphs captured from a queue's stream.
//
// Lock order: a queue's mutex, then a trace's mutex; the backend's other mutexes (sites,
// domains, staging) are leaves. Nothing here calls a CUDA API that stream capture forbids on a
// capturing thread (see RelaxedCapture).
#pragma once

#include "cuda/failures.hpp"
#include "cuda/staging.hpp"
#include "retrace/backend.hpp"
#include "retrace/cuda.hpp"

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace retrace::cuda {

struct CudaTrace final : BackendTrace {
  std::mutex mutex;
  cudaGraphExec_t exec = nullptr;
  Domain domain;
  bool has_asserts = false;
  bool released = false;
  std::uint64_t replayed_on = 0;  // bit per queue
  std::size_t graph_nodes = 0;
  std::size_t commands = 0;
  TraceId id{};
  // cuBLAS workspace of the trace's GEMMs (from its pool): a replay on any queue never shares
  // a workspace with eager work or with another trace.
  std::shared_ptr<Buffer> blas_workspace;
  // Scratch memory of its commands (attention scores), from its pool.
  std::vector<std::shared_ptr<Buffer>> scratch;
  // The float32 scratch its half-precision products with a bias share (kGemmScratchBytes, from
  // its pool, taken at the first such product): its commands run one after another.
  std::shared_ptr<Buffer> gemm_scratch;
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
  cublasLtHandle_t blas_lt = nullptr;
  void* blas_workspace = nullptr;
  void* gemm_scratch = nullptr;  // eager commands' float32 scratch (cudaMalloc'd at first need)
  Domain domain;
  std::vector<std::shared_ptr<void>> pending;  // used by work since the last event
  std::size_t pending_commands = 0;
  std::deque<Retained> in_flight;
  std::vector<cudaEvent_t> spare_events;
  // Replays of traces that can fail (assert_finite) since the queue last reported; a trace
  // removes itself from every queue's list when it is released.
  std::vector<CudaTrace*> replayed;
  std::string released_failure;        // failure of a trace released before it was reported
  std::unique_ptr<CudaTrace> capture;  // the trace being recorded on this queue
  std::thread::id capture_thread;
  cudaEvent_t capture_fence = nullptr;  // recorded just before the capture began
};

class CudaBackend final : public Backend {
 public:
  // `region` (cudaMalloc'd, `region_bytes`) becomes the backend's; freed with it.
  CudaBackend(const CudaDeviceOptions& options, std::byte* region, std::size_t region_bytes);
  ~CudaBackend() override;

  std::string_view name() const noexcept override { return "cuda"; }
  bool supports(Capability capability) const noexcept override;
  bool supports(KernelId kernel) const noexcept override;
  const char* unsupported_reason(const KernelLaunch& launch) const noexcept override;
  std::string description() const override { return cuda_device_description(options_.ordinal); }
  MemoryRegion region() override;

  void write(QueueId queue, const Buffer& dst, std::size_t offset, std::span<const std::byte> src,
             Blocking blocking) override;
  void read(QueueId queue, const Buffer& src, std::size_t offset,
            std::span<std::byte> dst) override;
  void enqueue(QueueId queue, const KernelLaunch& launch) override;
  void synchronize(QueueId queue) override;
  std::shared_ptr<detail::EventState> record_event(QueueId queue) override;
  void wait_event(QueueId queue, std::shared_ptr<const detail::EventState> event) override;

  void begin_capture(QueueId queue, TraceId trace) override;
  std::unique_ptr<BackendTrace> end_capture(QueueId queue) override;
  void abort_capture(QueueId queue) noexcept override;
  void execute(BackendTrace& trace, TraceId id, QueueId queue, Blocking blocking) override;
  void release(BackendTrace& trace, TraceId id) noexcept override;

  void reclaim() noexcept override;
  void shutdown() noexcept override;

  [[nodiscard]] cudaStream_t stream(QueueId queue) const { return queues_.at(queue.value)->stream; }
  [[nodiscard]] int ordinal() const noexcept { return options_.ordinal; }

 private:
  Queue& queue_at(QueueId queue) { return *queues_[queue.value]; }
  void make_current() const;
  void create_queues();
  void destroy_queues() noexcept;
  void give_trace_workspace(Queue& q, CudaTrace& trace);
  [[nodiscard]] void* gemm_scratch(Queue& q, CudaTrace* trace);
  void restore_workspace(Queue& q, CudaTrace& trace) noexcept;
  void mark(Queue& q);
  void reap(Queue& q);
  void drain_and_report(Queue& q);
  [[nodiscard]] bool any_failure(const Queue& q) const;
  void record_launch_failure(const KernelLaunch& launch, const Queue& q, const CudaTrace* trace,
                             cudaError_t error, cublasStatus_t blas);

  CudaDeviceOptions options_;
  std::byte* region_;
  std::size_t region_bytes_;
  DomainPool domains_;  // outlives the queues and traces that hold domains
  SiteTable sites_;
  std::shared_ptr<StagingPool> staging_;
  std::vector<std::unique_ptr<Queue>> queues_;
};

}  // namespace retrace::cuda
