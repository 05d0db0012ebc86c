// Mesh devices: distribute / gather, the collectives eager and traced against single-device
// references computed here, failures that reach every member, and repeated capture cycles.
#include "mesh_battery.hpp"
#include "support.hpp"

#include "retrace/backend/collective.hpp"
#include "retrace/backend/mesh.hpp"

#include "retrace/cpu.hpp"
#include "retrace/mesh.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"
#include "retrace/tracer.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

namespace retrace {
namespace {

std::vector<float> iota_values(std::int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(i % 97) - 20.0f;
  return v;
}

using testing::expect_error;

class MeshTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(MeshTest, DistributeThenGatherIsTheIdentity) {
  auto mesh = MeshDevice::open("cpu", {GetParam()});
  const auto n = static_cast<std::int64_t>(GetParam());
  const Tensor host = Tensor::from_vector(iota_values(3 * 4 * n), {3, 4 * n}, DType::float32);
  for (Placement p : {Placement::replicate(), Placement::shard(1), Placement::shard(-1)}) {
    const MeshTensor m = distribute(host, *mesh, {p});
    EXPECT_EQ(m.shape(), host.shape());
    EXPECT_EQ(gather_to_host(m).to_vector<float>(), host.to_vector<float>()) << p.to_string();
  }
  const MeshTensor rows = distribute(host, *mesh, {Placement::shard(1)});
  EXPECT_EQ(rows.shard(0).shape(), (Shape{3, 4}));
}

TEST_P(MeshTest, CollectivesMatchASingleDeviceReference) {
  const std::size_t n = GetParam();
  auto mesh = MeshDevice::open("cpu", {n});
  const std::int64_t rows = 3, cols = 8 * static_cast<std::int64_t>(n);
  // Every member holds its own summand: shard k of x is x_k.
  std::vector<std::vector<float>> parts;
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < n; ++k) {
    parts.push_back(iota_values(rows * cols, 0.37f * static_cast<float>(k + 1)));
    shards.push_back(Tensor::from_vector(parts.back(), {rows, cols}, DType::float32)
                         .to_device(mesh->member(k)));
  }
  const MeshTensor partial(shards, *mesh, {Placement::partial()});
  std::vector<float> sum(parts[0]);
  for (std::size_t k = 1; k < n; ++k) {
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += parts[k][i];
  }
  const MeshTensor reduced = ops::all_reduce(partial);
  for (std::size_t k = 0; k < n; ++k) EXPECT_EQ(reduced.shard(k).to_vector<float>(), sum);
  EXPECT_EQ(gather_to_host(partial).to_vector<float>(), sum);  // the same order and rounding

  const MeshTensor scattered = ops::reduce_scatter(partial, 1);
  EXPECT_EQ(scattered.placements()[0], Placement::shard(1));
  EXPECT_EQ(gather_to_host(scattered).to_vector<float>(), sum);

