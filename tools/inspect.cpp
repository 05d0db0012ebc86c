// retrace inspect: capture one sampler step of the DiT (or, with --vae, one decode of the VAE)
// and print its trace — commands by op, memory, input slots — and optionally a Graphviz graph
// of it (--dot FILE): one node per command, an edge from the last earlier command that used one
// of its buffers.
#include "demo_common.hpp"
#include "model_options.hpp"

#include <retrace/models/safetensors.hpp>
#include <retrace/models/vae.hpp>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

namespace retrace::cli {

namespace {

void write_dot(const std::string& path, const TraceInfo& info,
               const std::vector<std::pair<std::string, std::uint64_t>>& inputs,
               std::uint64_t output) {
  std::ofstream out(path);
  RETRACE_CHECK(out.good(), invalid_argument, "inspect: cannot write {}", path);
  out << "digraph trace {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::map<std::uint64_t, std::string> last_user;
  for (const auto& [name, address] : inputs) {
    const std::string node = fmt::format("\"in:{}\"", name);
    out << "  " << node << " [label=\"" << name
        << "\", shape=ellipse, style=filled, fillcolor=lightblue];\n";
    last_user[address] = node;
  }
  for (std::size_t i = 0; i < info.ops.size(); ++i) {
    const std::string node = fmt::format("c{}", i);
    out << "  " << node << " [label=\"" << i << ": " << info.ops[i] << "\"];\n";
    std::set<std::string> from;
    for (std::uint64_t address : info.command_buffers[i]) {
      if (auto it = last_user.find(address); it != last_user.end()) from.insert(it->second);
      last_user[address] = node;
    }
    for (const std::string& f : from) out << "  " << f << " -> " << node << ";\n";
  }
  if (auto it = last_user.find(output); it != last_user.end()) {
    out << "  out [label=\"output\", shape=ellipse, style=filled, fillcolor=lightgreen];\n";
    out << "  " << it->second << " -> out;\n";
  }
  out << "}\n";
}

}  // namespace

// The profile of a replay: time by op, the slowest commands, and optionally a Chrome trace file
// with one replay's commands laid end to end at their median times.
void print_profile(const TraceProfile& p, const std::string& json_path) {
  double sum = 0;
  for (double ns : p.command_ns) sum += ns;
  std::printf("profile: %zu timed replays; median replay %.3f ms, sum of the commands' medians "
              "%.3f ms\n",
              p.replays, p.replay_ns / 1e6, sum / 1e6);
  struct OpTime {
    std::size_t count = 0;
    double ns = 0;
  };
  std::map<std::string_view, OpTime> by_op;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    by_op[p.ops[i]].count += 1;
    by_op[p.ops[i]].ns += p.command_ns[i];
  }
  std::vector<std::pair<double, std::string_view>> ops;
  for (const auto& [op, t] : by_op) ops.emplace_back(t.ns, op);
  std::sort(ops.rbegin(), ops.rend());
  std::printf("time by op (median per replay):\n  %-30s %8s %11s %7s %10s\n", "op", "commands",
              "ms", "share", "us/command");
  for (const auto& [ns, op] : ops) {
    const OpTime& t = by_op[op];
    std::printf("  %-30.*s %8zu %11.3f %6.1f%% %10.1f\n", static_cast<int>(op.size()), op.data(),
                t.count, ns / 1e6, sum > 0 ? 100.0 * ns / sum : 0.0,
                ns / 1e3 / static_cast<double>(t.count));
  }
  std::vector<std::size_t> order(p.ops.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return p.command_ns[a] > p.command_ns[b]; });
  std::printf("slowest commands:\n");
  for (std::size_t k = 0; k < std::min<std::size_t>(10, order.size()); ++k) {
    const std::size_t i = order[k];
    std::printf("  #%-5zu %-30.*s %10.1f us %6.1f%%\n", i, static_cast<int>(p.ops[i].size()),
                p.ops[i].data(), p.command_ns[i] / 1e3,
                sum > 0 ? 100.0 * p.command_ns[i] / sum : 0.0);
  }
  if (json_path.empty()) return;
  nlohmann::json events = nlohmann::json::array();
  double at_us = 0;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    const double dur_us = p.command_ns[i] / 1e3;
    events.push_back({{"name", std::string(p.ops[i])},
                      {"cat", "command"},
                      {"ph", "X"},
                      {"ts", at_us},
                      {"dur", dur_us},
                      {"pid", 1},
                      {"tid", 1},
                      {"args", {{"command", i}, {"median_ns", p.command_ns[i]}}}});
    at_us += dur_us;
  }
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"trace", p.trace.value},
                          {"replays", p.replays},
                          {"replay_median_ns", p.replay_ns}}}};
  std::ofstream out(json_path);
  RETRACE_CHECK(out.good(), invalid_argument, "inspect: cannot write {}", json_path);
  out << doc.dump(1) << "\n";
  RETRACE_CHECK(out.good(), invalid_argument, "inspect: writing {} failed", json_path);
  std::printf("wrote %s (one replay at median command times; open in ui.perfetto.dev or "
              "chrome://tracing)\n",
              json_path.c_str());
}

