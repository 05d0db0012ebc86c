// Meshes of CUDA devices: collectives through NCCL, eager and traced (CUDA graphs), against the
// same battery on CPU meshes; a member's failure reaching its peers; refusals. Every case skips,
// saying why, on a machine with fewer GPUs than it needs.
#include "mesh_battery.hpp"
#include "support.hpp"

#include "retrace/cuda.hpp"
#include "retrace/mesh.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"
#include "retrace/tracer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace retrace {
namespace {

using testing::expect_error;

#define RETRACE_NEED_GPUS(n)                                                            \
  do {                                                                                  \
    if (cuda_device_count() < (n)) {                                                    \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << cuda_device_count() << " visible" \
                   << (cuda_unavailable_reason().empty() ? "" : ": ")                   \
                   << cuda_unavailable_reason();                                        \
    }                                                                                   \
  } while (false)

TEST(CudaMesh, CollectivesMatchTheCpuMeshAndReplayBitForBit) {
  RETRACE_NEED_GPUS(1);
  const auto gpus = static_cast<std::size_t>(cuda_device_count());
  std::vector<std::vector<std::size_t>> shapes{{1}};
  if (gpus >= 2) shapes.push_back({2});
  if (gpus >= 4) shapes.push_back({2, 2});
  for (const std::vector<std::size_t>& shape : shapes) {
    auto gpu = MeshDevice::open("cuda", shape, testing::small_gpu_options());
    SCOPED_TRACE(gpu->name());
    auto cpu = MeshDevice::open("cpu", shape);
    testing::expect_batteries_close(testing::collective_battery(*gpu),
                                    testing::collective_battery(*cpu), gpu->size());
  }
}

TEST(CudaMesh, IntegerAndBfloat16Sums) {
  RETRACE_NEED_GPUS(2);
  auto mesh = MeshDevice::open("cuda", {2}, testing::small_gpu_options());
  testing::expect_integer_and_bfloat16_sums(*mesh);
}

TEST(CudaMesh, AFailingMemberFailsTheCollectiveOnEveryMember) {
  RETRACE_NEED_GPUS(2);
  auto mesh = MeshDevice::open("cuda", {2}, testing::small_gpu_options());
  testing::expect_a_failing_member_fails_every_member(*mesh, {"all_reduce", "member cuda:1"});
}

TEST(CudaMesh, RepeatedCaptureAndReleaseLeavesMemoryWhereItStarted) {
  RETRACE_NEED_GPUS(2);
  auto mesh = MeshDevice::open("cuda", {2}, testing::small_gpu_options());
  testing::expect_capture_cycles_leave_memory_where_it_started(*mesh, 1000);
}

TEST(CudaMesh, TwoMembersOnOneGpuAreRefusedWithTheReason) {
  RETRACE_NEED_GPUS(1);
  std::vector<std::unique_ptr<Device>> members;
  for (std::uint32_t id = 0; id < 2; ++id) {
    CudaDeviceOptions options;
    options.id = DeviceId{id};
    options.ordinal = 0;
    options.memory_bytes = std::size_t{64} << 20;
    members.push_back(open_cuda_device(options));
  }
  MeshDevice mesh(std::move(members));
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 2; ++k) shards.push_back(ops::full({4}, 1.0, mesh.member(k)));
  const MeshTensor x(shards, mesh, {Placement::partial()});
  expect_error([&] { (void)ops::all_reduce(x); }, ErrorCategory::unimplemented, "both use GPU 0");
  // Nothing ran: the members are usable.
  EXPECT_EQ(shards[0].to_vector<float>(), std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace retrace