  const MeshTensor gathered = ops::all_gather(scattered);
  for (std::size_t k = 0; k < n; ++k) EXPECT_EQ(gathered.shard(k).to_vector<float>(), sum);
}

TEST_P(MeshTest, TracedCollectivesEqualEagerBitForBit) {
  const std::size_t n = GetParam();
  auto mesh = MeshDevice::open("cpu", {n});
  const std::int64_t d = 16;
  const Tensor w = Tensor::from_vector(iota_values(d * d, 0.01f), {d, d}, DType::float32);
  const MeshTensor weight = distribute(w, *mesh, {Placement::shard(1)});
  // Row-parallel matmul: x sharded along features, partial products, one all_reduce.
  auto step = [&](const MeshTensor& x) {
    const MeshTensor y = mesh_map(
        {Placement::partial()},
        [](const Tensor& xs, const Tensor& ws) {
          return ops::matmul(xs, ws, ops::Transpose::no, ops::Transpose::yes);
        },
        x, weight);
    return mesh_map([](const Tensor& t) { return ops::gelu(t); }, ops::all_reduce(y));
  };
  auto tracer = make_tracer<MeshTensor>(step, mesh->devices());
  for (int call = 0; call < 4; ++call) {
    const Tensor xh =
        Tensor::from_vector(iota_values(4 * d, 0.1f * static_cast<float>(call + 1)), {4, d},
                            DType::float32);
    const MeshTensor x = distribute(xh, *mesh, {Placement::shard(1)});
    const std::vector<float> eager = gather_to_host(step(x)).to_vector<float>();
    const MeshTensor& traced = tracer(x);
    EXPECT_EQ(gather_to_host(traced).to_vector<float>(), eager) << "call " << call;
    for (std::size_t k = 1; k < n; ++k) {  // replicas agree bit for bit
      EXPECT_EQ(traced.shard(k).to_vector<float>(), traced.shard(0).to_vector<float>());
    }
    // Against the single-device product within float32 rounding of the split sum.
    const std::vector<float> ref = ops::gelu(ops::matmul(xh.to_device(mesh->member(0)),
                                                         w.to_device(mesh->member(0)),
                                                         ops::Transpose::no, ops::Transpose::yes))
                                       .to_vector<float>();
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(eager[i], ref[i], 1e-5f * (1.0f + std::abs(ref[i]))) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Members, MeshTest, ::testing::Values(1, 2, 4));

// A mesh whose groups take whole buffers only, as NCCL does: the ops rearrange gathers and
// scatters of strided blocks around them. Shared memory underneath, so this runs anywhere.
std::unique_ptr<MeshDevice> whole_buffer_mesh(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  std::vector<std::unique_ptr<Device>> members;
  std::vector<std::size_t> local;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < n; ++i) {
    members.push_back(open_device(fmt::format("cpu:{}", 20 + i)));
    local.push_back(i);
    names.push_back(members.back()->name());
  }
  return std::make_unique<MeshDevice>(detail::make_mesh_state(
      std::move(members), std::move(local), std::move(names), shape, MeshOptions{},
      [](detail::MeshLine line) {
        return std::make_unique<detail::SharedMemoryGroup>(
            std::move(line.names), std::move(line.label), std::chrono::minutes(1), true);
      },
      nullptr));
}

TEST(Mesh, WholeBufferTransportsGiveTheSameBitsAsStridedOnes) {
  for (const std::vector<std::size_t>& shape :
       {std::vector<std::size_t>{1}, std::vector<std::size_t>{2}, std::vector<std::size_t>{4},
        std::vector<std::size_t>{2, 2}}) {
    SCOPED_TRACE(::testing::Message() << "mesh of " << shape.size() << " axes, "
                                      << shape.front() << " along the first");
    auto strided = MeshDevice::open("cpu", shape);
    auto whole = whole_buffer_mesh(shape);
    const std::vector<std::vector<float>> expected = testing::collective_battery(*strided);
    const std::vector<std::vector<float>> got = testing::collective_battery(*whole);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "result " << i;
  }
}

TEST(Mesh, TwoDimensionalMeshReducesAlongEachAxis) {
  auto mesh = MeshDevice::open("cpu", {2, 2});
  EXPECT_EQ(mesh->coords(3), (std::vector<std::size_t>{1, 1}));
  EXPECT_EQ(&mesh->at(1, 0), &mesh->member(2));
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 4; ++k) {
    shards.push_back(ops::full({2, 4}, static_cast<double>(k + 1), mesh->member(k)));
  }
  const MeshTensor x(shards, *mesh, {Placement::partial(), Placement::partial()});
  const MeshTensor rows = ops::all_reduce(x, 0);  // members 0+2 and 1+3
  EXPECT_EQ(rows.shard(0).to_vector<float>(), std::vector<float>(8, 4.0f));
  EXPECT_EQ(rows.shard(1).to_vector<float>(), std::vector<float>(8, 6.0f));
  const MeshTensor all = ops::all_reduce(rows, 1);
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(all.shard(k).to_vector<float>(), std::vector<float>(8, 10.0f));
  }
  EXPECT_EQ(gather_to_host(x).to_vector<float>(), std::vector<float>(8, 10.0f));
  // Sharded along both axes: a 2x2 grid of blocks.
  const Tensor host = Tensor::from_vector(iota_values(16), {4, 4}, DType::float32);
  const MeshTensor grid = distribute(host, *mesh, {Placement::shard(0), Placement::shard(1)});
  EXPECT_EQ(grid.shard(3).to_vector<float>(),
            (std::vector<float>{host.to_vector<float>()[10], host.to_vector<float>()[11],
                                host.to_vector<float>()[14], host.to_vector<float>()[15]}));
  EXPECT_EQ(gather_to_host(grid).to_vector<float>(), host.to_vector<float>());
  const MeshTensor cols = ops::all_gather(grid, 1);
  EXPECT_EQ(cols.shard(1).shape(), (Shape{2, 4}));
  EXPECT_EQ(gather_to_host(cols).to_vector<float>(), host.to_vector<float>());
}

