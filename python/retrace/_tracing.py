"""StateTensor and the traced_function decorator, on top of retrace.Tracer (C++).

The decorator has the three device modes of ttnn's tracing utilities:

1. Context-bound: ``device=`` (a Device, or a callable taking the bound context, e.g.
   ``lambda self: self.device``). The first positional argument (``self``) is bound away; one
   tracer per context, held weakly (a context that goes away releases its traces).
2. Auto-discovered: the function declares a parameter named ``mesh_device`` or ``device``. On the
   first traced call each argument that is not a valid traced input (a tensor, array, scalar or
   None, possibly nested in tuples, lists and dicts) is bound; one tracer per identity of the
   bound values.
3. Injected: ``inject_mesh_device=True``. The wrapper takes ``mesh_device=`` or ``device=`` as a
   call-time keyword and does not pass it on.

Call-time keywords: ``traced`` (default False: a plain call), ``tracer_cq_id``,
``tracer_blocking_execution``, ``tracer_execute_on_capture`` and ``tracer_trace_key`` (selects
one of several traces of the same context).

retrace's additions (decorator keywords): ``auto_key=True`` keys traces by the input signature
(shapes, dtypes, layouts, devices, scalar values), so a new shape captures a new trace instead of
failing; ``max_traces`` and ``max_trace_bytes`` bound the live traces per context and their
trace memory (least recently used released first); ``name`` names the tracers in errors. ``wrapper.explain()`` lists the live traces.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Protocol, Sequence, TypeVar, overload

import numpy as _np

from . import _core

_OMITTED = object()
_MESH_DEVICE_PARAM_NAMES = ("mesh_device", "device")
_TRACER_CALL_KWARGS = frozenset(
    ("tracer_cq_id", "tracer_blocking_execution", "tracer_execute_on_capture")
)
_SCALARS = (int, float, str, bool, type(None))


class StateTensor:
    """A device buffer that keeps its address across traced updates.

    A trace reads fixed addresses, so a value that changes between replays (a timestep, a cache
    position) must be written into the same buffer. ``update(value, traced=True)`` copies into
    the existing buffer (shape and dtype must match); untraced, or on the first update, the state
    rebinds to the new value. The rule is the C++ ``retrace::StateTensor``'s (one per shard of a
    mesh tensor); this class turns Python values into tensors around it.
    """

    def __init__(self) -> None:
        self._data: Any = None
        self._states: list[Any] = []  # _core._StateTensor: one, or one per mesh shard
        self._device: Any = None  # where array values go when update() is given no device

    @property
    def data(self) -> Any:
        return self._data

    @property
    def value(self) -> Any:
        return self._data

    def update(self, value: Any, traced: bool, dtype: Any = _core.bfloat16,
               mesh_axes: Sequence[int | None] | None = None, device: Any = None) -> None:
        """Sets the state to ``value``: a retrace.Tensor or MeshTensor, or an array (numpy, torch,
        anything with ``__dlpack__``) converted to ``dtype`` and put on ``device`` (or on the
        state's device when it has one). On a ``retrace.MeshDevice``, ``mesh_axes`` gives, per
        dimension of the value, the mesh axis that dimension is split over (None: not split),
        as ttnn's ``from_torch`` takes it; dimensions not named are replicated."""
        if device is None:
            device = self._device
        if not isinstance(value, (_core.Tensor, _core.MeshTensor)):
            if device is None and isinstance(self._data, _core.Tensor):
                device = self._data.device
            if device is None:
                raise _core.InvalidArgument(
                    "StateTensor.update: device must be given for an array value "
                    "(the state has no device yet)")
            value = _to_device(value, device, dtype, mesh_axes)
        if device is not None:
            self._device = device
        if isinstance(value, _core.MeshTensor) or isinstance(self._data, _core.MeshTensor):
            self._update_shards(value, traced)
            return
        if not self._states:
            self._states = [_core._StateTensor()]
        target = device if isinstance(device, _core.Device) else None
        if self._states[0].update(value, traced, target):
            self._data = value if not value.on_host else self._states[0].data

    def _update_shards(self, value: Any, traced: bool) -> None:
        """A mesh tensor state: the rule applied to every shard."""
        if self._data is None or not traced:
            if not isinstance(value, _core.MeshTensor):
                raise _core.InvalidArgument(
                    f"StateTensor.update: a mesh tensor state takes mesh tensors, got {value!r}")
            self._states = [_core._StateTensor() for _ in value.shards]
            for state, shard in zip(self._states, value.shards):
                state.update(shard, False)
            self._data = value
            return
        if not isinstance(value, _core.MeshTensor) or len(value.shards) != len(self._states):
            raise _core.InvalidArgument(
                f"StateTensor.update: the state is {self._data!r}; a traced update copies into "
                f"its shards, got {value!r}")
        for state, shard in zip(self._states, value.shards):
            state.update(shard, True)

    def __repr__(self) -> str:
        return f"StateTensor({self._data!r})"


def _to_device(value: Any, device: Any, dtype: Any, mesh_axes: Sequence[int | None] | None) -> Any:
    """An array (or host tensor) on a Device, or distributed over a MeshDevice by mesh_axes."""
    if isinstance(value, _core.Tensor):
        host = value
    elif hasattr(value, "__dlpack__") and not isinstance(value, _np.ndarray):
        host = _core.from_numpy(value, dtype=dtype)  # torch tensors (bfloat16 too)
    else:
        host = _core.from_numpy(_np.asarray(value), dtype=dtype)
    if isinstance(device, _core.MeshDevice):
        return _core.distribute(host, device, _placements(mesh_axes, host.shape, device))
    if mesh_axes is not None and any(axis is not None for axis in mesh_axes):
        raise _core.InvalidArgument(
            f"StateTensor.update: mesh_axes {list(mesh_axes)} splits the value over a mesh, but "
            f"device is {device!r}, a single device (pass a retrace.MeshDevice)")
    return host.to_device(device) if host.dtype == dtype or not host.on_host else \
        _core.from_numpy(host.numpy(), device=device, dtype=dtype)


def _placements(mesh_axes: Sequence[int | None] | None, shape: tuple[int, ...], mesh: Any) -> list:
    """ttnn's mesh_axes (per tensor dimension: the mesh axis it is split over, or None) as one
    placement per mesh axis."""
    placements = [_core.Placement.replicate() for _ in mesh.shape]
    if mesh_axes is None:
        return placements
    if len(mesh_axes) != len(shape):
        raise _core.InvalidArgument(
            f"StateTensor.update: mesh_axes has {len(mesh_axes)} entries for a value of rank "
            f"{len(shape)} (one per dimension: a mesh axis or None)")
    for dim, axis in enumerate(mesh_axes):
        if axis is None:
            continue
        if not isinstance(axis, int) or not 0 <= axis < len(mesh.shape):
            raise _core.InvalidArgument(
                f"StateTensor.update: mesh_axes[{dim}] = {axis!r} is not an axis of {mesh!r} "
                f"(0 to {len(mesh.shape) - 1})")
        if placements[axis] != _core.Placement.replicate():
            raise _core.InvalidArgument(
                f"StateTensor.update: mesh_axes splits two dimensions over mesh axis {axis}")
        placements[axis] = _core.Placement.shard(dim)
    return placements


def _is_tracer_valid_value(value: Any) -> bool:
    """Whether a value can be a traced input (else traced_function binds it): tensors, mesh
    tensors, arrays, the scalars (np.float64 is a float) and None, in tuples, lists and dicts
    with scalar keys. numpy's other scalars (np.float32, ...) are not, as in ttnn's utilities."""
    if isinstance(value, (_core.Tensor, _core.MeshTensor) + _SCALARS):
        return True
    if isinstance(value, (tuple, list)):
        return all(_is_tracer_valid_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, _SCALARS) and _is_tracer_valid_value(v) for k, v in value.items())
    if isinstance(value, _np.generic):
        return False
    return hasattr(value, "__array_interface__") or hasattr(value, "__dlpack__")


