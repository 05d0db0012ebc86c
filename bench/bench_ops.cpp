// Op library throughput on the CPU device, beside the libraries and memcpy, in one run.
//
//  BM_Matmul/<impl>/<m>/<n>/<k>: GFLOP/s (counter `GFLOPs`) of
//    impl 0 = retrace ops::matmul (a one-op trace replayed, so dispatch is excluded),
//    impl 1 = OpenBLAS sgemm, 1 thread;  2 = OpenBLAS sgemm, 2 threads;  3 = Eigen, 1 thread;
//    4 = oneDNN matmul, 1 thread (when built with oneDNN).
//    Shapes: a transformer block at hidden 256, sequence 32 (qkv, projection, MLP up/down), the
//    DiT bench's M size (256 tokens: qkv, MLP up/down), its adaLN projection of 1, 2 and 4
//    conditioning rows (retrace's thin-product kernel), and squares n = 256 and 1024.
//  BM_MatmulVsLibraries/<n>: the same, interleaved in one loop; `ratio` = retrace GFLOP/s over
//    the best single-thread library (the acceptance figure at n = 256).
//  BM_ThinLinear/<m>: a linear of m = 1..5 rows against a [1536, 256] weight, retrace (kernels
//    on one thread) beside oneDNN and Eigen on one thread; `ratio` = the faster library's time
//    over retrace's.
//  BM_BandwidthVsMemcpy/<op>: GB/s of add (reads 2 x 16 MiB, writes 16 MiB) or softmax (reads
//    and writes 16 MiB) next to std::memcpy of 16 MiB, interleaved; `ratio` = op / memcpy.
#include "cpu/isa.hpp"

#include "util/timing.hpp"

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <retrace/retrace.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace {

using namespace retrace;
using timing::Clock;
using timing::median;
using timing::seconds;

// The sgemm of the kernel variant a device picks here (the libraries as the device calls them).
void sgemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
           float* c, cpu::GemmLibrary library, bool trans_b = false) {
  static const cpu::KernelVariant& kernels =
      *cpu::choose_variant("", std::getenv("RETRACE_CPU_ISA"), cpu::this_cpu(), "bench")
           .variant;
  kernels.sgemm(false, trans_b, m, n, k, 1.0f, a, b, 0.0f, c, library, nullptr);
}

struct MatmulSetup {
  std::unique_ptr<Device> device = open_cpu_device();
  Tensor a, b;
  std::vector<float> ha, hb, hc;
  std::int64_t m, n, k;
  TraceId trace;
  Tensor out;

  MatmulSetup(std::int64_t m_, std::int64_t n_, std::int64_t k_) : m(m_), n(n_), k(k_) {
    ha.assign(static_cast<std::size_t>(m * k), 0.5f);
    hb.assign(static_cast<std::size_t>(k * n), 0.25f);
    hc.assign(static_cast<std::size_t>(m * n), 0.0f);
    a = Tensor::from_vector<float>(ha, {m, k}, DType::float32).to_device(*device);
    b = Tensor::from_vector<float>(hb, {k, n}, DType::float32).to_device(*device);
    device->begin_trace_capture(kDefaultQueue);
    out = ops::matmul(a, b);
    trace = device->end_trace_capture(kDefaultQueue);
    device->execute_trace(trace, kDefaultQueue, Blocking::yes);  // warm up scratch and pages
  }
  void run(int impl) {
    switch (impl) {
      case 0: device->execute_trace(trace, kDefaultQueue, Blocking::yes); break;
      case 1:
        openblas_set_num_threads(1);
        sgemm(m, n, k, ha.data(), hb.data(), hc.data(), cpu::GemmLibrary::openblas);
        break;
      case 2:
        openblas_set_num_threads(2);
        sgemm(m, n, k, ha.data(), hb.data(), hc.data(), cpu::GemmLibrary::openblas);
        break;
      case 3:
        sgemm(m, n, k, ha.data(), hb.data(), hc.data(), cpu::GemmLibrary::eigen);
        break;
      default:
        sgemm(m, n, k, ha.data(), hb.data(), hc.data(), cpu::GemmLibrary::onednn);
        break;
    }
  }
  double flops() const { return 2.0 * static_cast<double>(m * n * k); }
};

int default_openblas_threads() {
  static const int threads = openblas_get_num_threads();
  return threads;
}

