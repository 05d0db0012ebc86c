// retrace bench: the comparison matrix of one denoising step of the DiT (one DDIM step, batch 1,
// no guidance).
// Sizes S (dispatch-bound), M, L (compute-bound); float32; 1 and 2 kernel threads. Modes, per
// step: eager (ops dispatched one by one), traced (the step replayed), floor (the same math
// straight on the kernel library, FloorDiT) and libtorch (the same model and weights in
// libtorch's C++ API, when the build found libtorch; its output must match ours within a
// relative error of 1e-4 or the bench fails). retrace's modes take turns in one process, each
// for a few consecutive steps at a time (see measure); libtorch runs in a child process of its
// own per size and thread count (see measure_libtorch). Medians and ratios go to JSON, and a
// gnuplot chart when gnuplot is installed.
#include "dit_bench.hpp"
#include "fma_peak.hpp"
#include "floor_dit.hpp"
#include "load.hpp"

#include <retrace/models/dit.hpp>
#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>
#include <retrace/retrace.hpp>
#include "torch_dit.hpp"

#include "cpu/isa.hpp"
#include "cpu/parallel.hpp"
#include "util/same_bits.hpp"
#include "util/timing.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

namespace retrace::bench {

namespace {

using timing::Clock;
using timing::median;
using timing::percentile;

// How long a competitor of --load may spin at most (it is killed as soon as its round ends).
constexpr std::chrono::seconds kLoadLimit{600};

template <class F>
double time_ms(F&& f) {
  const auto t0 = Clock::now();
  f();
  return timing::milliseconds_since(t0);
}

// One mode's step times: unloaded, and under --load.
struct ModeTimes {
  std::vector<double> unloaded, loaded;
};

// The largest |bfloat16 step - float32 step| over the largest |float32 step| a bfloat16 cell may
// show (its weights and state rounded to bfloat16, its activations rounded after every op).
constexpr double kBFloat16Tolerance = 5e-2;

struct Row {
  std::string size;
  int threads = 1;
  std::string isa;  // the device's kernel variant
  DType dtype = DType::float32;
  std::string bfloat16_products;  // what the device's bfloat16 products run on
  // bfloat16: the eager step against the float32 eager step from the same state and weights.
  std::optional<double> float32_rel_error;
  double eager_ms = 0, traced_ms = 0, floor_ms = 0, floor_max_rel_diff = 0;
  double traced_p95_ms = 0;
  // The traced step's linears (a profiled replay): their time per step and GFLOP/s.
  std::optional<double> linear_ms, linear_gflops;
  std::optional<double> libtorch_ms, libtorch_rel_error;
  // Under --load: medians, and the traced step's 95th percentile.
  std::optional<double> eager_loaded_ms, traced_loaded_ms, floor_loaded_ms, traced_loaded_p95_ms;
  std::optional<double> libtorch_loaded_ms;
};

// max |got - want| / max |want|.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The state a step starts from, and the step's arguments, as every mode (and the libtorch
// child) builds them: the same seed, so the same numbers in every process.
struct StepInputs {
  std::vector<float> start, features, labels;
  std::int64_t label;
  float a, b;
};

StepInputs step_inputs(const models::DiT& model, std::int64_t steps) {
  const models::DiTConfig& c = model.config();
  StepInputs in;
  in.start.resize(static_cast<std::size_t>(c.in_channels * c.input_size * c.input_size));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : in.start) v = dist(rng);
  // The middle step of a DDIM schedule of `steps` steps.
  const models::DdimSchedule schedule(std::max<std::int64_t>(steps, 2));
  const std::size_t middle = schedule.timesteps.size() / 2;
  in.features = model.timestep_frequencies({&schedule.timesteps[middle], 1});
  in.label = c.num_classes > 207 ? 207 : 0;
  in.labels = model.label_rows({&in.label, 1});
  in.a = schedule.a[middle];
  in.b = schedule.b[middle];
  return in;
}

// The step's inputs on the device, and the step.
struct DeviceStep {
  const models::DiT& model;
  Shape shape;
  Tensor features, labels, coefficients;
  DeviceStep(const models::DiT& m, const StepInputs& in, Device& device) : model(m) {
    const models::DiTConfig& c = m.config();
    shape = Shape{1, c.in_channels, c.input_size, c.input_size};
    auto upload = [&](const std::vector<float>& v, const Shape& s) {
      return Tensor::from_vector<float>(v, s, c.dtype).to_device(device);
    };
    features = upload(in.features, {1, c.frequency_size});
    labels = upload(in.labels, {1, c.num_classes + 1});
    coefficients = upload({in.a, in.b}, {2});
  }
  [[nodiscard]] Tensor operator()(const Tensor& x) const {
    return model.sample_step(x, features, labels, coefficients, 1.0);
  }
};

const models::NamedDiTConfig& find_size(const std::string& name) {
  const auto& sizes = models::benchmark_sizes();
  auto it = std::find_if(sizes.begin(), sizes.end(),
                         [&](const models::NamedDiTConfig& s) { return s.name == name; });
  RETRACE_CHECK(it != sizes.end(), invalid_argument, "bench: unknown size {} (use S, M, L)", name);
  return *it;
}

// libtorch's step for one size and thread count, timed in a child process (this program with
// --libtorch-peer) started with OMP_WAIT_POLICY=PASSIVE (unless set already) and
// OPENBLAS_NUM_THREADS=<threads>. Why: libtorch runs its ops on OpenMP (libgomp) threads and
// its matrix products on OpenBLAS's own threads; with libgomp's default policy its idle threads
// spin and take the cores from OpenBLAS's, so at two threads on two cores the step ran 2-6x
// slower than on one (M: 127-216 ms vs 64 ms, alone in its process as much as in ours). libgomp
// reads OMP_WAIT_POLICY once, when it is loaded, so only a new process can set it; the BLAS
// library libtorch calls is a separate copy of OpenBLAS that openblas_set_num_threads in this
// process does not reach. Both settings are what a user tuning libtorch on such a machine sets.
std::optional<double> libtorch_step_ms(const Row& row, int repeats, std::int64_t steps,
                                       std::optional<double>* error);

void measure_libtorch(Row& row, int repeats, std::int64_t steps, int load) {
  row.libtorch_ms = libtorch_step_ms(row, repeats, steps, &row.libtorch_rel_error);
  if (load > 0) {
    const Load competitors(load, kLoadLimit);
    row.libtorch_loaded_ms = libtorch_step_ms(row, repeats, steps, nullptr);
  }
}

// One run of the libtorch child process: its median step time, and its relative error against
// retrace's step when `error` is given.
std::optional<double> libtorch_step_ms(const Row& row, int repeats, std::int64_t steps,
                                       std::optional<double>* error_out) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const std::string command = fmt::format(
      "OMP_WAIT_POLICY={} OPENBLAS_NUM_THREADS={} '{}' bench --libtorch-peer {} --sizes {} "
      "--repeats {} --steps {}",
      policy != nullptr && *policy != '\0' ? policy : "PASSIVE", row.threads, self, row.threads,
      row.size, repeats, steps);
  FILE* pipe = ::popen(command.c_str(), "r");
  RETRACE_CHECK(pipe != nullptr, device_error, "bench: cannot start the libtorch process ({})",
                command);
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = ::pclose(pipe);
  double ms = 0.0, error = 0.0;
  std::istringstream in(output);
  std::string key;
  while (in >> key) {
    if (key == "libtorch_ms") in >> ms;
    if (key == "libtorch_relative_error") in >> error;
  }
  RETRACE_CHECK(status == 0 && ms > 0.0, device_error,
                "bench: the libtorch process failed (status {}): {}", status, output);
  if (error_out != nullptr) *error_out = error;
  return ms;
}

