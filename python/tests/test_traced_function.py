"""@retrace.traced_function in the original's three device modes, plus retrace's options."""
import gc

import numpy as np
import pytest

import retrace
from retrace import ops


def dev(device, a):
    return retrace.from_numpy(np.asarray(a, np.float32), device=device)


class Model:
    def __init__(self, device, bias):
        self.device = device
        self.bias = bias
        self.calls = 0

    @retrace.traced_function(device=lambda self: self.device)
    def step(self, x, scale: float):
        self.calls += 1
        return ops.add(ops.mul(x, scale), self.bias)


def test_context_bound_method(device):
    m = Model(device, 1.0)
    x = dev(device, [1, 2])
    np.testing.assert_array_equal(m.step(x, 2.0).numpy(), [3, 5])  # untraced by default
    assert m.calls == 1
    y = m.step(x, 2.0, traced=True)
    calls = m.calls
    for i in range(3):
        assert m.step(dev(device, [i, i]), 2.0, traced=True) is y
    assert m.calls == calls  # replays do not run Python
    np.testing.assert_array_equal(y.numpy(), [5, 5])
    # The capture's device tensor became the trace's input slot: later calls copy into it.
    np.testing.assert_array_equal(x.numpy(), [2, 2])
    other = Model(device, 10.0)  # one tracer per context
    np.testing.assert_array_equal(other.step(dev(device, [1, 2]), 2.0, traced=True).numpy(), [12, 14])
    assert len(Model.step.tracers()) == 2


def test_trace_keys_and_auto_key(device):
    m = Model(device, 0.0)
    a = m.step(dev(device, [1, 1]), 1.0, traced=True, tracer_trace_key="2")
    b = m.step(dev(device, [1, 1, 1]), 1.0, traced=True, tracer_trace_key="3")
    assert a is not b and a.shape == (2,) and b.shape == (3,)
    assert m.step(dev(device, [5, 5]), 1.0, traced=True, tracer_trace_key="2") is a
    with pytest.raises(retrace.InvalidArgument, match="shape"):
        m.step(dev(device, [5, 5, 5, 5]), 1.0, traced=True, tracer_trace_key="2")

    class Auto:
        def __init__(self, device):
            self.device = device

        @retrace.traced_function(device=lambda self: self.device, auto_key=True, max_traces=2)
        def step(self, x, scale):
            return ops.mul(x, scale)

    s = Auto(device)
    outs = [s.step(dev(device, [1] * n), 2.0, traced=True) for n in (1, 2, 3)]
    assert [o.shape for o in outs] == [(1,), (2,), (3,)]
    assert len(Auto.step.tracers()) == 2  # the least recently used was released
    assert device.live_traces() >= 2
    s.step(dev(device, [1] * 3), 3.0, traced=True)  # a new scalar value is a new key
    assert "captures=1" in Auto.step.explain()


def test_context_death_releases_its_traces(device):
    m = Model(device, 0.0)
    m.step(dev(device, [1]), 1.0, traced=True)
    before = device.live_traces()
    del m
    gc.collect()
    assert device.live_traces() == before - 1


def test_device_parameter_mode(device):
    class Manager:  # not a traced input: bound, part of the tracer's identity
        factor = 3.0

    calls = []

    @retrace.traced_function
    def attention(x, mesh_device, manager=None, scale=1.0):
        calls.append(1)
        return ops.mul(x, manager.factor * scale)

    mgr = Manager()
    x = dev(device, [1, 2])
    np.testing.assert_array_equal(attention(x, device, mgr).numpy(), [3, 6])
    y = attention(x, device, mgr, traced=True)
    n = len(calls)
    assert attention(dev(device, [2, 2]), mesh_device=device, manager=mgr, traced=True) is y
    assert len(calls) == n
    np.testing.assert_array_equal(y.numpy(), [6, 6])
    z = attention(x, device, Manager(), traced=True)  # another bound identity: another tracer
    assert z is not y

    @retrace.traced_function(clone_prep_inputs=False)
    def uses_device(x, device):
        return ops.add(x, 1.0)

    np.testing.assert_array_equal(uses_device(dev(device, [1, 2]), device=device, traced=True).numpy(), [2, 3])
    with pytest.raises(TypeError, match="the device is a NoneType, expected a retrace.Device"):
        attention(x, None, mgr, traced=True)


def test_injected_mode(device):
    @retrace.traced_function(inject_mesh_device=True)
    def gelu(x, scale=1.0):
        return ops.mul(ops.gelu(x), scale)

    x = dev(device, [0.5, -1.0])
    eager = gelu(x).numpy()
    traced = gelu(x, mesh_device=device, traced=True)
    np.testing.assert_array_equal(traced.numpy(), eager)
    assert gelu(x, device=device, traced=True) is traced  # either name
    with pytest.raises(TypeError, match="pass only one"):
        gelu(x, device=device, mesh_device=device, traced=True)
    with pytest.raises(TypeError, match="were supplied as kwargs"):
        gelu(x, traced=True)
    np.testing.assert_array_equal(gelu(x, device=device).numpy(), eager)  # untraced drops it


