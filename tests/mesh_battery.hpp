// A battery of collectives for any mesh (CPU, CUDA, a test transport): all_gather and
// reduce_scatter along every tensor dimension (so the gathered rows are strided blocks or not),
// all_reduce, along every mesh axis, eager and traced. It checks traced == eager bit for bit and
// returns every member's shard of every result, to compare meshes with each other.
#pragma once

#include "retrace/mesh.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"
#include "retrace/tracer.hpp"
#include "retrace/tree.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace retrace::testing {

// Options of a CUDA mesh member small enough for several on one GPU (throws without the
// CUDA backend).
inline DeviceOptions small_gpu_options() {
  DeviceOptions options = default_device_options("cuda");
  options.memory_bytes = std::size_t{256} << 20;
  options.trace_region_bytes = std::size_t{128} << 20;
  return options;
}

struct BatteryInputs {
  MeshTensor partial;               // member k holds its own summand
  std::vector<MeshTensor> sharded;  // sharded along dimension d = 0, 1, 2 on the axis
};
RETRACE_FIELDS(BatteryInputs, partial, sharded)

inline BatteryInputs battery_inputs(const MeshDevice& mesh, std::size_t axis, std::uint32_t seed) {
  const auto m = static_cast<std::int64_t>(mesh.size());
  const std::vector<std::int64_t> dims{2 * m, 3 * m, 2 * m};
  const std::int64_t count = dims[0] * dims[1] * dims[2];
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  auto values = [&] {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = uniform(rng);
    return v;
  };
  std::vector<Placement> placements(mesh.rank(), Placement::replicate());
  std::vector<Tensor> summands;
  for (std::size_t k = 0; k < mesh.local_size(); ++k) {
    summands.push_back(
        Tensor::from_vector(values(), Shape(dims), DType::float32).to_device(mesh.local_member(k)));
  }
  placements[axis] = Placement::partial();
  BatteryInputs in{MeshTensor(summands, mesh, placements), {}};
  const Tensor whole = Tensor::from_vector(values(), Shape(dims), DType::float32);
  for (std::int64_t d = 0; d < 3; ++d) {
    placements[axis] = Placement::shard(d);
    in.sharded.push_back(distribute(whole, mesh, placements));
  }
  return in;
}

// The collectives of the battery on one set of inputs.
inline std::vector<MeshTensor> battery_step(const BatteryInputs& in, std::size_t axis) {
  std::vector<MeshTensor> out{ops::all_reduce(in.partial, axis)};
  for (std::int64_t d = 0; d < 3; ++d) {
    out.push_back(ops::reduce_scatter(in.partial, d, axis));
    out.push_back(ops::all_gather(in.sharded[static_cast<std::size_t>(d)], axis));
  }
  return out;
}

// Every member's shard of every result, for each mesh axis; traced == eager checked on the way.
inline std::vector<std::vector<float>> collective_battery(MeshDevice& mesh) {
  std::vector<std::vector<float>> results;
  for (std::size_t axis = 0; axis < mesh.rank(); ++axis) {
    auto tracer = make_tracer<BatteryInputs>(
        [axis](const BatteryInputs& in) { return battery_step(in, axis); }, mesh.devices());
    for (std::uint32_t call = 0; call < 3; ++call) {
      const BatteryInputs in = battery_inputs(mesh, axis, 17 + call);
      const std::vector<MeshTensor> eager = battery_step(in, axis);
      const std::vector<MeshTensor> traced = tracer(in);
      for (std::size_t r = 0; r < eager.size(); ++r) {
        const std::vector<Tensor> e = gather_shards(eager[r]);
        const std::vector<Tensor> t = gather_shards(traced[r]);
        for (std::size_t k = 0; k < e.size(); ++k) {
          results.push_back(e[k].to_vector<float>());
          EXPECT_EQ(t[k].to_vector<float>(), results.back())
              << "traced != eager: axis " << axis << ", call " << call << ", result " << r
              << ", member " << k;
        }
      }
    }
  }
  return results;
}

// Two batteries' results (a mesh against a CPU mesh of the same shape) within float32 rounding
// of sums over `members` members taken in another order (NCCL's): n * 4 ulp of 1 + |value|.
inline void expect_batteries_close(const std::vector<std::vector<float>>& got,
                                   const std::vector<std::vector<float>>& want,
                                   std::size_t members) {
  ASSERT_EQ(got.size(), want.size());
  const float scale = static_cast<float>(members) * 4.0f * std::numeric_limits<float>::epsilon();
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << "result " << r;
    for (std::size_t i = 0; i < got[r].size(); ++i) {
      ASSERT_NEAR(got[r][i], want[r][i], scale * (1.0f + std::abs(want[r][i])))
          << "result " << r << ", element " << i;
    }
  }
}