// The multiply-adds of the step's linears, times 2 (batch 1), and how many there are: each
// [out, in] weight (the patch embedding's [hidden, channels, p, p] too) applied to every token,
// or to the one conditioning row (the timestep MLP, the adaLN projections).
std::pair<double, int> linear_flops(const models::DiTConfig& c) {
  double flops = 0;
  int linears = 0;
  for (const auto& [name, shape] : models::DiT::weight_shapes(c)) {
    if (!name.ends_with(".weight") || name.starts_with("y_embedder") || shape.rank() < 2) continue;
    const bool one_row =
        name.find("adaLN") != std::string::npos || name.starts_with("t_embedder");
    flops += 2.0 * static_cast<double>(one_row ? 1 : c.tokens()) *
             static_cast<double>(shape.numel());
    ++linears;
  }
  return {flops, linears};
}

Row measure(const models::NamedDiTConfig& size, DType dtype, int threads, const std::string& isa,
            int repeats, std::int64_t steps, int load) {
  cpu::set_kernel_thread_limit(threads);  // GEMMs too: OpenBLAS runs single-threaded per block
  CpuDeviceOptions options;
  options.kernel_isa = isa;
  auto device = open_cpu_device(options);
  models::DiTConfig c = size.config;
  c.dtype = dtype;
  const bool with_floor = dtype == DType::float32;  // the floor computes in float32
  models::DiT model(c, *device);
  const StepInputs in = step_inputs(model, steps);
  const DeviceStep device_step(model, in, *device);
  const Shape& shape = device_step.shape;
  const std::vector<float>& start = in.start;
  auto upload = [&](const std::vector<float>& v) {
    return Tensor::from_vector<float>(v, shape, c.dtype).to_device(*device);
  };

  Tensor eager_x = upload(start);
  // The traced step updates the latents in place (the copy is part of the trace), so a step is
  // one blocking replay: no eager op, no hand-off to the queue's worker.
  auto tracer = make_tracer(
      [&](const Tensor& x) {
        Tensor next = device_step(x);
        ops::copy(next, x);
        return next;
      },
      *device, TraceOptions{.prep_run = true, .clone_prep_inputs = true, .name = "bench step"});
  const Tensor slot = upload(start);
  tracer(slot);  // capture (and run once)
  const std::unique_ptr<FloorStep> floor =
      with_floor ? make_floor(model, cpu_kernel_isa(*device)) : nullptr;
  std::vector<float> floor_x = start;
  auto floor_step = [&](float* x, float a, float b) {
    floor->step(x, in.features.data(), in.label, a, b);
  };

  Row row;
  row.size = size.name;
  row.threads = threads;
  row.isa = cpu_kernel_isa(*device);
  row.dtype = dtype;
  row.bfloat16_products = cpu_bfloat16_products(*device);
  // Agreement: one step of each from the same state.
  const std::vector<float> e = device_step(upload(start)).to_vector<float>();
  if (with_floor) {
    std::vector<float> f = start;
    floor_step(f.data(), in.a, in.b);
    double worst = 0.0;
    for (std::size_t i = 0; i < e.size(); ++i) {
      worst = std::max(worst, std::abs(double(f[i]) - e[i]) / (std::abs(double(e[i])) + 1e-3));
    }
    row.floor_max_rel_diff = worst;
  } else {
    // The float32 model of the same seed (the same weights before rounding), one eager step
    // (the step's inputs are float32 values whatever the model's dtype).
    const models::DiT reference(size.config, *device);
    const DeviceStep reference_step(reference, in, *device);
    const std::vector<float> want =
        reference_step(Tensor::from_vector<float>(start, shape, DType::float32).to_device(*device))
            .to_vector<float>();
    row.float32_rel_error = relative_error(e, want);
  }
  // Each round runs every mode for `steps` consecutive steps (one untimed step first), as a
  // sampler loop runs them and as bench/python/peers.py times ONNX Runtime and torch.compile
  // (each alone in its loop). Alternating the modes step by step instead made every step start
  // with caches full of another mode's weights and buffers: the M traced step measured 20 ms
  // that way against 17.6 ms in a loop of its own. The modes' order turns every round, so drift
  // in the machine's speed falls on each mode alike.
  // With --load, every round then runs the modes again beside the competitors (started for the
  // round and stopped after it), so loaded and unloaded steps alternate through the run.
  ModeTimes eager_ms, traced_ms, floor_ms;
  std::vector<std::function<void()>> modes = {
      [&] {
        eager_x = device_step(eager_x);
        device->synchronize();
      },
      [&] { tracer(std::get<0>(tracer.inputs())); }};
  std::vector<ModeTimes*> times = {&eager_ms, &traced_ms};
  if (with_floor) {
    modes.emplace_back([&] { floor_step(floor_x.data(), in.a, in.b); });
    times.push_back(&floor_ms);
  }
  const int mode_count = static_cast<int>(modes.size());
  auto round = [&](int r, bool loaded) {
    for (int i = 0; i < mode_count; ++i) {
      const int mode = (r + i) % mode_count;
      std::vector<double>& into = loaded ? times[mode]->loaded : times[mode]->unloaded;
      modes[mode]();  // untimed: the caches hold this mode's data again
      for (std::int64_t s = 0; s < steps; ++s) into.push_back(time_ms(modes[mode]));
    }
  };
  for (int r = 0; r < repeats; ++r) {
    round(r, false);
    if (load > 0) {
      const Load competitors(load, kLoadLimit);
      round(r, true);
    }
  }
  // Where the traced step's time goes: the linears' share, from replays with every command
  // timed (after the timed rounds, so it changes none of the figures above).
  const TraceProfile profile =
      device->profile_trace(tracer.trace_ids().front(), kDefaultQueue, 5);
  double linear_ns = 0;
  int linear_commands = 0;
  for (std::size_t i = 0; i < profile.ops.size(); ++i) {
    if (profile.ops[i] != "linear") continue;
    linear_ns += profile.command_ns[i];
    ++linear_commands;
  }
  const auto [flops, linears] = linear_flops(c);
  if (linear_commands == linears && linear_ns > 0) {
    row.linear_ms = linear_ns / 1e6;
    row.linear_gflops = flops / linear_ns;
  }
  row.eager_ms = median(eager_ms.unloaded);
  row.traced_ms = median(traced_ms.unloaded);
  row.floor_ms = with_floor ? median(floor_ms.unloaded) : 0.0;
  row.traced_p95_ms = percentile(traced_ms.unloaded, 0.95);
  if (load > 0) {
    row.eager_loaded_ms = median(eager_ms.loaded);
    row.traced_loaded_ms = median(traced_ms.loaded);
    if (with_floor) row.floor_loaded_ms = median(floor_ms.loaded);
    row.traced_loaded_p95_ms = percentile(traced_ms.loaded, 0.95);
  }
  return row;
}

