"""SPMD: every device of the plugin as one mesh, and torch tensors sharded over it.

The names are PyTorch/XLA's (``torch_xla.distributed.spmd``)::

    import numpy as np
    import pjrt_host.spmd as xs

    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    w = torch.randn(1024, 4096, device="jax")
    xs.mark_sharding(w, mesh, (None, "model"))   # columns split over 'model'

A sharded 'jax' tensor holds one ``jax.Array`` with a ``NamedSharding``
(:func:`jax_array` returns it).  Ops on it are the same compiled ops as on
one device: jax compiles them for the mesh (GSPMD) and their results are
sharded as XLA propagates the inputs' shardings.  An in-place op keeps the
sharding of the tensor it writes.  A tensor on one device that meets a
sharded one is copied onto the mesh, replicated, for that op.
``.cpu()``, printing and ``torch.save`` gather the whole tensor.

Inside ``torch.compile(backend='jax')``, :func:`mark_sharding` is a sharding
constraint on the value (``jax.lax.with_sharding_constraint``): use the
tensor it returns.

See docs/spmd.md.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any, Iterable, Sequence

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from ._jax_settings import x64_api as _x64_api
from . import _runtime
from ._torch import _hiding
from ._torch import _devices, _loader, _sharded_storage, _sharding, _tensor
from ._torch._tensor import JaxTensor

__all__ = [
    "Mesh", "ShardingError", "clear_sharding", "create_mesh", "get_1d_mesh", "get_global_mesh", "get_partition_spec",
    "get_sharding", "global_device_count", "jax_array", "make_global_tensor", "mark_sharding", "set_global_mesh",
    "with_sharding_constraint",
]


class ShardingError(ValueError):
    """A mesh or a partition spec that cannot be: the message names the
    tensor's shape, the mesh and the fix."""


def _global_devices() -> list[Any]:
    """The plugin's devices in every process of the job, device id i = i-th."""
    _loader.device()  # the device's dispatcher: tensors may be made here first
    _devices._all()  # the client, and jax's settings for the device
    return list(jax.devices(_runtime.backend_name()))


def global_device_count() -> int:
    """Number of the plugin's devices across all processes (a mesh's ids are below it)."""
    return len(_global_devices())


