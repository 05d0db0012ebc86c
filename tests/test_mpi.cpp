// Meshes across MPI ranks (retrace/mpi.hpp), run as `mpirun -np 2 retrace_test_mpi`: every rank
// runs every test. The collectives eager and traced against a reference computed here and
// against the same mesh in one process (bit for bit), the tensor-parallel DiT step across ranks,
// failures that reach every rank, a rank that never arrives, and repeated capture cycles.
#include "mesh_battery.hpp"
#include "support.hpp"

#include <retrace/mesh.hpp>
#include <retrace/models/dit.hpp>
#include <retrace/models/tensor_parallel_dit.hpp>
#include <retrace/mpi.hpp>
#include <retrace/ops.hpp>
#include <retrace/registry.hpp>
#include <retrace/tracer.hpp>
#include "util/cpus.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

namespace retrace {
namespace {

std::vector<float> values(std::int64_t n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = scale * static_cast<float>(static_cast<int>(i % 89) - 40) + 0.1f * scale;
  }
  return v;
}

// Same shape, dtype and bytes (host tensors, or device tensors read back).
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.on_host() ? a : a.to_host();
  const Tensor hb = b.on_host() ? b : b.to_host();
  if (ha.shape() != hb.shape() || ha.dtype() != hb.dtype()) return false;
  const auto x = ha.host_bytes(), y = hb.host_bytes();
  return std::equal(x.begin(), x.end(), y.begin(), y.end());
}

Tensor host_full(std::int64_t n, float value) {
  return Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), value), {n},
                             DType::float32);
}

using testing::expect_error;

std::size_t ranks() { return static_cast<std::size_t>(mpi::world_size()); }
std::size_t my_rank() { return static_cast<std::size_t>(mpi::world_rank()); }

// A partial mesh tensor whose member k holds parts[k]: on `mesh` (MPI or in-process).
MeshTensor partial_of(const std::vector<Tensor>& parts, const MeshDevice& mesh,
                      std::vector<Placement> placements = {Placement::partial()}) {
  std::vector<Tensor> shards;
  for (std::size_t i = 0; i < mesh.local_size(); ++i) {
    shards.push_back(parts[mesh.local_index(i)].to_device(mesh.local_member(i)));
  }
  return MeshTensor(shards, mesh, std::move(placements));
}

TEST(MpiMesh, OpensOneMemberPerRank) {
  auto mesh = mpi::open_mesh("cpu");
  const std::size_t n = ranks(), r = my_rank();
  EXPECT_EQ(mesh->size(), n);
  EXPECT_EQ(mesh->local_size(), 1u);
  EXPECT_EQ(mesh->local_index(0), r);
  EXPECT_TRUE(mesh->spans_processes());
  EXPECT_EQ(mesh->devices().size(), 1u);
  EXPECT_EQ(mesh->local_member(0).name(), fmt::format("cpu:{}", r));
  EXPECT_NE(mesh->name().find("mpi mesh " + std::to_string(n) + " [cpu:0@rank0, cpu:1@rank1"),
            std::string::npos)
      << mesh->name();
  EXPECT_EQ(&mesh->member(r), &mesh->local_member(0));
  expect_error([&] { (void)mesh->member((r + 1) % n); }, ErrorCategory::invalid_argument,
               "runs in another process");
  EXPECT_TRUE(mesh->all_processes(true));
  EXPECT_FALSE(mesh->all_processes(r != 0));  // false on rank 0: false everywhere
  expect_error([] { (void)mpi::open_mesh("cpu", {ranks() + 1}); },
               ErrorCategory::invalid_argument, "needs " + std::to_string(ranks() + 1) + " ranks");
}

TEST(MpiMesh, DistributeThenGatherIsTheIdentity) {
  auto mesh = mpi::open_mesh("cpu");
  const auto n = static_cast<std::int64_t>(ranks());
  const Tensor host = Tensor::from_vector(values(3 * 4 * n, 0.5f), {3, 4 * n}, DType::float32);
  for (Placement p : {Placement::replicate(), Placement::shard(1), Placement::shard(-1)}) {
    const MeshTensor m = distribute(host, *mesh, {p});
    EXPECT_EQ(m.shards().size(), 1u);
    EXPECT_EQ(gather_to_host(m).to_vector<float>(), host.to_vector<float>()) << p.to_string();
  }
  const MeshTensor cols = distribute(host, *mesh, {Placement::shard(1)});
  EXPECT_EQ(cols.shard(0).shape(), (Shape{3, 4}));
  const std::vector<Tensor> all = gather_shards(cols);
  ASSERT_EQ(all.size(), ranks());
  // Member k holds columns [4k, 4k + 4).
  const std::vector<float> whole = host.to_vector<float>();
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::vector<float> got = all[k].to_vector<float>();
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 0; j < 4; ++j) {
        EXPECT_EQ(got[static_cast<std::size_t>(i * 4 + j)],
                  whole[static_cast<std::size_t>(i * 4 * n + static_cast<std::int64_t>(k) * 4 + j)]);
      }
    }
  }
}

