// The tensor-parallel DiT on in-process meshes of 1, 2 and 4 CPU devices: against the
// single-device model (within float32 rounding of the changed summation order), traced == eager
// bit for bit on the mesh, replicas identical, bad meshes and inputs refused.
#include "support.hpp"

#include <retrace/mesh.hpp>
#include <retrace/models/dit.hpp>
#include <retrace/models/tensor_parallel_dit.hpp>

#include <algorithm>
#include <cmath>

namespace retrace {
namespace {

using models::DiT;
using models::DiTConfig;
using models::TensorParallelDiT;

// 4 heads and an MLP of 128 split over up to 4 members.
DiTConfig mesh_config(DType dtype = DType::float32) {
  return DiTConfig{.input_size = 8, .hidden = 32, .depth = 2, .heads = 4, .num_classes = 10,
                   .dtype = dtype, .seed = 5};
}

const std::vector<Placement> kR{Placement::replicate()};

struct Inputs {
  Tensor latents, frequencies, labels, coefficients;  // host tensors
};

Inputs make_inputs(const DiT& model, const models::DdimSchedule& schedule, std::size_t step,
                   std::int64_t size, std::uint64_t salt) {
  const DiTConfig& c = model.config();
  const Shape shape{1, c.in_channels, size, size};
  const std::vector<std::int64_t> labels{3, c.num_classes};
  return {Tensor::from_vector<float>(
              testing::random_floats(static_cast<std::size_t>(shape.numel()), salt), shape,
              c.dtype),
          Tensor::from_vector<float>(model.timestep_frequencies({&schedule.timesteps[step], 1}),
                                     {1, c.frequency_size}, c.dtype),
          Tensor::from_vector<float>(model.label_rows(labels), {2, c.num_classes + 1}, c.dtype),
          Tensor::from_vector<float>(schedule.coefficients(step), {2}, c.dtype)};
}

// max |a - b| / max |b| (b the single-device reference).
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

class TensorParallelDiTTest : public ::testing::TestWithParam<std::size_t> {};

// One guided DDIM step on the mesh against the single-device model, then three steps traced on
// the mesh against the same steps eager on the mesh.
TEST_P(TensorParallelDiTTest, MatchesOneDeviceAndTracedEqualsEager) {
  const std::size_t n = GetParam();
  auto device = open_cpu_device();
  auto mesh = MeshDevice::open("cpu", {n}, std::nullopt, {}, 1);
  const DiT model(mesh_config(), *device);
  const TensorParallelDiT split(model, *mesh);
  EXPECT_EQ(split.weight("blocks.0.attn.qkv.weight", n - 1).shape(), Shape({96 / static_cast<std::int64_t>(n), 32}));
  EXPECT_EQ(split.weight("blocks.1.mlp.fc2.weight", 0).shape(), Shape({32, 128 / static_cast<std::int64_t>(n)}));
  const models::DdimSchedule schedule(3);

  const Inputs in = make_inputs(model, schedule, 0, 8, 1);
  const std::vector<float> reference =
      model
          .sample_step(in.latents.to_device(*device), in.frequencies.to_device(*device),
                       in.labels.to_device(*device), in.coefficients.to_device(*device), 3.0)
          .to_vector<float>();
  const MeshTensor out = split.sample_step(distribute(in.latents, *mesh, kR),
                                           distribute(in.frequencies, *mesh, kR),
                                           distribute(in.labels, *mesh, kR),
                                           distribute(in.coefficients, *mesh, kR), 3.0);
  EXPECT_EQ(out.placements(), kR);
  const std::vector<float> first = out.shard(0).to_vector<float>();
  for (std::size_t k = 1; k < n; ++k) EXPECT_EQ(out.shard(k).to_vector<float>(), first) << k;
  // The bound: the two projections of each block sum over C / n (or 4C / n) values per member,
  // then over the n members, instead of over all C at once; one step of this model moves the
  // result by about 1e-7 of its largest value (bound: 1e-6).
  const double difference = relative_difference(first, reference);
  EXPECT_LT(difference, 1e-6) << n << " members";
  std::printf("[retrace] %zu members: max difference / max value %.3g\n", n, difference);
  if (n == 1) {
    EXPECT_EQ(first, reference);  // nothing split: the same sums
  }

  // Traced on the mesh (a tracer over the members) == eager on the mesh, bit for bit.
  auto step = [&](const MeshTensor& x, const MeshTensor& t, const MeshTensor& labels,
                  const MeshTensor& ab) { return split.sample_step(x, t, labels, ab, 3.0); };
  auto tracer = make_tracer<MeshTensor, MeshTensor, MeshTensor, MeshTensor>(step, *mesh);
  MeshTensor eager = distribute(in.latents, *mesh, kR);
  MeshTensor traced = eager;
  const MeshTensor labels = distribute(in.labels, *mesh, kR);
  for (std::size_t i = 0; i < schedule.timesteps.size(); ++i) {
    const Inputs s = make_inputs(model, schedule, i, 8, 1);
    const MeshTensor t = distribute(s.frequencies, *mesh, kR);
    const MeshTensor ab = distribute(s.coefficients, *mesh, kR);
    eager = step(eager, t, labels, ab);
    traced = tracer.call(CallOptions{.blocking = Blocking::no}, traced, t, labels, ab);
  }
  mesh->synchronize();
  const std::vector<float> want = eager.shard(0).to_vector<float>();
  for (float v : want) ASSERT_TRUE(std::isfinite(v));
  for (std::size_t k = 0; k < n; ++k) EXPECT_EQ(traced.shard(k).to_vector<float>(), want) << k;
  EXPECT_EQ(tracer.stats().captures, 1u);
  EXPECT_EQ(tracer.stats().replays, 2u);
}

INSTANTIATE_TEST_SUITE_P(Members, TensorParallelDiTTest, ::testing::Values(1u, 2u, 4u),
                         [](const auto& member_count) {
                           return std::to_string(member_count.param) + "members";
                         });

TEST(TensorParallelDiTErrors, RefusesMeshesAndInputsThatDoNotFit) {
  auto device = open_cpu_device();
  auto mesh3 = MeshDevice::open("cpu", {3}, std::nullopt, {}, 1);
  auto grid = MeshDevice::open("cpu", {2, 2}, std::nullopt, {}, 4);
  const DiT model(mesh_config(), *device);
  EXPECT_RETRACE_ERROR(TensorParallelDiT(model, *mesh3), invalid_argument,
                       "4 attention heads do not split evenly over the 3 members");
  EXPECT_RETRACE_ERROR(TensorParallelDiT(model, *grid), invalid_argument, "needs a 1-D mesh");
  DiTConfig odd_mlp = mesh_config();
  odd_mlp.heads = 2;
  odd_mlp.mlp_hidden = 33;
  const DiT narrow(odd_mlp, *device);
  auto mesh4 = MeshDevice::open("cpu", {2}, std::nullopt, {}, 8);
  EXPECT_RETRACE_ERROR(TensorParallelDiT(narrow, *mesh4), invalid_argument,
                       "MLP width 33 does not split evenly");

  const TensorParallelDiT split(model, *mesh4);
  const models::DdimSchedule schedule(2);
  const Inputs in = make_inputs(model, schedule, 0, 8, 2);
  const MeshTensor x = distribute(in.latents, *mesh4, kR);
  const MeshTensor t = distribute(in.frequencies, *mesh4, kR);
  const MeshTensor labels = distribute(in.labels, *mesh4, kR);
  const MeshTensor ab = distribute(in.coefficients, *mesh4, kR);
  const MeshTensor sharded = distribute(in.latents, *mesh4, {Placement::shard(1)});
  EXPECT_RETRACE_ERROR((void)split.sample_step(sharded, t, labels, ab, 2.0), invalid_argument,
                       "latents must be replicated on every member, got MeshTensor([1, 4, 8, 8], "
                       "float32, [S(1)]");
  const MeshTensor elsewhere = distribute(in.frequencies, *grid, {Placement::replicate(),
                                                                  Placement::replicate()});
  EXPECT_RETRACE_ERROR((void)split.sample_step(x, elsewhere, labels, ab, 2.0), invalid_argument,
                       "t_frequencies (MeshTensor([1, 256], float32, [R, R], mesh 2x2");
  EXPECT_RETRACE_ERROR((void)split.sample_step(x, t, labels, MeshTensor(), 2.0), invalid_argument,
                       "coefficients is a null mesh tensor");
  const MeshTensor one_label = distribute(
      Tensor::from_vector<float>(model.label_rows(std::vector<std::int64_t>{3}), {1, 11},
                                 DType::float32),
      *mesh4, kR);
  EXPECT_RETRACE_ERROR((void)split.sample_step(x, t, one_label, ab, 2.0), invalid_argument,
                       "with guidance, labels need 2 rows");
  // Nothing was left waiting: the next step runs and agrees on both members.
  const MeshTensor out = split.sample_step(x, t, labels, ab, 2.0);
  EXPECT_EQ(out.shard(1).to_vector<float>(), out.shard(0).to_vector<float>());
}

// Closing (or destroying) the mesh leaves the split model refusing calls, never touching freed
// devices.
TEST(TensorParallelDiTErrors, AClosedMeshIsRefused) {
  auto device = open_cpu_device();
  auto mesh = MeshDevice::open("cpu", {2}, std::nullopt, {}, 1);
  const DiT model(mesh_config(), *device);
  const TensorParallelDiT split(model, *mesh);
  const models::DdimSchedule schedule(2);
  const Inputs in = make_inputs(model, schedule, 0, 8, 4);
  const MeshTensor x = distribute(in.latents, *mesh, kR);
  const MeshTensor t = distribute(in.frequencies, *mesh, kR);
  const MeshTensor labels = distribute(in.labels, *mesh, kR);
  const MeshTensor ab = distribute(in.coefficients, *mesh, kR);
  EXPECT_EQ(split.members(), 2u);
  mesh.reset();  // destroyed: closes its members
  EXPECT_RETRACE_ERROR((void)split.sample_step(x, t, labels, ab, 2.0), failed_precondition,
                       "TensorParallelDiT: mesh 2 [cpu:1, cpu:2] was closed");
  EXPECT_RETRACE_ERROR(split.prepare_resolution(4, 4), failed_precondition, "was closed");
}

// A bfloat16 model splits too (weights converted once, values identical on every member).
TEST(TensorParallelDiTDTypes, BFloat16RunsAndReplicasAgree) {
  auto device = open_cpu_device();
  auto mesh = MeshDevice::open("cpu", {2}, std::nullopt, {}, 1);
  const DiT model(mesh_config(DType::bfloat16), *device);
  const TensorParallelDiT split(model, *mesh);
  const models::DdimSchedule schedule(2);
  const Inputs in = make_inputs(model, schedule, 1, 8, 3);
  const MeshTensor out = split.sample_step(distribute(in.latents, *mesh, kR),
                                           distribute(in.frequencies, *mesh, kR),
                                           distribute(in.labels, *mesh, kR),
                                           distribute(in.coefficients, *mesh, kR), 1.5);
  EXPECT_EQ(out.dtype(), DType::bfloat16);
  const std::vector<float> reference =
      model
          .sample_step(in.latents.to_device(*device), in.frequencies.to_device(*device),
                       in.labels.to_device(*device), in.coefficients.to_device(*device), 1.5)
          .to_vector<float>();
  const std::vector<float> got = out.shard(0).to_vector<float>();
  EXPECT_EQ(out.shard(1).to_vector<float>(), got);
  // bfloat16 keeps 8 bits: the changed sums may move a value by a few of its ulps.
  EXPECT_LT(relative_difference(got, reference), 0.05);
}

}  // namespace
}  // namespace retrace