class Mesh:
    """A logical arrangement of the plugin's devices, with named axes.

    ``device_ids``: ids of the devices (0 ... :func:`global_device_count` - 1,
    all processes' devices in a multi-process job), in the order they fill
    the mesh (row-major); ``mesh_shape``: the mesh's size along each axis;
    ``axis_names``: a name per axis (default ``axis_0``, ``axis_1``, ...).
    ``jax_mesh`` is the ``jax.sharding.Mesh`` underneath."""

    def __init__(self, device_ids: Sequence[int] | np.ndarray, mesh_shape: Sequence[int],
                 axis_names: Sequence[str] | None = None) -> None:
        ids = np.asarray(device_ids).reshape(-1)
        mesh_shape = tuple(int(s) for s in mesh_shape)
        if axis_names is None:
            axis_names = tuple(f"axis_{i}" for i in range(len(mesh_shape)))
        axis_names = tuple(str(a) for a in axis_names)
        devices = _global_devices()
        n = len(devices)
        what = f"Mesh(device_ids={ids.tolist()}, mesh_shape={mesh_shape}, axis_names={axis_names})"
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ShardingError(f"pjrt_host.spmd: {what}: device ids must be integers 0 ... {n - 1}")
        if len(axis_names) != len(mesh_shape):
            raise ShardingError(f"pjrt_host.spmd: {what}: {len(mesh_shape)} mesh dimensions but {len(axis_names)} "
                                "axis names; give one name per dimension")
        if len(set(axis_names)) != len(axis_names):
            raise ShardingError(f"pjrt_host.spmd: {what}: axis names repeat; give each axis its own name")
        if math.prod(mesh_shape) != ids.size:
            raise ShardingError(
                f"pjrt_host.spmd: {what}: a mesh of shape {mesh_shape} holds {math.prod(mesh_shape)} devices but "
                f"{ids.size} device ids were given; pass as many ids as the mesh's shape multiplies to")
        bad = [int(i) for i in ids if not 0 <= int(i) < n]
        if bad:
            raise ShardingError(
                f"pjrt_host.spmd: {what}: no device with id {bad[0]}: the selected plugin "
                f"({_runtime.plugin().describe()}) has {n} device(s) in this job, ids 0 ... {n - 1}; use ids "
                f"among them, e.g. Mesh(np.arange({n}), ({n},)) (pjrt_host.spmd.global_device_count() tells the "
                "number)")
        if len(set(ids.tolist())) != ids.size:
            raise ShardingError(f"pjrt_host.spmd: {what}: a device id repeats; each device may appear once")
        self.device_ids = tuple(int(i) for i in ids)
        self.mesh_shape = mesh_shape
        self.axis_names = axis_names
        self.jax_mesh = jax.sharding.Mesh(np.array([devices[i] for i in self.device_ids],
                                                   dtype=object).reshape(mesh_shape), axis_names)
        self._placement = _sharding.placement(self.jax_mesh)
        self._key = _sharding.register_mesh(self.jax_mesh)

    def size(self) -> int:
        return len(self.device_ids)

    def shape(self) -> collections.OrderedDict:
        """Axis name -> size, in order (as PyTorch/XLA's ``Mesh.shape()``)."""
        return collections.OrderedDict(zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids arranged in the mesh's shape."""
        return np.array(self.device_ids).reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        return self.axis_names.index(name) if name in self.axis_names else None

    def __repr__(self) -> str:
        axes = ", ".join(f"'{a}': {s}" for a, s in zip(self.axis_names, self.mesh_shape))
        return f"Mesh({{{axes}}}, device_ids={list(self.device_ids)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and other.jax_mesh == self.jax_mesh

    def __hash__(self) -> int:
        return hash(self.jax_mesh)


def create_mesh(mesh_shape: Sequence[int], axis_names: Sequence[str] | None = None) -> Mesh:
    """A mesh over all the plugin's devices, in the order the plugin
    prefers for this shape (``DevicePlugin.mesh_device_order``: e.g. one
    that keeps a torus's neighbours adjacent), else by id."""
    devices = _global_devices()
    mesh_shape = tuple(int(s) for s in mesh_shape)
    order = None
    if math.prod(mesh_shape) == len(devices):
        order = _runtime.plugin().mesh_device_order(mesh_shape, devices)
    ids = np.arange(len(devices)) if order is None else np.asarray(list(order))
    return Mesh(ids, mesh_shape, axis_names)


def get_1d_mesh(axis_name: str | None = "data") -> Mesh:
    """All devices along one axis."""
    n = global_device_count()
    return create_mesh((n,), (axis_name,) if axis_name is not None else None)


_global_mesh: Mesh | None = None
_global_lock = threading.Lock()


def set_global_mesh(mesh: Mesh | None) -> None:
    """The mesh :func:`mark_sharding` uses when it is given none."""
    global _global_mesh
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"pjrt_host.spmd.set_global_mesh expects a Mesh, got {type(mesh).__name__}")
    with _global_lock:
        _global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    return _global_mesh


# ---------------------------------------------------------------- specs


def _mesh(mesh: Mesh | None, what: str) -> Mesh:
    if mesh is None:
        mesh = _global_mesh
        if mesh is None:
            raise ShardingError(f"pjrt_host.spmd.{what}: no mesh given and no global mesh set; pass a Mesh or "
                                "call pjrt_host.spmd.set_global_mesh(mesh) first")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"pjrt_host.spmd.{what}: expected a pjrt_host.spmd.Mesh, got {type(mesh).__name__}")
    return mesh


def _spec(shape: tuple[int, ...], mesh: Mesh, partition_spec: Iterable[Any] | None, what: str) -> tuple:
    """The spec as jax takes it (axis names, tuples of names, None), one
    entry per dimension, checked against the tensor's shape and the mesh."""
    spec = tuple(partition_spec) if partition_spec is not None else ()
    where = f"pjrt_host.spmd.{what}: tensor of shape {tuple(shape)}, {mesh}, partition_spec {spec}"
    if len(spec) > len(shape):
        raise ShardingError(
            f"{where}: the spec has {len(spec)} entries but the tensor has {len(shape)} dimension(s); give at "
            f"most one entry per dimension (None for a dimension that is not split), e.g. "
            f"{tuple(list(spec[:len(shape)]))}")
    names = mesh.axis_names
    used: dict[str, int] = {}
    out = []
    for dim, entry in enumerate(spec):
        if entry is None:
            out.append(None)
            continue
        group = entry if isinstance(entry, (tuple, list)) else (entry,)
        axes = []
        for a in group:
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                if not 0 <= int(a) < len(names):
                    raise ShardingError(f"{where}: mesh axis index {a} out of range; the mesh has axes "
                                        f"0 ... {len(names) - 1} ({', '.join(names)})")
                a = names[int(a)]
            if a not in names:
                raise ShardingError(f"{where}: {a!r} is not an axis of the mesh; use one of "
                                    f"{', '.join(repr(n) for n in names)} or None")
            if a in used:
                raise ShardingError(f"{where}: mesh axis {a!r} splits dimensions {used[a]} and {dim}; an axis "
                                    "may split one dimension only")
            used[a] = dim
            axes.append(a)
        ways = math.prod(mesh.shape()[a] for a in axes)
        if shape[dim] % ways:
            raise ShardingError(
                f"{where}: dimension {dim} (size {shape[dim]}) is not divisible by {ways}, the size of mesh "
                f"axes {tuple(axes)}; pad that dimension to a multiple of {ways}, split another dimension, or "
                "leave it whole (None)")
        out.append(axes[0] if len(axes) == 1 and not isinstance(entry, (tuple, list)) else tuple(axes))
    return tuple(out)