// Every collective, on every dtype that sums, against sums computed here in rank order and
// against the same collective on an in-process mesh of as many CPU devices: the same bits.
TEST(MpiMesh, CollectivesMatchTheReferenceAndTheInProcessMesh) {
  auto mesh = mpi::open_mesh("cpu");
  auto local = MeshDevice::open("cpu", {ranks()}, std::nullopt, {}, 100);
  const std::size_t n = ranks();
  const std::int64_t rows = 3, cols = 4 * static_cast<std::int64_t>(n);
  for (DType dtype : {DType::float32, DType::bfloat16, DType::int32}) {
    std::vector<Tensor> parts;
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<float> v = values(rows * cols, 0.37f * static_cast<float>(k + 1));
      if (dtype == DType::int32) {
        for (float& x : v) x = std::round(x * 1000.0f);
      }
      parts.push_back(Tensor::from_vector(v, {rows, cols}, dtype));
    }
    // The reference: the parts summed in rank order (float32 accumulation, rounded once).
    const Tensor expected = [&] {
      Tensor acc = ops::typecast(parts[0].to_device(local->member(0)), DType::float32);
      if (dtype == DType::int32) acc = parts[0].to_device(local->member(0));
      for (std::size_t k = 1; k < n; ++k) {
        const Tensor p = parts[k].to_device(local->member(0));
        acc = ops::add(acc, dtype == DType::int32 ? p : ops::typecast(p, DType::float32));
      }
      return ops::typecast(acc, dtype).to_host();
    }();
    const std::string what = fmt::format("{}", dtype);

    const MeshTensor x = partial_of(parts, *mesh);
    const MeshTensor x_local = partial_of(parts, *local);
    const MeshTensor reduced = ops::all_reduce(x);
    EXPECT_TRUE(same_bits(reduced.shard(0).to_host(), expected)) << what;
    EXPECT_TRUE(same_bits(gather_to_host(x), expected)) << what;
    EXPECT_TRUE(same_bits(reduced.shard(0).to_host(),
                                   ops::all_reduce(x_local).shard(my_rank()).to_host()))
        << what;

    for (std::int64_t dim : {0, 1}) {
      if (dim == 0 && rows % static_cast<std::int64_t>(n) != 0) continue;
      const MeshTensor scattered = ops::reduce_scatter(x, dim);
      EXPECT_EQ(scattered.placements()[0], Placement::shard(dim));
      EXPECT_TRUE(same_bits(gather_to_host(scattered), expected)) << what << dim;
      EXPECT_TRUE(same_bits(
          scattered.shard(0).to_host(),
          ops::reduce_scatter(x_local, dim).shard(my_rank()).to_host()))
          << what << dim;
      const MeshTensor gathered = ops::all_gather(scattered);  // outer 1 (dim 0) and 3 (dim 1)
      EXPECT_TRUE(same_bits(gathered.shard(0).to_host(), expected)) << what << dim;
    }
  }
}

