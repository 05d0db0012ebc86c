"""retrace.Tracer: the original's contract, with Python trees walked in C++."""
import numpy as np
import pytest

import retrace
from retrace import ops


def dev(device, a, dtype=None):
    return retrace.from_numpy(np.asarray(a, np.float32), device=device, dtype=dtype)


class Counter:
    """A function that counts how often Python runs its body."""

    def __init__(self, body):
        self.body, self.calls = body, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.body(*args, **kwargs)


def test_capture_then_replay_without_python(device):
    f = Counter(lambda x, scale: ops.mul(ops.add(x, 1.0), scale))
    tracer = retrace.Tracer(f, device=device)
    assert not tracer.trace_captured and tracer.inputs == {}
    x = dev(device, [[1, 2, 3]])
    y = tracer(x, 2.0)
    assert f.calls == 2  # the prep run and the capture
    assert tracer.trace_captured
    np.testing.assert_array_equal(y.numpy(), [[4, 6, 8]])
    for i in range(5):
        z = tracer(dev(device, [[i, i, i]]), 2.0)
        assert z is y  # the same output object every time
        np.testing.assert_array_equal(z.numpy(), [[2 * (i + 1)] * 3])
    assert f.calls == 2  # replays never entered the function
    stats = tracer.stats
    assert stats["captures"] == 1 and stats["replays"] == 5 and stats["copies"] == 1


def test_trees_and_kwargs(device):
    f = Counter(lambda pair, scale=1.0, extra=None, **kw: {
        "sum": ops.add(pair[0], pair[1]),
        "scaled": [ops.mul(kw["latents"][1], scale), None, "tag", 3],
    })
    tracer = retrace.Tracer(f, device=device, prep_run=False)
    a, b, c = dev(device, [1, 2]), dev(device, [10, 20]), dev(device, [5, 6])
    out = tracer((a, b), scale=3.0, latents=[None, c])
    assert f.calls == 1
    np.testing.assert_array_equal(out["sum"].numpy(), [11, 22])
    np.testing.assert_array_equal(out["scaled"][0].numpy(), [15, 18])
    assert out["scaled"][1:] == [None, "tag", 3]
    out2 = tracer((c, c), scale=3.0, latents=[None, a])
    assert out2 is out and f.calls == 1
    np.testing.assert_array_equal(out["sum"].numpy(), [10, 12])
    np.testing.assert_array_equal(out["scaled"][0].numpy(), [3, 6])
    inputs = tracer.inputs
    assert set(inputs) == {0, "scale", "latents"}
    assert isinstance(inputs[0], tuple) and inputs["scale"] == 3.0


def test_errors_carry_paths(device):
    tracer = retrace.Tracer(lambda x, **kw: ops.add(x, kw["latents"][1]), device=device)
    x = dev(device, [1, 2])
    tracer(x, latents=[0, x])
    with pytest.raises(retrace.InvalidArgument, match=r'kwargs\["latents"\]\[1\]: shape \[3\] does not match the captured shape \[2\]'):
        tracer(x, latents=[0, dev(device, [1, 2, 3])])
    with pytest.raises(retrace.InvalidArgument, match=r'kwargs\["latents"\]\[1\]: dtype bfloat16'):
        tracer(x, latents=[0, dev(device, [1, 2], "bfloat16")])
    with pytest.raises(retrace.InvalidArgument, match=r'kwargs\["latents"\]\[0\]: value 1 does not match the captured value 0'):
        tracer(x, latents=[1, x])
    with pytest.raises(TypeError, match=r'kwargs\["latents"\]: is a tuple, the captured input is a list'):
        tracer(x, latents=(0, x))
    with pytest.raises(retrace.InvalidType, match=r'kwargs\["latents"\]\[0\]: is a float, the captured input is a int'):
        tracer(x, latents=[0.0, x])
    with pytest.raises(ValueError, match=r'kwargs\["latents"\]: has 3 elements, the captured input has 2'):
        tracer(x, latents=[0, x, x])
    with pytest.raises(TypeError, match="expected 1 positional args, got 2"):
        tracer(x, x, latents=[0, x])
    with pytest.raises(TypeError, match=r"keys \['other'\] do not match the captured keys \['latents'\]"):
        tracer(x, other=[0, x])
    with pytest.raises(TypeError, match=r"args\[0\]: is a str, the captured input is a tensor"):
        tracer("x", latents=[0, x])


