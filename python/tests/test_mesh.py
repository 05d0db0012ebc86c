"""Mesh devices from Python: distribute / gather, the collectives eager and traced (bit for bit
against eager and against sums computed here), mesh_map, and the errors."""
import numpy as np
import pytest

import retrace
from retrace import ops

R, P = retrace.Placement.replicate(), retrace.Placement.partial()


def S(dim):
    return retrace.Placement.shard(dim)


@pytest.fixture(params=[2, 4])
def mesh(request):
    with retrace.open_mesh("cpu", (request.param,), first_id=10) as m:
        yield m


def test_open_mesh_and_its_members(mesh):
    n = mesh.size
    assert mesh.shape == (n,) and len(mesh) == n
    assert [d.name for d in mesh.devices] == [f"cpu:{10 + i}" for i in range(n)]
    assert mesh.name.startswith(f"mesh {n} [cpu:10")
    assert mesh.member(1) is mesh.devices[1]
    with pytest.raises(retrace.FailedPrecondition, match="close the mesh"):
        mesh.devices[0].close()


def test_distribute_then_gather_is_the_identity(mesh):
    n = mesh.size
    x = np.arange(3 * 4 * n, dtype=np.float32).reshape(3, 4 * n)
    for p in (R, S(1), S(-1)):
        m = retrace.distribute(x, mesh, [p])
        assert m.shape == x.shape and m.placements == [p if p != S(-1) else S(1)]
        np.testing.assert_array_equal(retrace.gather_to_host(m).numpy(), x)
    cols = retrace.distribute(x, mesh, S(1))
    assert cols.shards[0].shape == (3, 4)
    assert cols.shards[1].device is mesh.devices[1]
    parts = retrace.gather_shards(cols)
    for k, part in enumerate(parts):
        np.testing.assert_array_equal(part.numpy(), x[:, 4 * k:4 * k + 4])


def test_collectives_sum_in_member_order(mesh):
    n = mesh.size
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((3, 4 * n)).astype(np.float32) for _ in range(n)]
    x = retrace.MeshTensor(
        [retrace.from_numpy(p, device=d) for p, d in zip(parts, mesh.devices)], mesh, [P])
    expected = parts[0].copy()
    for p in parts[1:]:
        expected = (expected + p).astype(np.float32)  # float32, member order
    reduced = ops.all_reduce(x)
    assert reduced.placements == [R]
    for shard in reduced.shards:
        np.testing.assert_array_equal(shard.numpy(), expected)
    np.testing.assert_array_equal(retrace.gather_to_host(x).numpy(), expected)
    scattered = ops.reduce_scatter(x, 1)
    assert scattered.placements == [S(1)]
    np.testing.assert_array_equal(retrace.gather_to_host(scattered).numpy(), expected)
    gathered = ops.all_gather(scattered)
    np.testing.assert_array_equal(gathered.shards[-1].numpy(), expected)


def test_a_traced_tensor_parallel_layer_equals_eager_bit_for_bit(mesh):
    n = mesh.size
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    weight = retrace.distribute(w, mesh, S(1))

    def layer(x):
        partial = retrace.mesh_map(lambda xs, ws: ops.matmul(xs, ws, transpose_b=True), x, weight,
                                   placements=[P])
        return retrace.mesh_map(ops.gelu, ops.all_reduce(partial))

    tracer = retrace.Tracer(layer, devices=mesh)
    assert tracer.devices == mesh.devices
    for call in range(3):
        xh = rng.standard_normal((4, 16)).astype(np.float32)
        x = retrace.distribute(xh, mesh, S(1))
        eager = retrace.gather_to_host(layer(x)).numpy()
        y = tracer(x)
        assert isinstance(y, retrace.MeshTensor) and y.placements == [R]
        np.testing.assert_array_equal(retrace.gather_to_host(y).numpy(), eager)
        replicas = [s.numpy() for s in retrace.gather_shards(y)]
        for r in replicas[1:]:
            np.testing.assert_array_equal(r, replicas[0])
    # Another placement than the captured one is refused before anything runs.
    with pytest.raises(retrace.InvalidArgument, match="placements are part of the trace"):
        tracer(retrace.distribute(xh, mesh, R))


def test_errors_name_what_was_wrong(mesh):
    x = retrace.distribute(np.ones((2, 4 * mesh.size), np.float32), mesh, S(1))
    with pytest.raises(retrace.InvalidArgument, match="all_reduce sums partial values"):
        ops.all_reduce(x)
    with pytest.raises(retrace.InvalidArgument, match="does not split evenly"):
        retrace.distribute(np.ones((3,), np.float32), mesh, S(0))
    with pytest.raises(retrace.InvalidArgument, match="placements must be"):
        retrace.distribute(np.ones((4,), np.float32), mesh, "R")
    with pytest.raises(retrace.InvalidArgument, match="no mesh tensor"):
        retrace.mesh_map(ops.gelu, 1.0)
    members = mesh.devices
    mesh.close()
    assert mesh.closed and all(d.closed for d in members)  # members close with their mesh
    with pytest.raises(retrace.FailedPrecondition, match="was closed"):
        members[0].synchronize()
    with pytest.raises(retrace.FailedPrecondition, match="was closed"):
        ops.all_reduce(x.with_placements([P]))