TEST(Mesh, IntegerAndBfloat16Sums) {
  auto mesh = MeshDevice::open("cpu", {2});
  testing::expect_integer_and_bfloat16_sums(*mesh);
}

TEST(Mesh, BadInputIsRefusedBeforeAnythingRuns) {
  auto mesh = MeshDevice::open("cpu", {2});
  auto other = open_device("cpu:7");
  const Tensor host = Tensor::from_vector(iota_values(6), {2, 3}, DType::float32);
  expect_error([&] { (void)distribute(host, *mesh, {Placement::shard(1)}); },
               ErrorCategory::invalid_argument, "does not split evenly");
  expect_error([&] { (void)distribute(host, *mesh, {}); }, ErrorCategory::invalid_argument,
               "one per mesh axis");
  expect_error([&] { (void)distribute(host, *mesh, {Placement::partial()}); },
               ErrorCategory::invalid_argument, "partial");
  expect_error(
      [&] {
        (void)MeshTensor({ops::full({2}, 1, mesh->member(0)), ops::full({3}, 1, mesh->member(1))},
                         *mesh, {Placement::partial()});
      },
      ErrorCategory::invalid_argument, "shard 1 is [3]");
  expect_error(
      [&] {
        (void)MeshTensor({ops::full({2}, 1, mesh->member(0)), ops::full({2}, 1, *other)}, *mesh,
                         {Placement::partial()});
      },
      ErrorCategory::invalid_argument, "shard 1 is on cpu:7");
  const MeshTensor rep = distribute(host, *mesh, {Placement::replicate()});
  expect_error([&] { (void)ops::all_reduce(rep); }, ErrorCategory::invalid_argument,
               "all_reduce sums partial values");
  expect_error([&] { (void)ops::all_gather(rep); }, ErrorCategory::invalid_argument,
               "all_gather assembles");
  expect_error([&] { (void)ops::all_reduce(rep.with_placements({Placement::partial()}), 1); },
               ErrorCategory::invalid_argument, "mesh axis 1 does not exist");
  expect_error(
      [&] { (void)ops::reduce_scatter(rep.with_placements({Placement::partial()}), 1); },
      ErrorCategory::invalid_argument, "does not split evenly");
  // Nothing ran: a later collective still pairs the members correctly.
  const MeshTensor ok = ops::all_reduce(rep.with_placements({Placement::partial()}));
  EXPECT_EQ(ok.shard(1).to_vector<float>()[1], 2 * host.to_vector<float>()[1]);
}

TEST(Mesh, AFailingMemberFailsTheCollectiveOnEveryMember) {
  auto mesh = MeshDevice::open("cpu", {2});
  testing::expect_a_failing_member_fails_every_member(
      *mesh, {"all_reduce", "cpu:1 did not take part", "assert_finite"});
}

TEST(Mesh, AMemberReplayedAloneTimesOutInsteadOfHanging) {
  auto mesh = MeshDevice::open("cpu", {2}, std::nullopt,
                               MeshOptions{std::chrono::milliseconds(200)});
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 2; ++k) shards.push_back(ops::full({4}, 1.0, mesh->member(k)));
  const MeshTensor x(shards, *mesh, {Placement::partial()});
  std::vector<TraceId> traces;
  for (std::size_t k = 0; k < 2; ++k) mesh->member(k).begin_trace_capture(kDefaultQueue);
  const MeshTensor y = ops::all_reduce(x);
  for (std::size_t k = 0; k < 2; ++k) {
    traces.push_back(mesh->member(k).end_trace_capture(kDefaultQueue));
  }
  expect_error([&] { mesh->member(0).execute_trace(traces[0], kDefaultQueue, Blocking::yes); },
               ErrorCategory::device_error, "cpu:1 to reach collective");
  // The group is broken from now on: collectives fail at once.
  expect_error(
      [&] {
        (void)ops::all_reduce(x);
        mesh->synchronize();
      },
      ErrorCategory::device_error, "cannot run collectives any more");
}

