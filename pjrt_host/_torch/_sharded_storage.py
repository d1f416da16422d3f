"""The storage side of sharding a 'jax' tensor (``pjrt_host.spmd``'s eager
half): a storage laid out over a mesh, gathered back, given the shape a
view needs so that the view can be sharded, and a sharded parameter's
gradient laid out as the parameter.

``spmd`` checks the user's mesh and spec and words the errors; this module
is what it does to storages, so that nothing outside ``_torch`` reaches
into a tensor's storage or view.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from . import _devices, _sharding
from ._sync import note_result
from ._tensor import JaxTensor, Storage, TensorSpec, read, view_for

__all__ = ["grad_follows_parameter", "placement", "shard", "storage_shape", "storage_spec", "unshard"]


def placement(t: JaxTensor) -> Any:
    """Where ``t``'s storage lives: its device index, or a mesh placement."""
    return t._storage.place


def storage_shape(t: JaxTensor) -> tuple[int, ...]:
    return t._storage.shape


def storage_spec(t: JaxTensor, spec: tuple) -> tuple | None:
    """The partition spec of ``t``'s storage that shards ``t`` as ``spec``
    asks: ``spec`` itself for a tensor that is (or can become) its whole
    storage, the spec reordered for a view that permutes its whole storage
    (``w.t()``), None for any other view (it cannot be sharded alone)."""
    if t._view is None or _own_whole_storage(t):
        return spec
    return _storage_spec_of_reordering(t, spec)


def shard(t: JaxTensor, sharding: Any, place: Any) -> None:
    """Lay ``t``'s storage out as ``sharding`` over ``place`` (a mesh
    placement): every tensor over the storage sees it.  A leaf that needs a
    gradient gets it laid out the same way once accumulated."""
    storage = t._storage
    arr = _sharding.device_put(storage.get(), sharding)
    storage.array = arr
    storage.place = place
    note_result(storage.device_index, arr)
    if t.requires_grad and t.is_leaf and not getattr(t, "_pjrt_host_grad_follows", False):
        t.register_post_accumulate_grad_hook(grad_follows_parameter)
        t._pjrt_host_grad_follows = True


def unshard(t: JaxTensor) -> None:
    """Gather ``t``'s storage onto its torch device (a storage on one device
    is left as it is)."""
    storage = t._storage
    if type(storage.place) is not int:
        storage.array = _sharding.device_put(storage.get(), _devices.sharding(storage.device_index))
        storage.place = storage.device_index


class _Holder:
    slot: Any = None


def _own_whole_storage(t: JaxTensor) -> bool:
    """A contiguous reshape of its whole storage (``arange(128).reshape(8,
    16)``, ``x.view(8, 16)``) that no other tensor shares: its storage takes
    its shape, so it can be sharded as any tensor.  False for a view that
    covers part of its storage, reorders it, or shares it (the base still
    in use): sharding the storage would change the others."""
    view = t._view
    storage = t._storage
    if view.kind != "reshape" or view.elem is not None or t.storage_offset() != 0 or t.numel() != storage.numel:
        return False
    return _reshape_storage(t, storage, tuple(t.shape))


def _reshape_storage(t: JaxTensor, storage: Any, shape: tuple[int, ...]) -> bool:
    """Give t's storage the row-major ``shape`` (its values' order kept),
    when only t and its autograd base use the storage; t and the base then
    read it through new views.  False where others may.  (The caller holds
    ``storage`` in a local too: the reference count below counts on it.)"""
    if storage.torch_storage is not None:
        return False
    # References: t's attribute (and its autograd base's, when the base is
    # the storage's other tensor), the caller's local and this frame's
    # argument, getrefcount's argument; counted inline beside an object held
    # the same way (Python versions count differently).
    base = t._base if isinstance(t._base, JaxTensor) and t._base._storage is storage else None
    probe = _Holder()
    probe.slot = marker = object()
    other = marker  # noqa: F841 -- the caller's local, counted alike
    if sys.getrefcount(storage) > sys.getrefcount(marker) + (base is not None):
        return False
    storage.array = storage.get().reshape(shape)
    storage.shape = shape
    storage.spec = TensorSpec((storage.jax_dtype, shape, None))
    t._view = view_for(storage, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if base is not None:  # the base reads the same storage through a reshape now
        base._view = view_for(storage, tuple(base.shape), tuple(base.stride()), base.storage_offset())
    return True


def _storage_spec_of_reordering(t: JaxTensor, spec: tuple) -> tuple | None:
    """For a view that reorders the dims of its whole storage (``w.t()``,
    ``x.permute(...)``): the storage's partition spec that splits the view
    as ``spec`` asks; its base, sharing the storage, is split the same way.
    None for any other view."""
    view = t._view
    if view.kind != "perm" or view.elem is not None:
        return None
    sorted_size, inverse = view.static[3]
    storage = t._storage
    if tuple(sorted_size) != tuple(storage.shape) and not _reshape_storage(t, storage, tuple(sorted_size)):
        return None
    spec = tuple(spec) + (None,) * (t.dim() - len(spec))
    held = [None] * t.dim()
    for d, axis in enumerate(spec):
        held[inverse[d]] = axis
    return tuple(held)


def grad_follows_parameter(p: torch.Tensor) -> None:
    """A sharded leaf's gradient, once accumulated, is sharded like it:
    what XLA propagates to a gradient may be replicated (an embedding's,
    a bias's), and an optimizer's state made from it (SGD's momentum
    ``clone(grad)``) would then be whole on every device."""
    g = p.grad
    if not isinstance(g, JaxTensor) or g.shape != p.shape or p._view is not None:
        return
    target = p._storage
    if type(target.place) is int and type(g._storage.place) is int:
        return
    if g._view is None:
        g._storage.array = _sharding.settle(g._storage.get(), target.get())
        g._storage.place = target.place
    elif g.is_contiguous() and g.storage_offset() == 0:
        # A view (e.g. a slice of a fused gradient): the gradient gets its own storage.
        arr = _sharding.settle(read(g), target.get())
        g._storage = Storage(arr, tuple(g.shape), arr.dtype, target.device_index, target.place)
        g._view = None