def test_unsupported_types(device):
    tracer = retrace.Tracer(lambda x: x, device=device)
    with pytest.raises(TypeError, match=r"args\[0\]\[1\]: has unsupported type <class 'object'>"):
        tracer([1, object()])
    with pytest.raises(TypeError, match=r"args\[0\]: has a key of type <class 'tuple'>"):
        tracer({(1, 2): 2})
    assert not tracer.trace_captured
    bad = retrace.Tracer(lambda x: np.zeros(2), device=device)
    with pytest.raises(TypeError, match="outputs: has unsupported type"):
        bad(dev(device, [1]))
    assert not bad.trace_captured and device.live_traces() == 0
    host_out = retrace.Tracer(lambda x: retrace.from_numpy(np.zeros(2, np.float32)), device=device)
    with pytest.raises(retrace.InvalidArgument, match="outputs: is a host tensor"):
        host_out(dev(device, [1]))


def test_rejected_call_changes_nothing(device):
    tracer = retrace.Tracer(lambda a, b: ops.add(a, b), device=device)
    a, b = dev(device, [1, 1]), dev(device, [2, 2])
    out = tracer(a, b)
    slot_a = tracer.inputs[0]
    with pytest.raises(retrace.InvalidArgument):
        tracer(dev(device, [7, 7]), dev(device, [1, 2, 3]))  # second input wrong
    np.testing.assert_array_equal(slot_a.numpy(), [1, 1])  # first slot untouched
    np.testing.assert_array_equal(out.numpy(), [3, 3])