// A 2-D mesh over 4 ranks (the ctest run with 4 ranks): sums along each axis, against the same
// 2x2 mesh in one process, bit for bit.
TEST(MpiMesh, TwoDimensionalMeshReducesAlongEachAxis) {
  if (ranks() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto mesh = mpi::open_mesh("cpu", {2, 2});
  auto local = MeshDevice::open("cpu", {2, 2}, std::nullopt, {}, 100);
  EXPECT_EQ(mesh->coords(my_rank()), local->coords(my_rank()));
  std::vector<Tensor> parts;
  for (std::size_t k = 0; k < 4; ++k) {
    parts.push_back(Tensor::from_vector(values(2 * 6, static_cast<float>(k) + 0.3f), {2, 6},
                                        DType::float32));
  }
  for (std::size_t axis : {0u, 1u}) {
    std::vector<Placement> placements{Placement::replicate(), Placement::replicate()};
    placements[axis] = Placement::partial();
    const MeshTensor x = partial_of(parts, *mesh, placements);
    const MeshTensor x_local = partial_of(parts, *local, placements);
    const MeshTensor y = ops::all_reduce(x, axis);
    const MeshTensor y_local = ops::all_reduce(x_local, axis);
    EXPECT_TRUE(same_bits(y.shard(0), y_local.shard(my_rank()))) << "axis " << axis;
    const MeshTensor s = ops::reduce_scatter(x, 1, axis);
    EXPECT_TRUE(same_bits(s.shard(0), ops::reduce_scatter(x_local, 1, axis).shard(my_rank())))
        << "axis " << axis;
    EXPECT_TRUE(same_bits(ops::all_gather(s, axis).shard(0), y.shard(0))) << "axis " << axis;
  }
}

TEST(MpiMesh, TracedCollectivesEqualEagerBitForBit) {
  auto mesh = mpi::open_mesh("cpu");
  const std::int64_t d = 16;
  const Tensor w = Tensor::from_vector(values(d * d, 0.01f), {d, d}, DType::float32);
  const MeshTensor weight = distribute(w, *mesh, {Placement::shard(1)});
  // Row-parallel matmul (partial products, one all_reduce), then an all_gather of a shard.
  auto step = [&](const MeshTensor& x) {
    const MeshTensor y = mesh_map(
        {Placement::partial()},
        [](const Tensor& xs, const Tensor& ws) {
          return ops::matmul(xs, ws, ops::Transpose::no, ops::Transpose::yes);
        },
        x, weight);
    const MeshTensor r = mesh_map([](const Tensor& t) { return ops::gelu(t); }, ops::all_reduce(y));
    return ops::all_gather(ops::reduce_scatter(r.with_placements({Placement::partial()}), 1));
  };
  auto tracer = make_tracer<MeshTensor>(step, *mesh);
  for (int call = 0; call < 4; ++call) {
    const Tensor xh = Tensor::from_vector(values(4 * d, 0.1f * static_cast<float>(call + 1)),
                                          {4, d}, DType::float32);
    const MeshTensor x = distribute(xh, *mesh, {Placement::shard(1)});
    const Tensor eager = gather_to_host(step(x));
    const MeshTensor& traced = tracer(x);
    EXPECT_TRUE(same_bits(gather_to_host(traced), eager)) << "call " << call;
    const std::vector<Tensor> replicas = gather_shards(traced);
    for (std::size_t k = 1; k < replicas.size(); ++k) {
      EXPECT_TRUE(same_bits(replicas[k], replicas[0])) << k;
    }
  }
  EXPECT_EQ(tracer.trace_ids().size(), 1u);  // one trace per rank
}

TEST(MpiMesh, TensorParallelDiTMatchesOneDeviceAndTracedEqualsEager) {
  const std::size_t n = ranks();
  auto device = open_cpu_device();
  auto mesh = mpi::open_mesh("cpu", {}, std::nullopt, {}, 1);
  auto local = MeshDevice::open("cpu", {n}, std::nullopt, {}, 100);
  const models::DiTConfig c{.input_size = 8, .hidden = 32, .depth = 2, .heads = 4,
                            .num_classes = 10, .dtype = DType::float32, .seed = 5};
  const models::DiT model(c, *device);
  const models::TensorParallelDiT split(model, *mesh);
  const models::TensorParallelDiT split_local(model, *local);
  const models::DdimSchedule schedule(3);
  const std::vector<Placement> r{Placement::replicate()};
  auto host = [&](const std::vector<float>& v, const Shape& s) {
    return Tensor::from_vector<float>(v, s, c.dtype);
  };
  const Shape shape{1, c.in_channels, 8, 8};
  const std::vector<std::int64_t> classes{3, c.num_classes};
  const Tensor labels = host(model.label_rows(classes), {2, c.num_classes + 1});
  auto freq = [&](std::size_t i) {
    return host(model.timestep_frequencies({&schedule.timesteps[i], 1}), {1, c.frequency_size});
  };
  auto coef = [&](std::size_t i) { return host(schedule.coefficients(i), {2}); };
  const Tensor start =
      host(testing::random_floats(static_cast<std::size_t>(shape.numel()), 7), shape);

  // One step: across the ranks, on the in-process mesh and on one device.
  const MeshTensor out = split.sample_step(distribute(start, *mesh, r),
                                           distribute(freq(0), *mesh, r),
                                           distribute(labels, *mesh, r),
                                           distribute(coef(0), *mesh, r), 3.0);
  const MeshTensor out_local = split_local.sample_step(
      distribute(start, *local, r), distribute(freq(0), *local, r),
      distribute(labels, *local, r), distribute(coef(0), *local, r), 3.0);
  const Tensor reference =
      model.sample_step(start.to_device(*device), freq(0).to_device(*device),
                        labels.to_device(*device), coef(0).to_device(*device), 3.0)
          .to_host();
  EXPECT_TRUE(same_bits(gather_to_host(out), out_local.shard(0).to_host()));
  const std::vector<float> got = gather_to_host(out).to_vector<float>();
  const std::vector<float> want = reference.to_vector<float>();
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  EXPECT_LT(diff / scale, 1e-6) << "the split sums moved the step by more than float32 rounding";

  // Three steps traced on the ranks against the same steps eager.
  auto tracer = make_tracer<MeshTensor, MeshTensor, MeshTensor, MeshTensor>(
      [&](const MeshTensor& x, const MeshTensor& t, const MeshTensor& l, const MeshTensor& ab) {
        return split.sample_step(x, t, l, ab, 3.0);
      },
      *mesh);
  MeshTensor eager = distribute(start, *mesh, r);
  MeshTensor traced = eager;
  const MeshTensor rows = distribute(labels, *mesh, r);
  for (std::size_t i = 0; i < 3; ++i) {
    const MeshTensor t = distribute(freq(i), *mesh, r), ab = distribute(coef(i), *mesh, r);
    eager = split.sample_step(eager, t, rows, ab, 3.0);
    traced = tracer(traced, t, rows, ab);
    EXPECT_TRUE(same_bits(gather_to_host(traced), gather_to_host(eager))) << i;
  }
}

TEST(MpiMesh, AFailingMemberFailsTheCollectiveOnEveryRank) {
  auto mesh = mpi::open_mesh("cpu");
  const std::size_t n = ranks();
  std::vector<Tensor> parts;
  for (std::size_t k = 0; k < n; ++k) parts.push_back(host_full(4, 1.0f));
  const MeshTensor x = partial_of(parts, *mesh);
  const Tensor& mine = x.shard(0);
  // The last rank's queue fails before the collective (a NaN caught by assert_finite).
  if (my_rank() == n - 1) {
    ops::fill(mine, std::nan(""));
    ops::assert_finite(mine);
  }
  const MeshTensor y = ops::all_reduce(x);
  try {
    mesh->synchronize();
    ADD_FAILURE() << "rank " << my_rank() << " did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::device_error);
    const std::string what = e.what();
    EXPECT_NE(what.find("assert_finite"), std::string::npos) << what;
    if (my_rank() != n - 1) {
      EXPECT_NE(what.find("all_reduce"), std::string::npos) << what;
      EXPECT_NE(what.find(fmt::format("cpu:{}@rank{} did not take part", n - 1, n - 1)),
                std::string::npos)
          << what;
    }
  }
  // Reported; the mesh is usable again.
  ops::fill(mine, 2.0);
  const MeshTensor z = ops::all_reduce(x);
  EXPECT_EQ(z.shard(0).to_vector<float>(), std::vector<float>(4, 2.0f * static_cast<float>(n)));
}

TEST(MpiMesh, RanksThatDisagreeFailTogether) {
  auto mesh = mpi::open_mesh("cpu");
  // The last rank's shard has another size: every rank's all_reduce fails, naming both sizes.
  const std::int64_t len = my_rank() + 1 == ranks() ? 6 : 4;
  const MeshTensor x(std::vector<Tensor>{ops::full({len}, 1.0, mesh->local_member(0))}, *mesh,
                     {Placement::partial()});
  expect_error(
      [&] {
        (void)ops::all_reduce(x);
        mesh->synchronize();
      },
      ErrorCategory::device_error, "the members disagree");
  const MeshTensor ok(std::vector<Tensor>{ops::full({4}, 1.0, mesh->local_member(0))}, *mesh,
                      {Placement::partial()});
  EXPECT_EQ(ops::all_reduce(ok).shard(0).to_vector<float>(),
            std::vector<float>(4, static_cast<float>(ranks())));
}

TEST(MpiMesh, RepeatedCaptureAndReleaseLeavesMemoryWhereItStarted) {
  auto mesh = mpi::open_mesh("cpu");
  const auto n = static_cast<std::int64_t>(ranks());
  const MeshTensor x = distribute(
      Tensor::from_vector(values(4 * 8 * n, 1.0f), {4, 8 * n}, DType::float32), *mesh,
      {Placement::shard(1)});
  auto step = [](const MeshTensor& t) {
    return ops::all_gather(mesh_map([](const Tensor& s) { return ops::mul(s, 2.0); }, t));
  };
  Device& member = mesh->local_member(0);
  const std::size_t before = member.stats().bytes_in_use;
  for (int cycle = 0; cycle < 1000; ++cycle) {
    auto tracer = make_tracer<MeshTensor>(step, *mesh);
    const CallOptions async{kDefaultQueue, Blocking::no};
    (void)tracer.call(async, x);
    (void)tracer.call(async, x);
    tracer.release_trace();
  }
  mesh->synchronize();
  EXPECT_EQ(member.stats().bytes_in_use, before);
  EXPECT_EQ(member.stats().live_traces, 0u);
}

TEST(MpiMesh, ARankThatNeverArrivesTimesOutInsteadOfHanging) {
  auto mesh = mpi::open_mesh("cpu", {}, std::nullopt, MeshOptions{std::chrono::milliseconds(300)});
  const MeshTensor x(std::vector<Tensor>{ops::full({4}, 1.0, mesh->local_member(0))}, *mesh,
                     {Placement::partial()});
  if (my_rank() == 0) {
    // The other ranks never run this collective: rank 0 gives up after the timeout.
    expect_error(
        [&] {
          (void)ops::all_reduce(x);
          mesh->synchronize();
        },
        ErrorCategory::device_error, "waited 300 ms for the other ranks");
    // The group is broken from now on: collectives fail at once.
    expect_error(
        [&] {
          (void)ops::all_reduce(x);
          mesh->synchronize();
        },
        ErrorCategory::device_error, "cannot run collectives any more");
  }
  EXPECT_TRUE(mesh->all_processes(true));  // the ranks meet again (on another communicator)
}

TEST(MpiMesh, ClosingTheMeshRefusesItsTensors) {
  auto mesh = mpi::open_mesh("cpu");
  const MeshTensor x =
      distribute(host_full(4, 1.0f), *mesh, {Placement::replicate()});
  mesh->close();
  expect_error([&] { (void)ops::all_reduce(x.with_placements({Placement::partial()})); },
               ErrorCategory::failed_precondition, "was closed");
}

// One GPU per rank (the k-th rank on a host takes its GPU k), meeting through NCCL: the battery
// of collectives against the CPU members of the same ranks. Skipped on every rank when a rank
// has no GPU (or the build no CUDA backend): open_mesh fails on all of them then.
TEST(MpiMesh, CudaMembersMeetThroughNccl) {
  std::unique_ptr<MeshDevice> gpu;
  try {
    gpu = mpi::open_mesh("cuda", {}, testing::small_gpu_options());
  } catch (const Error& e) {
    GTEST_SKIP() << "no GPU for every rank: " << e.message();
  }
  SCOPED_TRACE(gpu->name());
  auto cpu = mpi::open_mesh("cpu");
  testing::expect_batteries_close(testing::collective_battery(*gpu),
                                  testing::collective_battery(*cpu), gpu->size());
}

// Tests that hold for any number of ranks, one included (ctest runs them alone on one rank).
// Members opened without options get the host's CPUs shared among the ranks on it, and no more
// than the rank may run on: kernel_threads 1 (their queue's thread only) or n > 1 (at most n of
// the shared kernel threads).
TEST(MpiAnyRanks, DefaultMembersGetTheirShareOfTheCpus) {
  auto mesh = mpi::open_mesh("cpu");
  EXPECT_EQ(mesh->size(), ranks());
  MPI_Comm node = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            MPI_SUCCESS);
  int on_node = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  const unsigned share = std::max(
      1u, std::min(util::host_cpus() / static_cast<unsigned>(on_node), util::usable_cpus()));
  const std::string description = mesh->local_member(0).description();
  EXPECT_NE(
      description.find(share == 1 ? std::string("each on its queue's thread")
                                  : fmt::format("kernels split over at most {} threads", share)),
      std::string::npos)
      << description;
  // The member computes: an all_reduce of this rank's ones gives the number of ranks.
  const MeshTensor ones = partial_of(std::vector<Tensor>(ranks(), host_full(1000, 1.0f)), *mesh);
  const MeshTensor sum = ops::all_reduce(ones);
  EXPECT_EQ(sum.shard(0).to_vector<float>(), std::vector<float>(1000, static_cast<float>(ranks())));
}

}  // namespace
}  // namespace retrace

// GoogleTest under MPI: every rank runs the tests; only rank 0 prints (each rank's failures
// still reach its exit status, which mpirun reports).
int main(int argc, char** argv) {
  retrace::mpi::init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // One rank: only the tests that hold for any number of ranks.
  if (retrace::mpi::world_size() < 2) ::testing::GTEST_FLAG(filter) = "MpiAnyRanks.*";
  if (retrace::mpi::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int status = RUN_ALL_TESTS();
  // Every rank's result: a failure on any rank fails the run on all.
  auto mesh = retrace::mpi::open_mesh("cpu");
  return mesh->all_processes(status == 0) ? 0 : 1;
}