const char* short_dtype(DType dtype) { return dtype == DType::bfloat16 ? "bf16" : "f32"; }

// The linears' rate over the float32 FMA peak of the cell's threads, where both are known.
std::optional<double> linear_over_peak(const Row& r, const std::optional<FmaPeak>& peak) {
  if (!peak || !r.linear_gflops) return std::nullopt;
  return *r.linear_gflops / (peak->gflops * r.threads);
}

void write_plot(const std::string& path, const std::vector<Row>& rows, bool multi_isa) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    std::printf("plot skipped: gnuplot is not installed (make bench installs gnuplot-nox)\n");
    return;
  }
  const std::string data = path + ".dat", script = path + ".gp";
  {
    std::ofstream out(data);
    out << "# case eager traced floor libtorch\n";
    for (const Row& r : rows) {
      out << r.size << "/" << short_dtype(r.dtype) << "/" << r.threads << "t"
          << (multi_isa ? "/" + r.isa : "") << " " << r.eager_ms << " " << r.traced_ms << " "
          << (r.floor_ms > 0.0 ? fmt::format("{}", r.floor_ms) : "NaN") << " "
          << (r.libtorch_ms ? fmt::format("{}", *r.libtorch_ms) : "NaN") << "\n";
    }
  }
  {
    std::ofstream out(script);
    out << "set terminal pngcairo size 900,500\nset output '" << path << "'\n"
        << "set title 'retrace: one DiT denoising step (CPU device; floor and libtorch float32 only)'\n"
        << "set ylabel 'ms per step (log scale)'\nset logscale y\nset style data histograms\n"
        << "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
        << "set key top left\nset grid ytics\nset xlabel 'size / dtype / kernel threads"
        << (multi_isa ? " / kernel variant'\nset xtics rotate by -30\n" : "'\n")
        << "plot '" << data << "' using 2:xtic(1) title 'eager', '' using 3 title 'traced', "
        << "'' using 4 title 'floor', '' using 5 title 'libtorch'\n";
  }
  const int rc = std::system(("gnuplot '" + script + "'").c_str());
  std::printf(rc == 0 ? "wrote %s\n" : "gnuplot failed for %s\n", path.c_str());
}

