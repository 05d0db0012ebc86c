"""Code written for ttnn's tracing utilities (tracing.py) runs on retrace: the call patterns
where the two once differed, each checked against what the original does."""
import numpy as np
import pytest

import retrace
from retrace import ops


@pytest.fixture
def device():
    return retrace.open_device("cpu")


def test_state_tensor_update_takes_the_original_signature(device):
    state = retrace.StateTensor()
    # update(value, traced, dtype, mesh_axes, device): the 4th positional parameter is mesh_axes.
    state.update(np.ones(4, np.float32), False, retrace.float32, None, device)
    first = state.data
    state.update(np.full(4, 2.0, np.float32), True, retrace.float32, None, device)
    assert state.data is first  # traced: copied into the same buffer
    np.testing.assert_array_equal(state.data.numpy(), np.full(4, 2.0, np.float32))
    state.update(np.full(4, 3.0, np.float32), traced=True, dtype=retrace.float32, mesh_axes=None)
    np.testing.assert_array_equal(first.numpy(), np.full(4, 3.0, np.float32))
    with pytest.raises(retrace.InvalidArgument, match=r"mesh_axes \[0\] splits the value over a mesh"):
        state.update(np.ones(4, np.float32), True, retrace.float32, [0], device)


def test_state_tensor_mesh_axes_shard_over_a_mesh():
    with retrace.open_mesh("cpu", (2,)) as mesh:
        state = retrace.StateTensor()
        value = np.arange(8, dtype=np.float32).reshape(2, 4)
        state.update(value, traced=False, dtype=retrace.float32, mesh_axes=[None, 0], device=mesh)
        assert isinstance(state.data, retrace.MeshTensor)
        assert state.data.placements == [retrace.Placement.shard(1)]
        shards = state.data.shards
        state.update(value + 10, traced=True, dtype=retrace.float32, mesh_axes=[None, 0])
        np.testing.assert_array_equal(retrace.gather_to_host(state.data).numpy(), value + 10)
        np.testing.assert_array_equal(shards[1].numpy(), (value + 10)[:, 2:])
        with pytest.raises(retrace.InvalidArgument, match=r"mesh_axes has 1 entries for a value of rank 2"):
            state.update(value, traced=False, dtype=retrace.float32, mesh_axes=[0], device=mesh)
        with pytest.raises(retrace.InvalidArgument, match=r"mesh_axes\[1\] = 3 is not an axis"):
            state.update(value, traced=False, dtype=retrace.float32, mesh_axes=[None, 3], device=mesh)


def test_a_float64_scalar_is_a_float_baked_into_the_trace(device):
    seen = []

    def step(x, dt):
        seen.append(type(dt))
        return ops.mul(x, float(dt))  # a float: the original passes it through as given

    tracer = retrace.Tracer(step, device=device)
    x = retrace.from_numpy(np.ones(4, np.float32), device=device)
    np.testing.assert_array_equal(tracer(x, np.float64(0.5)).numpy(), np.full(4, 0.5))
    assert seen and all(t is np.float64 for t in seen)
    tracer(x, np.float64(0.5))  # the same value: a replay
    assert tracer.stats["replays"] == 1
    with pytest.raises(ValueError, match="does not match the initial value"):
        tracer(x, np.float64(0.25))
    with pytest.raises(TypeError, match="does not match the initial type"):
        tracer(x, 0.5)  # a float, where the capture had an np.float64


@pytest.mark.parametrize("scalar", [np.float32(0.5), np.int64(3), np.bool_(True), np.float16(1)])
def test_other_numpy_scalars_are_refused_as_the_original_refuses_them(device, scalar):
    tracer = retrace.Tracer(lambda x, s: ops.mul(x, 2.0), device=device)
    x = retrace.from_numpy(np.ones(4, np.float32), device=device)
    with pytest.raises(TypeError, match=rf"has unsupported type <class 'numpy\.{type(scalar).__name__}'>"):
        tracer(x, scalar)
    assert not tracer.trace_captured