def _jax_tensor(t: Any, what: str) -> JaxTensor:
    if not isinstance(t, JaxTensor):
        device = getattr(t, "device", type(t).__name__)
        raise ShardingError(f"pjrt_host.spmd.{what}: expected a tensor on the 'jax' device, got one on {device}; "
                            "move it first (t.to('jax'))")
    return t


# ---------------------------------------------------------------- sharding tensors


def _traced(t: Any) -> bool:
    """A fake or functional 'jax' tensor: a trace (``assume_pure``) is running."""
    return isinstance(t, torch.Tensor) and not isinstance(t, JaxTensor) and t.device.type == _devices.DEVICE_NAME


@_x64_api
def mark_sharding(t: torch.Tensor, mesh: Mesh | None, partition_spec: Iterable[Any]) -> torch.Tensor:
    """Shard ``t`` over ``mesh`` (None: the global mesh): entry i of
    ``partition_spec`` says which mesh axis (a name, an axis index, a tuple
    of them, or None: not split) splits dimension i.  Entries may be fewer
    than dimensions (the rest are not split).

    Eagerly ``t`` itself is resharded (every view of it sees the new
    placement) and returned.  Inside ``torch.compile`` or an
    ``assume_pure`` function it is a sharding constraint on the value: the
    result is the constrained tensor."""
    mesh = _mesh(mesh, "mark_sharding")
    spec = _spec(tuple(t.shape), mesh, partition_spec, "mark_sharding")
    if _hiding.dynamo_compiling() or _traced(t):
        return torch.ops.pjrt_host.sharding_constraint(t, mesh._key, _sharding.spec_key(spec))
    t = _jax_tensor(t, "mark_sharding")
    held = _sharded_storage.storage_spec(t, spec)
    if held is None:
        raise ShardingError(
            f"pjrt_host.spmd.mark_sharding: the tensor of shape {tuple(t.shape)} is a view of a tensor of shape "
            f"{_sharded_storage.storage_shape(t)}; shard that tensor, or shard a copy (t.clone())")
    place = mesh._placement
    if t.device.index != place.index:
        raise ShardingError(
            f"pjrt_host.spmd.mark_sharding: the tensor of shape {tuple(t.shape)} is on {t.device}, but tensors "
            f"sharded over {mesh} report 'jax:{place.index}' (the lowest-numbered of its devices in this process); move it "
            f"there first (t.to('jax:{place.index}'), model.to('jax:{place.index}'))")
    _sharded_storage.shard(t, NamedSharding(mesh.jax_mesh, PartitionSpec(*held)), place)
    return t


@_x64_api
def with_sharding_constraint(t: torch.Tensor, mesh: Mesh | None, partition_spec: Iterable[Any]) -> torch.Tensor:
    """A new tensor with ``t``'s values sharded as given (``t`` is left as it
    is); inside ``torch.compile``, ``jax.lax.with_sharding_constraint``.
    Differentiable: the gradient is constrained the same way."""
    mesh = _mesh(mesh, "with_sharding_constraint")
    spec = _spec(tuple(t.shape), mesh, partition_spec, "with_sharding_constraint")
    if not _hiding.dynamo_compiling() and not _traced(t):
        _jax_tensor(t, "with_sharding_constraint")
    return torch.ops.pjrt_host.sharding_constraint(t, mesh._key, _sharding.spec_key(spec))


