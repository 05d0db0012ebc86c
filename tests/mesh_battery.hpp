// A battery of collectives for any mesh (CPU, CUDA, a test transport): all_gather and
// reduce_scatter along every tensor dimension (so the gathered rows are strided blocks or not),
// all_reduce, along every mesh axis, eager and traced. It checks traced == eager bit for bit and
// returns every member's shard of every result, to compare meshes with each other.
#pragma once

#include "retrace/mesh.hpp"
#include "retrace/ops.hpp"
#include "retrace/tracer.hpp"
#include "retrace/tree.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace retrace::testing {

struct BatteryInputs {
  MeshTensor partial;              // member k holds its own summand
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

}  // namespace retrace::testing