// "x86-64, avx2, avx512 (not on this CPU: lacks avx512f, ...)"
std::string describe_isas() {
  std::string out;
  for (const CpuKernelIsa& isa : cpu_kernel_isas()) {
    if (!out.empty()) out += ", ";
    out += isa.name;
    if (!isa.unusable.empty()) out += " (not on this CPU: " + isa.unusable + ")";
  }
  return out;
}

// {} -> the default variant; {"all"} -> every variant this CPU runs; names are checked when a
// device opens with them.
std::vector<std::string> expand_isas(const std::vector<std::string>& isas) {
  if (isas.empty()) return {""};
  if (isas.size() == 1 && isas[0] == "all") {
    std::vector<std::string> out;
    for (const CpuKernelIsa& isa : cpu_kernel_isas()) {
      if (isa.unusable.empty()) out.push_back(isa.name);
    }
    return out;
  }
  std::vector<std::string> out;
  for (const std::string& name : isas) {
    const cpu::VariantInfo* variant = cpu::find_variant(name);  // aliases included
    RETRACE_CHECK(variant != nullptr, invalid_argument,
                  "bench: --isa: unknown kernel variant '{}' (this build has: {}, or all)", name,
                  describe_isas());
    const std::string unusable = cpu::unsupported_reason(variant->name, cpu::this_cpu());
    RETRACE_CHECK(unusable.empty(), unimplemented,
                  "bench: --isa {}: this CPU cannot run the {} kernels: it {}", name,
                  variant->name, unusable);
    out.emplace_back(variant->name);
  }
  return out;
}

}  // namespace

namespace {

// Whether libtorch's mode can run (prints why not).
bool libtorch_available() {
  std::string why;
  auto device = open_cpu_device();
  models::DiT probe(
      models::DiTConfig{.input_size = 2, .hidden = 8, .depth = 1, .heads = 2, .num_classes = 1},
      *device);
  if (make_torch_step(probe, why) != nullptr) {
    std::printf("libtorch: timed in a process of its own per size and thread count, with "
                "OMP_WAIT_POLICY=PASSIVE and OPENBLAS_NUM_THREADS=<threads> (with libgomp's "
                "default policy its idle threads spin and starve OpenBLAS's threads)\n");
    return true;
  }
  std::printf("libtorch mode skipped: %s\n", why.c_str());
  return false;
}

// The row of r's size and kernel variant with this dtype and thread count, if measured.
const Row* matching_row(const std::vector<Row>& rows, const Row& r, DType dtype, int threads) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& other) {
    return other.dtype == dtype && other.threads == threads && other.size == r.size &&
           other.isa == r.isa;
  });
  return it == rows.end() ? nullptr : &*it;
}

// The bfloat16 cell's float32 twin (same size, threads and variant), if measured.
const Row* float32_twin(const std::vector<Row>& rows, const Row& r) {
  return matching_row(rows, r, DType::float32, r.threads);
}

void print_row(const Row& r) {
  const std::string torch_ms = r.libtorch_ms ? fmt::format("{:.3f}", *r.libtorch_ms) : "-";
  const std::string over_torch =
      r.libtorch_ms ? fmt::format("{:.2f}x", r.traced_ms / *r.libtorch_ms) : "-";
  const bool floor = r.floor_ms > 0.0;
  std::printf("%-4s %5s %7d %-7s %10.3f %10.3f %10s %11s %12.2fx %13s %13s\n", r.size.c_str(),
              short_dtype(r.dtype), r.threads, r.isa.c_str(), r.eager_ms, r.traced_ms,
              floor ? fmt::format("{:.3f}", r.floor_ms).c_str() : "-", torch_ms.c_str(),
              r.eager_ms / r.traced_ms,
              floor ? fmt::format("{:.2f}x", r.traced_ms / r.floor_ms).c_str() : "-",
              over_torch.c_str());
}

