"""retrace: capture a function's device work once, replay it safely many times.

    import numpy as np
    import retrace
    from retrace import ops

    device = retrace.open_device("cpu")

    @retrace.traced_function(inject_mesh_device=True)
    def step(x, scale):
        return ops.mul(ops.add(x, 1.0), scale)

    x = retrace.from_numpy(np.ones((2, 64), np.float32), device=device)
    y = step(x, 0.5, device=device, traced=True)   # captures, runs once
    y = step(x, 0.5, device=device, traced=True)   # replays (the same output object)

Replay runs entirely in C++: the inputs are checked and copied into the trace's input slots,
the trace runs, and the same output objects come back. docs/python.md is the manual and
docs/contract.md the rules.
"""

from ._core import (  # noqa: F401
    DType,
    Layout,
    Device,
    Tensor,
    Tracer,
    Generator,
    Error,
    InvalidArgument,
    InvalidType,
    FailedPrecondition,
    CaptureViolation,
    OutOfMemory,
    DeviceError,
    Unimplemented,
    float32,
    bfloat16,
    float16,
    int32,
    uint32,
    int64,
    uint8,
    bool as bool_,
    ROW_MAJOR_LAYOUT,
    TILE_LAYOUT,
    open_device,
    available_backends,
    from_numpy,
    from_dlpack,
    empty,
    ops,
    MeshDevice,
    MeshTensor,
    Placement,
    open_mesh,
    distribute,
    gather_to_host,
    gather_shards,
    mpi,
)
from ._tracing import StateTensor, TracedFunction, traced_function  # noqa: F401
from ._mesh import mesh_map  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "DType", "Layout", "Device", "Tensor", "Tracer", "Generator", "StateTensor", "TracedFunction", "traced_function",
    "Error", "InvalidArgument", "InvalidType", "FailedPrecondition", "CaptureViolation",
    "OutOfMemory", "DeviceError", "Unimplemented",
    "float32", "bfloat16", "float16", "int32", "uint32", "int64", "uint8", "bool_", "ROW_MAJOR_LAYOUT", "TILE_LAYOUT",
    "open_device", "available_backends", "from_numpy", "from_dlpack", "empty", "ops",
    "MeshDevice", "MeshTensor", "Placement", "open_mesh", "distribute", "gather_to_host",
    "gather_shards", "mesh_map", "mpi",
]
