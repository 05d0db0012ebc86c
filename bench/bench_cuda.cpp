// retrace_bench_cuda: what retrace costs on a GPU, per step, against hand-written CUDA.
//
//   retrace_bench_cuda [--json PATH] [--rounds N]
//
// Two steps, each timed four ways in interleaved rounds (the median of the rounds' mean step
// times is reported):
//  - tiny: 20 dependent `x + 1` launches on 4096 floats, so launch overhead is all there is.
//      eager:       20 ops::add calls, then synchronize;
//      traced:      a Tracer call (input already in its slot), blocking;
//      hand graph:  the same 20 launches of a hand-written kernel, captured by hand with
//                   cudaStreamBeginCapture, replayed with cudaGraphLaunch + cudaStreamSynchronize;
//      same graph:  cudaGraphLaunch of the very graph behind the Tracer's trace (the floor for
//                   our wrapper: any difference to "traced" is retrace's own per-call cost).
//    Also the submit cost (calls return before the GPU is done; 100 calls, then one sync).
//  - dit: one sampler step of the DiT at sizes S and M: eager, traced, same graph.
// Exits 3 (and prints why) when no GPU can be used.
#include "util/timing.hpp"

#include <retrace/cuda.hpp>
#include <retrace/models/dit.hpp>
#include <retrace/retrace.hpp>

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

cudaError_t bench_hand_add_one(float* x, long long n, cudaStream_t stream);