class _Slot:
    """Stands for argument `index` (an int: positional; a str: keyword) while a plan is made."""

    __slots__ = ("index",)

    def __init__(self, index: Any) -> None:
        self.index = index


class _CallPlan:
    """The binding of one call shape (number of positional arguments, keyword names) of a
    function: which arguments are bound away (by name) and what the tracer is called with.
    Made once with placeholders through inspect's binding, then applied by indexing, so later
    calls skip inspect.Signature.bind (tens of microseconds)."""

    def __init__(self, sig: inspect.Signature, names: tuple[str, ...], nargs: int,
                 keys: tuple[str, ...], label: str) -> None:
        bound = sig.bind(*(_Slot(i) for i in range(nargs)), **{k: _Slot(k) for k in keys})
        bound.apply_defaults()
        self.bind = [(n, bound.arguments.pop(n)) for n in names if n in bound.arguments]
        self.args = list(bound.args)
        kwargs = bound.kwargs
        # A *args parameter after a bound one would reach the function as a keyword (inspect
        # puts it in .kwargs): refuse that instead of passing it wrongly; drop it when empty.
        lost = [p.name for p in sig.parameters.values()
                if p.kind == inspect.Parameter.VAR_POSITIONAL and p.name in kwargs]
        for n in lost:
            if kwargs[n] == ():
                del kwargs[n]
        lost = [n for n in lost if n in kwargs]
        self.kwargs = list(kwargs.items())
        used = self._slots([s for _, s in self.bind] + self.args + [s for _, s in self.kwargs])
        if lost or used != nargs + len(keys):
            raise TypeError(
                f"@traced_function: {label}: once {list(names)} are bound, this call's extra "
                f"positional arguments ({', '.join('*' + n for n in lost)}) cannot be passed on; "
                "pass them in a list instead")

    @staticmethod
    def _slots(sources: list[Any]) -> int:
        count = 0
        for s in sources:
            if type(s) is _Slot:
                count += 1
            elif type(s) is tuple:
                count += sum(type(x) is _Slot for x in s)
            elif type(s) is dict:
                count += sum(type(x) is _Slot for x in s.values())
        return count

    @staticmethod
    def _value(source: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if type(source) is _Slot:
            return args[source.index] if type(source.index) is int else kwargs[source.index]
        if type(source) is tuple and any(type(s) is _Slot for s in source):  # *args
            return tuple(_CallPlan._value(s, args, kwargs) for s in source)
        if type(source) is dict and any(type(s) is _Slot for s in source.values()):  # **kwargs
            return {k: _CallPlan._value(s, args, kwargs) for k, s in source.items()}
        return source  # a default value

    def apply(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        value = self._value
        return ({n: value(s, args, kwargs) for n, s in self.bind},
                tuple(value(s, args, kwargs) for s in self.args),
                {k: value(s, args, kwargs) for k, s in self.kwargs})


def _call(store: _TraceStore, key: Any, tracer: _core.Tracer, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> Any:
    captured = tracer.trace_captured
    out = tracer(*args, **kwargs)
    if not captured:
        store.enforce_bounds(key)
    return out


def _bind_weakly(fn: Callable[..., Any], context: Any, label: str) -> Callable[..., Any]:
    """fn with its first argument bound to a weak reference of context: the tracer (kept in a
    WeakKeyDictionary under the context) must not keep the context alive, or neither would die."""
    ref = weakref.ref(context)

    def bound(*args: Any, **kwargs: Any) -> Any:
        target = ref()
        if target is None:
            raise _core.FailedPrecondition(f"{label}: the object this trace belongs to was deleted")
        return fn(target, *args, **kwargs)

    return bound


_CONTEXT_TYPES: dict[type, bool] = {}


def _is_context(value: Any) -> bool:
    """True for a first argument to bind away (self): anything but a traced input. Decided once
    per type for types that are never inputs."""
    kind = type(value)
    known = _CONTEXT_TYPES.get(kind)
    if known is not None:
        return known
    context = not _is_tracer_valid_value(value)
    if context and kind not in (tuple, list, dict):
        _CONTEXT_TYPES[kind] = True
    return context


class _TraceStore:
    """The tracers of one context (or one bound identity) by trace key, within the decorator's
    bounds. Which to release is decided by the C++ wrappers' own bounds (``_core._TraceBounds``):
    least recently used first, never the newest."""

    def __init__(self, max_traces: int, max_trace_bytes: int) -> None:
        self.bounds = _core._TraceBounds(max_traces, max_trace_bytes)
        self.tracers: dict[Any, _core.Tracer] = {}
        self.last_used: dict[Any, int] = {}
        self.evictions = 0

    def get(self, key: Any, make: Callable[[], _core.Tracer]) -> _core.Tracer:
        tracer = self.tracers.get(key)
        if tracer is None or (not tracer.trace_captured and not tracer.has_function):
            tracer = make()
            self.tracers[key] = tracer
        self.last_used[key] = self.bounds.touch()
        return tracer

    def enforce_bounds(self, newest: Any) -> None:
        """After a capture: releases what the bounds say, least recently used first."""
        keys = list(self.tracers)
        entries = [(self.last_used.get(k, 0), self.tracers[k].trace_bytes) for k in keys]
        for victim in self.bounds.victims(entries, keys.index(newest)):
            key = keys[victim]
            self.tracers.pop(key).release_trace()
            self.last_used.pop(key, None)
            self.evictions += 1

    def release(self) -> None:
        for tracer in self.tracers.values():
            tracer.release_trace()
        self.tracers.clear()
        self.last_used.clear()


def _default_tracer(store: _TraceStore) -> _core.Tracer | None:
    """The tracer of a store's default trace key (with auto_key: the most recently used one made
    without an explicit key)."""
    tracer = store.tracers.get(None)
    if tracer is not None:
        return tracer
    auto = [k for k in store.tracers if type(k) is tuple and len(k) == 2 and k[0] is None]
    if not auto:
        return None
    return store.tracers[max(auto, key=lambda k: store.last_used.get(k, 0))]


class _TracerView(Mapping):
    """The decorator's tracers as ttnn's decorator exposes them: ``wrapper._tracers`` maps a
    context (the bound ``self``) to its Tracer for the default key, ``wrapper._tracers_keyed`` a
    context to ``{trace key: Tracer}``, ``wrapper._tracers_auto`` the identities of the bound
    values (modes 2 and 3) to their Tracer. Read-only views of the live traces."""

    def __init__(self, stores: Callable[[], Any], keyed: bool) -> None:
        self._stores = stores  # () -> mapping of owner -> _TraceStore
        self._keyed = keyed

    def _value(self, store: _TraceStore) -> Any:
        if self._keyed:
            return {k: t for k, t in store.tracers.items() if k is not None}
        return _default_tracer(store)

    def __getitem__(self, owner: Any) -> Any:
        value = self._value(self._stores()[owner])
        if value is None or value == {}:
            raise KeyError(owner)
        return value

    def __iter__(self):
        return iter([o for o, s in list(self._stores().items()) if self._value(s) not in (None, {})])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class TracedFunction(Protocol[R_co]):
    """What ``@traced_function`` makes of a function returning R: called plain, or with
    ``traced=True`` (and the call-time keywords) traced; with the decorator's introspection."""

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...
    def explain(self) -> str: ...
    def tracers(self) -> list[_core.Tracer]: ...
    def release_traces(self) -> None: ...
    _tracers: Mapping[Any, _core.Tracer]
    _tracers_keyed: Mapping[Any, dict[Any, _core.Tracer]]
    _tracers_auto: Mapping[Any, _core.Tracer]


@overload
def traced_function(_fn: Callable[..., R], /) -> TracedFunction[R]: ...


@overload
def traced_function(
    _fn: None = None,
    /,
    *,
    device: Any = None,
    inject_mesh_device: bool = False,
    prep_run: bool = True,
    clone_prep_inputs: bool = True,
    auto_key: bool = False,
    max_traces: int = 0,
    max_trace_bytes: int = 0,
    name: str | None = None,
) -> Callable[[Callable[..., R]], TracedFunction[R]]: ...


def traced_function(
    _fn: Callable[..., Any] | None = None,
    /,
    *,
    device: Any = None,
    inject_mesh_device: bool = False,
    prep_run: bool = True,
    clone_prep_inputs: bool = True,
    auto_key: bool = False,
    max_traces: int = 0,
    max_trace_bytes: int = 0,
    name: str | None = None,
) -> Any:
    """Makes a function or method traceable: ``f(..., traced=True)`` captures on the first call
    and replays afterwards; ``f(...)`` is a plain call. See the module documentation for the
    three device modes and the call-time keywords."""
    if inject_mesh_device and device is not None:
        raise ValueError("@traced_function: inject_mesh_device=True is mutually exclusive with "
                         "device= (the device comes from one or the other)")
    if max_traces < 0 or max_trace_bytes < 0:
        raise ValueError("@traced_function: max_traces and max_trace_bytes must be >= 0, got "
                         f"{max_traces} and {max_trace_bytes}")

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        mesh_param = next((n for n in _MESH_DEVICE_PARAM_NAMES if n in sig.parameters), None)
        label = name or getattr(fn, "__qualname__", "traced function")
        if inject_mesh_device and mesh_param is not None:
            raise ValueError(
                f"@traced_function: {label} declares a {mesh_param!r} parameter but "
                "inject_mesh_device=True would also add one; rename the parameter or drop "
                "inject_mesh_device=True (the parameter is then found by its name)")
        if device is None and not inject_mesh_device and mesh_param is None:
            raise ValueError(
                f"@traced_function: {label} was decorated without device= and has no parameter "
                f"named any of {_MESH_DEVICE_PARAM_NAMES}: pass device= (a Device, or a "
                "callable on the bound context such as lambda self: self.device), declare such a "
                "parameter, or use inject_mesh_device=True")

        by_context: weakref.WeakKeyDictionary[Any, _TraceStore] = weakref.WeakKeyDictionary()
        by_identity: dict[tuple[int, ...], tuple[tuple[Any, ...], _TraceStore]] = {}
        bind_names: list[tuple[str, ...] | None] = [None]
        plans: dict[tuple[int, tuple[str, ...]], _CallPlan] = {}

        def make_tracer(function: Callable[..., Any], dev: Any) -> _core.Tracer:
            if not isinstance(dev, _core.Device):
                raise _core.InvalidType(
                    f"@traced_function: {label}: the device is a {type(dev).__name__}, "
                    "expected a retrace.Device")
            return _core.Tracer(function, device=dev, prep_run=prep_run,
                                clone_prep_inputs=clone_prep_inputs, name=label)

        def trace_key(explicit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if auto_key:
                return (explicit, _core._signature(*args, **kwargs))
            return explicit

        @functools.wraps(fn)
        def wrapper(*args: Any, traced: bool = False, **kwargs: Any) -> Any:
            explicit_key = kwargs.pop("tracer_trace_key", None)
            injected = _OMITTED
            if inject_mesh_device:
                supplied = [(n, kwargs.pop(n)) for n in _MESH_DEVICE_PARAM_NAMES if n in kwargs]
                if len(supplied) > 1:
                    raise TypeError(
                        f"@traced_function: {label}: pass only one of "
                        f"{_MESH_DEVICE_PARAM_NAMES} as the injected mesh-device kwarg, got both")
                if supplied:
                    injected = supplied[0][1]
            if not traced:
                for k in _TRACER_CALL_KWARGS:
                    kwargs.pop(k, None)
                return fn(*args, **kwargs)

            call_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _TRACER_CALL_KWARGS}

            if device is None:
                # Modes 2 and 3: bind what is not a traced input, key the tracer by identity.
                if bind_names[0] is None:
                    bound = sig.bind(*args, **kwargs)
                    bound.apply_defaults()
                    bind_names[0] = tuple(
                        n for n in sig.parameters
                        if n in bound.arguments and not _is_tracer_valid_value(bound.arguments[n]))
                    names = bind_names[0]
                    if not inject_mesh_device and mesh_param not in names:
                        value = bound.arguments.get(mesh_param)
                        raise TypeError(
                            f"@traced_function: {label}: {mesh_param!r} must be a retrace.Device, "
                            f"got {type(value).__name__} (expected {mesh_param!r} to be a "
                            f"non-tracer-valid value, got {type(value).__name__}={value!r})")
                # How this call shape maps onto the parameters: worked out once per shape.
                shape = (len(args), tuple(kwargs))
                plan = plans.get(shape)
                if plan is None:
                    plan = _CallPlan(sig, bind_names[0], len(args), tuple(kwargs), label)
                    plans[shape] = plan
                bind_values, call_args, call_kwargs_in = plan.apply(args, kwargs)
                if inject_mesh_device:
                    if injected is _OMITTED:
                        raise TypeError(
                            f"@traced_function: {label} was called with traced=True but none of "
                            f"{_MESH_DEVICE_PARAM_NAMES} were supplied as kwargs (required when "
                            "inject_mesh_device=True)")
                    dev = injected
                    identity_values = (dev, *bind_values.values())
                else:
                    dev = bind_values[mesh_param]
                    identity_values = tuple(bind_values.values())
                identity = tuple(id(v) for v in identity_values)
                entry = by_identity.get(identity)
                if entry is None:
                    # The values are held, so their ids cannot be reused by other objects.
                    entry = (identity_values, _TraceStore(max_traces, max_trace_bytes))
                    by_identity[identity] = entry
                store = entry[1]
                key = trace_key(explicit_key, call_args, call_kwargs_in)
                tracer = store.get(
                    key, lambda: make_tracer(functools.partial(fn, **bind_values), dev))
                call_kwargs_in.update(call_kwargs)
                return _call(store, key, tracer, call_args, call_kwargs_in)

            # Mode 1: the first positional argument is the context.
            if args and _is_context(args[0]):
                context, rest = args[0], args[1:]
                try:
                    store = by_context.get(context)
                    if store is None:
                        store = _TraceStore(max_traces, max_trace_bytes)
                        by_context[context] = store
                except TypeError as error:
                    raise TypeError(
                        f"@traced_function: {label}: the context {type(context).__name__} cannot "
                        "be referenced weakly (give its class __weakref__ or drop __slots__)"
                    ) from error
                key = trace_key(explicit_key, rest, kwargs)

                def make() -> _core.Tracer:
                    dev = device(context) if callable(device) else device
                    return make_tracer(_bind_weakly(fn, context, label), dev)

                return _call(store, key, store.get(key, make), rest, {**kwargs, **call_kwargs})
            raise TypeError(
                f"@traced_function: {label} was called with traced=True, but device= was provided "
                "at decoration time and the first positional argument is not a bindable context "
                "(it is a traced input or absent); standalone functions declare a 'mesh_device' "
                "or 'device' parameter instead")

        def tracers() -> list[_core.Tracer]:
            out = []
            for store in list(by_context.values()) + [e[1] for e in by_identity.values()]:
                out.extend(store.tracers.values())
            return out

        def release_traces() -> None:
            for store in list(by_context.values()) + [e[1] for e in by_identity.values()]:
                store.release()
            by_identity.clear()

        def explain() -> str:
            lines = []
            for store in list(by_context.values()) + [e[1] for e in by_identity.values()]:
                for key, tracer in store.tracers.items():
                    stats = tracer.stats
                    lines.append(
                        f"{label} key={key!r}: captured={tracer.trace_captured} "
                        f"captures={stats['captures']} replays={stats['replays']} "
                        f"trace_bytes={stats['trace_bytes']} "
                        f"reason={tracer.last_capture_reason!r}")
            return "\n".join(lines) if lines else f"{label}: no traces"

        wrapper._tracers = _TracerView(lambda: by_context, keyed=False)  # type: ignore[attr-defined]
        wrapper._tracers_keyed = _TracerView(lambda: by_context, keyed=True)  # type: ignore[attr-defined]
        wrapper._tracers_auto = _TracerView(  # type: ignore[attr-defined]
            lambda: {identity: store for identity, (_, store) in by_identity.items()}, keyed=False)
        wrapper.tracers = tracers  # type: ignore[attr-defined]
        wrapper.release_traces = release_traces  # type: ignore[attr-defined]
        wrapper.explain = explain  # type: ignore[attr-defined]
        return wrapper

    if _fn is not None:
        return decorator(_fn)
    return decorator
