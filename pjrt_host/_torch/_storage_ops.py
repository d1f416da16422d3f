"""Ops about a tensor and its storage rather than math, which the device
runs itself: copies between devices, ``_to_copy``, reading a scalar,
cloning (free: jax arrays are immutable), ``set_``, ``resize_``, ``*_like``
factories, and batch norm's running-statistics update.

Declared with :func:`storage_op`; the dispatcher routes these names here
before anything else.  The lowering table has the values of some of them
(``clone``, ``lift_fresh``, ``_to_copy``'s cast, ``copy_``'s new value) for
callers that trace whole graphs; here eager adds what is about storage
(devices, layouts, views, sharing an array).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._mode_utils import no_dispatch

from .. import _lowerings, _program_cache
from .._lowerings._dtypes import dtype_name, jax_dtype, torch_dtype
from .._lowerings._util import broadcast_shapes_or_raise
from ._conversion import to_jax_array, to_torch
from ._devices import DEVICE_NAME, device_index, jax_device
from ._dtype_policy import device_dtype
from ._engine import CompiledOp, missing_lowering
from ._meta import check_out_overlap, meta_view_of
from . import _config, _dynamic_dims, _factories, _fused, _meta, _padding, _sharding, _storage_bridge, _strided
from ._signatures import HostLane, Traceable
from ._sync import last_note, names_failed_collectives, run_deferred_checks
from ._tensor import (JaxTensor, Pending, Storage, contiguous_strides, dense_layout, make, new_tensor, read, view_for,
                      wrap_array, write)

__all__ = ["STORAGE_OPS", "storage_op"]

StorageOp = Callable[[Any, tuple, dict], Any]

#: ATen name (exact overload, or packet for all overloads) -> handler(func, args, kwargs).
STORAGE_OPS: dict[str, StorageOp] = {}


def storage_op(*names: str) -> Callable[[StorageOp], StorageOp]:
    def register(fn: StorageOp) -> StorageOp:
        for name in names:
            if name in STORAGE_OPS:
                raise RuntimeError(f"pjrt_host: storage op {name} is declared twice")
            STORAGE_OPS[name] = fn
        return fn

    return register


def lookup(name: str) -> StorageOp | None:
    """The handler for the op named ``name`` ("aten::add.Tensor"), or None."""
    found = STORAGE_OPS.get(name)
    if found is None:
        found = STORAGE_OPS.get(name.split(".", 1)[0])
    if found is None:
        found = STORAGE_OPS.get(name.split("::", 1)[0] + "::")  # a whole namespace (c10d::)
    return found


def _adopt(t: Any) -> Any:
    """A plain torch tensor on 'jax' -- made in C++ over a torch storage of
    _storage_bridge (torch's storage writers do that) -- as a 'jax' tensor
    over the same data; anything else as it is."""
    if isinstance(t, JaxTensor) or not isinstance(t, torch.Tensor) or t.device.type != DEVICE_NAME:
        return t
    storage = _storage_for(t.untyped_storage(), t.dtype)
    size, stride, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    return make(storage, size, t.dtype, stride, offset, view_for(storage, size, stride, offset))


@storage_op("aten::_to_copy")
def to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    self = _adopt(args[0])
    dtype = kwargs.get("dtype") or self.dtype
    device = kwargs.get("device")
    device = self.device if device is None else torch.device(device)
    if not isinstance(self, JaxTensor):
        # A torch tensor coming to the device (torch.tensor(data, device='jax')).
        index = device_index(device)
        dtype = device_dtype(dtype)
        if self.numel() == 0:  # no values to move (transformers' DynamicCache makes two a layer a forward)
            return new_tensor(tuple(self.shape), dtype, index)
        # (a size that keeps changing at the line: padded on the way)
        padded, mark = _dynamic_dims.move_layout(self, index, last_note(index))
        moved = wrap_array(to_jax_array(self, index, dtype, padded), index, dtype, None, padded, tuple(self.shape))
        if padded is not None:
            _padding.noted_padding()
        _dynamic_dims.moved(mark)
        return moved
    if device.type != DEVICE_NAME:
        return to_torch(self, device, dtype)
    index = device_index(device)
    dtype = device_dtype(dtype)
    storage = self._storage
    stride = strides_for(self, kwargs.get("memory_format", torch.preserve_format))
    if storage.padded is None and index == storage.device_index and stride is None \
            and jax_dtype(dtype) != storage.jax_dtype:
        _dynamic_dims.cast_grows(self)  # (a size that keeps changing at the line: padded first)
    if index == storage.device_index:
        recorded = _recorded_copy(self, stride, dtype, func)
        if recorded is not None:
            return recorded
    if storage.padded is not None and index == storage.device_index and _row_major(tuple(self.shape), stride):
        found = _dynamic_dims.padded_values(self)  # cast padded: one program per bucket
        if found is not None:
            arr, padded = found
            if arr.dtype != jax_dtype(dtype):
                arr = _cast(arr, dtype, func)
            return _strided_as(Storage(arr, tuple(self.shape), arr.dtype, index, storage.place, padded),
                               tuple(self.shape), dtype, stride)
    arr = read(self)
    if arr.dtype != jax_dtype(dtype):
        arr = _cast(arr, dtype, func)
    if index != self._storage.device_index:
        # To another device: a sharded tensor is gathered there.
        arr = _sharding.device_put(arr, jax_device(index))
        return wrap_array(arr, index, dtype)
    return laid_out(arr, index, dtype, self._storage.place, stride)


_read_ops: dict[tuple, Traceable] = {}


def _row_major(size: tuple, stride: tuple | None) -> bool:
    """Whether a copy's ``stride`` (``strides_for``'s; None: row-major)
    lays its values out row-major all the same: they differ from
    row-major ones in dims of size 1 only (a row selected from a longer
    tensor, ``logits[:, i, :]``, keeps its stride there, as CPU's clone
    keeps it)."""
    return stride is None or all(n == 1 or s == c for n, s, c in zip(size, stride, contiguous_strides(size)))


def _strided_as(storage: Storage, size: tuple, dtype: torch.dtype, stride: tuple | None) -> JaxTensor:
    """A tensor over the row-major ``storage`` with ``stride`` (see
    :func:`_row_major`)."""
    if stride is None:
        return make(storage, size, dtype)
    return make(storage, size, dtype, stride, 0, view_for(storage, size, stride, 0))


def _recorded_copy(t: JaxTensor, stride: tuple | None, dtype: torch.dtype | None = None,
                   to_copy: Any = None, clone: Any = None) -> JaxTensor | None:
    """:func:`_recorded_read` of a copy torch gives ``stride`` (None:
    row-major), when those lay it out row-major (:func:`_row_major`).
    ``clone``: the clone op of the call, whose later calls at the copy's
    place in a replayed script take its lane (:class:`_CloneLane`)."""
    size = tuple(t.shape)
    if not _row_major(size, stride):
        return None
    recorded = _recorded_read(t, dtype, to_copy, clone if stride is None else None)
    if recorded is None or stride is None:
        return recorded
    return _strided_as(recorded._storage, size, recorded.dtype, stride)


def _recorded_read(t: JaxTensor, dtype: torch.dtype | None = None, to_copy: Any = None,
                   clone: Any = None) -> JaxTensor | None:
    """Fused eager: a row-major copy of ``t`` in ``dtype`` (a ``clone`` of a
    view, a ``_to_copy``) recorded into the thread's segment, as an op that
    reads ``t``'s storage through its view (and casts), so that the copy is
    made inside the program of the ops around it instead of by a read
    program of its own (GPT-2's ``generate()`` ran 94 per call: the last
    token's logits, the ids' clones).  A padded storage's copy is padded as
    its view reads it.  ``dtype`` None: a copy in ``t``'s dtype (a clone,
    which never casts).  None: it runs now (another mode, a mesh, a view
    that reads other elements than the storage's, or nothing to read or
    cast: the copy shares the storage's array)."""
    if _config.current().eager != "fused":
        return None
    storage, view = t._storage, t._view
    if type(storage.place) is not int or (view is not None and view.elem is not None):
        return None
    shape = tuple(t.shape)
    padded = None
    if storage.padded is not None:
        r = _dynamic_dims.read_of(t) if _config.current().dynamic_shapes else None
        if r is None:
            return None
        static, offset, physical = r.view, (r.offset if r.view is not None else 0), r.psize
        padded = None if r.psize == shape else r.comps
    else:
        static, offset, physical = (None, 0, shape) if view is None else (view.static, view.run_offset, shape)
    if dtype is None:  # (a storage held in another width than t's dtype says: not recorded)
        if jax_dtype(t.dtype) != storage.jax_dtype:
            return None
        dtype = t.dtype
    cast = jax_dtype(dtype) if jax_dtype(dtype) != storage.jax_dtype else None
    if static is None and cast is None:
        return None
    key = (static, dtype_name(storage.jax_dtype), None if cast is None else dtype_name(dtype))
    def make() -> tuple:
        lowering = _lowerings.lookup(to_copy) if cast is not None else None
        ctx = _lowerings.LoweringContext()  # a cast does no matmul and draws nothing

        def body(a: Any, off: Any) -> Any:
            if static is not None:
                a = _strided.read(a, static, off)
            if cast is not None:
                a = _lowerings.invoke(lowering, (a,), {"dtype": dtype}, ctx, cast)
            return a

        return body, _program_cache.jit(body)

    op = _fused.host_op(_read_ops, "pjrt_host.read", key, make)
    plan = _meta.OutputPlan("single", (_meta.OutputSpec("tensor", shape, dtype),))
    array = storage._array if storage.pending else (storage.computed() if storage.padded is not None else storage.get())
    recorded = _fused.record(op, [array, offset], plan, storage.device_index, storage.place,
                             padded=None if padded is None else [(shape, physical, padded)])
    if recorded is not None and clone is not None and storage.padded is None:
        _CloneLane.of(op, clone, key, storage.place, shape, dtype)
    return recorded


class _CloneLane(HostLane):
    """Fused eager's replay lane of a row-major clone of an exact view
    recorded as a read (:func:`_recorded_read`: ``.contiguous()`` after a
    transpose or a permute, a ViT's attention heads five times a layer and
    step): a later call at the read's place in a replayed script, of a view
    with the same static layout and dtype, is recorded again without the
    storage op's checks, its stride rule's meta kernel or the op's key.
    Anything else (a padded storage, another layout, a cast) takes the
    clone's own way."""

    __slots__ = ()

    def _call(self, args: tuple, kwargs: dict) -> tuple | None:
        """``(key, [array, offset])`` of a call :func:`clone` records as a
        read of a row-major copy; None for any other."""
        if len(args) != 1 or (kwargs and (len(kwargs) != 1 or "memory_format" not in kwargs)):
            return None
        t = args[0]
        if type(t) is not JaxTensor:
            return None
        storage, view = t._storage, t._view
        if view is None or view.elem is not None or storage.padded is not None or storage.place != self.place \
                or view.static is None or jax_dtype(t.dtype) != storage.jax_dtype:
            return None
        if strides_for(t, kwargs.get("memory_format", torch.preserve_format)) is not None:
            return None
        array = storage._array if storage.pending else storage.get()
        return (view.static, dtype_name(storage.jax_dtype), None), [array, view.run_offset]

    def match(self, args: tuple, kwargs: dict, dyn: list, place: int) -> tuple | None:
        """``(((shape, shape, None),), None)`` when the call is a clone of
        this lane's key (its inputs appended to ``dyn``), None when not."""
        call = self._call(args, kwargs)
        if call is None or call[0] != self.key or args[0].dtype != self.outputs[0][1]:
            return None
        dyn.extend(call[1])
        shape = self.outputs[0][0]
        return ((shape, shape, None),), None

    def engine_key(self, args: tuple, kwargs: dict, cfg: Any, results: tuple) -> tuple:
        """The key and inputs :func:`clone`'s way gives the call
        (``PJRT_HOST_CHECK_REPLAY``), after checking its result's shape and
        dtype are the lane's."""
        call = self._call(args, kwargs)
        t = args[0]
        if call is None or tuple(t.shape) != self.outputs[0][0] or t.dtype != self.outputs[0][1]:
            raise AssertionError("pjrt_host: fused eager's replay lane took a clone as a recorded read, but the "
                                 "clone's own way would not record it so")
        return call


_cast_cache: dict[torch.dtype, Any] = {}


def _cast(arr: Any, dtype: torch.dtype, to_copy: Any) -> Any:
    """The values of ``arr`` in ``dtype``: the lowering of ``to_copy`` (the
    ``_to_copy`` overload), as a compiled graph computes them."""
    fn = _cast_cache.get(dtype)
    if fn is None:
        target = jax_dtype(dtype)
        lowering = _lowerings.lookup(to_copy)
        ctx = _lowerings.LoweringContext()  # a cast does no matmul and draws nothing
        fn = _cast_cache[dtype] = _program_cache.Kept(
            "pjrt_host.cast", lambda a: _lowerings.invoke(lowering, (a,), {"dtype": dtype}, ctx, target), str(dtype))
    return fn(arr)


@storage_op("aten::copy_")
def copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = _adopt(args[0]), _adopt(args[1])
    if not isinstance(dst, JaxTensor):
        # A torch tensor (CPU, ...) receiving a 'jax' tensor's values.
        return dst.copy_(to_torch(src, dst.device))
    if src is dst:  # torch's copy_ returns at once (before its overlap check): x.expand(2, 3).copy_(itself)
        return dst
    check_out_overlap([dst], "copy_")
    index = dst._storage.device_index
    if dst._storage.padded is not None and isinstance(src, JaxTensor) and src._storage.place == dst._storage.place \
            and src.dim() <= dst.dim() and _dynamic_dims.write(dst, src):
        return dst  # in the storage's bucket (a padded source as it is laid out)
    if isinstance(src, JaxTensor) and src._storage.padded is not None and _dynamic_dims.adopt(dst, src):
        return dst  # all of an exact storage, laid out as the padded source is
    if isinstance(src, JaxTensor):
        value = read(src)
        if src._storage.place != dst._storage.place:
            value = _sharding.put(value, dst._storage)
    elif isinstance(src, torch.Tensor):
        value = to_jax_array(src, index, device_dtype(src.dtype))
    else:
        value = jnp.asarray(src)
    shape = tuple(dst.shape)
    if tuple(value.shape) != shape:
        wide = broadcast_shapes_or_raise(shape, tuple(value.shape))
        if wide != shape:  # the source broadcasts to the destination, never the other way (jax's ValueError)
            raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape {list(wide)}")
        if dst._view is None:
            value = jnp.broadcast_to(value, shape)
    if dst._storage.padded is not None and _dynamic_dims.write(dst, value):
        return dst
    write(dst, value)
    return dst


@storage_op("aten::_local_scalar_dense", "aten::item")  # item: reached directly in inference mode
@names_failed_collectives
def local_scalar_dense(func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if t._storage.padded is not None:
        # through the host, as ``cpu()``: a cut and a read of the view on the
        # device compiled two programs per logical size (generate()'s last
        # token, ``out[0, -1].item()``, at every prompt length)
        value = to_torch(t, torch.device("cpu")).item()
    else:
        value = np.asarray(read(t)).item()
    run_deferred_checks()
    dtype = args[0].dtype
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if dtype.is_complex:
        return complex(value)
    return int(value)


@storage_op("aten::sparse_dim", "aten::dense_dim")
def sparse_dense_dim(func: Any, args: tuple, kwargs: dict) -> int:
    """A strided tensor's sparse and dense dimensions (0 and its dim()), as
    torch answers for any strided tensor."""
    return 0 if func.name() == "aten::sparse_dim" else args[0].dim()


@storage_op("aten::clone", "aten::lift_fresh_copy")  # lift_fresh_copy: what its decomposition amounts to
def clone(func: Any, args: tuple, kwargs: dict) -> Any:
    """A copy in ``memory_format`` (torch's default, preserve_format: the
    source's own strides where they are dense, as on CPU).  jax arrays
    never change: a clone of a whole storage shares its array until one of
    the two is written (a write replaces the storage's array)."""
    self = args[0]
    storage = self._storage
    view = self._view
    stride = strides_for(self, kwargs.get("memory_format", torch.preserve_format))
    if storage.padded is not None and view is not None and view.kind == "perm" and view.elem is None \
            and stride == tuple(self.stride()):
        # the array (and its padding) shared, as below
        copy = Storage(storage.computed(), storage.shape, storage.jax_dtype, storage.device_index, storage.place,
                       storage.padded)
        return make(copy, tuple(self.shape), self.dtype, stride, 0, view_for(copy, view.size, stride, 0))
    if view is not None or storage.padded is not None:
        recorded = _recorded_copy(self, stride, clone=func)
        if recorded is not None:
            return recorded
    if view is None and stride is None and type(storage._array) is Pending and type(storage.place) is int:
        # fused eager: the copy of a whole storage shares its result still
        # pending, padded or not (reading it ran the segment: autograd clones
        # each parameter's first gradient, 13 programs more a GPT-2 backward;
        # a padded one split each backward layer at every new bucket)
        pending = storage._array
        copy = Storage(None, storage.shape, storage.jax_dtype, storage.device_index, storage.place)
        if pending.segment.share(pending, copy):
            copy.padded = storage.padded  # (after the write, which makes a storage exact)
            return make(copy, tuple(self.shape), self.dtype)
    if storage.padded is not None and _row_major(tuple(self.shape), stride):
        found = _dynamic_dims.padded_values(self)  # a padded copy, when the view is a physical one
        if found is not None:
            arr, padded = found
            return _strided_as(Storage(arr, tuple(self.shape), storage.jax_dtype, storage.device_index,
                                       storage.place, padded), tuple(self.shape), self.dtype, stride)
    if view is None and stride is None:
        return make(Storage(storage.array, storage.shape, storage.jax_dtype, storage.device_index, storage.place),
                    tuple(self.shape), self.dtype)
    if view is not None and view.kind == "perm" and view.elem is None and stride == tuple(self.stride()):
        copy = Storage(storage.array, storage.shape, storage.jax_dtype, storage.device_index, storage.place)
        return make(copy, tuple(self.shape), self.dtype, stride, 0, view_for(copy, view.size, stride, 0))
    return laid_out(read(self), storage.device_index, self.dtype, storage.place, stride)


def strides_for(t: Any, memory_format: Any) -> tuple[int, ...] | None:
    """The strides torch gives a new tensor shaped like ``t`` in
    ``memory_format``; None for row-major ones."""
    size = tuple(t.shape)
    if memory_format is None or memory_format == torch.contiguous_format:
        return None
    if memory_format == torch.preserve_format and dense_layout(size, stride := tuple(t.stride())):
        # torch's rule keeps a non-overlapping, dense layout's strides (a
        # clone or cast of a whole tensor, or of a transpose: most calls)
        return None if stride == contiguous_strides(size) else stride
    if memory_format == torch.preserve_format:  # torch's rule, as its meta kernel applies it
        stride = torch.empty_like(meta_view_of(t) if isinstance(t, JaxTensor) else t, device="meta").stride()
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    return None if stride == contiguous_strides(size) else tuple(stride)


def laid_out(arr: Any, index: int, dtype: torch.dtype, place: Any, stride: tuple[int, ...] | None) -> JaxTensor:
    """A new tensor of the values ``arr`` with dense ``stride`` (None:
    row-major): its storage holds them in stride order."""
    if stride is None:
        return wrap_array(arr, index, dtype, place)
    size = tuple(arr.shape)
    dims = sorted(range(len(size)), key=lambda d: (-stride[d], d))
    held = jnp.transpose(arr, dims)
    storage = Storage(held, tuple(held.shape), held.dtype, index, place)
    return make(storage, size, dtype, stride, 0, view_for(storage, size, stride, 0))


@storage_op("aten::lift_fresh")
def lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.tensor(data, device='jax')`` makes the device tensor with
    torch's modes switched off, then lifts it so that modes see it.  A
    tracer's modes (dynamo's FakeTensorMode, AOTAutograd's functional /
    proxy / fake stack: a model whose forward calls a factory, as
    transformers' DynamicCache does) only lift plain tensors, and defer to
    ours; a real device tensor in a fake trace then fails at its first op
    beside a fake one.  So under modes the lift is what cuda's amounts to
    for them: the values as a host constant, lifted, moved to the device
    (a fake on 'jax' for the fake mode, ``lift_fresh_copy(constant)`` then
    ``_to_copy`` in a traced graph)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    tensor = args[0]
    if not _get_current_dispatch_mode_stack():
        return tensor
    with no_dispatch():
        host = to_torch(tensor, torch.device("cpu"))
    return func(host).to(tensor.device)


@storage_op("aten::_assert_tensor_metadata")
def assert_tensor_metadata(func: Any, args: tuple, kwargs: dict) -> None:
    """torch.export's guard before a ``.to()`` in the traced code: the
    tensor's size, stride, dtype and layout are checked by torch's own meta
    kernel (over a meta tensor of the same metadata: its errors, word for
    word), the device here, as torch's CPU kernel does.  Nothing is read
    from the device."""
    t, *rest = args
    kwargs = dict(kwargs)
    device = kwargs.pop("device", None)
    with no_dispatch():
        func(torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta"), *rest, **kwargs)
    expected = None if device is None else torch.device(device)
    if expected is not None and not (expected.type == DEVICE_NAME and device_index(expected) == t.device.index):
        # 'jax' without an index is the current device (what
        # move_to_device_pass(ep, 'jax') writes), as everywhere on 'jax'.
        raise RuntimeError(
            f"Tensor device mismatch! Expected: {device}, Got: {t.device} (aten::_assert_tensor_metadata: the "
            f"program was traced with this tensor on {device}, and torch.export burnt that device into the graph; "
            f"move an exported program with torch.export.passes.move_to_device_pass(ep, '{DEVICE_NAME}') "
            f"before ep.module(), or export the model with its inputs on '{DEVICE_NAME}')")
    return None


@storage_op("aten::is_pinned")
def is_pinned(func: Any, args: tuple, kwargs: dict) -> Any:
    return False


@storage_op("aten::record_stream")
def record_stream(func: Any, args: tuple, kwargs: dict) -> Any:
    return None


@storage_op("aten::resize_")
def resize_(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's resize_ within the tensor's storage (same or fewer elements):
    a contiguous reinterpretation of the same values (in ``memory_format``,
    when given), as on CPU.  A storage that holds no elements grows onto
    a new one: torch's composite factories make ``empty(0)`` and fill it
    through an out= op that resizes it (``arange_out`` under every window
    function, so ``torch.stft`` with a window made on the device), and
    nothing can see an empty storage's elements.  Growing a storage that
    holds elements is not supported (other views of it would have to see
    the new ones, and a 'jax' storage cannot grow in place)."""
    self, size = args[0], tuple(args[1])
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    if memory_format == torch.preserve_format:
        raise RuntimeError("Unsupported memory format preserve")
    if tuple(self.shape) == size and memory_format is None:
        return self
    if memory_format is None or memory_format == torch.contiguous_format:
        stride = contiguous_strides(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    offset = self.storage_offset()
    extent = 0 if 0 in size else 1 + sum((n - 1) * st for n, st in zip(size, stride))
    storage = self._storage
    elem = self._view.elem if self._view is not None else None
    whole = storage.numel if elem is None else storage.nbytes // np.dtype(elem).itemsize
    if offset + extent > whole:
        if whole != 0:
            raise NotImplementedError(
                f"pjrt_host: growing a 'jax' tensor of {whole} elements in place (resize_ from "
                f"{tuple(self.shape)} to {size}) is not supported: other views of its storage would have to see "
                "the new elements (resize_(0) keeps the storage); make a new tensor instead (e.g. pass no out= "
                "argument)")
        # made on first use, as an empty tensor's
        storage, elem = Storage(None, (offset + extent,), jax_dtype(device_dtype(self.dtype)), storage.device_index,
                                storage.place), None
    # (over the whole storage: the tensor's own torch metadata spans only
    # its elements, which a view growing within the storage passes, as
    # fftfreq's arange(out=) into a slice of its result)
    return _set_metadata(self, storage, size, stride, offset, elem)


@storage_op("aten::resize_as_")
def resize_as_(func: Any, args: tuple, kwargs: dict) -> Any:
    """``resize_as_(template)``: resize_ to the template's shape (in the
    template's memory format for ``torch.preserve_format``); torch's meta
    kernel would call resize_ on the device tensor itself."""
    self, template = args[0], args[1]
    memory_format = args[2] if len(args) > 2 else kwargs.get("memory_format")
    if memory_format == torch.preserve_format:
        memory_format = next((f for f in (torch.channels_last, torch.channels_last_3d)
                              if not template.is_contiguous() and template.is_contiguous(memory_format=f)),
                             torch.contiguous_format)
    return resize_(func, (self, tuple(template.shape), memory_format), {})


@storage_op("c10d::")  # every op of the namespace
def c10d_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch.distributed's dispatcher ops (``c10d::allreduce_``,
    ``c10d::_allgather_base_`` ...) on 'jax' tensors: run by the 'pjrt'
    process group they name (torch's C++ kernels would look for a C++
    backend for the device, which a Python process group is not)."""
    from . import _c10d

    return _c10d.run_op(func, args, kwargs)


@storage_op("_c10d_functional::")  # every op of the namespace
def c10d_functional_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's functional collectives on 'jax' tensors (DTensor, FSDP2)."""
    from . import _c10d

    return _c10d.run_functional(func, args, kwargs)


@storage_op("aten::set_")
def set_(func: Any, args: tuple, kwargs: dict) -> Any:
    """``tensor.set_(...)`` in each of torch's forms: over another 'jax'
    tensor's data, over a torch storage on 'jax' (what torch.load and
    storage copies do; see _storage_bridge), or empty (``set_()``)."""
    self = args[0]
    params = dict(zip(("source", "storage_offset", "size", "stride"), args[1:]))
    params.update(kwargs)
    source = params.get("source")
    if source is None:
        storage = Storage(None, (0,), jax_dtype(device_dtype(self.dtype)), self._storage.device_index)
        return _set_metadata(self, storage, (0,), (1,), 0)
    if isinstance(source, torch.Tensor):
        if not isinstance(source, JaxTensor):
            raise RuntimeError(f"Expected a tensor on '{DEVICE_NAME}' as set_'s source, got one on {source.device}")
        if source.dtype != self.dtype:
            raise RuntimeError(f"Could not set tensor of type {source.dtype} to a tensor of type {self.dtype}")
        storage = source._storage
        elem = source._view.elem if source._view is not None else None
        if "size" not in params:
            return _set_metadata(self, storage, tuple(source.shape), tuple(source.stride()), source.storage_offset(),
                                 elem)
    else:
        storage, elem = _storage_for(source, self.dtype), None
    whole = storage.numel if elem is None else storage.nbytes // np.dtype(elem).itemsize
    size = params.get("size")
    if size is None:
        size = (whole,)
    size = tuple(int(d) for d in size)
    stride = params.get("stride")
    stride = contiguous_strides(size) if not stride else tuple(int(d) for d in stride)
    offset = int(params.get("storage_offset") or 0)
    return _set_metadata(self, storage, size, stride, offset, elem)


def _set_metadata(self: JaxTensor, storage: Storage, size: tuple, stride: tuple, offset: int,
                  elem: Any = None) -> JaxTensor:
    """Make ``self`` a tensor over ``storage`` with these sizes, strides and
    offset (counted in ``elem``s where it reads the storage as another
    element type, see View): torch's meta kernels change self's metadata
    (first onto a placeholder of the storage's size, then to the view),
    self's view follows."""
    whole = storage.numel if elem is None else storage.nbytes // np.dtype(elem).itemsize
    extent = offset + sum((d - 1) * st for d, st in zip(size, stride)) + 1 if all(size) else 0
    if extent > whole:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset} require a storage of "
            f"{extent * self.element_size()} bytes, but the storage has {whole * self.element_size()}")
    placeholder = make(storage, (whole,), self.dtype)
    with no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            torch.ops.aten.set_.source_Tensor(self, placeholder)
            torch.ops.aten.as_strided_.default(self, size, stride, offset)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    self._storage = storage
    self._view = view_for(storage, size, stride, offset, elem)
    return self


def _storage_for(source: Any, dtype: torch.dtype) -> Storage:
    """The device Storage of ``dtype`` behind torch storage ``source`` on
    'jax': the one tensors of that dtype already share, else made from the
    storage's newest values (another dtype's, reinterpreted bytewise) or its
    host bytes."""
    entry = _storage_bridge.entry_of(source)
    if entry is None:
        raise RuntimeError(
            f"pjrt_host: tensor.set_(storage) needs a storage on '{DEVICE_NAME}' made by torch.load, "
            f"storage.to('{DEVICE_NAME}'), torch.UntypedStorage(n, device='{DEVICE_NAME}') or "
            f"tensor.untyped_storage(); got a {source.device} storage")
    target = jax_dtype(device_dtype(dtype))
    found = entry.storage(target)
    if found is not None:
        entry.latest = np.dtype(target)
        return found
    itemsize = np.dtype(target).itemsize
    numel = entry.nbytes // itemsize
    index = entry.device_index
    newest = entry.newest()
    if newest is not None:
        array = _bytes_as(_as_bytes(newest.get()), target, numel)
    else:
        host = torch.empty(0, dtype=torch.uint8).set_(entry.host)[: numel * itemsize]
        array = to_jax_array(host.view(dtype) if dtype.itemsize == itemsize else host.view(torch.uint8), index,
                             None)
        if dtype.itemsize != itemsize:  # a substituted dtype (the plugin's policy)
            array = _bytes_as(array, target, numel)
    storage = Storage(array, (numel,), target, index)
    if entry.host is None and newest is not None:
        # A byte-level snapshot of a tensor's data (storage.cpu() comes
        # this way): writes would not reach the tensor.
        storage.read_only = (
            f"pjrt_host: writing into a '{DEVICE_NAME}' tensor's storage as {dtype} (its tensors are "
            f"{torch_dtype(newest.jax_dtype)}) is not supported; write the tensor itself (t.copy_(...))")
    if storage.read_only is None:
        entry.put(target, storage)
    return storage


_bytes_cache: dict[tuple, Any] = {}


def _as_bytes(array: Any) -> Any:
    """The bytes of ``array`` (row-major, the host's byte order) as a flat uint8 array."""
    key = ("to", array.dtype, array.shape)
    fn = _bytes_cache.get(key)
    if fn is None:
        def to_bytes(a):
            a = a.reshape(-1)
            if a.dtype == jnp.bool_:
                return a.astype(jnp.uint8)
            if jnp.issubdtype(a.dtype, jnp.complexfloating):
                a = jnp.stack([a.real, a.imag], axis=-1).reshape(-1)
            if a.dtype.itemsize == 1:
                return jax.lax.bitcast_convert_type(a, jnp.uint8)
            return jax.lax.bitcast_convert_type(a, jnp.uint8).reshape(-1)

        fn = _bytes_cache[key] = _program_cache.Kept("pjrt_host.to_bytes", to_bytes, key)
    return fn(array)


def _bytes_as(data: Any, dtype: Any, numel: int) -> Any:
    """uint8 array ``data`` read as ``numel`` elements of jax dtype ``dtype``."""
    key = ("from", data.shape, np.dtype(dtype), numel)
    fn = _bytes_cache.get(key)
    if fn is None:
        target = np.dtype(dtype)

        def from_bytes(d):
            d = d.reshape(-1)[: numel * target.itemsize]
            if target == np.bool_:
                return d != 0
            if target.kind == "c":
                part = np.dtype(f"f{target.itemsize // 2}")
                pairs = jax.lax.bitcast_convert_type(d.reshape(numel * 2, part.itemsize), part).reshape(numel, 2)
                return jax.lax.complex(pairs[:, 0], pairs[:, 1]).astype(target)
            if target.itemsize == 1:
                return jax.lax.bitcast_convert_type(d, target)
            return jax.lax.bitcast_convert_type(d.reshape(numel, target.itemsize), target)

        fn = _bytes_cache[key] = _program_cache.Kept("pjrt_host.from_bytes", from_bytes, key)
    return fn(data)


# ---------------------------------------------------------------- *_like / new_*

# name -> (the factory it amounts to, position of its fill value in the op's arguments)
_LIKE: dict[str, tuple[Callable[..., torch.Tensor], int | None]] = {
    "aten::zeros_like": (torch.zeros, None),
    "aten::ones_like": (torch.ones, None),
    "aten::empty_like": (torch.empty, None),
    "aten::full_like": (torch.full, 1),
    "aten::rand_like": (torch.rand, None),
    "aten::randn_like": (torch.randn, None),
    "aten::new_empty": (torch.empty, None),
    "aten::new_empty_strided": (torch.empty, None),
    "aten::new_zeros": (torch.zeros, None),
    "aten::new_ones": (torch.ones, None),
    "aten::new_full": (torch.full, 2),
}


@storage_op(*_LIKE)
def like(func: Any, args: tuple, kwargs: dict) -> Any:
    """A factory shaped after a tensor: torch's meta kernel gives the shape
    and dtype, the device's factory the values."""
    self = args[0]
    device = kwargs.get("device")
    device = self.device if device is None else torch.device(device)
    meta_kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "memory_format", "generator")}
    try:
        meta = func(meta_view_of(self), *args[1:], device="meta", **meta_kwargs)
    except Exception:
        _meta.check_cpu_kernel(func, args, kwargs)  # CPU's own refusal first, where its kernel refuses
        raise
    factory, fill = _LIKE[func.name()]
    # (a random draw keeps its exact shape: a seed draws the same numbers with buckets and without)
    random = torch.Tag.nondeterministic_seeded in func.tags
    factory_kwargs = {"dtype": meta.dtype, "device": device}
    if "generator" in kwargs:
        factory_kwargs["generator"] = kwargs["generator"]
    shape = tuple(meta.shape)
    if self._storage.padded is not None and random and device == self.device:
        drawn = _drawn_like(self, meta, func.name(), kwargs.get("generator"))
        if drawn is not None:
            return drawn
    if self._storage.padded is not None and random is False and device == self.device:
        def values(physical: tuple) -> JaxTensor:
            with _factories.shaped_after_a_tensor():
                if fill is not None:
                    return factory(physical, args[fill], **factory_kwargs)
                return (torch.zeros if factory is torch.empty else factory)(physical, **factory_kwargs)

        padded = _padded_like(self, meta, values)
        if padded is not None:
            return padded
    with _factories.shaped_after_a_tensor():  # (its sizes are that tensor's, not a length changing at a line)
        if func.name() == "aten::new_empty_strided":  # the strides it was given, as on CPU
            out = torch.empty_strided(shape, tuple(meta.stride()), **factory_kwargs)
        else:
            out = factory(shape, args[fill], **factory_kwargs) if fill is not None else factory(shape, **factory_kwargs)
    stride = strides_for(self, kwargs.get("memory_format", torch.preserve_format)) \
        if func.name().endswith("_like") and not random else None
    if stride is not None:
        # laid out as torch lays it out (preserve_format keeps a transpose's
        # layout: CPU's zeros_like of one is transposed too)
        if out.device.type == DEVICE_NAME:
            out = laid_out(out._storage.get(), out._storage.device_index, out.dtype, out._storage.place, stride)
        else:
            out = torch.empty_strided(shape, stride, dtype=out.dtype, device=out.device).copy_(out)
    storage = self._storage
    if type(storage.place) is not int and self._view is None and device == self.device and shape == storage.shape:
        # Shaped like a sharded tensor (an optimizer's state of a sharded
        # parameter): sharded like it.
        arr = out._storage.array
        if arr is None:  # empty_like: zeros, made on the host and sent shard by shard
            arr = np.zeros(shape, dtype=out._storage.jax_dtype)
        out._storage.place = storage.place
        out._storage.array = _sharding.device_put(arr, storage.get().sharding)
    return out