TEST(Mesh, RepeatedCaptureAndReleaseLeavesMemoryWhereItStarted) {
  auto mesh = MeshDevice::open("cpu", {2});
  testing::expect_capture_cycles_leave_memory_where_it_started(*mesh, 1000);
}

TEST(Mesh, MembersReplayFromTheirOwnThreads) {
  auto mesh = MeshDevice::open("cpu", {4});
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 4; ++k) {
    shards.push_back(ops::full({256}, static_cast<double>(k), mesh->member(k)));
  }
  const MeshTensor x(shards, *mesh, {Placement::partial()});
  std::vector<TraceId> traces;
  for (std::size_t k = 0; k < 4; ++k) mesh->member(k).begin_trace_capture(kDefaultQueue);
  MeshTensor y = ops::all_reduce(x);
  for (int i = 0; i < 3; ++i) {
    y = ops::all_reduce(mesh_map({Placement::partial()},
                                 [](const Tensor& t) { return ops::mul(t, 0.25); }, y));
  }
  for (std::size_t k = 0; k < 4; ++k) {
    traces.push_back(mesh->member(k).end_trace_capture(kDefaultQueue));
  }
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) {
        mesh->member(k).execute_trace(traces[k], kDefaultQueue, Blocking::yes);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(y.shard(k).to_vector<float>(), std::vector<float>(256, 6.0f));
  }
}

// Members opened by MeshDevice::open keep their kernels to their own queue threads
// (kernel_threads = 1): large products and loops still give the same values eager and traced,
// within rounding of the shared-threads device (another GEMM library), and work side by side.
TEST(Mesh, MembersRunTheirKernelsOnTheirOwnThreads) {
  auto mesh = MeshDevice::open("cpu", {2});
  EXPECT_NE(mesh->member(0).description().find("each on its queue's thread"), std::string::npos)
      << mesh->member(0).description();
  auto shared = open_cpu_device(CpuDeviceOptions{.id = DeviceId{7}});
  EXPECT_EQ(shared->description().find("each on its queue's thread"), std::string::npos);
  const std::int64_t d = 256;  // past the size where the shared device hands GEMMs to OpenBLAS
  const Tensor a = Tensor::from_vector(iota_values(d * d, 1e-3f), {d, d}, DType::float32);
  const MeshTensor x = distribute(a, *mesh, {Placement::replicate()});
  auto step = [](const MeshTensor& m) {
    return mesh_map([](const Tensor& t) { return ops::gelu(ops::matmul(t, t)); }, m);
  };
  const std::vector<float> eager = step(x).shard(1).to_vector<float>();
  auto tracer = make_tracer<MeshTensor>(step, *mesh);
  const MeshTensor& traced = tracer(x);
  EXPECT_EQ(traced.shard(0).to_vector<float>(), eager);
  EXPECT_EQ(traced.shard(1).to_vector<float>(), eager);
  const std::vector<float> reference =
      ops::gelu(ops::matmul(a.to_device(*shared), a.to_device(*shared))).to_vector<float>();
  for (std::size_t i = 0; i < reference.size(); i += 97) {
    EXPECT_NEAR(eager[i], reference[i], 1e-5f * (1.0f + std::abs(reference[i]))) << i;
  }
  // kernel_threads = 2: at most two of the shared kernel threads, the same library as the
  // shared device, so the same bits.
  auto capped = open_cpu_device(CpuDeviceOptions{.id = DeviceId{8}, .kernel_threads = 2});
  EXPECT_NE(capped->description().find("kernels split over at most 2 threads"), std::string::npos)
      << capped->description();
  EXPECT_EQ(ops::gelu(ops::matmul(a.to_device(*capped), a.to_device(*capped))).to_vector<float>(),
            reference);
}

TEST(Mesh, ClosingTheMeshDetachesItsTensors) {
  auto mesh = MeshDevice::open("cpu", {2});
  const MeshTensor x = distribute(ops::full({2}, 1.0, mesh->member(0)).to_host(), *mesh,
                                  {Placement::replicate()});
  mesh->close();
  expect_error([&] { (void)gather_to_host(x); }, ErrorCategory::failed_precondition,
               "was closed");
  expect_error([&] { (void)ops::all_reduce(x.with_placements({Placement::partial()})); },
               ErrorCategory::failed_precondition, "was closed");
}

}  // namespace
}  // namespace retrace
