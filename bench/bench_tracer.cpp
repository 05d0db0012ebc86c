// Tracer call overhead, excluding the trace's own execution.
//
// The traced function takes N tensor leaves (a std::vector<Tensor>) and returns them, so its
// trace holds no command. Each iteration times a batch of tracer calls whose inputs are already
// in their slots (passed back from inputs()), and a batch of direct execute_trace calls of the
// same trace, interleaved so machine noise hits both alike. Counters:
//   tracer_ns   per tracer call;   execute_ns per bare execute_trace;
//   overhead_ns = tracer_ns - execute_ns;   goal_ns = 150 + 15 * N (the target).
#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <retrace/retrace.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

namespace {

using namespace retrace;
using timing::Clock;
using timing::median;
using timing::seconds;

// Times batches of tracer calls (inputs passed back from inputs(), so nothing is copied) against
// batches of bare execute_trace calls of the same trace, interleaved, and reports the medians.
template <typename TracerT>
void time_against_execute(benchmark::State& state, TracerT& tracer, Device& device) {
  const auto& slots = std::get<0>(tracer.inputs());
  const TraceId trace = tracer.trace_ids().front();
  constexpr int kBatch = 64;
  std::vector<double> tracer_ns, execute_ns;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kBatch; ++i) benchmark::DoNotOptimize(&tracer(slots));
    const auto t1 = Clock::now();
    for (int i = 0; i < kBatch; ++i) device.execute_trace(trace, kDefaultQueue, Blocking::yes);
    const auto t2 = Clock::now();
    tracer_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBatch);
    execute_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / kBatch);
  }
  const double tracer_median = median(tracer_ns), execute_median = median(execute_ns);
  state.counters["tracer_ns"] = tracer_median;
  state.counters["execute_ns"] = execute_median;
  state.counters["overhead_ns"] = tracer_median - execute_median;
  if (tracer.stats().copies != 0) state.SkipWithError("inputs were copied");
}

void BM_TracerOverhead(benchmark::State& state) {
  const auto leaves = static_cast<int>(state.range(0));
  auto device = open_cpu_device();
  std::vector<Tensor> xs;
  for (int i = 0; i < leaves; ++i) xs.push_back(ops::full({16}, i, *device));
  device->synchronize();
  auto tracer = make_tracer([](const std::vector<Tensor>& in) { return in; }, *device,
                            TraceOptions{.prep_run = false});
  tracer(xs);
  time_against_execute(state, tracer, *device);
  state.counters["goal_ns"] = 150.0 + 15.0 * leaves;
}

// The same, with N outputs in the trace's own memory (each written by a one-element fill): the
// tracer then stamps each output after every replay, for the stale-output check. The difference
// of overhead_ns with BM_TracerOverhead is what the check costs per replay.
void BM_TracerOverheadWithOutputs(benchmark::State& state) {
  const auto leaves = static_cast<int>(state.range(0));
  auto device = open_cpu_device();
  std::vector<Tensor> xs;
  for (int i = 0; i < leaves; ++i) xs.push_back(ops::full({1}, i, *device));
  device->synchronize();
  auto tracer = make_tracer(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> out;
        for (const Tensor& x : in) out.push_back(ops::full(x.shape(), 1.0, *x.device()));
        return out;
      },
      *device, TraceOptions{.prep_run = false});
  tracer(xs);
  time_against_execute(state, tracer, *device);
}

}  // namespace

BENCHMARK(BM_TracerOverhead)->Arg(1)->Arg(8)->Arg(64);
BENCHMARK(BM_TracerOverheadWithOutputs)->Arg(1)->Arg(8)->Arg(64);

BENCHMARK_MAIN();
