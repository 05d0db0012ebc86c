// retrace demo: the denoising loop of the example DiT on the chosen device, eager and traced,
// at two resolutions (a trace key each), with a StateTensor for the timestep and the tracer's
// input slot for the latents, as the ttnn pipelines do. Exits 1 if traced and eager final
// latents differ in any bit.
#include "model_options.hpp"
#include "util/timing.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <random>

namespace retrace::cli {

namespace {

using timing::Clock;
using timing::median;

// A progress bar on a terminal; nothing in between when stdout is a pipe or a file.
class Progress {
 public:
  Progress(std::string label, std::int64_t total)
      : label_(std::move(label)), total_(total), tty_(isatty(fileno(stdout)) != 0) {}
  void tick(std::int64_t done) {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const auto filled = static_cast<int>(kWidth * done / total_);
    std::printf("\r  %-7s [%s%s] %lld/%lld", label_.c_str(), std::string(filled, '#').c_str(),
                std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done),
                static_cast<long long>(total_));
    std::fflush(stdout);
  }
  void finish(const std::string& summary) {
    if (tty_) std::printf("\r\033[K");
    std::printf("  %-7s %s\n", label_.c_str(), summary.c_str());
  }

 private:
  std::string label_;
  std::int64_t total_;
  bool tty_;
};

std::vector<float> initial_latents(std::int64_t tokens, std::int64_t hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(tokens));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(tokens * hidden));
  for (float& x : v) x = dist(rng);
  return v;
}

struct Result {
  std::int64_t tokens;
  double eager_ms, traced_ms, capture_ms;
  std::size_t commands, trace_bytes;
  bool identical;
};

}  // namespace

int run_demo(ModelOptions& o) {
  auto device = open_device(o);
  auto model = make_model(o, *device);
  const models::DiTConfig& c = model->config();
  auto step = traced_method(
      &models::DiT::euler_step, [](models::DiT& m) -> Device& { return m.device(); },
      TraceOptions{.name = "DiT euler_step"});
  const std::vector<float> timesteps = models::euler_timesteps(o.steps);
  const float dt = -1.0f / static_cast<float>(o.steps);
  // The latents live on the device several times over (eager, the input slot, the trace's
  // activations): refuse sizes that cannot fit before spending minutes making random data.
  const std::size_t latent_bytes = storage_bytes(Shape{1, c.tokens, c.hidden}, c.dtype,
                                                 Layout::row_major);
  const std::size_t capacity = device->stats().capacity_bytes;
  RETRACE_CHECK(latent_bytes <= capacity / 4, out_of_memory,
                "demo: the latents ({} tokens x {}, {}) need {} and the demo about 4x that, but "
                "{} has {} of memory; lower --tokens or --hidden",
                c.tokens, c.hidden, o.dtype, human_bytes(latent_bytes), device->name(),
                human_bytes(capacity));
  std::printf(
      "retrace demo: DiT (hidden %lld, depth %lld, heads %lld, %s, %s weights) on %s, "
      "%lld Euler steps\n",
      static_cast<long long>(c.hidden), static_cast<long long>(c.depth),
      static_cast<long long>(c.heads), o.dtype.c_str(),
      o.weights.empty() ? "random" : o.weights.c_str(), device->name().c_str(),
      static_cast<long long>(o.steps));

  std::vector<std::int64_t> resolutions{c.tokens};
  if (c.tokens >= 2) resolutions.push_back(c.tokens / 2);
  std::vector<Result> results;
  for (std::int64_t tokens : resolutions) {
    const std::string key = fmt::format("{} tokens", tokens);
    std::printf("%s (trace key \"%s\"):\n", key.c_str(), key.c_str());
    const std::vector<float> start = initial_latents(tokens, c.hidden, c.seed);
    const Shape shape{1, tokens, c.hidden};

    // Eager: every op dispatched, one step after the other.
    Progress eager_bar("eager", o.steps);
    std::vector<double> eager_ms;
    Tensor x = Tensor::from_vector<float>(start, shape, c.dtype).to_device(*device);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const Tensor features =
          Tensor::from_vector<float>(model->timestep_features(timesteps[i]), {1, c.hidden}, c.dtype)
              .to_device(*device);
      x = model->euler_step(x, features, dt);
      device->synchronize();
      eager_ms.push_back(timing::milliseconds_since(t0));
      eager_bar.tick(i + 1);
    }
    const std::vector<float> eager_final = x.to_vector<float>();
    eager_bar.finish(fmt::format("median {:.2f} ms/step", median(eager_ms)));

    // Traced: the first step captures, the others replay. The timestep lives in a StateTensor
    // (same buffer every step); the latents go back into the trace's input slot.
    Progress traced_bar("traced", o.steps);
    std::vector<double> traced_ms;
    double capture_ms = 0.0;
    StateTensor timestep;
    const Tensor x0 = Tensor::from_vector<float>(start, shape, c.dtype).to_device(*device);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      timestep.update(model->timestep_features(timesteps[i]), {1, c.hidden}, Traced::yes, *device,
                      c.dtype);
      const bool first = !step.tracer(*model, key);
      const Tensor& latents = first ? x0 : std::get<0>(step.inputs(*model, key));
      const Tensor& next =
          step.call(CallOptions{.key = key}, *model, latents, timestep.data(), dt);
      ops::copy(next, std::get<0>(step.inputs(*model, key)));
      device->synchronize();
      (first ? capture_ms : traced_ms.emplace_back()) = timing::milliseconds_since(t0);
      traced_bar.tick(i + 1);
    }
    const std::vector<float> traced_final =
        std::get<0>(step.inputs(*model, key)).to_vector<float>();
    const TraceId trace = step.tracer(*model, key)->trace_ids().front();
    const TraceInfo info = device->trace_info(trace);
    const double traced_median = traced_ms.empty() ? capture_ms : median(traced_ms);
    traced_bar.finish(fmt::format("median {:.2f} ms/step (first step, with capture: {:.1f} ms)",
                                  traced_median, capture_ms));
    // Bitwise: a NaN (say, from weights holding one) equals itself here, as it should.
    const bool identical =
        traced_final.size() == eager_final.size() &&
        (traced_final.empty() || std::memcmp(traced_final.data(), eager_final.data(),
                                             traced_final.size() * sizeof(float)) == 0);
    std::printf("  trace %llu: %zu commands, %s of private trace memory, %zu outside buffers\n",
                static_cast<unsigned long long>(trace.value), info.commands,
                human_bytes(info.bytes).c_str(), info.external_buffers);
    std::printf("  final latents (%zu values): traced %s eager %s\n", traced_final.size(),
                identical ? "==" : "!=", identical ? "bit for bit" : "-- MISMATCH");
    results.push_back({tokens, median(eager_ms), traced_median, capture_ms, info.commands,
                       info.bytes, identical});
  }

  std::printf("summary:\n");
  bool all_identical = true;
  for (const Result& r : results) {
    std::printf("  %5lld tokens: eager %8.2f ms/step, traced %8.2f ms/step, speedup %.2fx, %s\n",
                static_cast<long long>(r.tokens), r.eager_ms, r.traced_ms, r.eager_ms / r.traced_ms,
                r.identical ? "identical" : "DIFFERENT");
    all_identical = all_identical && r.identical;
  }
  std::printf("  live traces: %zu (one per resolution)\n", step.live_traces(*model));
  if (!all_identical) {
    std::fprintf(stderr,
                 "retrace demo: traced and eager results differ; this is a bug, please "
                 "report it with the command line above\n");
    return 1;
  }
  return 0;
}

}  // namespace retrace::cli