def test_host_arrays_and_tensors_as_inputs(device):
    tracer = retrace.Tracer(lambda x: ops.mul(x, 2.0), device=device)
    out = tracer(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(out.numpy(), [2, 4, 6])
    tracer(np.array([4, 5, 6], np.float32))
    np.testing.assert_array_equal(out.numpy(), [8, 10, 12])
    tracer(retrace.from_numpy(np.array([1, 1, 1], np.float32)))
    np.testing.assert_array_equal(out.numpy(), [2, 2, 2])
    tracer(np.array([1.0, 2.0, 3.0]))  # float64 goes into the float32 slot
    np.testing.assert_array_equal(out.numpy(), [2, 4, 6])
    with pytest.raises(retrace.InvalidArgument, match="dtype int32 does not match"):
        tracer(np.array([1, 2, 3], np.int32))


def test_bfloat16_slot_takes_float_arrays(device):
    tracer = retrace.Tracer(lambda x: ops.add(x, 1.0), device=device)
    out = tracer(dev(device, [1, 2], "bfloat16"))
    tracer(np.array([3, 4], np.float32))
    np.testing.assert_array_equal(out.numpy(), [4, 5])


def test_swapped_inputs_are_safe(device):
    tracer = retrace.Tracer(lambda a, b: ops.sub(a, b), device=device)
    out = tracer(dev(device, [10]), dev(device, [1]))
    a_slot, b_slot = tracer.inputs[0], tracer.inputs[1]
    tracer(b_slot, a_slot)  # each slot's value goes into the other
    np.testing.assert_array_equal(out.numpy(), [-9])
    same = dev(device, [5])
    t2 = retrace.Tracer(lambda a, b: ops.sub(a, b), device=device)
    o2 = t2(same, same)  # one tensor for two inputs gets two slots
    t2(dev(device, [8]), dev(device, [3]))
    np.testing.assert_array_equal(o2.numpy(), [5])


def test_prep_run_and_clone_prep_inputs(device):
    def inc(x):
        ops.add(x, 1.0, out=x)
        return ops.mul(x, 1.0)

    x = dev(device, [0])
    out = retrace.Tracer(inc, device=device)(x)  # prep run on clones: x incremented once
    np.testing.assert_array_equal(out.numpy(), [1])
    y = dev(device, [0])
    out2 = retrace.Tracer(inc, device=device, clone_prep_inputs=False)(y)
    np.testing.assert_array_equal(out2.numpy(), [2])  # prep run and trace both incremented
    z = dev(device, [0])
    out3 = retrace.Tracer(inc, device=device, prep_run=False)(z)
    np.testing.assert_array_equal(out3.numpy(), [1])


def test_untraced_and_release(device):
    f = Counter(lambda x: ops.add(x, 1.0))
    tracer = retrace.Tracer(f, device=device)
    x = dev(device, [1])
    np.testing.assert_array_equal(tracer(x, traced=False).numpy(), [2])
    assert tracer.inputs == {0: x}
    tracer(x)
    with pytest.raises(retrace.FailedPrecondition, match="untraced execution is not allowed after the trace has been captured"):
        tracer(x, traced=False)
    assert device.live_traces() == 1
    tracer.release_trace()
    assert not tracer.trace_captured and device.live_traces() == 0 and tracer.inputs == {}
    tracer.release_trace()  # idempotent
    tracer(x)  # captures again
    assert tracer.trace_captured
    tracer.release_function()
    tracer(x)  # replays still work
    tracer.release_trace()
    with pytest.raises(retrace.FailedPrecondition, match="no function|function"):
        tracer(x)
    with pytest.raises(retrace.FailedPrecondition, match="released"):
        tracer(x, traced=False)


def test_execute_on_capture_false_and_options(device):
    tracer = retrace.Tracer(lambda x: ops.add(x, 1.0), device=device)
    x = dev(device, [1])
    out = tracer(x, tracer_execute_on_capture=False, tracer_cq_id=1)
    assert tracer.trace_captured
    tracer(x, tracer_cq_id=1, tracer_blocking_execution=False)
    device.synchronize()
    np.testing.assert_array_equal(out.numpy(), [2])


def test_capture_failure_leaves_no_trace(device):
    def boom(x):
        ops.add(x, 1.0)
        raise RuntimeError("inside the function")

    tracer = retrace.Tracer(boom, device=device, prep_run=False)
    with pytest.raises(RuntimeError, match="inside the function"):
        tracer(dev(device, [1]))
    assert not tracer.trace_captured and device.live_traces() == 0
    # A host read during capture is a capture violation; the device stays usable.
    def reads(x):
        y = ops.add(x, 1.0)
        y.numpy()
        return y

    t2 = retrace.Tracer(reads, device=device, prep_run=False)
    with pytest.raises(retrace.CaptureViolation):
        t2(dev(device, [1]))
    np.testing.assert_array_equal(ops.add(dev(device, [1]), 1.0).numpy(), [2])


def test_constructor_errors(device):
    with pytest.raises(ValueError, match="exactly one of 'device' or 'devices'"):
        retrace.Tracer(lambda: None)
    with pytest.raises(ValueError, match="exactly one of 'device' or 'devices'"):
        retrace.Tracer(lambda: None, device=device, devices=[device])
    with pytest.raises(retrace.InvalidArgument, match="callable"):
        retrace.Tracer(3, device=device)
    with pytest.raises(retrace.InvalidArgument, match="expected a retrace.Device"):
        retrace.Tracer(lambda: None, device="cpu")


def test_several_devices(device):
    other = retrace.open_device("cpu:1")
    tracer = retrace.Tracer(lambda a, b: (ops.add(a, 1.0), ops.add(b, 2.0)), devices=[device, other])
    a, b = dev(device, [1]), dev(other, [1])
    out = tracer(a, b)
    tracer(dev(device, [5]), dev(other, [5]))
    device.synchronize()
    other.synchronize()
    np.testing.assert_array_equal(out[0].numpy(), [6])
    np.testing.assert_array_equal(out[1].numpy(), [7])
    with pytest.raises(retrace.InvalidArgument, match="host tensor"):
        retrace.Tracer(lambda a: a, devices=[device, other])(np.zeros(1, np.float32))
    other.close()


def test_stale_output_copy_is_detected(device):
    tracer = retrace.Tracer(lambda x: ops.add(x, 1.0), device=device)
    out = tracer(dev(device, [1, 1]))
    view = ops.reshape(out, (2, 1))  # a second handle on the output, taken now
    np.testing.assert_array_equal(view.numpy(), [[2], [2]])
    tracer(dev(device, [2, 2]))
    np.testing.assert_array_equal(out.numpy(), [3, 3])  # the tracer's own object follows replays
    with pytest.raises(retrace.FailedPrecondition, match="replay"):
        view.numpy()  # the copy is stale: a later replay overwrote it


def test_device_closed_under_tracer():
    d = retrace.open_device("cpu:2")
    tracer = retrace.Tracer(lambda x: ops.add(x, 1.0), device=d)
    tracer(retrace.from_numpy(np.ones(2, np.float32), device=d))
    d.close()
    with pytest.raises(retrace.FailedPrecondition, match="cpu:2 was closed"):
        tracer(np.ones(2, np.float32))


def test_many_leaves(device):
    leaves = [dev(device, [i]) for i in range(64)]
    tracer = retrace.Tracer(lambda xs: ops.concat(list(xs), 0), device=device)
    out = tracer(leaves)
    tracer(list(reversed(leaves)))
    np.testing.assert_array_equal(out.numpy(), np.arange(64)[::-1])


def test_tracer_in_a_reference_cycle_is_collected(device):
    import gc

    def make():
        holder = {}
        holder["tracer"] = retrace.Tracer(lambda x: (holder, ops.add(x, 1.0))[1], device=device)
        holder["tracer"](dev(device, [1]))
        return device.live_traces()

    before = device.live_traces()
    assert make() == before + 1
    gc.collect()
    assert device.live_traces() == before  # the cycle tracer -> function -> holder was broken


def test_host_arrays_released_after_non_blocking_replays(device):
    import gc
    import weakref

    tracer = retrace.Tracer(lambda x: ops.mul(x, 2.0), device=device)
    out = tracer(np.ones(1024, np.float32))
    refs = []
    for i in range(20):
        a = np.full(1024, float(i), np.float32)
        refs.append(weakref.ref(a))
        tracer(a, tracer_blocking_execution=False)
        del a
    device.synchronize()
    retrace.from_numpy(np.zeros(1, np.float32))  # any call releases what worker threads dropped
    gc.collect()
    np.testing.assert_array_equal(out.numpy(), np.full(1024, 38.0, np.float32))
    assert all(r() is None for r in refs)


def test_tensor_operators(device):
    a = np.array([1.0, 2.0, 4.0], np.float32)
    x = dev(device, a)
    np.testing.assert_array_equal((x + 1).numpy(), a + 1)
    np.testing.assert_array_equal((1 + x).numpy(), a + 1)
    np.testing.assert_array_equal((x - 1).numpy(), a - 1)
    np.testing.assert_array_equal((1 - x).numpy(), 1 - a)
    np.testing.assert_array_equal((x * x).numpy(), a * a)
    np.testing.assert_array_equal((2 * x).numpy(), 2 * a)
    np.testing.assert_array_equal((x / 2).numpy(), a / 2)
    np.testing.assert_array_equal((x ** 2).numpy(), a ** 2)
    np.testing.assert_array_equal((-x).numpy(), -a)
    m = dev(device, np.eye(3))
    np.testing.assert_array_equal((x @ m).numpy(), a)
    with pytest.raises(TypeError):
        x + "one"


def test_reentrant_call_is_refused(device):
    holder = {}

    def f(x):
        return holder["t"](x)  # calls its own tracer during the capture

    holder["t"] = retrace.Tracer(f, device=device, prep_run=False)
    with pytest.raises(retrace.FailedPrecondition, match="one call at a time"):
        holder["t"](dev(device, [1]))
    assert not holder["t"].trace_captured
    holder.clear()


def test_trace_info_and_array_copy_flag(device):
    tracer = retrace.Tracer(lambda x: ops.exp(ops.add(x, 1.0)), device=device)
    tracer(dev(device, [0]))
    (info,) = tracer.trace_info()
    assert info["device"] == "cpu:0" and info["commands"] == 2 and info["ops"] == ["add", "exp"]
    host = retrace.from_numpy(np.ones(2, np.float32))
    assert np.asarray(host, copy=False) is not None  # a view
    with pytest.raises(ValueError, match="copy=False"):
        np.asarray(dev(device, [1]), copy=False)


def test_profile(device):
    tracer = retrace.Tracer(lambda x: ops.exp(ops.add(x, 1.0)), device=device)
    with pytest.raises(retrace.FailedPrecondition):
        tracer.profile()
    out = tracer(dev(device, [0, 1]))
    (p,) = tracer.profile(replays=3)
    assert p["ops"] == ["add", "exp"] and len(p["command_ns"]) == 2 and p["replays"] == 3
    assert p["replay_ns"] > 0
    np.testing.assert_allclose(out.numpy(), np.exp([1, 2]), rtol=1e-6)
