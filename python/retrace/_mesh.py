"""mesh_map: run a function on every member of a mesh, shard by shard."""

from __future__ import annotations

from typing import Any, Callable

from ._core import MeshTensor, InvalidArgument, Tensor


def mesh_map(fn: Callable[..., Tensor], *args: Any, placements: Any = None) -> MeshTensor:
    """Calls ``fn`` once per mesh member, with every MeshTensor argument replaced by that
    member's shard (other arguments are passed as they are); ``fn`` returns the member's Tensor.
    The results form a MeshTensor with ``placements`` (default: those of the first MeshTensor
    argument, as for elementwise ops)."""
    first = next((a for a in args if isinstance(a, MeshTensor)), None)
    if first is None:
        raise InvalidArgument("mesh_map: no mesh tensor among the arguments")
    members = len(first.shards)
    shards = [a.shards if isinstance(a, MeshTensor) else None for a in args]
    for a in args:
        if isinstance(a, MeshTensor) and len(a.shards) != members:
            raise InvalidArgument(f"mesh_map: the mesh tensors live on different meshes "
                                  f"({first!r} and {a!r})")
    out = []
    for i in range(members):
        call_args = [s[i] if s is not None else a for s, a in zip(shards, args)]
        out.append(fn(*call_args))
    return first.with_shards(out, placements)
