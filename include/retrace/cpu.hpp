// The built-in CPU device: the reference backend every other backend is measured against.
//
// Memory is one arena per device with real, stable, 64-byte aligned addresses. Each command
// queue either runs its work on a worker thread (ExecutionMode::worker, the default) or on the
// calling thread as it is enqueued (ExecutionMode::inline_). A blocking replay always runs on the
// calling thread, once the queue's earlier work is done: a hand-off to another core costs
// microseconds, more than replaying a small trace. Kernels split large loops across the CPUs the
// process may run on (its affinity mask: taskset, a container's cpuset, an MPI rank's binding;
// RETRACE_KERNEL_THREADS sets the count instead). Commands are plain structs (a kernel function
// pointer and its parameters), replayed by walking an array.
//
// The kernels are built for several instruction sets (on x86-64: "x86-64", the baseline;
// "avx2", x86-64-v3; "avx512", x86-64-v4) and each device runs one of them, chosen when it
// opens: CpuDeviceOptions::kernel_isa if set, else the environment variable RETRACE_CPU_ISA,
// else automatically from the CPU (cpuid, and whether the OS saves the vector registers): the
// widest variant it runs, except on AMD CPUs, which get avx2 (AVX-512 kernels measured slower
// there). Results are bit-identical between eager and traced work of one device; devices on
// different variants may round differently (FMA contraction, vector widths).
//
//   retrace::CpuDeviceOptions options;
//   options.memory_bytes = 256 << 20;
//   auto device = retrace::open_cpu_device(options);           // "cpu:0"
//   auto devices = retrace::open_cpu_devices(2, options);      // "cpu:0", "cpu:1"
#pragma once

#include "retrace/device.hpp"

#include <cstddef>
#include <memory>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace retrace {

enum class ExecutionMode : std::uint8_t { worker, inline_ };

struct CpuDeviceOptions {
  DeviceId id{0};
  std::size_t memory_bytes = std::size_t{1} << 30;  // arena size (reserved lazily)
  // Limit on memory held by traces (all live traces plus the capture in progress).
  std::size_t trace_region_bytes = std::size_t{256} << 20;
  std::uint32_t num_queues = 2;
  ExecutionMode execution = ExecutionMode::worker;
  // Eager commands are handed to the worker in batches of at most this many (and at every
  // synchronize, read, event and replay).
  std::uint32_t eager_batch = 32;
  // How long an idle worker spins before it sleeps.
  std::uint32_t worker_spin_us = 50;
  // Debug aid: bytes of a known pattern before and after every buffer, checked when the buffer
  // is freed; damage is reported as a sticky device error at the next synchronize.
  std::size_t guard_bytes = 0;
  // The kernel variant: "" (RETRACE_CPU_ISA if set, else automatic), "auto", "x86-64"
  // (alias "baseline"), "avx2" (alias "x86-64-v3") or "avx512" ("x86-64-v4"); on other
  // architectures "generic". A name this build lacks is invalid_argument; a variant this CPU
  // cannot run is unimplemented, naming what it lacks.
  std::string kernel_isa = {};
  // 0: kernels split large loops over the process's kernel threads (one per CPU the process may
  // run on, shared by every CPU device); 1: every kernel runs on the queue's own thread, GEMMs
  // single-threaded, so devices used side by side (a mesh's members) each keep to one core;
  // n > 1: as 0, over at most n threads (the queue's included). Results may round differently
  // between 1 and the other settings (another GEMM library), never between eager and traced work
  // of one device, nor between settings other than 1.
  std::uint32_t kernel_threads = 0;
};

[[nodiscard]] std::unique_ptr<Device> open_cpu_device(const CpuDeviceOptions& options = {});
// n independent devices with ids 0..n-1, each with its own memory and queues.
[[nodiscard]] std::vector<std::unique_ptr<Device>> open_cpu_devices(
    std::size_t count, CpuDeviceOptions options = {});

struct CpuKernelIsa {
  std::string name;      // "avx2"
  std::string march;     // the -march it was built with ("x86-64-v3"); "" for generic
  std::string unusable;  // "" when this CPU runs it, else why not ("lacks avx512f, ...")
};
// The kernel variants this library was built with, narrowest first.
[[nodiscard]] std::vector<CpuKernelIsa> cpu_kernel_isas();
// The variant a CPU device opened now with kernel_isa "" would run, and why:
// {"avx2", "automatic"} or {"x86-64", "RETRACE_CPU_ISA"}. Throws as open_cpu_device would
// for a bad RETRACE_CPU_ISA.
[[nodiscard]] std::pair<std::string, std::string> default_cpu_kernel_isa();
// The variant the device runs ("avx2"), or "" if it is not a CPU device.
[[nodiscard]] std::string cpu_kernel_isa(Device& device);
// What the device's bfloat16 matrix products (linear, matmul, attention) run on: "amx_bf16"
// (AMX tiles) or "avx512_bf16" (AVX512-BF16 dot products), through oneDNN, where the CPU has
// them; "float32" (operands converted, float32 products) elsewhere, or with RETRACE_NO_ONEDNN
// or RETRACE_NO_BF16_GEMM set. "" if it is not a CPU device.
[[nodiscard]] std::string cpu_bfloat16_products(Device& device);
// Bytes of weights the device's kernels hold in oneDNN's layout (packed copies, made for a
// weight that products read twice unchanged; see docs/devices.md), shared by every device of
// the process that runs the same kernel variant. 0 if it is not a CPU device.
[[nodiscard]] std::int64_t cpu_packed_weight_bytes(Device& device);

}  // namespace retrace