// "2.31x" of loaded over unloaded, "-" without a loaded figure.
std::string ratio(const std::optional<double>& loaded, const std::optional<double>& unloaded) {
  return loaded && unloaded ? fmt::format("{:.2f}x", *loaded / *unloaded) : "-";
}

// r's traced step under load over its one-thread twin's under the same load (null for a
// one-thread row).
std::optional<double> loaded_over_one_thread(const std::vector<Row>& rows, const Row& r) {
  const Row* one = r.threads > 1 ? matching_row(rows, r, r.dtype, 1) : nullptr;
  if (one == nullptr || !one->traced_loaded_ms || !r.traced_loaded_ms) return std::nullopt;
  return *r.traced_loaded_ms / *one->traced_loaded_ms;
}

void print_load_table(const std::vector<Row>& rows, int load) {
  std::printf("\nunder load: %d busy process(es) spinning on this process' CPUs; each mode's median "
              "step loaded / unloaded (p95: the traced step's 95th percentile loaded / its "
              "unloaded median; vs 1t: the traced step loaded over one thread's loaded)\n",
              load);
  std::printf("%-4s %5s %7s %-7s %10s %13s %9s %9s %7s %9s %9s %9s\n", "size", "dtype", "threads",
              "isa", "traced_ms", "traced@load", "traced", "p95", "vs 1t", "eager", "floor",
              "libtorch");
  for (const Row& r : rows) {
    const std::optional<double> vs_one = loaded_over_one_thread(rows, r);
    std::printf("%-4s %5s %7d %-7s %10.3f %13.3f %9s %9s %7s %9s %9s %9s\n", r.size.c_str(),
                short_dtype(r.dtype), r.threads, r.isa.c_str(), r.traced_ms,
                r.traced_loaded_ms.value_or(0.0), ratio(r.traced_loaded_ms, r.traced_ms).c_str(),
                ratio(r.traced_loaded_p95_ms, r.traced_ms).c_str(),
                vs_one ? fmt::format("{:.2f}x", *vs_one).c_str() : "-",
                ratio(r.eager_loaded_ms, r.eager_ms).c_str(),
                ratio(r.floor_loaded_ms, r.floor_ms).c_str(),
                ratio(r.libtorch_loaded_ms, r.libtorch_ms).c_str());
  }
}

nlohmann::json row_json(const Row& r, int load, const std::string& default_isa,
                        const std::string& how, const Row* float32,
                        const std::optional<FmaPeak>& peak) {
  auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  auto over = [&](const std::optional<double>& a, const std::optional<double>& b) {
    return optional(a && b ? std::optional<double>(*a / *b) : std::nullopt);
  };
  nlohmann::json row = {
      {"model", "dit"},
      {"size", r.size},
      {"threads", r.threads},
      {"kernel_isa", r.isa},
      {"kernel_isa_choice", r.isa == default_isa ? how : std::string("requested")},
      {"dtype", std::string(dtype_name(r.dtype))},
      {"bfloat16_products", r.bfloat16_products},
      {"eager_ms", r.eager_ms},
      {"traced_ms", r.traced_ms},
      {"traced_p95_ms", r.traced_p95_ms},
      {"libtorch_ms", optional(r.libtorch_ms)},
      {"floor_ms", r.floor_ms > 0.0 ? nlohmann::json(r.floor_ms) : nlohmann::json(nullptr)},
      {"traced_over_floor",
       r.floor_ms > 0.0 ? nlohmann::json(r.traced_ms / r.floor_ms) : nlohmann::json(nullptr)},
      {"traced_over_libtorch", over(r.traced_ms, r.libtorch_ms)},
      {"eager_over_traced", r.eager_ms / r.traced_ms},
      {"floor_relative_difference", r.floor_max_rel_diff},
      {"libtorch_relative_error", optional(r.libtorch_rel_error)}};
  row["linear_ms"] = optional(r.linear_ms);
  row["linear_gflops"] = optional(r.linear_gflops);
  row["fma_peak_gflops_per_thread"] = peak ? nlohmann::json(peak->gflops) : nlohmann::json(nullptr);
  row["fma_peak_isa"] = peak ? nlohmann::json(peak->isa) : nlohmann::json(nullptr);
  row["linear_over_fma_peak"] = optional(linear_over_peak(r, peak));
  if (r.dtype == DType::bfloat16) {
    row["float32_relative_difference"] = optional(r.float32_rel_error);
    row["float32_tolerance"] = kBFloat16Tolerance;
    row["traced_over_float32_traced"] =
        float32 != nullptr && float32 != &r ? nlohmann::json(r.traced_ms / float32->traced_ms)
                                            : nlohmann::json(nullptr);
    row["floor_relative_difference"] = nullptr;
  }
  if (load > 0) {
    row["load"] = load;
    row["eager_loaded_ms"] = optional(r.eager_loaded_ms);
    row["traced_loaded_ms"] = optional(r.traced_loaded_ms);
    row["traced_loaded_p95_ms"] = optional(r.traced_loaded_p95_ms);
    row["floor_loaded_ms"] = optional(r.floor_loaded_ms);
    row["libtorch_loaded_ms"] = optional(r.libtorch_loaded_ms);
    row["traced_loaded_over_unloaded"] = over(r.traced_loaded_ms, r.traced_ms);
    row["traced_loaded_p95_over_unloaded"] = over(r.traced_loaded_p95_ms, r.traced_ms);
    row["eager_loaded_over_unloaded"] = over(r.eager_loaded_ms, r.eager_ms);
    row["floor_loaded_over_unloaded"] = over(r.floor_loaded_ms, r.floor_ms);
    row["libtorch_loaded_over_unloaded"] = over(r.libtorch_loaded_ms, r.libtorch_ms);
  }
  return row;
}

