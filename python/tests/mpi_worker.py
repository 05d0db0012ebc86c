"""Run by test_mpi.py under `mpirun -np 2`: a mesh of one CPU device per rank, from Python."""
import sys

import numpy as np

import retrace
from retrace import ops, Placement


def main() -> int:
    mesh = retrace.mpi.open_mesh("cpu")
    rank, size = retrace.mpi.world_rank(), retrace.mpi.world_size()
    assert len(mesh) == size == 2, (len(mesh), size)
    assert len(mesh.devices) == 1  # this rank's member
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = retrace.distribute(host, mesh, [Placement.shard(1)])
    np.testing.assert_array_equal(x.shards[0].numpy(), host[:, 3 * rank:3 * rank + 3])
    np.testing.assert_array_equal(retrace.gather_to_host(x).numpy(), host)
    # Partial sums on each rank, reduced across ranks: eager and traced give the same bits.
    parts = retrace.MeshTensor([retrace.from_numpy(host * (rank + 1), device=mesh.devices[0])],
                               mesh, [Placement.partial()])
    total = ops.all_reduce(parts)
    np.testing.assert_array_equal(total.shards[0].numpy(), host * 3)

    def step(t):
        return ops.all_reduce(retrace.mesh_map(lambda s: ops.mul(s, 2.0), t))

    tracer = retrace.Tracer(step, devices=mesh)
    first = tracer(parts).shards[0].numpy()
    again = tracer(parts).shards[0].numpy()  # a replay
    np.testing.assert_array_equal(first, host * 6)
    np.testing.assert_array_equal(again, first)
    mesh.close()
    print(f"rank {rank} of {size}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