#: Random ``*_like`` factories and the in-place draw each amounts to.
_DRAWN_LIKE = {"aten::rand_like": "uniform_", "aten::randn_like": "normal_"}


def _drawn_like(self: JaxTensor, meta: Any, name: str, generator: Any) -> JaxTensor | None:
    """``rand_like`` / ``randn_like`` of a padded tensor (a diffusion
    step's noise, a VAE's sample, at a changing batch), drawn into a padded
    tensor laid out as it: each logical element takes what an exact draw
    gives it (``uniform_(0, 1)`` and ``normal_(0, 1)`` draw ``rand``'s and
    ``randn``'s numbers), one program per bucket instead of one per size.
    None where it is not one (see :func:`_padded_like`; complex and integer
    dtypes are drawn exact)."""
    method = _DRAWN_LIKE.get(name)
    if method is None or not meta.dtype.is_floating_point:
        return None

    def zeros(physical: tuple) -> JaxTensor:
        with _factories.shaped_after_a_tensor():
            return torch.zeros(physical, dtype=meta.dtype, device=self.device)

    out = _padded_like(self, meta, zeros)
    if out is not None:
        getattr(out, method)(generator=generator)
    return out


def _padded_like(self: JaxTensor, meta: Any, make_values: Callable[[tuple], JaxTensor]) -> JaxTensor | None:
    """A factory's result shaped like ``self`` (its whole padded storage),
    laid out as ``self``: ``make_values(physical shape)`` gives its values,
    padding included, so that what is computed from it runs the bucket's
    programs (torch's SiLU backward fills an ``empty_like`` of the
    activation, and an exact one compiled that fill at every length).  None
    where it is not one: a view, another shape, a layout other than
    row-major, dynamic shapes off."""
    storage = self._storage
    if not _config.current().dynamic_shapes or self._view is not None or tuple(meta.shape) != storage.shape \
            or not meta.is_contiguous() or type(storage.place) is not int:
        return None
    padded = storage.padded
    physical = _padding.physical_shape(padded)
    with _factories.at_physical_shape():
        values = make_values(physical)
    source = values._storage
    if source.padded is not None or source.shape != physical:
        return None  # (values the factory made otherwise: the exact route)
    grown = Storage(None, storage.shape, source.jax_dtype, source.device_index)
    grown.take(source)
    grown.padded = padded  # (the values were made exact, at the physical shape: laid out as ``self`` here)
    return make(grown, storage.shape, values.dtype)


