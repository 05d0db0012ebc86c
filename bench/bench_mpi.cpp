// Meshes across MPI ranks (retrace::mpi), run as `mpirun -np 2 retrace_bench_mpi`; rank 0
// reports. In one run:
//  - one all_reduce of 1 MiB of float32 per member across the ranks (eager, and replayed from a
//    captured trace), against a plain memcpy of the same bytes: ratio = all_reduce / memcpy;
//  - one DiT sampler step (the `retrace bench` sizes M and L, no guidance) traced on one device
//    (rank 0 alone, the other ranks sleeping) and traced on the mesh of one member per rank,
//    interleaved step by step: one_device_ms, mesh_ms, speedup = one_device_ms / mesh_ms.
// Every rank runs the same fixed number of iterations, so the collectives pair up.
#include "step_inputs.hpp"
#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <mpi.h>
#include <retrace/models/dit.hpp>
#include <retrace/models/tensor_parallel_dit.hpp>
#include <retrace/mpi.hpp>
#include <retrace/retrace.hpp>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using namespace retrace;
using timing::Clock;
using timing::median;
using timing::seconds;

constexpr std::int64_t kFloats = (std::int64_t{1} << 20) / 4;  // 1 MiB

// A barrier that sleeps while it waits, so a waiting rank leaves its core to the others.
void quiet_barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

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

void BM_MpiAllReduce1MiB(benchmark::State& state) {
  const bool traced = state.range(0) != 0;
  auto mesh = mpi::open_mesh("cpu");
  Device& member = mesh->local_member(0);
  const MeshTensor x(std::vector<Tensor>{ops::full({kFloats}, 1.0, member)}, *mesh,
                     {Placement::partial()});
  TraceId trace{};
  if (traced) {
    member.begin_trace_capture(kDefaultQueue);
    (void)ops::all_reduce(x);
    trace = member.end_trace_capture(kDefaultQueue);
  }
  const auto once = [&] {
    if (traced) {
      member.execute_trace(trace, kDefaultQueue, Blocking::no);
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
  quiet_barrier();
  const double copy = memcpy_seconds(static_cast<int>(times.size()) + 5);
  state.counters["all_reduce_us"] = median(times) * 1e6;
  state.counters["memcpy_us"] = copy * 1e6;
  state.counters["ratio"] = median(times) / copy;
  state.counters["ranks"] = static_cast<double>(mesh->size());
}
BENCHMARK(BM_MpiAllReduce1MiB)->Arg(0)->Arg(1)->ArgName("traced")->Iterations(200)->UseRealTime();

void BM_MpiDiTStepVsOneDevice(benchmark::State& state) {
  const models::NamedDiTConfig& named =
      models::benchmark_sizes().at(static_cast<std::size_t>(state.range(0)));
  const models::DiTConfig& c = named.config;
  state.SetLabel(named.name);
  const bool lead = mpi::world_rank() == 0;
  auto device = open_device("cpu");
  const models::DiT model(c, *device);
  auto mesh = mpi::open_mesh("cpu", {}, std::nullopt, {}, 1);
  const models::TensorParallelDiT split(model, *mesh);
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
  // Rank 0 alone runs the one-device step; the others sleep at the barrier after it.
  auto step_one = [&] {
    const auto t0 = Clock::now();
    if (lead) {
      (void)one(x1, t1, l1, ab1);
      device->synchronize();
    }
    const double s = seconds(t0, Clock::now());
    quiet_barrier();
    return s;
  };
  auto step_two = [&] {
    const auto t0 = Clock::now();
    (void)two.call(CallOptions{.blocking = Blocking::no}, x2, t2, l2, ab2);
    mesh->synchronize();
    const double s = seconds(t0, Clock::now());
    quiet_barrier();
    return s;
  };
  for (int i = 0; i < 2; ++i) {  // capture, then a warm replay each
    (void)step_one();
    (void)step_two();
  }
  std::vector<double> one_times, two_times;
  for (auto _ : state) {
    one_times.push_back(step_one());
    two_times.push_back(step_two());
  }
  state.counters["one_device_ms"] = median(one_times) * 1e3;
  state.counters["mesh_ms"] = median(two_times) * 1e3;
  state.counters["speedup"] = median(one_times) / median(two_times);
  state.counters["ranks"] = static_cast<double>(mesh->size());
}
// Sizes M and L (benchmark_sizes()[1], [2]).
BENCHMARK(BM_MpiDiTStepVsOneDevice)->Arg(1)->ArgName("size")->Iterations(15)->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MpiDiTStepVsOneDevice)->Arg(2)->ArgName("size")->Iterations(7)->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Reports nothing: the ranks other than 0 run the benchmarks silently.
class SilentReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  retrace::mpi::init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  if (retrace::mpi::world_size() < 2) {
    std::fprintf(stderr, "retrace_bench_mpi: run it under mpirun with 2 or more ranks\n");
    return 2;
  }
  if (retrace::mpi::world_rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}