namespace {

using retrace::timing::Clock;
using retrace::timing::median;
using retrace::timing::seconds;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "retrace_bench_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Interleaved rounds: each mode runs `steps` steps per round; returns the median over rounds of
// the mean microseconds per step, one entry per mode.
std::vector<double> interleaved(const std::vector<std::function<void()>>& modes, int rounds,
                                int steps) {
  std::vector<std::vector<double>> per_mode(modes.size());
  for (const auto& mode : modes) mode();  // warm up
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t m = 0; m < modes.size(); ++m) {
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) modes[m]();
      per_mode[m].push_back(seconds(t0, Clock::now()) * 1e6 / steps);
    }
  }
  std::vector<double> out;
  for (auto& v : per_mode) out.push_back(median(v));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retrace;
  std::string json_path;
  int rounds = 15;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: retrace_bench_cuda [--json PATH] [--rounds N]\n");
      return 2;
    }
  }
  if (const std::string reason = cuda_unavailable_reason(); !reason.empty()) {
    std::printf("retrace_bench_cuda: skipped, no usable GPU: %s\n", reason.c_str());
    return 3;
  }
  const std::string gpu = cuda_device_description(0);
  std::printf("GPU: %s\n", gpu.c_str());
  CudaDeviceOptions options;
  options.memory_bytes = std::size_t{2} << 30;
  auto device = open_cuda_device(options);
  cudaStream_t stream = cuda_stream(*device, kDefaultQueue);
  nlohmann::json report;
  report["gpu"] = gpu;
  report["rounds"] = rounds;

  // --- tiny ---------------------------------------------------------------------------------
  constexpr int kLaunches = 20;
  constexpr std::int64_t kFloats = 4096;
  auto chain = [](const Tensor& x) {
    Tensor y = x;
    for (int i = 0; i < kLaunches; ++i) y = ops::add(y, 1.0);
    return y;
  };
  Tensor x = ops::full({kFloats}, 0.0, *device);
  auto tracer = make_tracer(chain, *device, TraceOptions{.name = "tiny"});
  (void)tracer(x);
  const Tensor& slot = std::get<0>(tracer.inputs());
  const TraceId trace = tracer.trace_ids().front();
  cudaGraphExec_t same = cuda_graph_exec(*device, trace);

  float* hand_buffer = nullptr;
  cuda_check(cudaMalloc(reinterpret_cast<void**>(&hand_buffer), kFloats * sizeof(float)),
             "cudaMalloc");
  cudaStream_t hand_stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&hand_stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(hand_stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < kLaunches; ++i)
    cuda_check(bench_hand_add_one(hand_buffer, kFloats, hand_stream), "launch");
  cuda_check(cudaStreamEndCapture(hand_stream, &graph), "end capture");
  cudaGraphExec_t hand = nullptr;
  cuda_check(cudaGraphInstantiate(&hand, graph, 0), "instantiate");
  cuda_check(cudaGraphUpload(hand, hand_stream), "upload");

  const std::vector<double> latency =
      interleaved({[&] {
                     Tensor y = x;
                     for (int i = 0; i < kLaunches; ++i) y = ops::add(y, 1.0);
                     device->synchronize(kDefaultQueue);
                   },
                   [&] { (void)tracer(slot); },
                   [&] {
                     cuda_check(cudaGraphLaunch(hand, hand_stream), "launch");
                     cuda_check(cudaStreamSynchronize(hand_stream), "sync");
                   },
                   [&] {
                     cuda_check(cudaGraphLaunch(same, stream), "launch");
                     cuda_check(cudaStreamSynchronize(stream), "sync");
                   }},
                  rounds, 200);
  // Submit cost: 100 calls that return before the GPU is done, then one wait (not timed).
  constexpr int kBurst = 100;
  auto burst = [&](const std::function<void()>& submit, const std::function<void()>& wait) {
    std::vector<double> us;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      for (int i = 0; i < kBurst; ++i) submit();
      us.push_back(seconds(t0, Clock::now()) * 1e6 / kBurst);
      wait();
    }
    return median(us);
  };
  const CallOptions async{.blocking = Blocking::no};
  auto wait_device = [&] { device->synchronize(); };
  auto wait_hand = [&] { cuda_check(cudaStreamSynchronize(hand_stream), "sync"); };
  const double submit_traced = burst([&] { (void)tracer.call(async, slot); }, wait_device);
  const double submit_hand =
      burst([&] { cuda_check(cudaGraphLaunch(hand, hand_stream), "launch"); }, wait_hand);
  const double submit_same =
      burst([&] { cuda_check(cudaGraphLaunch(same, stream), "launch"); }, wait_device);

  std::printf(
      "tiny step (%d launches of x + 1 on %lld floats), us per step, median of %d rounds:\n",
      kLaunches, static_cast<long long>(kFloats), rounds);
  std::printf("  eager %8.2f | traced %8.2f | hand graph %8.2f | same graph %8.2f\n", latency[0],
              latency[1], latency[2], latency[3]);
  std::printf(
      "  retrace's per-call overhead: %+.2f us over the hand graph, %+.2f us over the same "
      "graph (goal <= 2 us)\n",
      latency[1] - latency[2], latency[1] - latency[3]);
  std::printf("  submit only (no wait): traced %.2f | hand graph %.2f | same graph %.2f us/call\n",
              submit_traced, submit_hand, submit_same);
  report["tiny"] = {{"launches", kLaunches},
                    {"floats", kFloats},
                    {"eager_us", latency[0]},
                    {"traced_us", latency[1]},
                    {"hand_graph_us", latency[2]},
                    {"same_graph_us", latency[3]},
                    {"overhead_vs_hand_us", latency[1] - latency[2]},
                    {"overhead_vs_same_us", latency[1] - latency[3]},
                    {"eager_over_traced", latency[0] / latency[1]},
                    {"submit_traced_us", submit_traced},
                    {"submit_hand_graph_us", submit_hand},
                    {"submit_same_graph_us", submit_same}};
  cuda_check(cudaGraphExecDestroy(hand), "destroy");
  cuda_check(cudaGraphDestroy(graph), "destroy");
  cuda_check(cudaStreamDestroy(hand_stream), "destroy");
  cuda_check(cudaFree(hand_buffer), "free");

  // --- dit ----------------------------------------------------------------------------------
  // Sizes S and M of the CLI's bench (L adds little on a GPU here: kernels, not launches).
  const auto& all_sizes = models::benchmark_sizes();
  const std::vector<models::NamedDiTConfig> sizes(all_sizes.begin(), all_sizes.begin() + 2);
  report["dit"] = nlohmann::json::array();
  for (const models::NamedDiTConfig& size : sizes) {
    models::DiT model(size.config, *device);
    const auto& c = model.config();
    // One sampler step: batch 1, class 0, no guidance.
    Tensor latents = ops::full({1, c.in_channels, c.input_size, c.input_size}, 0.5, *device);
    const float t = 500.0f;
    const std::int64_t label = 0;
    auto upload = [&](const std::vector<float>& v, const Shape& shape) {
      return Tensor::from_vector<float>(v, shape, c.dtype).to_device(*device);
    };
    Tensor features = upload(model.timestep_frequencies({&t, 1}), {1, c.frequency_size});
    Tensor labels = upload(model.label_rows({&label, 1}), {1, c.num_classes + 1});
    Tensor ab = upload({0.9f, 0.1f}, {2});
    auto dit_step = [&model](const Tensor& in, const Tensor& tf, const Tensor& y,
                             const Tensor& coefficients) {
      return model.sample_step(in, tf, y, coefficients, 1.0);
    };
    auto step = make_tracer(dit_step, *device, TraceOptions{.name = "dit"});
    (void)step(latents, features, labels, ab);
    const auto& [x_slot, t_slot, y_slot, ab_slot] = step.inputs();
    cudaGraphExec_t exec = cuda_graph_exec(*device, step.trace_ids().front());
    const std::size_t commands = device->trace_info(step.trace_ids().front()).commands;
    const std::vector<double> us =
        interleaved({[&] {
                       (void)dit_step(latents, features, labels, ab);
                       device->synchronize(kDefaultQueue);
                     },
                     [&] { (void)step(x_slot, t_slot, y_slot, ab_slot); },
                     [&] {
                       cuda_check(cudaGraphLaunch(exec, stream), "launch");
                       cuda_check(cudaStreamSynchronize(stream), "sync");
                     }},
                    rounds, 20);
    std::printf("dit %s (%lld tokens, hidden %lld, depth %lld; %zu commands), us per step:\n",
                size.name.c_str(), static_cast<long long>(c.tokens()),
                static_cast<long long>(c.hidden), static_cast<long long>(c.depth), commands);
    std::printf(
        "  eager %9.1f | traced %9.1f | same graph %9.1f | eager/traced %.2fx, "
        "traced - graph %+.2f us\n",
        us[0], us[1], us[2], us[0] / us[1], us[1] - us[2]);
    report["dit"].push_back({{"size", size.name},
                             {"commands", commands},
                             {"eager_us", us[0]},
                             {"traced_us", us[1]},
                             {"same_graph_us", us[2]},
                             {"eager_over_traced", us[0] / us[1]},
                             {"overhead_vs_same_us", us[1] - us[2]}});
  }

  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