# ---------------------------------------------------------------- batch norm

_batch_norm_plain: dict[Any, CompiledOp] = {}


@storage_op("aten::native_batch_norm")
def native_batch_norm(func: Any, args: tuple, kwargs: dict) -> Any:
    """native_batch_norm updates running_mean / running_var in training, but
    its schema does not say so (no alias annotation) and its lowering is
    functional: the update is done here, as torch CPU does it."""
    bound = dict(zip(("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"),
                     args))
    bound.update(kwargs)
    running_mean, running_var = bound.get("running_mean"), bound.get("running_var")
    if not bound.get("training") or running_mean is None or running_var is None:
        op = _batch_norm_plain.get(func)
        if op is None:
            lowering = _lowerings.lookup(func)
            if lowering is None:
                raise missing_lowering(func)
            op = _batch_norm_plain[func] = CompiledOp(func, lowering)
        return op(args, kwargs)
    functional = torch.ops.aten._native_batch_norm_legit_functional.default
    out, mean, rstd, new_mean, new_var = functional(
        bound["input"], bound.get("weight"), bound.get("bias"), running_mean, running_var, True,
        bound["momentum"], bound["eps"])
    with torch.no_grad():
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
    return out, mean, rstd


_BATCH_NORM_OUTS = ("out", "save_mean", "save_invstd")
_batch_norm_out_probed: set = set()