// One cell of the decode row: the VAE decode of one latent at one image size and thread count.
struct DecodeRow {
  std::int64_t image = 0;
  int threads = 1;
  std::string isa;
  double eager_ms = 0, traced_ms = 0;
  bool identical = false;  // traced == eager bit for bit
};

// The decoder of --vae, or the Stable Diffusion VAE's (blocks 128, 256, 512, 512, two layers per
// block, 83M parameters) with seeded random weights; eager and traced decodes of seeded random
// latents alternate, one untimed call of each first, `repeats` timed of each.
DecodeRow measure_decode(std::int64_t image, int threads, const std::string& vae_path,
                         int repeats) {
  cpu::set_kernel_thread_limit(threads);
  models::VaeDecoderConfig config;
  std::map<std::string, Tensor> weights;
  if (!vae_path.empty()) {
    weights = models::read_safetensors(vae_path);
    config = models::infer_vae_decoder_config(weights);
  }
  RETRACE_CHECK(image % config.upscale() == 0, invalid_argument,
                "bench: --decode {}: this VAE makes images {} times its latents; the size is not a "
                "multiple of that", image, config.upscale());
  const std::int64_t latent = image / config.upscale();
  const Shape shape{1, config.latent_channels, latent, latent};
  CpuDeviceOptions options;
  const std::size_t decode_bytes = models::VaeDecoder::decode_bytes(config, shape);
  options.memory_bytes = 3 * decode_bytes + (std::size_t{1} << 30);
  options.trace_region_bytes = decode_bytes;
  auto device = open_cpu_device(options);
  std::optional<models::VaeDecoder> vae;
  if (vae_path.empty()) {
    vae.emplace(config, *device);
  } else {
    vae.emplace(config, *device, weights);
  }
  std::mt19937 rng(static_cast<std::uint32_t>(image));
  std::normal_distribution<float> normal;
  std::vector<float> z(static_cast<std::size_t>(shape.numel()));
  for (float& v : z) v = normal(rng);
  const Tensor latents = Tensor::from_vector<float>(z, shape, DType::float32).to_device(*device);
  auto decode = traced_method(
      &models::VaeDecoder::decode, [](models::VaeDecoder& v) -> Device& { return v.device(); },
      TraceOptions{.name = "bench VAE decode"});
  std::vector<double> eager_ms, traced_ms;
  std::vector<float> eager;
  for (int r = -1; r < repeats; ++r) {
    const double e = time_ms([&] {
      const Tensor image_out = vae->decode(latents);
      device->synchronize();
      if (r == -1) eager = image_out.to_vector<float>();
    });
    const double t = time_ms([&] {
      (void)decode(*vae, latents);
      device->synchronize();
    });
    if (r >= 0) {
      eager_ms.push_back(e);
      traced_ms.push_back(t);
    }
  }
  const std::vector<float> traced = decode(*vae, latents).to_vector<float>();
  DecodeRow row;
  row.image = image;
  row.threads = threads;
  row.isa = cpu_kernel_isa(*device);
  row.eager_ms = median(eager_ms);
  row.traced_ms = median(traced_ms);
  row.identical = util::same_bits(eager, traced);
  return row;
}

}  // namespace

