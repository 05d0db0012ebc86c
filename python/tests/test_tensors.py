"""Tensors, devices, numpy and DLPack."""
import numpy as np
import pytest

import retrace
from retrace import ops


def test_from_numpy_host_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = retrace.from_numpy(a)
    assert t.on_host and not t.on_device and t.device is None
    assert t.shape == (2, 3) and t.dtype == retrace.float32 and t.layout == retrace.Layout.row_major
    a[0, 0] = 42.0  # no copy: the tensor sees it
    assert t.numpy()[0, 0] == 42.0
    view = t.numpy()
    view[1, 2] = -1.0  # numpy() of a host tensor is a view
    assert a[1, 2] == -1.0


def test_to_device_and_back(device, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    d = retrace.from_numpy(a, device=device)
    assert d.on_device and d.device is device and d.address != 0
    np.testing.assert_array_equal(d.numpy(), a)
    np.testing.assert_array_equal(np.asarray(d), a)
    np.testing.assert_array_equal(d.to_host().numpy(), a)
    c = d.clone()
    assert c.address != d.address
    np.testing.assert_array_equal(c.numpy(), a)
    np.testing.assert_array_equal(retrace.from_numpy(a).to_device(device).numpy(), a)
    assert "float32" in repr(d) and "cpu:0" in repr(d)
    assert len(d) == 3 and d.ndim == 2 and d.numel == 15


@pytest.mark.parametrize(
    "array, dtype",
    [
        (np.arange(4, dtype=np.float64) / 3, retrace.float32),
        (np.arange(4, dtype=np.int64) - 2, retrace.int32),
        (np.array([True, False, True]), retrace.bool_),
        (np.arange(4, dtype=np.uint32), retrace.uint32),
        (np.arange(4, dtype=np.uint8), retrace.uint8),
        (np.arange(4, dtype=np.int32), retrace.int32),
    ],
)
def test_default_conversions(array, dtype):
    t = retrace.from_numpy(array)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), array.astype(t.numpy().dtype))


def test_bfloat16_round_trip(device):
    values = np.array([1.0, 1.00390625, 3.14159, -2.5e-3, np.inf, np.nan], np.float32)
    t = retrace.from_numpy(values, device=device, dtype=retrace.bfloat16)
    assert t.dtype == retrace.bfloat16
    out = t.numpy()
    assert out.dtype == np.float32  # numpy has no bfloat16
    expected = ops.typecast(retrace.from_numpy(values, device=device), "bfloat16").numpy()
    np.testing.assert_array_equal(out, expected)
    assert out[0] == 1.0 and out[1] == 1.0  # rounds to nearest even
    assert np.isinf(out[4]) and np.isnan(out[5])


def test_dtype_spellings(device):
    for spec in ("bfloat16", retrace.bfloat16, retrace.DType.bfloat16):
        assert retrace.from_numpy(np.ones(2, np.float32), device=device, dtype=spec).dtype == retrace.bfloat16
    for spec in (np.float32, np.dtype("float32"), "float32"):
        assert retrace.from_numpy(np.ones(2), dtype=spec).dtype == retrace.float32
    for spec in (np.float16, "float16", retrace.float16):
        assert retrace.from_numpy(np.ones(2), dtype=spec).dtype == retrace.float16
    with pytest.raises(retrace.InvalidArgument, match="unknown dtype 'float64'"):
        retrace.from_numpy(np.ones(2), dtype="float64")


def test_non_contiguous_and_empty_arrays():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (a[:, ::2], a.T, a[::-1], a[1:3, 2:5]):
        np.testing.assert_array_equal(retrace.from_numpy(view).numpy(), view)
    for shape in ((0,), (3, 0), (0, 4, 1), (1,), ()):
        e = np.zeros(shape, np.float32)
        t = retrace.from_numpy(e)
        assert t.shape == shape
        np.testing.assert_array_equal(t.numpy(), e)


def test_bad_arrays():
    with pytest.raises(retrace.InvalidArgument, match="complex64"):
        retrace.from_numpy(np.zeros(3, np.complex64))
    with pytest.raises(retrace.InvalidArgument, match="outside the range of int32"):
        retrace.from_numpy(np.array([2**40]))
    with pytest.raises(retrace.InvalidArgument, match="rank 9"):
        retrace.from_numpy(np.zeros((1,) * 9, np.float32))
    with pytest.raises(retrace.InvalidArgument, match="expected an array"):
        retrace.from_numpy("not an array")
    with pytest.raises(retrace.InvalidArgument, match="layout=tile needs a device"):
        retrace.from_numpy(np.zeros((2, 2), np.float32), layout=retrace.TILE_LAYOUT)