@storage_op("aten::native_batch_norm.out", "aten::_native_batch_norm_legit.out",
            "aten::_native_batch_norm_legit.no_stats_out")
def native_batch_norm_out(func: Any, args: tuple, kwargs: dict) -> Any:
    """The out= forms of batch norm: the functional op (which updates the
    running statistics in training, as CPU's kernel does) and its three
    results written into the out= tensors, resized as torch resizes them.
    torch CPU's refusals of the out= tensors (another dtype than the input's,
    a write into overlapping memory) are asked of its kernel once per
    signature; an out= tensor on another device is refused."""
    from ._devices import device_mismatch

    outs = [kwargs[n] for n in _BATCH_NORM_OUTS]
    inputs = {k: v for k, v in kwargs.items() if k not in _BATCH_NORM_OUTS}
    device = args[0].device if args and isinstance(args[0], torch.Tensor) else inputs["input"].device
    for o in outs:
        if not isinstance(o, JaxTensor) or o.device != device:
            raise device_mismatch(device, o.device)
    key = (func, _meta.probe_key(args, kwargs))
    if key not in _batch_norm_out_probed:
        _meta.check_cpu_kernel(func, args, kwargs)
        if len(_batch_norm_out_probed) >= 1024:
            _batch_norm_out_probed.clear()
        _batch_norm_out_probed.add(key)
    functional = func.overloadpacket.no_stats if func.name().endswith("no_stats_out") else func.overloadpacket.default
    results = functional(*args, **inputs)
    for o, r in zip(outs, results):
        _meta.write_out(o, r)
    return tuple(outs)


# ---------------------------------------------------------------- sharding


@storage_op("pjrt_host::sharding_constraint")
def sharding_constraint(func: Any, args: tuple, kwargs: dict) -> Any:
    """pjrt_host.spmd.with_sharding_constraint on a tensor, eagerly: its
    values resharded (a new tensor).  Compiled graphs lower the same op to
    ``jax.lax.with_sharding_constraint``."""
    bound = dict(zip(("x", "mesh", "spec"), args))
    bound.update(kwargs)
    x = bound["x"]
    sharding = _sharding.constraint_sharding(bound["mesh"], bound["spec"])
    place = _sharding.placement(sharding.mesh)
    value = read(x)
    if type(x._storage.place) is int and x._storage.device_index != place.index:
        raise RuntimeError(f"pjrt_host.spmd: a tensor on {x.device} cannot be sharded over a mesh whose tensors "
                           f"report jax:{place.index}; move it there first")
    return wrap_array(_sharding.device_put(value, sharding), place.index, x.dtype, place)