namespace {

// What inspect prints of a captured trace after its title line: its size, commands by op, the
// input slots and the output; then the Graphviz graph and the profile when asked.
int report_trace(Device& device, TraceId trace,
                 const std::vector<std::pair<std::string, const Tensor*>>& slots,
                 const Tensor& output, const InspectOptions& inspect) {
  const TraceInfo info = device.trace_info(trace);
  std::printf(
      "  %zu commands, %s of private trace memory in %zu buffers, %zu outside buffers kept alive\n",
      info.commands, human_bytes(info.bytes).c_str(), info.pool_buffers, info.external_buffers);
  std::map<std::string_view, std::size_t> by_op;
  for (std::string_view op : info.ops) ++by_op[op];
  std::vector<std::pair<std::size_t, std::string_view>> sorted;
  for (const auto& [op, n] : by_op) sorted.emplace_back(n, op);
  std::sort(sorted.rbegin(), sorted.rend());
  std::printf("commands by op:\n");
  for (const auto& [n, op] : sorted)
    std::printf("  %-30.*s %5zu\n", static_cast<int>(op.size()), op.data(), n);
  std::printf("input slots (replays read these buffers; refresh them in place):\n");
  std::vector<std::pair<std::string, std::uint64_t>> inputs;
  for (const auto& [name, slot] : slots) {
    std::printf("  %-22s %s\n", name.c_str(), slot->to_string().c_str());
    inputs.emplace_back(name, slot->address());
  }
  std::printf("output (the same object on every replay):\n  %s\n", output.to_string().c_str());
  if (!inspect.dot_path.empty()) {
    write_dot(inspect.dot_path, info, inputs, output.address());
    std::printf("wrote %s (render: dot -Tpng %s -o trace.png)\n", inspect.dot_path.c_str(),
                inspect.dot_path.c_str());
  }
  if (inspect.profile) {
    print_profile(device.profile_trace(trace, kDefaultQueue, inspect.replays), inspect.trace_json);
  }
  std::printf("what these lines mean: %s\n", docs_page("cli.md#retrace-inspect").c_str());
  return 0;
}

// inspect --vae: the trace of one decode of a [1, C, input size, input size] latent.
int inspect_vae(ModelOptions& o, const InspectOptions& inspect) {
  const DType dtype = dtype_named(o.dtype);
  const auto weights = models::read_safetensors(inspect.vae);
  const models::VaeDecoderConfig config =
      models::infer_vae_decoder_config(weights, models::VaeInference{.dtype = dtype});
  const std::int64_t size = o.config.input_size;
  const Shape shape{1, config.latent_channels, size, size};
  o.extra_bytes = 2 * models::VaeDecoder::decode_bytes(config, shape);
  o.trace_bytes = models::VaeDecoder::decode_bytes(config, shape);
  auto device = open_device(o);
  models::VaeDecoder vae(config, *device, weights,
                         o.allow_unused ? models::UnusedWeights::warn : models::UnusedWeights::error);
  auto decode = make_tracer([&](const Tensor& latents) { return vae.decode(latents); }, *device,
                            TraceOptions{.name = "VAE decode"});
  const Tensor latents = ops::full(shape, 0.1, *device, dtype);
  const Tensor& output = decode(latents);
  const TraceId trace = decode.trace_ids().front();
  std::printf("trace %llu of one VAE decode (%s latents -> %s image, blocks [%s], %s) on %s\n",
              static_cast<unsigned long long>(trace.value), shape.to_string().c_str(),
              output.shape().to_string().c_str(),
              fmt::format("{}", fmt::join(config.block_out_channels, ", ")).c_str(),
              o.dtype.c_str(), device->name().c_str());
  return report_trace(*device, trace, {{"args[0] latents", &std::get<0>(decode.inputs())}},
                      output, inspect);
}

}  // namespace

int run_inspect(ModelOptions& o, const InspectOptions& inspect) {
  RETRACE_CHECK(inspect.trace_json.empty() || inspect.profile, invalid_argument,
                "inspect: --trace-json needs --profile");
  if (!inspect.vae.empty()) return inspect_vae(o, inspect);
  auto device = open_device(o);
  auto model = make_model(o, *device);
  const models::DiTConfig& c = model->config();
  // One sampler step (batch 1, class 0, no guidance) on constant latents.
  auto step = make_tracer(
      [&](const Tensor& latents, const Tensor& t, const Tensor& labels, const Tensor& ab) {
        return model->sample_step(latents, t, labels, ab, 1.0);
      },
      *device, TraceOptions{.name = "DiT sample_step"});
  const Tensor latents =
      ops::full({1, c.in_channels, c.input_size, c.input_size}, 0.1, *device, c.dtype);
  const float t = 500.0f;
  const std::int64_t label = 0;
  auto upload = [&](const std::vector<float>& values, const Shape& shape) {
    return Tensor::from_vector<float>(values, shape, c.dtype).to_device(*device);
  };
  const Tensor features = upload(model->timestep_frequencies({&t, 1}), {1, c.frequency_size});
  const Tensor labels = upload(model->label_rows({&label, 1}), {1, c.num_classes + 1});
  const Tensor& output = step(latents, features, labels, upload({0.9f, 0.1f}, {2}));
  const TraceId trace = step.trace_ids().front();
  std::printf(
      "trace %llu of one DiT sampler step (%lld tokens, hidden %lld, depth %lld, heads %lld, %s) "
      "on %s\n",
      static_cast<unsigned long long>(trace.value), static_cast<long long>(c.tokens()),
      static_cast<long long>(c.hidden), static_cast<long long>(c.depth),
      static_cast<long long>(c.heads), o.dtype.c_str(), device->name().c_str());
  const auto& [slot_latents, slot_t, slot_labels, slot_ab] = step.inputs();
  return report_trace(*device, trace,
                      {{"args[0] latents", &slot_latents},
                       {"args[1] timestep", &slot_t},
                       {"args[2] labels", &slot_labels},
                       {"args[3] coefficients", &slot_ab}},
                      output, inspect);
}

}  // namespace retrace::cli
