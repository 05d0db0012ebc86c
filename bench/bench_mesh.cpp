// Collectives on an in-process mesh of CPU devices, against a plain memcpy of the same bytes, in
// one run: the cost of one all_reduce of 1 MiB of float32 per member (eager: enqueue on both
// members and synchronize; replayed: a captured trace of the all_reduce on each member), and of
// the memcpy. Counter ratio: all_reduce time / memcpy time.
#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <retrace/retrace.hpp>

#include <cstring>
#include <vector>

namespace {

using namespace retrace;
using timing::Clock;
using timing::median;
using timing::seconds;

constexpr std::int64_t kFloats = (std::int64_t{1} << 20) / 4;  // 1 MiB

double memcpy_seconds(int reps) {
  std::vector<float> a(kFloats, 1.0f), b(kFloats);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), sizeof(float) * kFloats);
    benchmark::DoNotOptimize(b.data());
    times.push_back(seconds(t0, Clock::now()));
  }
  return median(times);
}

void BM_AllReduce1MiB(benchmark::State& state) {
  const bool traced = state.range(0) != 0;
  auto mesh = MeshDevice::open("cpu", {2});
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 2; ++k) shards.push_back(ops::full({kFloats}, 1.0, mesh->member(k)));
  const MeshTensor x(shards, *mesh, {Placement::partial()});
  std::vector<TraceId> traces;
  if (traced) {
    for (std::size_t k = 0; k < 2; ++k) mesh->member(k).begin_trace_capture(kDefaultQueue);
    (void)ops::all_reduce(x);
    for (std::size_t k = 0; k < 2; ++k) {
      traces.push_back(mesh->member(k).end_trace_capture(kDefaultQueue));
    }
  }
  const auto once = [&] {
    if (traced) {
      for (std::size_t k = 0; k < 2; ++k) {
        mesh->member(k).execute_trace(traces[k], kDefaultQueue, Blocking::no);
      }
    } else {
      (void)ops::all_reduce(x);
    }
    mesh->synchronize();
  };
  for (int i = 0; i < 5; ++i) once();
  std::vector<double> times;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    once();
    times.push_back(seconds(t0, Clock::now()));
  }
  const double copy = memcpy_seconds(static_cast<int>(times.size()) + 5);
  state.counters["all_reduce_us"] = median(times) * 1e6;
  state.counters["memcpy_us"] = copy * 1e6;
  state.counters["ratio"] = median(times) / copy;
}
BENCHMARK(BM_AllReduce1MiB)->Arg(0)->Arg(1)->ArgName("traced")->Iterations(200)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
