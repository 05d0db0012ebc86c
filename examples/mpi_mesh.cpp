// The row-parallel layer of readme_mesh.cpp with one member per MPI rank: every rank runs this
// same program (mpirun -np 2 ./retrace_example_mpi_mesh), opens the mesh, distributes the same
// host tensors and traces the same function; the all_reduce inside the trace moves the partial
// products between the processes. Built when an MPI library is found.
#include <retrace/mpi.hpp>
#include <retrace/retrace.hpp>

#include <cstdio>
#include <vector>

using retrace::MeshTensor;
using retrace::Placement;
using retrace::Tensor;
namespace ops = retrace::ops;

int main(int argc, char** argv) {
  retrace::mpi::init(&argc, &argv);            // MPI_THREAD_MULTIPLE
  auto mesh = retrace::mpi::open_mesh("cpu");  // member r is cpu:r on rank r

  std::vector<float> w(8 * 8), x(4 * 8);  // the same values on every rank
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
    return ops::all_reduce(partial);
  };
  // One trace per rank (this rank's member), the all_reduce inside it.
  auto traced = retrace::make_tracer<MeshTensor>(layer, mesh->devices());
  const MeshTensor input = retrace::distribute(
      Tensor::from_vector(x, {4, 8}, retrace::DType::float32), *mesh, {Placement::shard(1)});
  for (int step = 0; step < 3; ++step) (void)traced(input);
  // Collective across the ranks: every rank gets the whole product.
  const std::vector<float> y = retrace::gather_to_host(traced.outputs()).to_vector<float>();
  if (retrace::mpi::world_rank() == 0) {
    std::printf("%s: y[0] = %.4f (%llu replays on each of %d ranks)\n", mesh->name().c_str(), y[0],
                static_cast<unsigned long long>(traced.stats().replays),
                retrace::mpi::world_size());
  }
}