def test_dlpack_numpy_both_ways(device, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    host = retrace.from_dlpack(a)
    back = np.from_dlpack(host)
    back[0, 0, 0] = 7.0  # host tensors export without a copy
    assert a[0, 0, 0] == 7.0
    d = retrace.from_dlpack(a, device=device)
    np.testing.assert_array_equal(np.from_dlpack(d), a)
    assert host.__dlpack_device__() == (1, 0)
    for dtype in (np.int32, np.uint32, np.uint8):
        x = np.arange(5, dtype=dtype)
        np.testing.assert_array_equal(np.from_dlpack(retrace.from_dlpack(x)), x)


def test_torch_dlpack(device):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    r = retrace.from_dlpack(t)
    assert r.shape == (2, 3)
    t[0, 0] = 5.0
    assert r.numpy()[0, 0] == 5.0  # shared
    back = torch.from_dlpack(retrace.from_dlpack(t, device=device))
    assert torch.equal(back, t)
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert retrace.from_dlpack(bf).dtype == retrace.bfloat16
    assert torch.equal(torch.from_dlpack(retrace.from_dlpack(bf)), bf)


def test_tile_layout(device, rng):
    a = rng.standard_normal((33, 40)).astype(np.float32)
    t = retrace.from_numpy(a, device=device, layout=retrace.TILE_LAYOUT)
    assert t.layout == retrace.TILE_LAYOUT
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_empty_and_devices(device):
    e = retrace.empty((2, 3), device=device, dtype="bfloat16")
    assert e.shape == (2, 3) and e.dtype == retrace.bfloat16 and e.on_device
    h = retrace.empty([4])
    np.testing.assert_array_equal(h.numpy(), np.zeros(4, np.float32))
    assert device.name == "cpu:0" and device.backend == "cpu" and not device.closed
    assert device.num_queues >= 1
    names = [b["name"] for b in retrace.available_backends()]
    assert "cpu" in names
    with pytest.raises(retrace.InvalidArgument, match="unknown backend|backend"):
        retrace.open_device("nope")


def test_closed_device_under_live_tensor(rng):
    d = retrace.open_device("cpu:3")
    t = retrace.from_numpy(np.ones(4, np.float32), device=d)
    with d:
        pass  # the context manager closes the device
    assert d.closed and "closed" in repr(d)
    with pytest.raises(retrace.FailedPrecondition, match="cpu:3 was closed"):
        t.numpy()
    with pytest.raises(retrace.FailedPrecondition, match="cpu:3 was closed"):
        ops.add(t, 1.0)
    with pytest.raises(retrace.FailedPrecondition, match="closed"):
        d.synchronize()
    d.close()  # idempotent


def test_device_memory_option():
    d = retrace.open_device("cpu", memory=1 << 20)
    with pytest.raises(retrace.OutOfMemory) as info:
        retrace.empty((1 << 20,), device=d)
    assert info.value.category == "out of memory" or "memory" in str(info.value)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, retrace.Error)
    d.close()


def test_device_kernel_threads_option():
    x = np.arange(300 * 200, dtype=np.float32).reshape(300, 200) / 1e4
    results = []
    for threads, says in [(1, "each on its queue's thread"),
                          (2, "kernels split over at most 2 threads"), (None, None)]:
        d = retrace.open_device("cpu:5", kernel_threads=threads)
        if says is not None:
            assert says in d.description()
        t = retrace.from_numpy(x, device=d)
        results.append(ops.softmax(ops.mul(t, 3.0), dim=1).numpy())
        d.close()
    # Row-wise and elementwise kernels give the same bits however they are split.
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[1], results[2])
    with pytest.raises(TypeError):
        retrace.open_device("cpu", kernel_threads=-1)


def test_int64_on_request(device):
    big = np.array([2**53 + 1, -(2**63), 2**63 - 1], dtype=np.int64)
    t = retrace.from_numpy(big, device=device, dtype=retrace.int64)
    assert t.dtype == retrace.int64
    back = t.numpy()
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, big)
    # numpy's default integer still becomes int32 unless int64 is asked for.
    assert retrace.from_numpy(np.array([1, 2])).dtype == retrace.int32
    with pytest.raises(retrace.InvalidArgument, match="pass dtype=retrace.int64"):
        retrace.from_numpy(big)


def test_indexing_makes_views_as_numpy_does(device):
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    x = retrace.from_numpy(a, device=device)
    for key in [1, -1, (0, 2), (slice(None), 1), (..., 3), (1, slice(0, 4, 2), None),
                (None, ..., slice(1, None)), (slice(5, 1),), (0, -1, -1)]:
        view = x[key]
        assert view.shape == a[key].shape, key
        np.testing.assert_array_equal(view.numpy(), a[key])
    assert x[:, 1].address == x.address + 5 * 4  # a view of the same storage
    assert [row.numpy().tolist() for row in x[0]] == a[0].tolist()  # iteration
    x[:, 1] = 7.0
    a[:, 1] = 7
    x[0, :, 1:3] = np.array([1, 2], np.float32)  # broadcast
    a[0, :, 1:3] = [1, 2]
    x[2, 0] = retrace.from_numpy(np.full(5, -1, np.float32), device=device)
    a[2, 0] = -1
    np.testing.assert_array_equal(x.numpy(), a)
    with pytest.raises(IndexError, match="index 3 is out of range for dimension 0 of size 3"):
        x[3]
    with pytest.raises(retrace.InvalidArgument, match="only positive steps"):
        x[::-1]
    with pytest.raises(retrace.InvalidArgument, match="4 indices for a tensor of rank 3"):
        x[0, 0, 0, 0]
    with pytest.raises(retrace.InvalidArgument, match="index 'k' is a str"):
        x["k"]