int run_dit_bench(const BenchOptions& options) {
  const std::vector<std::string> variants = expand_isas(options.isas);  // checked first
  const int repeats = options.repeats;
  const std::int64_t steps = options.steps;
  std::vector<Row> rows;
  if (!options.sizes.empty()) {
    std::printf("retrace bench: one DiT sampler step, medians of %d x %lld steps per "
                "mode%s\n",
                repeats, static_cast<long long>(steps),
                options.load > 0 ? fmt::format(", unloaded and beside {} busy process(es)",
                                               options.load).c_str()
                                 : "");
  }
  const bool with_torch = !options.sizes.empty() && libtorch_available();
  const auto [default_isa, how] = default_cpu_kernel_isa();
  std::printf("CPU kernel variants: %s; a device picks %s (%s)\n", describe_isas().c_str(),
              default_isa.c_str(), how.c_str());
  if (!options.sizes.empty()) {
    std::printf("%-4s %5s %7s %-7s %10s %10s %10s %11s %13s %13s %13s\n", "size", "dtype",
                "threads", "isa", "eager_ms", "traced_ms", "floor_ms", "libtorch_ms",
                "eager/traced", "traced/floor", "traced/torch");
  }
  for (const std::string& name : options.sizes) {
    const models::NamedDiTConfig& size = find_size(name);
    for (const std::string& isa : variants) {
      for (const std::string& dtype_name : options.dtypes) {
        const DType dtype = dtype_name == "bfloat16" ? DType::bfloat16 : DType::float32;
        for (int threads : {1, 2}) {
          cpu::set_kernel_thread_limit(threads);
          if (cpu::kernel_threads() < threads) {
            // A process bound to fewer CPUs (taskset, a cpuset, mpirun) has fewer kernel threads.
            std::printf("%-4s %5s %7d %-7s skipped: this process may run on %d CPU(s) only\n",
                        name.c_str(), short_dtype(dtype), threads,
                        (isa.empty() ? default_isa : isa).c_str(), cpu::kernel_threads());
            continue;
          }
          Row r = measure(size, dtype, threads, isa, repeats, steps, options.load);
          if (with_torch && dtype == DType::float32) {
            // libtorch does not depend on our kernel variant: timed once per size and threads.
            const auto same = std::find_if(rows.begin(), rows.end(), [&](const Row& other) {
              return other.size == r.size && other.threads == r.threads && other.libtorch_ms;
            });
            if (same == rows.end()) {
              measure_libtorch(r, repeats, steps, options.load);
            } else {
              r.libtorch_ms = same->libtorch_ms;
              r.libtorch_rel_error = same->libtorch_rel_error;
              r.libtorch_loaded_ms = same->libtorch_loaded_ms;
            }
          }
          rows.push_back(r);
          print_row(r);
        }
      }
    }
  }
  bool bfloat16_mismatch = false;
  for (const Row& r : rows) {
    if (r.dtype != DType::bfloat16) continue;
    const Row* twin = float32_twin(rows, r);
    std::printf("%s %dt %s bfloat16 (products on %s): traced %s float32 traced; eager step vs the "
                "float32 eager step: %.2e of its largest value (tolerance %.0e)\n",
                r.size.c_str(), r.threads, r.isa.c_str(), r.bfloat16_products.c_str(),
                twin != nullptr ? fmt::format("{:.2f}x", r.traced_ms / twin->traced_ms).c_str()
                                : "(no float32 cell) vs",
                r.float32_rel_error.value_or(0.0), kBFloat16Tolerance);
    if (r.float32_rel_error.value_or(0.0) > kBFloat16Tolerance) {
      std::fprintf(stderr, "retrace bench: size %s, %d threads: the bfloat16 step differs from the "
                           "float32 step by %.2e (tolerance %.0e)\n",
                   r.size.c_str(), r.threads, *r.float32_rel_error, kBFloat16Tolerance);
      bfloat16_mismatch = true;
    }
  }
  std::vector<DecodeRow> decode_rows;
  if (!options.decode_sizes.empty()) {
    std::printf("\nthe VAE decode: %s, float32, latents [1, 4, size / 8, size / 8] -> an image "
                "[1, 3, size, size]; medians of %d decodes per mode, eager and traced "
                "alternating%s\n",
                options.vae.empty() ? "the Stable Diffusion VAE's decoder (random weights)"
                                    : ("the decoder of " + options.vae).c_str(),
                options.decode_repeats,
                ops::conv2d_winograd() ? "; 3x3 convolutions by Winograd F(4x4, 3x3)" : "");
    std::printf("%5s %7s %-7s %10s %10s %13s %s\n", "image", "threads", "isa", "eager_ms",
                "traced_ms", "eager/traced", "traced == eager");
    for (std::int64_t image : options.decode_sizes) {
      for (int threads : {1, 2}) {
        cpu::set_kernel_thread_limit(threads);
        if (cpu::kernel_threads() < threads) {
          std::printf("%5lld %7d skipped: this process may run on %d CPU(s) only\n",
                      static_cast<long long>(image), threads, cpu::kernel_threads());
          continue;
        }
        const DecodeRow d = measure_decode(image, threads, options.vae, options.decode_repeats);
        std::printf("%5lld %7d %-7s %10.1f %10.1f %12.2fx %s\n", static_cast<long long>(d.image),
                    d.threads, d.isa.c_str(), d.eager_ms, d.traced_ms, d.eager_ms / d.traced_ms,
                    d.identical ? "bit for bit" : "MISMATCH");
        decode_rows.push_back(d);
      }
    }
  }
  cpu::set_kernel_thread_limit(1 << 20);
  if (options.load > 0) print_load_table(rows, options.load);
  nlohmann::json out = nlohmann::json::array();
  bool torch_mismatch = false;
  // The core's float32 FMA peak at each measured variant's vector width (one thread).
  std::map<std::string, std::optional<FmaPeak>> peaks;
  for (const Row& r : rows) {
    if (!peaks.contains(r.isa)) peaks[r.isa] = measure_fma_peak(r.isa);
  }
  if (!rows.empty()) std::printf("\nthe traced step's linears (a profiled replay):\n");
  for (const Row& r : rows) {
    const std::optional<FmaPeak>& peak = peaks[r.isa];
    if (r.linear_gflops) {
      std::printf("%s %s %dt %s: linears %.3f ms, %.1f GFLOP/s%s\n", r.size.c_str(),
                  short_dtype(r.dtype), r.threads, r.isa.c_str(), *r.linear_ms, *r.linear_gflops,
                  peak ? fmt::format(" ({:.0f}% of the float32 FMA peak of {} thread(s), "
                                     "{:.1f} GFLOP/s each with {} FMAs)",
                                     100.0 * *linear_over_peak(r, peak), r.threads, peak->gflops,
                                     peak->isa)
                             .c_str()
                       : "");
    }
  }
  for (const Row& r : rows) {
    out.push_back(
        row_json(r, options.load, default_isa, how, float32_twin(rows, r), peaks[r.isa]));
    if (options.load > 0) {
      const std::optional<double> vs_one = loaded_over_one_thread(rows, r);
      out.back()["traced_loaded_over_one_thread_loaded"] =
          vs_one ? nlohmann::json(*vs_one) : nlohmann::json(nullptr);
    }
    if (r.libtorch_rel_error && *r.libtorch_rel_error > 1e-4) {
      std::fprintf(stderr,
                   "retrace bench: size %s, %d threads: libtorch and retrace differ by a relative "
                   "error of %.2e (limit 1e-4)\n",
                   r.size.c_str(), r.threads, *r.libtorch_rel_error);
      torch_mismatch = true;
    }
  }
  bool decode_mismatch = false;
  for (const DecodeRow& d : decode_rows) {
    out.push_back({{"model", "vae_decode"},
                   {"image", d.image},
                   {"threads", d.threads},
                   {"kernel_isa", d.isa},
                   {"vae", options.vae.empty() ? "random" : options.vae},
                   {"conv2d_winograd", ops::conv2d_winograd()},
                   {"eager_ms", d.eager_ms},
                   {"traced_ms", d.traced_ms},
                   {"eager_over_traced", d.eager_ms / d.traced_ms},
                   {"traced_equals_eager", d.identical}});
    if (!d.identical) {
      std::fprintf(stderr, "retrace bench: the traced decode at %lld, %d threads, differs from "
                           "the eager one\n", static_cast<long long>(d.image), d.threads);
      decode_mismatch = true;
    }
  }
  if (!options.json_path.empty()) {
    std::ofstream(options.json_path) << out.dump(2) << "\n";
    std::printf("wrote %s\n", options.json_path.c_str());
  }
  if (!options.plot_path.empty() && !rows.empty()) write_plot(options.plot_path, rows, variants.size() > 1);
  return torch_mismatch || decode_mismatch || bfloat16_mismatch ? 1 : 0;
}

