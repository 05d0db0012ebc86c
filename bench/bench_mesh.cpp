// Collectives on an in-process mesh of CPU devices, against a plain memcpy of the same bytes, in
// one run: the cost of one all_reduce of 1 MiB of float32 per member (eager: enqueue on both
// members and synchronize; replayed: a captured trace of the all_reduce on each member), and of
// the memcpy. Counter ratio: all_reduce time / memcpy time.
//
// And one DiT sampler step (the `retrace bench` sizes, no guidance) traced on one device and
// traced on a mesh of two (the model split by heads and MLP width, models::TensorParallelDiT),
// the two interleaved step by step in one run. Counters: one_device_ms, mesh_ms and
// speedup = one_device_ms / mesh_ms.
#include "step_inputs.hpp"
#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <retrace/models/dit.hpp>
#include <retrace/models/tensor_parallel_dit.hpp>
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

void BM_DiTStepTwoMembersVsOneDevice(benchmark::State& state) {
  const models::NamedDiTConfig& named =
      models::benchmark_sizes().at(static_cast<std::size_t>(state.range(0)));
  const models::DiTConfig& c = named.config;
  state.SetLabel(named.name);
  auto device = open_device("cpu");
  const models::DiT model(c, *device);
  auto mesh = MeshDevice::open("cpu", {2}, std::nullopt, {}, 1);
  const models::TensorParallelDiT split(model, *mesh);
  // Host inputs: latents, one timestep's features, a label, the DDIM coefficients.
  const auto [latents, t, labels, ab] = bench::step_inputs(model);

  auto one = make_tracer<Tensor, Tensor, Tensor, Tensor>(
      [&](const Tensor& x, const Tensor& tt, const Tensor& l, const Tensor& k) {
        return model.sample_step(x, tt, l, k, 1.0);
      },
      *device);
  const Tensor x1 = latents.to_device(*device), t1 = t.to_device(*device),
               l1 = labels.to_device(*device), ab1 = ab.to_device(*device);
  const std::vector<Placement> r{Placement::replicate()};
  auto two = make_tracer<MeshTensor, MeshTensor, MeshTensor, MeshTensor>(
      [&](const MeshTensor& x, const MeshTensor& tt, const MeshTensor& l, const MeshTensor& k) {
        return split.sample_step(x, tt, l, k, 1.0);
      },
      *mesh);
  const MeshTensor x2 = distribute(latents, *mesh, r), t2 = distribute(t, *mesh, r),
                   l2 = distribute(labels, *mesh, r), ab2 = distribute(ab, *mesh, r);
  auto step_one = [&] {
    (void)one(x1, t1, l1, ab1);
    device->synchronize();
  };
  auto step_two = [&] {
    (void)two.call(CallOptions{.blocking = Blocking::no}, x2, t2, l2, ab2);
    mesh->synchronize();
  };
  for (int i = 0; i < 2; ++i) {  // capture, then a warm replay each
    step_one();
    step_two();
  }
  std::vector<double> one_times, two_times;
  for (auto _ : state) {
    auto t0 = Clock::now();
    step_one();
    one_times.push_back(seconds(t0, Clock::now()));
    t0 = Clock::now();
    step_two();
    two_times.push_back(seconds(t0, Clock::now()));
  }
  state.counters["one_device_ms"] = median(one_times) * 1e3;
  state.counters["mesh_ms"] = median(two_times) * 1e3;
  state.counters["speedup"] = median(one_times) / median(two_times);
}
// Sizes M and L (benchmark_sizes()[1], [2]).
BENCHMARK(BM_DiTStepTwoMembersVsOneDevice)->Arg(1)->ArgName("size")->Iterations(15)
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiTStepTwoMembersVsOneDevice)->Arg(2)->ArgName("size")->Iterations(7)
    ->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
