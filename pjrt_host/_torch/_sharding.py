"""Where a storage's array lives: one device, or a mesh of devices.

A storage's ``place`` is its device index (an int, ``jax:N``) for an array
on one device -- every tensor until it is sharded -- or a
:class:`MeshPlacement` for an array spread over a ``jax.sharding.Mesh``
(``pjrt_host.spmd.mark_sharding``).  A sharded storage's array carries its
own ``NamedSharding``; the placement only says which devices, in which
order, so that the compiled-op engine can tell in one comparison whether an
op's operands can meet in one ``jax.jit`` call (jax requires one device
assignment per call).

When they cannot (a sharded tensor meets one on a single device, or two
meshes over different devices), :func:`unify` moves the odd ones onto the
first mesh, replicated: the op then runs on the mesh and its results are
sharded as XLA propagates them.  Nothing here branches on the device kind:
how devices are arranged into a mesh is the plugin's business
(``DevicePlugin.mesh_device_order``).
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from . import _devices

__all__ = [
    "MeshPlacement", "constraint_sharding", "device_put", "local_index", "mesh_by_key", "placement", "placement_of_array", "put",
    "register_mesh", "settle", "spec_key", "unify",
]


class MeshPlacement:
    """A mesh's devices, in the mesh's (row-major) order: what jax requires
    to be the same for every committed argument of one jitted call.
    ``index`` is the 'jax:N' index a sharded tensor reports as its torch
    device (the lowest-numbered of the mesh's devices this process holds:
    jax:0 for any mesh over all devices)."""

    __slots__ = ("mesh", "ids", "index", "replicated", "_hash")

    def __init__(self, mesh: Any, index: int) -> None:
        self.mesh = mesh
        self.ids = tuple(int(d.id) for d in mesh.devices.flat)
        self.index = index
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self._hash = hash(self.ids)

    def __eq__(self, other: object) -> bool:
        return type(other) is MeshPlacement and other.ids == self.ids  # type: ignore[union-attr]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"MeshPlacement({dict(self.mesh.shape)}, devices={list(self.ids)})"


_placements: dict[Any, MeshPlacement] = {}
_local: dict[int, int] | None = None


def local_index(device: Any) -> int | None:
    """The 'jax:N' index of a jax device of this process (None: another
    process's device)."""
    global _local
    if _local is None:
        _local = {int(d.id): i for i, d in enumerate(_devices._all())}
    return _local.get(int(device.id))


def placement(mesh: Any) -> MeshPlacement:
    """The placement of arrays sharded over the jax mesh ``mesh``."""
    p = _placements.get(mesh)
    if p is None:
        local = [i for i in (local_index(d) for d in mesh.devices.flat) if i is not None]
        index = min(local) if local else None
        if index is None:
            raise ValueError(f"pjrt_host: the mesh {dict(mesh.shape)} holds none of this process's devices")
        p = _placements[mesh] = MeshPlacement(mesh, index)
    return p


def placement_of_array(array: Any) -> Any:
    """The place (an int or a MeshPlacement) of a jax array made elsewhere
    (a compiled graph's result, an array handed in by the user)."""
    s = array.sharding
    if isinstance(s, SingleDeviceSharding):
        index = local_index(next(iter(s.device_set)))
        if index is not None:
            return index
    if isinstance(s, NamedSharding):
        return placement(s.mesh)
    devices = np.array(s._device_assignment)
    if devices.size == 1 and local_index(devices[0]) is not None:
        return local_index(devices[0])
    return placement(jax.sharding.Mesh(devices, ("devices",)))


def _assignment(s: Any) -> tuple[int, ...]:
    if isinstance(s, NamedSharding):
        return tuple(int(d.id) for d in s.mesh.devices.flat)
    if isinstance(s, SingleDeviceSharding):
        return (int(next(iter(s.device_set)).id),)
    return tuple(int(d.id) for d in s._device_assignment)


def device_put(value: Any, sharding: Any) -> Any:
    """``jax.device_put`` that also reaches a mesh spanning several processes
    from an array this process holds whole (each process supplies its own
    shards from its copy: every process holds the same values, as for any
    tensor a program computes alike everywhere), and a single device from
    an array spread over several processes (gathered).  ``sharding`` may
    be a device."""
    if not isinstance(sharding, jax.sharding.Sharding) or sharding.is_fully_addressable:
        if not getattr(value, "is_fully_addressable", True):
            from jax.experimental import multihost_utils

            value = multihost_utils.process_allgather(value, tiled=True)
        return jax.device_put(value, sharding)
    if getattr(value, "is_fully_addressable", True):
        host = np.asarray(value)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.device_put(value, sharding)


def _onto(array: Any, place: MeshPlacement) -> Any:
    """``array`` on ``place``'s devices: with the same partition spec when it
    is sharded over a mesh of the same axes, else replicated."""
    s = array.sharding
    if isinstance(s, NamedSharding) and s.spec and array.ndim:
        try:
            return device_put(array, NamedSharding(place.mesh, s.spec))
        except Exception:
            pass
    return device_put(array, place.replicated)


def unify(devs: list, dyn: list) -> MeshPlacement | None:
    """Operands on different places (``devs``: each tensor operand's place,
    ``dyn``: the values a compiled op takes).  With a mesh among them, move
    every jax array that is not on the first mesh onto it (in ``dyn``) and
    return that placement; None when all are single devices (torch's
    different-devices error is the caller's)."""
    place = next((d for d in devs if type(d) is MeshPlacement), None)
    if place is None:
        return None
    onto_mesh(dyn, place)
    return place


def onto_mesh(dyn: list, place: MeshPlacement) -> list:
    """``dyn`` (in place) with every jax array that is not on ``place`` moved
    onto it: also what a fused segment computed for a value that was pending
    when :func:`unify` looked (it runs on one device)."""
    for i, v in enumerate(dyn):
        if isinstance(v, jax.Array) and _assignment(v.sharding) != place.ids:
            dyn[i] = _onto(v, place)
    return dyn


def settle(result: Any, previous: Any) -> Any:
    """``result`` laid out as ``previous`` was: an in-place op keeps the
    placement and sharding of the tensor it writes, as an in-place op on
    torch never moves a tensor."""
    target = previous.sharding
    if result.sharding == target:
        return result
    return device_put(result, target)


def put(value: Any, storage: Any) -> Any:
    """``value`` (a jax array of the storage's shape, or broadcastable to a
    view's) where ``storage``'s values live, ready to be written there."""
    place = storage.place
    if type(place) is int:
        target = _devices.sharding(place)
        if value.sharding != target:
            value = device_put(value, target)
        return value
    if _assignment(value.sharding) != place.ids:
        value = _onto(value, place)
    return value


# ---------------------------------------------------------------- meshes by key

# torch.compile carries a mesh into a graph as a string (a custom op's
# arguments are torch types): the key of a registered mesh.
_meshes: dict[str, Any] = {}


def register_mesh(mesh: Any) -> str:
    """A key naming the jax mesh ``mesh`` in a graph (same mesh, same key)."""
    for key, m in _meshes.items():
        if m is mesh or m == mesh:
            return key
    key = f"mesh{len(_meshes)}"
    _meshes[key] = mesh
    return key


def mesh_by_key(key: str) -> Any:
    return _meshes[key]


def spec_key(spec: tuple) -> str:
    """A partition spec (entries None, a name, or a tuple of names) as a string."""
    return json.dumps([list(e) if isinstance(e, tuple) else e for e in spec])


def constraint_sharding(mesh_key: str, spec: str) -> NamedSharding:
    entries = [tuple(e) if isinstance(e, list) else e for e in json.loads(spec)]
    return NamedSharding(_meshes[mesh_key], PartitionSpec(*entries))
