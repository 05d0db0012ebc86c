// The public functions of retrace/cuda.hpp.
#include "retrace/backend.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/relaxed.hpp"

namespace retrace {

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cuda::clear_last_error();  // no driver or no GPU: 0, as documented
    return 0;
  }
  return count;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cuda::clear_last_error();
    return cuda::describe(error);
  }
  return count > 0 ? std::string() : std::string("no CUDA GPU is visible");
}

std::string cuda_device_description(int ordinal) {
  const int count = cuda_device_count();
  RETRACE_CHECK(ordinal >= 0 && ordinal < count, invalid_argument,
                "CUDA device ordinal {} does not exist ({} GPUs visible)", ordinal, count);
  cudaDeviceProp prop{};
  RETRACE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal), "describing GPU {}", ordinal);
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
  RETRACE_CUDA_CHECK(cudaSetDevice(options.ordinal), "open_cuda_device: making GPU {} current",
                     options.ordinal);
  const std::size_t bytes = device_memory_capacity(options.memory_bytes, 256);
  void* region = nullptr;
  cuda::RelaxedCapture relaxed;  // another device may be capturing on this thread
  if (const cudaError_t e = cudaMalloc(&region, bytes); e != cudaSuccess) {
    cuda::clear_last_error();
    std::size_t free_bytes = 0, total = 0;
    RETRACE_CUDA_WARN(cudaMemGetInfo(&free_bytes, &total));
    RETRACE_FAIL(out_of_memory,
                 "open_cuda_device: cannot allocate the {} arena on GPU {} ({}); {} of {} free; "
                 "lower CudaDeviceOptions::memory_bytes",
                 detail::human_bytes(bytes), options.ordinal, cuda::describe(e),
                 detail::human_bytes(free_bytes), detail::human_bytes(total));
  }
  // The backend owns the region from here (it frees it if its construction fails).
  auto backend = std::make_unique<cuda::CudaBackend>(options, static_cast<std::byte*>(region), bytes);
  DeviceOptions common{options.id, bytes, options.trace_region_bytes, options.num_queues, 0};
  return make_device(std::move(backend), common);
}

namespace {
cuda::CudaBackend& as_cuda(Device& device, std::string_view what) {
  auto* backend = backend_of<cuda::CudaBackend>(device);
  RETRACE_CHECK(backend != nullptr, invalid_argument, "{}: {} is not a CUDA device", what,
                device.name());
  return *backend;
}
}  // namespace

CUstream_st* cuda_stream(Device& device, QueueId queue) {
  if (queue == kDefaultQueue) queue = QueueId{0};  // no capture to follow here
  RETRACE_CHECK(queue.value < device.num_queues(), invalid_argument,
                "cuda_stream: {} has no queue {}", device.name(), queue.value);
  return as_cuda(device, "cuda_stream").stream(queue);
}

CUgraphExec_st* cuda_graph_exec(Device& device, TraceId trace) {
  (void)as_cuda(device, "cuda_graph_exec");
  auto* found = static_cast<cuda::CudaTrace*>(backend_trace(device, trace));
  RETRACE_CHECK(found != nullptr, invalid_argument,
                "cuda_graph_exec: trace {} does not exist on {} (never captured, or released)",
                trace, device.name());
  return found->exec;
}

}  // namespace retrace
