#include <retrace/retrace.hpp>

#include <cstdio>
#include <vector>

using retrace::MeshTensor;
using retrace::Placement;
using retrace::Tensor;
namespace ops = retrace::ops;

int main() {
  auto mesh = retrace::MeshDevice::open("cpu", {2});  // two CPU devices as one mesh

  // A row-parallel linear layer: each member holds half of the input features and half of the
  // weight's columns, multiplies its halves, and one all_reduce sums the partial products.
  std::vector<float> w(8 * 8), x(4 * 8);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 13);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7);
  const MeshTensor weight = retrace::distribute(
      Tensor::from_vector(w, {8, 8}, retrace::DType::float32), *mesh, {Placement::shard(1)});

  auto layer = [&](const MeshTensor& input) {
    MeshTensor partial = retrace::mesh_map(
        {Placement::partial()},
        [](const Tensor& xs, const Tensor& ws) {
          return ops::matmul(xs, ws, ops::Transpose::no, ops::Transpose::yes);
        },
        input, weight);
    return ops::all_reduce(partial);  // replicated: every member holds the whole product
  };
  // One trace per member, the all_reduce inside each; every call replays both.
  auto traced = retrace::make_tracer<MeshTensor>(layer, mesh->devices());
  const MeshTensor input = retrace::distribute(
      Tensor::from_vector(x, {4, 8}, retrace::DType::float32), *mesh, {Placement::shard(1)});
  for (int step = 0; step < 3; ++step) (void)traced.call({.blocking = retrace::Blocking::no}, input);
  mesh->synchronize();

  const std::vector<float> y = retrace::gather_to_host(traced.outputs()).to_vector<float>();
  std::printf("%s: y[0] = %.4f (%llu replays)\n", mesh->name().c_str(), y[0],
              static_cast<unsigned long long>(traced.stats().replays));
}
