// Device-level costs on the CPU device, all in one run so they can be compared as ratios:
//  - raw:    a plain loop calling the kernel loop directly (the floor);
//  - replay: a captured trace of N tiny commands, replayed on the calling thread (blocking,
//            idle queue) and handed to the queue's worker (non-blocking, then synchronize);
//  - eager:  the same op dispatched eagerly through the op front end, per op.
// The tiny kernel adds a scalar to 1024 floats (about 34 ns raw on a 4 GHz AVX-512 core).
// Counter per_command: seconds per recorded command or eager op ("48n" = 48 ns).
#include "cpu/elementwise.hpp"

#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <retrace/retrace.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

namespace {

using namespace retrace;
using timing::Clock;
using timing::median;
using timing::seconds;
constexpr std::int64_t kElements = 1024;

std::unique_ptr<Device> make_device(ExecutionMode mode) {
  CpuDeviceOptions options;
  options.execution = mode;
  options.memory_bytes = std::size_t{256} << 20;
  return open_cpu_device(options);
}

// The kernel loop as a plain out-of-line function, called directly by the raw loops; on x86-64
// built for AVX2 too (picked at load time where the CPU has it), like the device's kernels.
#if defined(__x86_64__)
[[gnu::noinline, gnu::target_clones("arch=x86-64-v3", "default")]]
#else
[[gnu::noinline]]
#endif
void add_scalar_kernel(const float* a, float* out, std::int64_t n, float s) {
  cpu::binary_scalar_loop<BinaryOp::add, float>(a, out, n, s);
}

void set_per_command(benchmark::State& state, std::int64_t commands_per_iteration) {
  // Seconds per command, printed with an SI prefix (n = nanoseconds).
  state.counters["per_command"] = benchmark::Counter(
      static_cast<double>(commands_per_iteration),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

struct CapturedChain {
  std::unique_ptr<Device> device;
  Tensor a, b;
  TraceId trace;
};

// A trace of n add-scalar commands alternating a -> b -> a.
CapturedChain capture_chain(ExecutionMode mode, std::int64_t n) {
  CapturedChain c;
  c.device = make_device(mode);
  c.a = ops::full({kElements}, 1.0, *c.device);
  c.b = ops::full({kElements}, 0.0, *c.device);
  c.device->synchronize();
  c.device->begin_trace_capture(kDefaultQueue);
  for (std::int64_t i = 0; i < n; ++i) {
    if (i & 1) {
      ops::add(c.b, 1e-6, c.a);
    } else {
      ops::add(c.a, 1e-6, c.b);
    }
  }
  c.trace = c.device->end_trace_capture(kDefaultQueue);
  return c;
}

// The floor: the same n kernel calls on the same device buffers as the trace, made directly.
void BM_Raw(benchmark::State& state) {
  const auto n = state.range(0);
  CapturedChain c = capture_chain(ExecutionMode::worker, n);
  auto* a = static_cast<float*>(c.a.buffer()->data());
  auto* b = static_cast<float*>(c.b.buffer()->data());
  for (auto _ : state) {
    for (std::int64_t i = 0; i < n; ++i) {
      add_scalar_kernel((i & 1) ? b : a, (i & 1) ? a : b, kElements, 1e-6f);
    }
    benchmark::DoNotOptimize(a);
    benchmark::ClobberMemory();
  }
  set_per_command(state, n);
  c.device->release_trace(c.trace);
}

void BM_ReplayInline(benchmark::State& state) {
  const auto n = state.range(0);
  CapturedChain c = capture_chain(ExecutionMode::worker, n);
  for (auto _ : state) c.device->execute_trace(c.trace, kDefaultQueue, Blocking::yes);
  set_per_command(state, n);
  c.device->release_trace(c.trace);
}

// Raw loop and inline replay interleaved in one loop, so machine noise hits both alike; the
// acceptance figure is `ratio` (replay time / raw time) at 1000 commands.
void BM_ReplayOverRaw(benchmark::State& state) {
    const auto n = state.range(0);
  CapturedChain c = capture_chain(ExecutionMode::worker, n);
  auto* a = static_cast<float*>(c.a.buffer()->data());
  auto* b = static_cast<float*>(c.b.buffer()->data());
  std::vector<double> raw_ns, replay_ns;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (std::int64_t i = 0; i < n; ++i) {
      add_scalar_kernel((i & 1) ? b : a, (i & 1) ? a : b, kElements, 1e-6f);
    }
    benchmark::ClobberMemory();
    const auto t1 = Clock::now();
    c.device->execute_trace(c.trace, kDefaultQueue, Blocking::yes);
    const auto t2 = Clock::now();
    raw_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    replay_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
  const double raw = median(raw_ns) / static_cast<double>(n);
  const double replay = median(replay_ns) / static_cast<double>(n);
  state.counters["raw_ns"] = raw;
  state.counters["replay_ns"] = replay;
  state.counters["ratio"] = replay / raw;
  c.device->release_trace(c.trace);
}

void BM_ReplayWorker(benchmark::State& state) {
  const auto n = state.range(0);
  CapturedChain c = capture_chain(ExecutionMode::worker, n);
  for (auto _ : state) {
    c.device->execute_trace(c.trace, kDefaultQueue, Blocking::no);
    c.device->synchronize(kDefaultQueue);
  }
  set_per_command(state, n);
  c.device->release_trace(c.trace);
}

// Eager dispatch: 100 out= ops per iteration (no allocation), then synchronize.
void eager_out(benchmark::State& state, ExecutionMode mode) {
  auto device = make_device(mode);
  Tensor a = ops::full({kElements}, 1.0, *device);
  Tensor b = ops::full({kElements}, 0.0, *device);
  constexpr int kOps = 100;
  for (auto _ : state) {
    for (int i = 0; i < kOps; ++i) {
      if (i & 1) {
        ops::add(b, 1e-6, a);
      } else {
        ops::add(a, 1e-6, b);
      }
    }
    device->synchronize(kDefaultQueue);
  }
  set_per_command(state, kOps);
}
void BM_EagerOutWorker(benchmark::State& state) { eager_out(state, ExecutionMode::worker); }
void BM_EagerOutInline(benchmark::State& state) { eager_out(state, ExecutionMode::inline_); }

// Eager dispatch with an output allocated per op (the common case), then synchronize.
void eager_alloc(benchmark::State& state, ExecutionMode mode) {
  auto device = make_device(mode);
  Tensor a = ops::full({kElements}, 1.0, *device);
  constexpr int kOps = 100;
  for (auto _ : state) {
    Tensor x = a;
    for (int i = 0; i < kOps; ++i) x = ops::add(x, 1e-6);
    device->synchronize(kDefaultQueue);
  }
  set_per_command(state, kOps);
}
void BM_EagerAllocWorker(benchmark::State& state) { eager_alloc(state, ExecutionMode::worker); }
void BM_EagerAllocInline(benchmark::State& state) { eager_alloc(state, ExecutionMode::inline_); }

}  // namespace

BENCHMARK(BM_Raw)->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK(BM_ReplayInline)->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK(BM_ReplayOverRaw)->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK(BM_ReplayWorker)->Arg(10)->Arg(100)->Arg(1000);
BENCHMARK(BM_EagerOutInline);
BENCHMARK(BM_EagerOutWorker);
BENCHMARK(BM_EagerAllocInline);
BENCHMARK(BM_EagerAllocWorker);

BENCHMARK_MAIN();