// Sums on a 2-member mesh: int32 wraps (two's complement, no undefined behaviour), bfloat16
// is summed and rounded once.
inline void expect_integer_and_bfloat16_sums(MeshDevice& mesh) {
  std::vector<Tensor> ints;
  for (std::size_t k = 0; k < 2; ++k) {
    ints.push_back(
        Tensor::from_vector(std::vector<std::int32_t>{2147483647, -5, 7}, {3}, DType::int32)
            .to_device(mesh.member(k)));
  }
  const MeshTensor r = ops::all_reduce(MeshTensor(ints, mesh, {Placement::partial()}));
  EXPECT_EQ(r.shard(1).to_vector<std::int32_t>(), (std::vector<std::int32_t>{-2, -10, 14}));
  std::vector<Tensor> halves;
  for (std::size_t k = 0; k < 2; ++k) {
    halves.push_back(ops::full({5}, 1.0078125, mesh.member(k), DType::bfloat16));
  }
  const MeshTensor h = ops::all_reduce(MeshTensor(halves, mesh, {Placement::partial()}));
  EXPECT_EQ(h.shard(0).to_vector<float>(), std::vector<float>(5, 2.015625f));
}

// Member 1 of a 2-member mesh fails (assert_finite on a NaN) before an all_reduce: every
// member's synchronize fails with device_error; member 0's message holds each of `peer_says`,
// member 1's names assert_finite. Once reported, the mesh runs collectives again.
inline void expect_a_failing_member_fails_every_member(MeshDevice& mesh,
                                                       const std::vector<std::string>& peer_says) {
  std::vector<Tensor> shards;
  for (std::size_t k = 0; k < 2; ++k) shards.push_back(ops::full({4}, 1.0, mesh.member(k)));
  const MeshTensor x(shards, mesh, {Placement::partial()});
  ops::fill(shards[1], std::nan(""));
  ops::assert_finite(shards[1]);
  const MeshTensor y = ops::all_reduce(x);
  for (std::size_t k = 0; k < 2; ++k) {
    try {
      mesh.member(k).synchronize();
      ADD_FAILURE() << "member " << k << " did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::device_error);
      const std::string what = e.what();
      for (const std::string& part :
           k == 0 ? peer_says : std::vector<std::string>{"assert_finite"}) {
        EXPECT_NE(what.find(part), std::string::npos) << "member " << k << ": " << what;
      }
    }
  }
  ops::fill(shards[1], 2.0);
  const MeshTensor z = ops::all_reduce(x);
  EXPECT_EQ(z.shard(0).to_vector<float>(), std::vector<float>(4, 3.0f));
}

// `cycles` captures, replays and releases of a traced all_gather on a 2-member mesh leave the
// members' memory where it started.
inline void expect_capture_cycles_leave_memory_where_it_started(MeshDevice& mesh, int cycles) {
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 13) - 6.0f;
  const MeshTensor x =
      distribute(Tensor::from_vector(values, {4, 16}, DType::float32), mesh, {Placement::shard(1)});
  auto step = [](const MeshTensor& t) {
    return ops::all_gather(mesh_map([](const Tensor& s) { return ops::mul(s, 2.0); }, t));
  };
  const std::size_t before0 = mesh.member(0).stats().bytes_in_use;
  const std::size_t before1 = mesh.member(1).stats().bytes_in_use;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    auto tracer = make_tracer<MeshTensor>(step, mesh.devices());
    const CallOptions async{kDefaultQueue, Blocking::no};
    (void)tracer.call(async, x);
    const MeshTensor& y = tracer.call(async, x);
    if (cycle == 0) {
      std::vector<float> doubled(values);
      for (float& v : doubled) v *= 2.0f;
      EXPECT_EQ(gather_to_host(y).to_vector<float>(), doubled);
    }
    tracer.release_trace();
  }
  mesh.synchronize();
  EXPECT_EQ(mesh.member(0).stats().bytes_in_use, before0);
  EXPECT_EQ(mesh.member(1).stats().bytes_in_use, before1);
  EXPECT_EQ(mesh.member(0).stats().live_traces, 0u);
}

}  // namespace retrace::testing
