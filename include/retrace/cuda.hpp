// The CUDA device: the Device interface on an NVIDIA GPU, with traces replayed as CUDA graphs.
// Part of the retrace::cuda target, built when CMake finds a CUDA toolkit.
//
// Memory is one cudaMalloc'd arena per device with the CPU device's allocator (stable,
// 256-byte aligned addresses, first fit, per-trace private pools). Each command queue is a CUDA
// stream with its own cuBLAS handle and workspace. A capture is a thread-local stream capture;
// end_trace_capture instantiates (and uploads) the graph, execute_trace is one cudaGraphLaunch.
// Host writes go through pinned staging buffers, so a non-blocking write returns once the data
// is staged. Buffers used by queued work stay alive until the work is done.
//
//   if (retrace::cuda_device_count() > 0) {
//     retrace::CudaDeviceOptions options;
//     options.memory_bytes = std::size_t{4} << 30;
//     auto gpu = retrace::open_cuda_device(options);       // "cuda:0"
//   }
//
// Differences from the CPU device, all by design: Buffer::data() is a device pointer (no
// host_visible_memory); there are no guard bytes; after a failed command (assert_finite) later
// kernels of the queue or trace are skipped, but cuBLAS products in between still run (their
// results are discarded with the rest); a replay's failure is found by the next synchronize,
// read or execute_trace of the queue it ran on. A product's bits can depend on how its operands
// lie in memory (cuBLAS picks its kernel, and so its order of summation, by orientation): a
// strided view copied dense may come out a rounding away from the same values given dense, where
// the CPU device is bit for bit; replays still equal eager runs bit for bit. A linear's bias is
// added by cuBLASLt's epilogue, in float32 before the output is rounded once; where cuBLASLt has
// no algorithm for the shapes or alignment, a half-precision linear multiplies into a float32
// scratch and rounds once too (cuBLAS alone would round the product before adding the bias).
// That scratch is 16 MiB, one per queue and one from the pool of each trace with such a linear.
#pragma once

#include "retrace/device.hpp"

#include <cstddef>
#include <memory>
#include <string>

struct CUstream_st;     // cudaStream_t is CUstream_st*
struct CUgraphExec_st;  // cudaGraphExec_t is CUgraphExec_st*

namespace retrace {

struct CudaDeviceOptions {
  DeviceId id{0};                                   // retrace's device id: the name is "cuda:<id>"
  int ordinal = 0;                                  // which GPU (CUDA device ordinal)
  std::size_t memory_bytes = std::size_t{8} << 30;  // arena, allocated when the device opens
  // Limit on memory held by traces (all live traces plus the capture in progress).
  std::size_t trace_region_bytes = std::size_t{1} << 30;
  std::uint32_t num_queues = 2;
  // cuBLAS workspace of each queue, and of each trace that multiplies matrices (taken from the
  // trace's pool, so replays on any queue never share a workspace with other work).
  std::size_t cublas_workspace_bytes = std::size_t{4} << 20;
};

// GPUs the CUDA runtime can use; 0 without a GPU or driver (never throws).
[[nodiscard]] int cuda_device_count() noexcept;
// Why no GPU can be used ("" when one can), e.g. "CUDA driver version is insufficient ...".
[[nodiscard]] std::string cuda_unavailable_reason();
// "NVIDIA H200 (sm_90, 139.8 GiB)"; throws if the ordinal does not exist.
[[nodiscard]] std::string cuda_device_description(int ordinal = 0);

// Throws failed_precondition without a usable GPU, out_of_memory if the arena does not fit.
[[nodiscard]] std::unique_ptr<Device> open_cuda_device(const CudaDeviceOptions& options = {});

// For code that mixes its own CUDA work with retrace's: the stream behind a queue, and the
// executable graph behind a trace (owned by the device; valid until the trace is released).
// Both throw invalid_argument for a device that is not a CUDA device; kDefaultQueue is queue 0.
[[nodiscard]] CUstream_st* cuda_stream(Device& device, QueueId queue);
[[nodiscard]] CUgraphExec_st* cuda_graph_exec(Device& device, TraceId trace);

}  // namespace retrace
