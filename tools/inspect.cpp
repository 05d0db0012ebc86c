// retrace inspect: capture one sampler step of the DiT and print its trace — commands
// by op, memory, input slots — and optionally a Graphviz graph of it (--dot FILE): one node per
// command, an edge from the last earlier command that used one of its buffers.
#include "model_options.hpp"

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

int run_inspect(ModelOptions& o, const std::string& dot_path) {
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
  const TraceInfo info = device->trace_info(trace);

  std::printf(
      "trace %llu of one DiT sampler step (%lld tokens, hidden %lld, depth %lld, heads %lld, %s) "
      "on %s\n",
      static_cast<unsigned long long>(trace.value), static_cast<long long>(c.tokens()),
      static_cast<long long>(c.hidden), static_cast<long long>(c.depth),
      static_cast<long long>(c.heads), o.dtype.c_str(), device->name().c_str());
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
  const auto& [slot_latents, slot_t, slot_labels, slot_ab] = step.inputs();
  for (const auto& [name, slot] :
       {std::pair<std::string, const Tensor*>{"args[0] latents", &slot_latents},
        {"args[1] timestep", &slot_t},
        {"args[2] labels", &slot_labels},
        {"args[3] coefficients", &slot_ab}}) {
    std::printf("  %-22s %s\n", name.c_str(), slot->to_string().c_str());
    inputs.emplace_back(name, slot->address());
  }
  std::printf("output (the same object on every replay):\n  %s\n", output.to_string().c_str());
  if (!dot_path.empty()) {
    write_dot(dot_path, info, inputs, output.address());
    std::printf("wrote %s (render: dot -Tpng %s -o trace.png)\n", dot_path.c_str(),
                dot_path.c_str());
  }
  return 0;
}

}  // namespace retrace::cli