void BM_Matmul(benchmark::State& state) {
  const int impl = static_cast<int>(state.range(0));
  MatmulSetup s(state.range(1), state.range(2), state.range(3));
  for (auto _ : state) s.run(impl);
  openblas_set_num_threads(default_openblas_threads());
  state.counters["GFLOPs"] = benchmark::Counter(s.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MatmulVsLibraries(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  MatmulSetup s(n, n, n);
  std::vector<double> t[5];
  std::vector<int> impls = {1, 3, 0};
  if (RETRACE_HAVE_ONEDNN) impls.push_back(4);
  for (auto _ : state) {
    for (int impl : impls) {
      if (impl == 0) openblas_set_num_threads(default_openblas_threads());
      const auto t0 = Clock::now();
      s.run(impl);
      t[impl].push_back(seconds(t0, Clock::now()));
    }
  }
  openblas_set_num_threads(default_openblas_threads());
  const double ours = s.flops() / median(t[0]) * 1e-9;
  const double blas = s.flops() / median(t[1]) * 1e-9;
  const double eigen = s.flops() / median(t[3]) * 1e-9;
  state.counters["retrace_GFLOPs"] = ours;
  state.counters["openblas1_GFLOPs"] = blas;
  state.counters["eigen1_GFLOPs"] = eigen;
  double best = std::max(blas, eigen);
  if (RETRACE_HAVE_ONEDNN) {
    const double onednn = s.flops() / median(t[4]) * 1e-9;
    state.counters["onednn1_GFLOPs"] = onednn;
    best = std::max(best, onednn);
  }
  state.counters["ratio"] = ours / best;
}

// A linear of m rows against a [1536, 256] weight (the DiT's adaLN projection): retrace's
// ops::linear replayed on a device whose kernels keep to one thread (the thin-product kernel
// for m <= 4 on AVX2/AVX-512 variants) against oneDNN and Eigen on one thread given the same
// [n, k] weight. Each mode runs 32 products in a row (so each finds its own data in the cache,
// as a step's consecutive commands do), the modes taking turns.
void BM_ThinLinear(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = 1536, k = 256;
  auto device = open_cpu_device(CpuDeviceOptions{.kernel_threads = 1});
  std::vector<float> ha(static_cast<std::size_t>(m * k), 0.5f);
  std::vector<float> hw(static_cast<std::size_t>(n * k), 0.25f);
  std::vector<float> hc(static_cast<std::size_t>(m * n));
  const Tensor a = Tensor::from_vector<float>(ha, {m, k}, DType::float32).to_device(*device);
  const Tensor w = Tensor::from_vector<float>(hw, {n, k}, DType::float32).to_device(*device);
  device->begin_trace_capture(kDefaultQueue);
  const Tensor out = ops::linear(a, w);
  const TraceId trace = device->end_trace_capture(kDefaultQueue);
  device->execute_trace(trace, kDefaultQueue, Blocking::yes);
  const std::function<void()> modes[3] = {
      [&] { device->execute_trace(trace, kDefaultQueue, Blocking::yes); },
      [&] { sgemm(m, n, k, ha.data(), hw.data(), hc.data(), cpu::GemmLibrary::onednn, true); },
      [&] { sgemm(m, n, k, ha.data(), hw.data(), hc.data(), cpu::GemmLibrary::eigen, true); }};
  std::vector<double> times[3];
  for (auto _ : state) {
    for (int mode = 0; mode < 3; ++mode) {
      modes[mode]();  // untimed: its data into the cache
      for (int rep = 0; rep < 32; ++rep) {
        const auto t0 = Clock::now();
        modes[mode]();
        times[mode].push_back(seconds(t0, Clock::now()));
      }
    }
  }
  const double flops = 2.0 * static_cast<double>(m * n * k) * 1e-9;
  state.counters["retrace_GFLOPs"] = flops / median(times[0]);
  state.counters["onednn1_GFLOPs"] = flops / median(times[1]);
  state.counters["eigen1_GFLOPs"] = flops / median(times[2]);
  state.counters["ratio"] = std::min(median(times[1]), median(times[2])) / median(times[0]);
  device->release_trace(trace);
}

void BM_BandwidthVsMemcpy(benchmark::State& state) {
  const bool softmax = state.range(0) == 1;
  constexpr std::int64_t kFloats = (16 << 20) / 4;
  auto device = open_cpu_device();
  Tensor x = ops::full({kFloats / 1024, 1024}, 0.5, *device);
  Tensor y = ops::full({kFloats / 1024, 1024}, 0.25, *device);
  device->begin_trace_capture(kDefaultQueue);
  Tensor out = softmax ? ops::softmax(x) : ops::add(x, y);
  const TraceId trace = device->end_trace_capture(kDefaultQueue);
  device->execute_trace(trace, kDefaultQueue, Blocking::yes);
  std::vector<char> src(16 << 20, 1), dst(16 << 20, 0);
  std::vector<double> op_s, copy_s;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
    const auto t1 = Clock::now();
    device->execute_trace(trace, kDefaultQueue, Blocking::yes);
    const auto t2 = Clock::now();
    copy_s.push_back(seconds(t0, t1));
    op_s.push_back(seconds(t1, t2));
  }
  const double mib16 = 16.0 * (1 << 20);
  const double op_gbps = (softmax ? 2 : 3) * mib16 / median(op_s) * 1e-9;
  const double copy_gbps = 2 * mib16 / median(copy_s) * 1e-9;
  state.counters["op_GBps"] = op_gbps;
  state.counters["memcpy_GBps"] = copy_gbps;
  state.counters["ratio"] = op_gbps / copy_gbps;
  device->release_trace(trace);
}

void matmul_shapes(benchmark::internal::Benchmark* b) {
  const std::vector<std::vector<std::int64_t>> shapes = {
      {32, 768, 256}, {32, 256, 256}, {32, 1024, 256}, {32, 256, 1024},
      {256, 768, 256}, {256, 1024, 256}, {256, 256, 1024},
      {1, 1536, 256}, {2, 1536, 256}, {4, 1536, 256},
      {256, 256, 256}, {1024, 1024, 1024}};
  for (int impl = 0; impl < (RETRACE_HAVE_ONEDNN ? 5 : 4); ++impl) {
    for (const auto& s : shapes) b->Args({impl, s[0], s[1], s[2]});
  }
  b->ArgNames({"impl", "m", "n", "k"});
}

}  // namespace

BENCHMARK(BM_Matmul)->Apply(matmul_shapes)->MinTime(0.1);
BENCHMARK(BM_MatmulVsLibraries)->Arg(256)->Arg(1024)->MinTime(0.5);
BENCHMARK(BM_ThinLinear)->DenseRange(1, 5)->ArgName("m")->MinTime(0.3);
BENCHMARK(BM_BandwidthVsMemcpy)->Arg(0)->Arg(1)->ArgName("softmax")->MinTime(0.5);

BENCHMARK_MAIN();