def test_dict_inputs_may_have_int_keys(device):
    def step(inputs):
        return ops.add(inputs[3], inputs[5])

    tracer = retrace.Tracer(step, device=device)
    a = np.ones(4, np.float32)
    out = tracer({3: a, 5: a * 2})
    np.testing.assert_array_equal(out.numpy(), np.full(4, 3.0))
    tracer({5: a * 4, 3: a})  # the same keys, in another order
    np.testing.assert_array_equal(out.numpy(), np.full(4, 5.0))
    with pytest.raises(ValueError, match=r"args\[0\]\[3\]: shape \[2\] does not match the captured shape \[4\]"):
        tracer({3: np.ones(2, np.float32), 5: a})
    with pytest.raises(TypeError, match=r"keys \['x', 3\] do not match the captured keys \[3, 5\]"):
        tracer({3: a, "x": a})


def test_the_decorators_stores_read_as_the_originals(device):
    class Model:
        def __init__(self, device):
            self.device = device

        @retrace.traced_function(device=lambda self: self.device)
        def step(self, x):
            return ops.add(x, 1.0)

    model = Model(device)
    x = np.ones(4, np.float32)
    before = dict(retrace.Tracer._traces_live)
    model.step(x, traced=True)
    tracer = Model.step._tracers[model]
    assert isinstance(tracer, retrace.Tracer) and tracer.trace_captured
    assert retrace.Tracer._traces_live[device.id] == before.get(device.id, 0) + 1
    model.step(x, traced=True, tracer_trace_key="other")
    assert set(Model.step._tracers_keyed[model]) == {"other"}
    assert model in Model.step._tracers and len(Model.step._tracers) == 1

    @retrace.traced_function
    def scale(x, mesh_device, factor=None):
        return ops.mul(x, 2.0)

    scale(x, device, traced=True)
    (identity, auto_tracer), = scale._tracers_auto.items()
    assert identity == (id(device),)
    assert auto_tracer.trace_captured and auto_tracer._function is not None
    tracer.release_trace()
    assert retrace.Tracer._traces_live[device.id] == before.get(device.id, 0) + 2


def test_a_device_tensor_given_to_the_capture_is_its_input_slot(device):
    tracer = retrace.Tracer(lambda x, scale: ops.mul(x, scale), device=device)
    x = retrace.from_numpy(np.ones(4, np.float32), device=device)
    tracer(x, 2.0, traced=True)
    assert tracer.inputs[0] is x
    y = retrace.from_numpy(np.full(4, 3.0, np.float32), device=device)
    tracer(y, 2.0)
    np.testing.assert_array_equal(x.numpy(), np.full(4, 3.0))  # the replay wrote into x


def test_messages_keep_the_originals_phrases(device):
    tracer = retrace.Tracer(lambda x, s: ops.mul(x, s), device=device)
    x = retrace.from_numpy(np.ones(4, np.float32), device=device)
    tracer(x, 2.0)
    with pytest.raises(TypeError, match="expected 2 positional args, got 3"):
        tracer(x, 2.0, 3.0)
    with pytest.raises(ValueError, match="tensor properties do not match the initial value"):
        tracer(np.ones(3, np.float32), 2.0)
    with pytest.raises(ValueError, match="does not match the initial value"):
        tracer(x, 3.0)
    with pytest.raises(TypeError, match="has unsupported type <class 'object'>"):
        retrace.Tracer(lambda x, s: x, device=device)(x, object())
    with pytest.raises(TypeError, match=r"expected kwargs \['a'\], got \['b'\]"):
        kw = retrace.Tracer(lambda **k: ops.mul(k[next(iter(k))], 2.0), device=device)
        kw(a=x)
        kw(b=x)


def test_none_keeps_a_tensor_input_slot_as_it_is(device):
    # A cache the traced function updates in place: later calls pass None to keep it.
    def step(x, cache):
        ops.add(cache, x, out=cache)
        return ops.mul(cache, 1.0)

    tracer = retrace.Tracer(step, device=device, prep_run=False)
    cache = retrace.from_numpy(np.zeros(4, np.float32), device=device)
    ones = np.ones(4, np.float32)
    tracer(ones, cache)
    np.testing.assert_array_equal(tracer(ones, None).numpy(), np.full(4, 2.0))
    np.testing.assert_array_equal(tracer(ones, None).numpy(), np.full(4, 3.0))
    assert tracer.stats["copies_skipped"] == 1