def test_call_time_keywords_are_not_forwarded(device):
    seen = {}

    @retrace.traced_function(inject_mesh_device=True)
    def f(x, **kwargs):
        seen.update(kwargs)
        return ops.add(x, 1.0)

    x = dev(device, [1])
    f(x, device=device, tracer_cq_id=0, tracer_blocking_execution=True)
    assert seen == {}
    f(x, device=device, traced=True, tracer_cq_id=0, tracer_execute_on_capture=True,
      tracer_trace_key="k")
    assert seen == {}


def test_decoration_errors(device):
    with pytest.raises(ValueError, match="is mutually exclusive with device="):
        retrace.traced_function(device=device, inject_mesh_device=True)
    with pytest.raises(ValueError, match="was decorated without device= and has no parameter named any of"):
        @retrace.traced_function
        def no_device(x):
            return x
    with pytest.raises(ValueError, match="declares a 'mesh_device' parameter but inject_mesh_device=True would also add one"):
        @retrace.traced_function(inject_mesh_device=True)
        def both(x, mesh_device):
            return x

    @retrace.traced_function(device=device)
    def standalone(x):
        return x

    with pytest.raises(TypeError, match="is not a bindable context"):
        standalone(dev(device, [1]), traced=True)


def test_literal_device_with_context(device):
    class Holder:
        pass

    @retrace.traced_function(device=device)
    def f(self, x):
        return ops.add(x, 2.0)

    h = Holder()
    np.testing.assert_array_equal(f(h, dev(device, [1]), traced=True).numpy(), [3])


def test_state_tensor(device):
    state = retrace.StateTensor()
    assert state.data is None and state.value is None
    state.update(np.array([1.0], np.float32), traced=True, device=device)
    assert state.data.dtype == retrace.bfloat16  # the original's default dtype
    buffer = state.data.address
    state.update(np.array([2.0], np.float32), traced=True)
    assert state.data.address == buffer  # traced: copied into the same buffer
    np.testing.assert_array_equal(state.value.numpy(), [2.0])
    state.update(dev(device, [3.0]), traced=False)
    assert state.data.dtype == retrace.float32  # untraced: rebinds
    with pytest.raises(retrace.InvalidArgument, match=r"a traced update must keep the state.s shape"):
        state.update(np.zeros(2, np.float32), traced=True, dtype=retrace.float32)
    with pytest.raises(retrace.InvalidArgument, match="device must be given"):
        retrace.StateTensor().update(np.zeros(1), traced=True)


def test_state_tensor_in_a_traced_loop(device):
    @retrace.traced_function(inject_mesh_device=True)
    def step(x, t):
        return ops.add(x, t)

    t = retrace.StateTensor()
    x = retrace.StateTensor()
    x.update(np.zeros(2, np.float32), traced=True, dtype=retrace.float32, device=device)
    for i in range(4):
        t.update(np.array([float(i)], np.float32), traced=True, dtype=retrace.float32, device=device)
        x.update(step(x.data, t.data, device=device, traced=True), traced=True)
    np.testing.assert_array_equal(x.data.numpy(), [6, 6])


def test_device_parameter_must_be_a_device_on_first_call(device):
    @retrace.traced_function
    def f(x, mesh_device):
        return x

    with pytest.raises(TypeError, match="'mesh_device' must be a retrace.Device, got NoneType"):
        f(dev(device, [1]), None, traced=True)


def test_max_trace_bytes(device):
    class M:
        def __init__(self, device):
            self.device = device

        @retrace.traced_function(device=lambda self: self.device, auto_key=True,
                                 max_trace_bytes=1)
        def step(self, x):
            return ops.add(x, 1.0)

    m = M(device)
    for n in (1, 2, 3):
        out = m.step(dev(device, [1] * n), traced=True)
        np.testing.assert_array_equal(out.numpy(), [2] * n)
    assert len(M.step.tracers()) == 1  # the bound keeps only the newest trace
    with pytest.raises(ValueError, match="must be >= 0"):
        retrace.traced_function(device=device, max_trace_bytes=-1)


def test_call_shapes_bind_like_inspect(device):
    class Ccl:
        scale = 2.0

    seen = []

    @retrace.traced_function
    def f(x, mesh_device, ccl, *rest, offset=0.0, **extra):
        seen.append((len(rest), sorted(extra)))
        out = ops.add(ops.mul(x, ccl.scale), offset)
        for r in rest:
            out = ops.add(out, r)
        return out

    ccl = Ccl()
    x, y = dev(device, [1, 2]), dev(device, [10, 10])
    calls = [
        lambda v: f(v, device, ccl, traced=True),
        lambda v: f(v, mesh_device=device, ccl=ccl, traced=True),
        lambda v: f(x=v, mesh_device=device, ccl=ccl, offset=1.0, traced=True, tracer_trace_key="o"),
        lambda v: f(v, device, ccl, offset=0.5, tag="a", traced=True, tracer_trace_key="extra"),
    ]
    expected = [[2, 4], [2, 4], [3, 5], [2.5, 4.5]]
    for _ in range(2):  # capture, then replay through the cached call plans
        for call, want in zip(calls, expected):
            np.testing.assert_array_equal(call(dev(device, [1, 2])).numpy(), want)
    with pytest.raises(TypeError):
        f(x, traced=True)  # missing arguments: inspect's own error
    # *rest after the bound parameters cannot be passed on positionally: said, not dropped.
    with pytest.raises(TypeError, match=r"\*rest\) cannot be passed on"):
        f(x, device, ccl, y, traced=True, tracer_trace_key="rest")
