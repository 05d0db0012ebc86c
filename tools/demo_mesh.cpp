// retrace demo --mesh N: the DiT split over N CPU devices (tensor parallel: each member has its
// share of the attention heads and of the MLP's width, two all-reduces per block), its sampler
// loop eager and traced on the mesh (one trace per member, the all-reduces inside), against
// the same loop eager on one device. Exits 1 if the traced and eager mesh results differ in any
// bit, or the members' replicas disagree.
//
// Started by mpirun with N ranks (`mpirun -np 2 retrace demo --mesh 2`), the mesh has one
// member per rank (retrace::mpi); rank 0 runs the one-device reference and prints, every rank
// exits with the same status.
#include "demo_common.hpp"

#include <retrace/mesh.hpp>
#include <retrace/models/tensor_parallel_dit.hpp>
#include "util/cpus.hpp"
#include "util/timing.hpp"
#ifdef RETRACE_HAVE_MPI
#include <retrace/mpi.hpp>
#endif

#include <algorithm>
#include <cmath>

namespace retrace::cli {

namespace {

using timing::Clock;
using timing::median;

const std::vector<Placement> kReplicated{Placement::replicate()};

// max |a - b| / max |b|: how far the split model moved from the one-device values.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

struct MeshResult {
  std::int64_t size;
  double one_ms, eager_ms, traced_ms;
  bool identical;
  double difference;
};

}  // namespace

int run_demo_mesh(ModelOptions& o, const DemoOptions& d) {
  const std::size_t n = d.mesh;
  const std::string backend = o.device.substr(0, o.device.find(':'));
  RETRACE_CHECK(backend == "cpu" || backend == "cuda", invalid_argument,
                "demo: --mesh splits the model over CPU or CUDA devices, not --device {}",
                o.device);
  RETRACE_CHECK(d.sampler == "ddim", invalid_argument,
                "demo: --mesh runs the DDIM sampler only, not --sampler {}", d.sampler);
  // Under mpirun: one member per rank; rank 0 leads (prints, runs the reference).
  bool across = false, lead = true;
#ifdef RETRACE_HAVE_MPI
  if (mpi::launched()) {
    mpi::init();
    const auto ranks = static_cast<std::size_t>(mpi::world_size());
    if (ranks > 1) {
      RETRACE_CHECK(ranks == n, invalid_argument,
                    "demo: --mesh {} under MPI needs {} ranks (one member per rank), but {} were "
                    "started",
                    n, n, ranks);
      across = true;
      lead = mpi::world_rank() == 0;
      if (!lead) (void)std::freopen("/dev/null", "w", stdout);
      progress_bars = false;  // mpirun forwards every rank's output: lines only
    }
  }
#endif
  // The whole model on one device: the reference.
  auto [device, model, batch, label] = load_demo_model(o, d);
  const models::DiTConfig& c = model->config();
  DeviceOptions member_options = device_options_for(o);
  member_options.kernel_threads = 1;  // members side by side, each on a core of its own
  std::unique_ptr<MeshDevice> mesh;
#ifdef RETRACE_HAVE_MPI
  // Under MPI a CUDA member is the rank's GPU on its host (the k-th rank there takes GPU k).
  if (across && backend == "cuda") mesh = mpi::open_mesh("cuda", {n}, member_options);
  if (across && !mesh) mesh = mpi::open_mesh("cpu", {n}, member_options, {}, device->id().value + 1);
#endif
  (void)across;
  if (!mesh && backend == "cuda") {
    // One member per GPU (cuda:0 .. cuda:n-1; the reference device shares GPU 0), meeting
    // through NCCL.
    try {
      mesh = MeshDevice::open("cuda", {n}, member_options);
    } catch (const Error& e) {
      throw cli::DeviceUnavailable(
          fmt::format("--mesh {} --device cuda needs {} GPUs: {}", n, n, e.message()));
    }
  }
  if (!mesh) mesh = MeshDevice::open("cpu", {n}, member_options, {}, device->id().value + 1);
  const models::TensorParallelDiT split(*model, *mesh);
  const models::DdimSchedule schedule(o.steps);
  print_demo_header(o, d, c, label, fmt::format("{} and, for reference, {}", mesh->name(),
                                                device->name()));
  std::printf("  tensor parallel: %lld of %lld heads and %lld of %lld MLP columns per member, "
              "2 all-reduces of [%lld, tokens, %lld] per block\n",
              static_cast<long long>(c.heads / static_cast<std::int64_t>(n)),
              static_cast<long long>(c.heads),
              static_cast<long long>(c.mlp_width() / static_cast<std::int64_t>(n)),
              static_cast<long long>(c.mlp_width()), static_cast<long long>(batch),
              static_cast<long long>(c.hidden));

  // The CPUs the reference may use: under mpirun, the ones rank 0 is bound to.
  const unsigned cpus = util::usable_cpus();
  if (across && backend != "cuda" && cpus < util::host_cpus()) {
    std::printf(
        "  the reference runs on rank 0's %u of %u CPUs (mpirun's binding; "
        "mpirun --bind-to none lets it use them all)\n",
        cpus, util::host_cpus());
  }

  std::vector<std::int64_t> label_list{label};
  if (batch == 2) label_list.push_back(c.num_classes);  // the null class
  auto host = [&](const std::vector<float>& values, const Shape& shape) {
    return Tensor::from_vector<float>(values, shape, c.dtype);
  };
  const Tensor labels = host(model->label_rows(label_list), {batch, c.num_classes + 1});
  const Tensor labels_one = labels.to_device(*device);
  const MeshTensor labels_mesh = distribute(labels, *mesh, kReplicated);
  const Shape freq_shape{1, c.frequency_size};
  auto frequencies = [&](std::size_t i) {
    return host(model->timestep_frequencies({&schedule.timesteps[i], 1}), freq_shape);
  };
  auto coefficients = [&](std::size_t i) { return host(schedule.coefficients(i), {2}); };

  std::vector<MeshResult> results;
  bool ok = true;
  for (std::int64_t size : demo_sizes(*model)) {
    std::printf("%lldx%lld latents, %lld tokens:\n", static_cast<long long>(size),
                static_cast<long long>(size),
                static_cast<long long>((size / c.patch_size) * (size / c.patch_size)));
    model->prepare_resolution(size, size);
    split.prepare_resolution(size, size);
    const Shape shape{1, c.in_channels, size, size};
    const Tensor start =
        host(initial_latents(static_cast<std::size_t>(shape.numel()), c.seed, size), shape);

    // The reference: the whole model on one device, eager.
    Progress one_bar("1 dev", o.steps);
    std::vector<double> one_ms;
    Tensor x = start.to_device(*device);
    for (std::int64_t i = 0; i < (lead ? o.steps : 0); ++i) {
      const auto t0 = Clock::now();
      const auto k = static_cast<std::size_t>(i);
      x = model->sample_step(x, frequencies(k).to_device(*device), labels_one,
                             coefficients(k).to_device(*device), d.cfg_scale);
      device->synchronize();
      one_ms.push_back(timing::milliseconds_since(t0));
      one_bar.tick(i + 1);
    }
    const std::vector<float> one_final = x.to_vector<float>();
    if (lead) {
      one_bar.finish(fmt::format(
          "median {:.2f} ms/step (eager, whole model on {}{})", median(one_ms), device->name(),
          backend == "cuda" ? std::string()
                            : fmt::format(", {} {}", cpus, cpus == 1 ? "CPU" : "CPUs")));
    } else {
      one_ms.push_back(0.0);  // the lead rank's reference
    }

    // The mesh, eager: every member dispatches its ops; the all-reduces meet on the queues.
    Progress eager_bar("eager", o.steps);
    std::vector<double> eager_ms;
    MeshTensor mx = distribute(start, *mesh, kReplicated);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const auto k = static_cast<std::size_t>(i);
      mx = split.sample_step(mx, distribute(frequencies(k), *mesh, kReplicated), labels_mesh,
                             distribute(coefficients(k), *mesh, kReplicated), d.cfg_scale);
      mesh->synchronize();
      eager_ms.push_back(timing::milliseconds_since(t0));
      eager_bar.tick(i + 1);
    }
    const std::vector<float> eager_final = mx.shard(0).to_vector<float>();
    eager_bar.finish(fmt::format("median {:.2f} ms/step (eager on the mesh)", median(eager_ms)));

    // The mesh, traced: the first step captures a trace on every member, the others replay
    // them (non-blocking on each member, then one synchronize); the latents go back into the
    // input slot.
    Progress traced_bar("traced", o.steps);
    std::vector<double> traced_ms;
    double capture_ms = 0.0;
    auto tracer = make_tracer<MeshTensor, MeshTensor, MeshTensor, MeshTensor>(
        [&](const MeshTensor& latents, const MeshTensor& t, const MeshTensor& rows,
            const MeshTensor& ab) { return split.sample_step(latents, t, rows, ab, d.cfg_scale); },
        *mesh, TraceOptions{.name = "DiT sample_step on the mesh"});
    const MeshTensor x0 = distribute(start, *mesh, kReplicated);
    for (std::int64_t i = 0; i < o.steps; ++i) {
      const auto t0 = Clock::now();
      const auto k = static_cast<std::size_t>(i);
      const bool first = !tracer.trace_captured();
      const MeshTensor& latents = first ? x0 : std::get<0>(tracer.inputs());
      const MeshTensor& next = tracer.call(
          CallOptions{.blocking = Blocking::no}, latents,
          distribute(frequencies(k), *mesh, kReplicated), labels_mesh,
          distribute(coefficients(k), *mesh, kReplicated));
      const MeshTensor& slot = std::get<0>(tracer.inputs());
      for (std::size_t m = 0; m < mesh->local_size(); ++m) ops::copy(next.shard(m), slot.shard(m));
      mesh->synchronize();
      (first ? capture_ms : traced_ms.emplace_back()) = timing::milliseconds_since(t0);
      traced_bar.tick(i + 1);
    }
    const double traced_median = traced_ms.empty() ? capture_ms : median(traced_ms);
    traced_bar.finish(fmt::format(
        "median {:.2f} ms/step on the mesh (first step, with capture: {:.1f} ms)", traced_median,
        capture_ms));
    const MeshTensor& traced_x = std::get<0>(tracer.inputs());
    const std::vector<float> traced_final = traced_x.shard(0).to_vector<float>();
    bool replicas = true;
    for (const Tensor& replica : gather_shards(traced_x)) {  // every member's, in every process
      replicas = replicas && same_bits(replica.to_vector<float>(), traced_final);
    }
    std::size_t commands = 0, collectives = 0;
    const std::size_t local = mesh->local_size();
    for (std::size_t m = 0; m < local; ++m) {
      const TraceInfo info = mesh->local_member(m).trace_info(tracer.trace_ids()[m]);
      commands += info.commands;
      collectives += static_cast<std::size_t>(
          std::count(info.ops.begin(), info.ops.end(), std::string_view("all_reduce")));
    }
    std::printf("  traces: one per member, %zu commands each, %zu all-reduces each\n",
                commands / local, collectives / local);
    const bool identical = same_bits(traced_final, eager_final);
    const double difference = relative_difference(traced_final, one_final);
    std::printf("  final latents (%zu values): traced %s eager on the mesh%s; the %zu members' "
                "copies %s\n",
                traced_final.size(), identical ? "==" : "!=",
                identical ? " bit for bit" : " -- MISMATCH", n,
                replicas ? "identical" : "DIFFER -- MISMATCH");
    std::printf("  against one device: max |difference| = %.3g of the largest value (the "
                "projections' sums are split over the members: float32 rounding)\n",
                difference);
    ok = ok && identical && replicas;
    results.push_back({size, median(one_ms), median(eager_ms), traced_median, identical,
                       difference});
  }

  ok = mesh->all_processes(ok);  // every rank exits with the same status
  std::printf("summary (%s):\n", mesh->name().c_str());
  for (const MeshResult& r : results) {
    const std::string key = fmt::format("{}x{}", r.size, r.size);
    std::printf("  %7s latents: one device %8.2f ms/step, mesh eager %8.2f, mesh traced %8.2f "
                "(%.2fx one device), %s\n",
                key.c_str(), r.one_ms, r.eager_ms, r.traced_ms, r.one_ms / r.traced_ms,
                r.identical ? "identical" : "DIFFERENT");
  }
  std::printf("what these lines mean: %s\n", docs_page("mesh.md#the-dit-split-over-a-mesh").c_str());
  if (!ok) {
    std::fprintf(stderr,
                 "retrace demo: on the mesh, traced and eager results (or the members' copies) "
                 "differ; this is a bug, please report it with the command line above\n");
    return 1;
  }
  return 0;
}

}  // namespace retrace::cli
