// Captures a small computation on the CPU device, replays it with new inputs, and shows that
// the replay equals eager execution: a trace made by hand, without a Tracer.
#include <retrace/retrace.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

// y = (x + 1) * w + x, four ops per step, repeated `depth` times.
retrace::Tensor step(const retrace::Tensor& x, const retrace::Tensor& w, int depth) {
  retrace::Tensor y = x;
  for (int i = 0; i < depth; ++i) {
    retrace::Tensor t = retrace::ops::add(y, 1.0);
    t = retrace::ops::mul(t, w);
    y = retrace::ops::add(t, y);
    y = retrace::ops::mul(y, 0.5);
  }
  return y;
}

double median_us(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  using namespace retrace;
  using Clock = std::chrono::steady_clock;
  constexpr int kDepth = 25;
  constexpr std::int64_t kWidth = 256;
  constexpr int kIterations = 200;

  auto device = open_cpu_device();
  std::vector<float> host(kWidth);
  for (std::int64_t i = 0; i < kWidth; ++i) host[i] = 0.01f * static_cast<float>(i);
  Tensor x = Tensor::from_vector<float>(host, {1, kWidth}, DType::float32).to_device(*device);
  Tensor w = ops::full({1, kWidth}, 0.75, *device);

  std::printf("retrace capture/replay example on %s\n", device->name().c_str());
  std::printf("  step: %d x (add scalar, mul, add, mul scalar) on [1, %lld] float32\n", kDepth,
              static_cast<long long>(kWidth));

  // Capture: the ops are recorded, not executed; the trace owns the temporaries' memory.
  device->begin_trace_capture(kDefaultQueue);
  Tensor traced_out = step(x, w, kDepth);
  TraceId trace = device->end_trace_capture(kDefaultQueue);
  TraceInfo info = device->trace_info(trace);
  std::printf("  captured trace %llu: %zu commands, %zu bytes of private trace memory\n",
              static_cast<unsigned long long>(trace.value), info.commands, info.bytes);

  std::vector<double> eager_us, replay_us;
  bool identical = true;
  for (int it = 0; it < kIterations; ++it) {
    // New input values, written in place so the trace's baked-in address stays valid.
    for (auto& v : host) v += 0.001f;
    ops::copy(Tensor::from_vector<float>(host, {1, kWidth}, DType::float32), x);

    auto t0 = Clock::now();
    Tensor eager = step(x, w, kDepth);
    device->synchronize();
    auto t1 = Clock::now();
    device->execute_trace(trace, kDefaultQueue, Blocking::yes);
    auto t2 = Clock::now();
    eager_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    replay_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    identical = identical && eager.to_vector<float>() == traced_out.to_vector<float>();
  }
  const double eager = median_us(eager_us), replay = median_us(replay_us);
  std::printf("  %d iterations: eager %.2f us/step, replay %.2f us/step (median), %.1fx faster\n",
              kIterations, eager, replay, eager / replay);
  std::printf("  replay output equals eager output bit for bit: %s\n", identical ? "yes" : "NO");

  device->release_trace(trace);
  DeviceStats stats = device->stats();
  std::printf("  after release: %zu live traces, %zu bytes of trace memory, %llu commands run\n",
              stats.live_traces, stats.trace_bytes,
              static_cast<unsigned long long>(stats.commands_executed));
  return identical ? 0 : 1;
}