int run_libtorch_peer(const std::string& size_name, int threads, int repeats,
                      std::int64_t steps) {
  const models::NamedDiTConfig& size = find_size(size_name);
  auto device = open_cpu_device();
  const models::DiTConfig& c = size.config;
  models::DiT model(c, *device);
  std::string why;
  std::unique_ptr<TorchStep> torch_step = make_torch_step(model, why);
  RETRACE_CHECK(torch_step != nullptr, unimplemented, "bench: {}", why);
  torch_step->set_threads(threads);
  const StepInputs in = step_inputs(model, steps);
  const DeviceStep device_step(model, in, *device);
  const std::vector<float> want =
      device_step(Tensor::from_vector<float>(in.start, device_step.shape, c.dtype).to_device(*device))
          .to_vector<float>();
  std::vector<float> x = in.start;
  torch_step->step(x.data(), in.features.data(), in.label, in.a, in.b);
  const double error = relative_error(x, want);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    for (std::int64_t s = 0; s < steps; ++s) {
      ms.push_back(time_ms([&] { torch_step->step(x.data(), in.features.data(), in.label, in.a, in.b); }));
    }
  }
  std::printf("libtorch_ms %.9g libtorch_relative_error %.9g\n", median(ms), error);
  return 0;
}

int export_dit_steps(const std::string& dir, const std::vector<std::string>& sizes,
                     std::int64_t steps) {
  std::filesystem::create_directories(dir);
  auto device = open_cpu_device();
  for (const std::string& name : sizes) {
    const models::DiTConfig& c = find_size(name).config;
    models::DiT model(c, *device);
    const StepInputs in = step_inputs(model, steps);
    const DeviceStep device_step(model, in, *device);
    const Tensor x = Tensor::from_vector<float>(in.start, device_step.shape, c.dtype);
    std::map<std::string, Tensor> tensors;
    for (const auto& [weight, shape] : models::DiT::weight_shapes(c)) {
      tensors[weight] = model.weight(weight);
    }
    tensors["step.x"] = x;
    tensors["step.t_frequencies"] = Tensor::from_vector<float>(in.features, {1, c.frequency_size},
                                                               DType::float32);
    tensors["step.label"] = Tensor::from_vector<std::int32_t>(
        {static_cast<std::int32_t>(in.label)}, {1}, DType::int32);
    tensors["step.coefficients"] = Tensor::from_vector<float>({in.a, in.b}, {2}, DType::float32);
    tensors["step.heads"] = Tensor::from_vector<std::int32_t>(
        {static_cast<std::int32_t>(c.heads)}, {1}, DType::int32);
    tensors["step.x_next"] = device_step(x.to_device(*device)).to_host();
    const std::string path = (std::filesystem::path(dir) / ("dit_step_" + name + ".safetensors")).string();
    models::write_safetensors(path, tensors);
    std::printf("wrote %s (size %s: the weights, the step's inputs and retrace's result)\n",
                path.c_str(), name.c_str());
  }
  return 0;
}

}  // namespace retrace::bench
