// Meshes across processes and machines, over MPI (target retrace::mpi, built when an MPI
// library is found; Open MPI from Debian: `apt-get install libopenmpi-dev openmpi-bin`).
//
// One member device per MPI rank. Every rank runs the same program (SPMD), opens the mesh, and
// then uses it as a MeshDevice of retrace/mesh.hpp: distribute the same host tensors, run the
// same ops and collectives, trace the same function. The collectives run on each member's queue
// and are captured into its trace like any other command; a replay is one call per rank.
//
//   int main(int argc, char** argv) {
//     retrace::mpi::init(&argc, &argv);                  // optional: open_mesh does it too
//     auto mesh = retrace::mpi::open_mesh("cpu");         // 1-D, one member per rank
//     auto x = retrace::distribute(host, *mesh, {retrace::Placement::shard(1)});
//     ...
//   }
//   $ mpirun -np 2 ./program                              # or across hosts: --hostfile hosts
//
// How the ranks meet: each collective exchanges a small header first (operation, dtype, sizes,
// and whether the member's queue failed before it), so a member that failed, or that runs a
// different collective, makes the collective fail on every rank with an error naming it, and a
// rank that never arrives makes the others fail after MeshOptions::collective_timeout (the group
// is then broken, as in one process). The values then move with MPI_Iallgather / MPI_Ialltoall
// and are summed on each rank in rank order, so the results are bit-identical to the same mesh
// in one process (and traced == eager bit for bit).
//
// CUDA members: open_mesh("cuda") gives the k-th rank on each host its GPU k, and the ranks'
// collectives run through NCCL (its ids sent over MPI) inside their CUDA graphs, as in one
// process; their headers are compared when they are enqueued, not when they run (see
// docs/contract.md for what differs from CPU members).
//
// MPI must provide MPI_THREAD_MULTIPLE: the collectives run on the members' queue threads while
// the program's thread may call gather_to_host. init() asks for it; a program that initialises
// MPI itself must ask for it too (failed_precondition otherwise). MPI is finalised at exit when
// init() initialised it.
#pragma once

#include "retrace/mesh.hpp"

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace retrace::mpi {

// Initialises MPI with MPI_THREAD_MULTIPLE, unless it is initialised already (then checks that
// level). argc/argv may be null.
void init(int* argc = nullptr, char*** argv = nullptr);
// Whether this process was started by an MPI launcher (mpirun, mpiexec, srun): the environment
// says so; MPI need not be initialised.
[[nodiscard]] bool launched() noexcept;
// This process' rank in MPI_COMM_WORLD and the number of ranks (init() first).
[[nodiscard]] int world_rank();
[[nodiscard]] int world_size();

// Opens a mesh with one member per rank of MPI_COMM_WORLD, in rank order: rank r opens
// `backend`:<first_id + r> (member_options, the backend's defaults if absent: the kernel
// threads are then the host's CPUs shared among its ranks, and at most the CPUs the rank is
// bound to). `shape` is {ranks} (the default, empty) or {rows, cols} with rows * cols ranks.
// Every rank calls it; if one rank cannot open its member, every rank fails.
[[nodiscard]] std::unique_ptr<MeshDevice> open_mesh(
    std::string_view backend, std::vector<std::size_t> shape = {},
    std::optional<DeviceOptions> member_options = std::nullopt, MeshOptions options = {},
    std::uint32_t first_id = 0);

}  // namespace retrace::mpi