@_x64_api
def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Gather ``t``'s storage onto its torch device (``t.device``): it is an
    unsharded tensor again.  Returns ``t``."""
    _sharded_storage.unshard(_jax_tensor(t, "clear_sharding"))
    return t


@_x64_api
def jax_array(t: torch.Tensor) -> jax.Array:
    """The ``jax.Array`` holding ``t``'s values (for a sharded tensor, one
    array with its ``NamedSharding``; for a view, computed from its storage).
    Do not write through it: jax arrays are immutable and the tensor's
    storage may share it."""
    return _tensor.read(_jax_tensor(t, "jax_array"))


@_x64_api
def get_sharding(t: torch.Tensor) -> NamedSharding | None:
    """The ``NamedSharding`` of a sharded tensor; None for a tensor on one device."""
    t = _jax_tensor(t, "get_sharding")
    place = _sharded_storage.placement(t)
    if type(place) is int:
        return None
    s = _tensor.read(t).sharding
    if not isinstance(s, NamedSharding):
        s = NamedSharding(place.mesh, PartitionSpec())  # a layout jax gave without a spec
    return s


def get_partition_spec(t: torch.Tensor) -> tuple | None:
    """The partition spec of a sharded tensor, one entry per dimension (None
    for a dimension not split); None for a tensor on one device."""
    s = get_sharding(t)
    if s is None:
        return None
    spec = tuple(s.spec) + (None,) * (t.dim() - len(s.spec))
    return spec


@_x64_api
def make_global_tensor(local: torch.Tensor, mesh: Mesh | None, partition_spec: Iterable[Any],
                       global_shape: Sequence[int] | None = None) -> torch.Tensor:
    """One sharded 'jax' tensor from each process's part of it
    (``jax.make_array_from_process_local_data``): in a multi-process job,
    every process passes its local rows (e.g. its share of a batch) and all
    get the same global tensor.  ``global_shape`` defaults to the local
    shape scaled by how many processes share each split dimension."""
    mesh = _mesh(mesh, "make_global_tensor")
    host = local.detach().cpu().contiguous()
    if host.dtype == torch.bfloat16:
        values = host.view(torch.int16).numpy().view(jax.numpy.bfloat16)
    else:
        values = host.numpy()
    shape = tuple(global_shape) if global_shape is not None else None
    if shape is None:
        # Each process holds 1/k of a split dimension, k = the processes along its mesh axes.
        raw = tuple(partition_spec)
        shape = list(values.shape)
        for dim, entry in enumerate(raw):
            if entry is None:
                continue
            group = entry if isinstance(entry, (tuple, list)) else (entry,)
            axes = [mesh.axis_names[a] if isinstance(a, int) else a for a in group]
            shape[dim] *= _processes_along(mesh, axes)
        shape = tuple(shape)
    spec = _spec(shape, mesh, partition_spec, "make_global_tensor")
    sharding = NamedSharding(mesh.jax_mesh, PartitionSpec(*spec))
    arr = jax.make_array_from_process_local_data(sharding, values, shape)
    place = mesh._placement
    dtype = local.dtype
    return _tensor.wrap_array(arr, place.index, dtype, place)


def _processes_along(mesh: Mesh, axes: Sequence[str]) -> int:
    """How many distinct processes the devices along ``axes`` belong to."""
    devices = mesh.jax_mesh.devices
    idx = [mesh.axis_names.index(a) for a in axes]
    moved = np.moveaxis(devices, idx, list(range(len(idx))))
    line = moved.reshape(math.prod(devices.shape[i] for i in idx), -1)[:, 0]
    return len({d.process_index for d in line})


# ---------------------------------------------------------------- the constraint as a torch op

@torch.library.custom_op("pjrt_host::sharding_constraint", mutates_args=())
def _sharding_constraint(x: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
    # 'jax' tensors never get here (the device runs the op itself); a tensor of
    # another device has no mesh to be sharded over.
    raise ShardingError(f"pjrt_host.spmd: a tensor on {x.device} cannot be sharded; move it to 'jax' first")


@_sharding_constraint.register_fake
def _(x: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
    return torch.empty_like(x)


def _constraint_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.mesh, ctx.spec = inputs[1], inputs[2]


def _constraint_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    return torch.ops.pjrt_host.sharding_constraint(grad, ctx.mesh, ctx.spec), None, None


_sharding_constraint.register_autograd(_constraint_backward, setup_context=_constraint_setup)
