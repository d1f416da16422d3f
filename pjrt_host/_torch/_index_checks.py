"""Out-of-range indices raise torch CPU's error
(``pjrt_host.config(checks=...)``).

The lowerings index with clipping or wrapping (an XLA gather cannot fail),
so without a check ``torch.arange(3, device='jax')[torch.tensor([5],
device='jax')]`` returns a value where CPU raises.  Per checked op, one
small compiled min/max per index tensor runs on the device; its verdict is
read on the host:

- ``True`` (the default): at the next synchronisation point (``.item()``,
  ``.cpu()``, printing, ``torch.jax.synchronize()``), so the check never
  stalls the device's queue -- as cuda reports a device-side assert at a
  later call.  The error names the op it comes from.
- ``"sync"``: at the op itself (a device-to-host read per checked op, which
  waits for the queue): the traceback points at the offending line.
- ``False``: no check; indices are clipped / wrapped.

See docs/torch-device.md for the measured cost.

Checked ops (and their in-place / out= forms): advanced indexing and index
puts, index_select, gather, scatter (all forms), index_add / index_copy /
index_fill, embedding, take, put, and the class targets of nll_loss (so
cross_entropy).  The error types and texts are CPU's.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import torch

from .. import _program_cache
from .._lowerings._dtypes import dtype_name, jax_dtype, torch_dtype
from . import _config, _fused, _padding
from ._meta import OutputPlan, OutputSpec
from ._sync import defer_check
from ._tensor import JaxTensor, read

__all__ = ["check", "check_structure", "checker_for", "failure", "indexes_along_dim", "sites"]

_minmax = _program_cache.Kept("pjrt_host.minmax", lambda a: jnp.stack([jnp.min(a), jnp.max(a)]).astype(jnp.int64))
# the same over the values that are not ``v`` (a loss's ignore_index)
_minmax_except = _program_cache.Kept("pjrt_host.minmax_except", lambda a, v: _minmax.jitted(jnp.where(a == v, 0, a)))


_local = threading.local()  # .op: the op being checked, .deferred: check at the next sync point,
#                             .collect: a list while :func:`sites` reads an op's checks (graph form)


_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def check_structure(x: Any, indices: Any, reads: bool) -> None:
    """CPU's IndexError for indices that cannot index ``x`` whatever their
    values: none given to a read (``reads``: aten::index; an index put with
    none writes the whole tensor), a dtype that cannot index, a mask whose
    shape is not the indexed dims', index shapes that do not broadcast
    together.  (The meta kernels raise RuntimeError for these; torch's CPU
    and cuda kernels IndexError.)  A mask's count is read only when it must
    broadcast with another index."""
    if len(indices) == 0:
        if reads:
            raise IndexError("at least one index must be provided")
        return
    shapes: list = []  # per index tensor after masks expand: a shape, or a mask awaiting its count
    dim = 0
    for i in indices:
        if i is None:
            dim += 1
            continue
        if not isinstance(i, torch.Tensor) or i.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if i.dtype in (torch.bool, torch.uint8):
            for j in range(i.dim()):
                if dim + j >= x.dim():
                    raise IndexError(f"too many indices for tensor of dimension {x.dim()} "
                                     f"(got {dim + i.dim()})")
                if i.shape[j] != x.shape[dim + j]:
                    raise IndexError(f"The shape of the mask {list(i.shape)} at index {j} does not match the "
                                     f"shape of the indexed tensor {list(x.shape)} at index {dim + j}")
            shapes.extend([i] * max(i.dim(), 1))
            dim += i.dim()
        else:
            shapes.append(tuple(i.shape))
            dim += 1
    if len(shapes) < 2:
        return
    counts: dict[int, int] = {}
    sizes = [(counts.setdefault(id(s), int(s.count_nonzero())),) if isinstance(s, torch.Tensor) else s
             for s in shapes]
    try:
        torch.broadcast_shapes(*sizes)
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(s)) for s in sizes)) from None


def _first_bad(values: Any, low: int, high: int, ignore: int | None = None) -> int:
    values = np.asarray(values).reshape(-1)
    bad = (values < low) | (values >= high)
    if ignore is not None:
        bad &= values != ignore
    return int(values[bad][0])


def failure(error: Callable[[int, int, int], Exception], value: int, dim: int, size: int, op: str, where: str,
            when: str) -> Exception:
    """The error of an index check found after its op ran: torch's type and
    text for ``value``, then which op raised it ``where`` and ``when``."""
    err = error(value, dim, size)
    return type(err)(f"{err} (raised by {op} {where}, {when})")


def _check(index: Any, size: int, dim: int, negative_ok: bool, error: Callable[[int, int, int], Exception],
           ignore: int | None = None) -> None:
    """Check ``index``'s values against ``[-size if negative_ok else 0,
    size)``; a value equal to ``ignore`` (a loss's ignore_index) is
    allowed wherever it lies."""
    collect = getattr(_local, "collect", None)
    if collect is not None:  # graph form: the check itself is computed inside the compiled program
        if isinstance(index, torch.Tensor) and not index.dtype.is_floating_point:
            collect.append((index, size, dim, negative_ok, error, ignore))
        return
    if not isinstance(index, JaxTensor) or index.numel() == 0 or index.dtype.is_floating_point:
        return
    low = -size if negative_ok else 0
    found = _padded_bounds(index, ignore)
    if found is not None:
        bounds, values = found
        if type(bounds) is JaxTensor:  # recorded into its segment: pending until it runs
            defer_check(_verdict(lambda: not bounds._storage.pending and bounds._storage._array.is_ready(),
                                 lambda: read(bounds), lambda: values, low, size, dim, ignore, error, _local.op,
                                 index.device))
            return
    else:
        if _local.deferred and _config.current().eager == "fused":
            recorded = _recorded_bounds(index, ignore)
            if recorded is not None:
                bounds, values = recorded  # pending until their segment runs
                defer_check(_verdict(lambda: not bounds._storage.pending and bounds._storage._array.is_ready(),
                                     lambda: read(bounds), lambda: read(values), low, size, dim, ignore, error,
                                     _local.op, index.device))
                return
        values = read(index)
        bounds = _minmax(values) if ignore is None else _minmax_except(values, int(ignore))
    if not _local.deferred:
        lo, hi = np.asarray(bounds).tolist()
        if lo < low or hi >= size:
            raise error(_first_bad(values, low, size, ignore), dim, size)
        return
    defer_check(_verdict(bounds.is_ready, lambda: bounds, lambda: values, low, size, dim, ignore, error, _local.op,
                         index.device))


def _verdict(ready: Callable[[], bool], bounds: Callable[[], Any], values: Callable[[], Any], low: int, size: int,
             dim: int, ignore: int | None, error: Callable[[int, int, int], Exception], op: str,
             device: Any) -> Callable[[bool], bool]:
    """A deferred check's verdict: not ready while ``ready()`` says so
    (unless ``wait``), then torch's error for the first bad value, if the
    ``bounds()`` (min, max) show one."""
    def verdict(wait: bool) -> bool:
        if not wait and not ready():
            return False
        lo, hi = np.asarray(bounds()).tolist()
        if lo < low or hi >= size:
            raise failure(error, _first_bad(values(), low, size, ignore), dim, size, op, f"on {device}",
                          "found at the next synchronisation point; pjrt_host.config(checks='sync'), or "
                          "the debugging mode PJRT_HOST_EAGER=sync, raises at the op itself")
        return True

    return verdict


_bounds_ops: dict = {}


def _recorded_bounds(index: JaxTensor, ignore: int | None) -> tuple | None:
    """Fused eager, deferred checks: the index's min and max (``ignore``
    taken as 0) and its values, recorded into the thread's segment as one
    op, so that a check is computed inside the program of the ops around it
    (an embedding's ids, position ids made by the ops before it) instead of
    a program call of its own that also ran the segment computing the index
    first (GPT-2's ``generate()`` made 96 per call).  Its results stay
    pending until the check's verdict reads them.  None: checked now (a
    padded or sharded storage, a view reading other elements)."""
    storage, view = index._storage, index._view
    if storage.padded is not None or type(storage.place) is not int or (view is not None and view.elem is not None) \
            or jax_dtype(index.dtype) != storage.jax_dtype:
        return None
    static = None if view is None else view.static
    key = (static, dtype_name(storage.jax_dtype), ignore)
    def make() -> tuple:
        from . import _strided

        def body(a: Any, off: Any) -> tuple:
            if static is not None:
                a = _strided.read(a, static, off)
            kept = a if ignore is None else jnp.where(a == ignore, 0, a)
            return jnp.stack([jnp.min(kept), jnp.max(kept)]).astype(jnp.int64), a

        return body, _program_cache.jit(body)

    op = _fused.host_op(_bounds_ops, "pjrt_host.minmax", key, make)
    plan = OutputPlan("tuple", (OutputSpec("tensor", (2,), torch.int64),
                                OutputSpec("tensor", tuple(index.shape), index.dtype)))
    array = storage._array if storage.pending else storage.get()
    return _fused.record(op, [array, 0 if view is None else view.run_offset], plan, storage.device_index,
                         storage.place)


#: (op, place, rank) -> per dim, the sizes its checked indices had and how
#: they ran (``_padding.runs_padded``, as ``_dynamic_dims.on_miss`` decides
#: for an op's inputs)
_seen: dict = {}
_padded_programs: dict = {}
_padded_bodies: dict = {}  #: key -> the traceable function of _padded_programs' program


def _padded_bounds(index: JaxTensor, ignore: int | None) -> tuple | None:
    """``(bounds, values)`` of an index over a padded storage, read whole
    (no view, or a reshape of it): the min and max of its logical values
    (``ignore`` taken as 0) from one program per bucket, the logical sizes
    passed at run time, and its values for the error (cut on the host).  An
    exact index is padded first where its op then reads it padded (the ops
    have padded rules, ``_dynamic_dims``): an embedding's whose dims took a
    third size, a loss's targets as its padded input's rows are.  None: the
    check reads the index exact."""
    mode = _config.current().dynamic_shapes
    view = index._view
    if not mode or (view is not None and view.elem is not None):
        return None
    if view is not None and view.kind != "reshape":
        return _wider_bounds(index, ignore, mode)
    storage = index._storage
    if storage.padded is None:
        if type(storage.place) is not int or not _pad_index(storage, mode):
            return None
    if type(storage.place) is not int:
        return None
    comps = tuple(c for dim in storage.padded for c in dim)
    key = (tuple(c[0] for c in comps), tuple(c[0] != c[1] for c in comps), ignore is not None)
    fn = _padded_programs.get(key)
    if fn is None:
        from jax import lax

        shape, cut, except_ = key

        def body(a: Any, v: Any, *logical: Any) -> Any:
            a = a.reshape(shape)
            if except_:
                a = jnp.where(a == v, 0, a)
            sizes = iter(logical)
            for axis, padded in enumerate(cut):
                if padded:  # 0 is in range wherever there is something to check
                    a = jnp.where(lax.broadcasted_iota(jnp.int32, shape, axis) < next(sizes), a, 0)
            return jnp.stack([jnp.min(a), jnp.max(a)]).astype(jnp.int64)

        if len(_padded_programs) > 256:
            _padded_programs.clear()
            _padded_bodies.clear()
        fn = _padded_programs[key] = _program_cache.Kept("pjrt_host.minmax_padded", body, key)
        _padded_bodies[key] = body
    sizes = [_padding.device_scalar(c[1], storage.place) for c in comps if c[0] != c[1]]
    if _local.deferred and _config.current().eager == "fused" and jax_dtype(index.dtype) == storage.jax_dtype:
        recorded = _recorded_padded_bounds(storage, key, _padded_bodies[key], sizes, ignore, index.dtype)
        if recorded is not None:
            bounds, values = recorded
            return bounds, _Cut(lambda: read(values), comps)
    arr = storage.computed()
    return fn(arr, 0 if ignore is None else int(ignore), *sizes), _Cut(arr, comps)


_padded_bounds_ops: dict = {}


def _recorded_padded_bounds(storage: Any, key: tuple, body: Any, sizes: list, ignore: int | None,
                            dtype: torch.dtype) -> tuple | None:
    """Fused eager, deferred checks: :func:`_padded_bounds`'s min and max of
    a padded index (position ids made by the ops before an embedding, a
    loss's shifted labels, a batch's token ids), recorded into the thread's
    segment with the values for the error, as :func:`_recorded_bounds`
    records an exact one's: computed now, a pending index ran the segment (a
    GPT-2 step's first layer and its head split from their segments at
    every new bucket), and any ran a program of its own.  None: checked
    now."""
    op = _fused.host_op(_padded_bounds_ops, "pjrt_host.minmax_padded", key,
                        lambda: (lambda a, v, *logical: (body(a, v, *logical), a), None))
    plan = OutputPlan("tuple", (OutputSpec("tensor", (2,), torch.int64),
                                OutputSpec("tensor", tuple(storage._array.shape), dtype)))
    # (the padded array itself, pending or not: ``get`` would cut it)
    return _fused.record(op, [storage._array, 0 if ignore is None else int(ignore), *sizes], plan,
                         storage.device_index, storage.place)


def _wider_bounds(index: JaxTensor, ignore: int | None, mode: Any) -> tuple | None:
    """``(bounds, values)`` of an index that is a view of a padded storage,
    or of an exact one read wider (``_dynamic_dims.mark_wider``: BERT's
    position ids, a slice of a buffer of 512 that an embedding reads
    padded): the min and max of
    its logical values from one program per bucket, the logical sizes
    passed at run time.  An embedding's index is marked here when its dims
    took a third size at the place :func:`_pad_index` counts them at.  None:
    the check reads it exact."""
    from . import _dynamic_dims

    storage = index._storage
    if type(storage.place) is not int:
        return None
    if storage.padded is not None:  # a view of a padded storage (transformers' token types: an expand)
        r = _dynamic_dims.read_of(index)
    else:
        wide = _dynamic_dims.wide_of(index)
        if wide is None:
            dims = _changing_index_dims(tuple(index.shape), mode)
            if not dims or not _dynamic_dims.mark_wider(index, dims, odd=mode == "all"):
                return None
            wide = _dynamic_dims.wide_of(index)
        r = _dynamic_dims.read_wider(index, wide)
    if r is None:
        return None
    key = ("wider", r.view, r.physical, dtype_name(storage.jax_dtype), r.masks, ignore is not None)
    fn = _padded_programs.get(key)
    if fn is None:
        from . import _strided

        static, masks, except_ = r.view, r.masks, ignore is not None

        def body(a: Any, off: Any, v: Any, *logical: Any) -> Any:
            if static is not None:
                a = _strided.read(a, static, off)
            if except_:
                a = jnp.where(a == v, 0, a)
            a = _padding.fill(a, masks, logical, 0)  # 0 is in range wherever there is something to check
            return jnp.stack([jnp.min(a), jnp.max(a)]).astype(jnp.int64)

        if len(_padded_programs) > 256:
            _padded_programs.clear()
        fn = _padded_programs[key] = _program_cache.Kept("pjrt_host.minmax_wider", body, key)
    sizes = [_padding.device_scalar(n, storage.place) for dim in r.sizes for n in dim]
    arr = storage.computed() if storage.padded is not None else storage.get()
    return fn(arr, r.offset, 0 if ignore is None else int(ignore), *sizes), _Logical(index)


class _Logical:
    """An index's logical values, read on the host when an error names the
    first bad one."""

    def __init__(self, index: JaxTensor) -> None:
        self.index = index

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return self.index.detach().cpu().numpy().reshape(-1)


def _changing_index_dims(shape: tuple, mode: Any) -> set:
    """The dims of the checked op's index that took a third size at its
    place (the line that called the op and the shape of the tensor it
    indexes: an embedding's weight, the buffer RoBERTa gathers its token
    types from); every dim longer than 1 in the mode "all"."""
    if mode == "all":
        return {d for d, n in enumerate(shape) if n > 1}
    if len(_seen) > 4096:
        _seen.clear()
    first = _local.args[0] if _local.args else None
    place = (_padding.caller(), tuple(first.shape) if isinstance(first, torch.Tensor) else None)
    sizes = _seen.setdefault((_local.op, place, len(shape)), [{} for _ in shape])
    return {d for d, n in enumerate(shape) if _padding.runs_padded(sizes[d], n)}


def _pad_index(storage: Any, mode: Any) -> bool:
    """Pad an exact index's ``storage`` for the op being checked to read it
    padded; False where it is not padded."""
    op = _local.op
    shape = storage.shape
    if op == "aten::embedding":
        # at the place an op's inputs are counted at (_dynamic_dims.on_miss):
        # counted by the op alone, T5's token ids ([4, 32], [4, 16]) and its
        # relative positions ([32, 32], [16, 16]) gave a dim three sizes, and
        # every training step of fixed shapes ran padded, 3.5x slower
        dims = _changing_index_dims(shape, mode)
        return bool(dims) and _padding.pad_storage(storage, dims, odd=mode == "all")
    if op == "aten::nll_loss_forward":
        # the targets line up with the input's rows: laid out as they are
        rows = _rows(_local.args[0])
        if rows is None or math.prod(c[1] for c in rows) != storage.numel:
            return False
        padded, at = [], 0
        for n in shape:  # the storage's dims, each one or more of the rows' components
            if n == 1:
                padded.append(((1, 1, False),))
                continue
            run, size = [], 1
            while at < len(rows) and size < n:
                run.append(rows[at])
                size *= rows[at][1]
                at += 1
            if size != n:
                return False
            padded.append(tuple(run))
        return at == len(rows) and _pad_storage_as(storage, tuple(padded))
    return False


_pad_ops: dict = {}


def _pad_storage_as(storage: Any, padded: tuple) -> bool:
    """``_padding.pad_storage_as``; under fused eager a storage still
    pending (a loss's shifted labels, made by the ops before it) is laid out
    by an op recorded into its segment, which it would otherwise run (the
    model's head split from its segment at every new bucket)."""
    split, widths, physical = _padding.pad_layout(padded)
    if not storage.pending or _config.current().eager != "fused" or physical == storage.shape:
        return _padding.pad_storage_as(storage, padded)

    def make() -> tuple:
        return (lambda a: jnp.pad(a.reshape(split), widths).reshape(physical)), None

    op = _fused.host_op(_pad_ops, "pjrt_host.pad_as", (storage.shape, padded, dtype_name(storage.jax_dtype)), make)
    plan = OutputPlan("single", (OutputSpec("tensor", physical, torch_dtype(storage.jax_dtype)),))
    laid_out = _fused.record(op, [storage._array], plan, storage.device_index, storage.place)
    pending = None if laid_out is None else laid_out._storage._array
    if pending is None or not pending.segment.share(pending, storage):
        return _padding.pad_storage_as(storage, padded)
    storage.padded = padded  # (after the write, which makes a storage exact)
    _padding.note("pads")
    _padding.live = True
    return True


def _rows(x: Any) -> tuple | None:
    """The components of dim 0 of a loss's input ``x``, padded (its whole
    storage, or a reshape of it that merges whole dims of it): None when
    it is not such a tensor."""
    if not isinstance(x, JaxTensor) or x.dim() != 2:
        return None
    storage, view = x._storage, x._view
    if storage.padded is None or (view is not None and (view.kind != "reshape" or view.elem is not None)):
        return None
    comps = [c for dim in storage.padded for c in dim]
    run, size = [], 1
    for c in comps:
        if size == x.shape[0]:
            break
        run.append(c)
        size *= c[1]
    if size != x.shape[0] or not any(c[2] and c[0] != c[1] for c in run):
        return None
    return tuple(run)


class _Cut:
    """A padded index's logical values, cut on the host when an error
    names the first bad one."""

    def __init__(self, arr: Any, comps: tuple) -> None:
        self.arr, self.comps = arr, comps

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        arr = self.arr() if callable(self.arr) else self.arr  # (a recorded check's: read once it ran)
        a = np.asarray(arr).reshape(tuple(c[0] for c in self.comps))
        return a[tuple(slice(0, c[1]) for c in self.comps)].reshape(-1)


def check(func_name: str, check_fn: Callable[[tuple, dict], None], mode: Any, args: tuple, kwargs: dict) -> None:
    """Run ``check_fn`` for op ``func_name`` in ``mode`` (True: deferred,
    "sync": now)."""
    _local.op = func_name
    _local.args = args  # (a loss's input: how its targets are padded, _pad_index)
    _local.deferred = mode != "sync"
    try:
        check_fn(args, kwargs)
    finally:
        _local.args = None


def sites(name: str, args: tuple, kwargs: dict) -> list[tuple]:
    """Graph form: the index checks ATen op ``name`` makes on ``args``
    (fake tensors, as a traced graph records them), without reading values:
    ``[(index tensor, size, dim, negative_ok, error, ignore)]``, the index
    valid in ``[-size if negative_ok else 0, size)`` or equal to ``ignore``
    (None: no such value); ``error(value, dim, size)`` is
    torch's exception for a bad ``value``.  The compiled program computes
    the verdict itself."""
    fn = checker_for(name)
    if fn is None:
        return []
    found: list[tuple] = []
    _local.collect = found
    try:
        fn(args, kwargs)
    finally:
        _local.collect = None
    return found


def _located(exc: type, text: Callable[[int, int, int], str]) -> Callable[[int, int, int], Exception]:
    return lambda value, dim, size: exc(text(value, dim, size))


_OUT_OF_BOUNDS = "index {0} is out of bounds for dimension {1} with size {2}"
_index_error = _located(IndexError, lambda v, d, s: _OUT_OF_BOUNDS.format(v, d, s))
_runtime_error = _located(RuntimeError, lambda v, d, s: _OUT_OF_BOUNDS.format(v, d, s))
_index_select_error = _located(RuntimeError, lambda v, d, s: f"INDICES element is out of DATA bounds, id={v} axis_dim={s}")
_in_self_error = _located(IndexError, lambda v, d, s: "index out of range in self")
_index_copy_error = _located(IndexError, lambda v, d, s: "index_copy_(): " + _OUT_OF_BOUNDS.format(v, d, s))
_embedding_error = _located(IndexError, lambda v, d, s: "index out of range in self")
_take_error = _located(IndexError, lambda v, d, s: f"out of range: tried to access index {v} on a tensor of {s} elements.")
_target_error = _located(IndexError, lambda v, d, s: f"Target {v} is out of bounds.")


def _size(x: Any, dim: int) -> tuple[int, int]:
    if x.dim() == 0:
        return 1, 0
    dim = dim % x.dim()
    return x.shape[dim], dim


def _advanced(args: tuple, kwargs: dict) -> None:
    x = args[0]
    if x.numel() == 0:
        # CPU's kernels read or write no element of an empty tensor, so
        # they check no index value (``zeros(1, 0)[[0, 5]]`` is an empty
        # (2, 0) tensor); a nonempty index into a dimension of size 0 is
        # refused at the call, whatever its values
        return
    indices = args[1] if len(args) > 1 else kwargs.get("indices")
    dim = 0
    given = 0  # CPU's message names an index by its place among the given ones (x[:, :, i]: dimension 0)
    for idx in indices or ():
        if idx is None:
            dim += 1
        elif idx.dtype.is_floating_point or idx.dtype in _MASKS:
            dim += max(idx.dim(), 1)
            given += max(idx.dim(), 1)
        else:
            _check(idx, x.shape[dim] if dim < x.dim() else 1, given, True, _index_error)
            dim += 1
            given += 1


def _along(error: Callable[[int, int, int], Exception] | Callable[[tuple, dict, Any, int], Any],
           chosen: bool = False, empty_ok: bool = False) -> Callable[[tuple, dict], None]:
    """The check of an op taking ``(self, dim, index, ...)``: ``error``, or
    where ``chosen`` a function of ``(args, kwargs, self, dim)`` giving the
    error the CPU kernel's path for this call raises (None: it checks
    nothing).  ``empty_ok``: CPU checks nothing where ``self`` is empty
    along another dimension than ``dim``."""
    def check(args: tuple, kwargs: dict) -> None:
        x = args[0]
        dim = args[1] if len(args) > 1 else kwargs["dim"]
        index = args[2] if len(args) > 2 else kwargs["index"]
        if isinstance(dim, str):
            return  # named dimensions: left to torch
        size, dim = _size(x, dim)
        if x.numel() == 0 and size > 0 and empty_ok:
            return  # CPU's kernel touches no element of an empty self, so checks no index
        err = error(args, kwargs, x, dim) if chosen else error
        if err is not None:
            _check(index, size, dim, False, err)

    check.along_dim = True
    return check


def _index_select_path(args: tuple, kwargs: dict, x: Any, dim: int) -> Any:
    """torch CPU's index_select checks each index with ``TORCH_CHECK_INDEX``
    (IndexError, "index out of range in self"), except on its paths for a
    self of more than one dimension that is empty or indexed along dim 1
    into a contiguous result: a RuntimeError ("INDICES element is out of
    DATA bounds")."""
    if x.dim() <= 1:
        return _in_self_error
    out = kwargs.get("out")
    contiguous = out is None or out.is_contiguous() or out.numel() == 0
    return _index_select_error if x.numel() == 0 or (dim == 1 and contiguous) else _in_self_error


def _index_add_path(args: tuple, kwargs: dict, x: Any, dim: int) -> Any:
    """torch CPU's index_add: a self of at most one dimension checks each
    index with ``TORCH_CHECK_INDEX`` (IndexError, "index out of range in
    self"); an empty self of more dimensions checks nothing; along its first
    or last dimension with alpha 1, an int64 index and a source of self's
    other sizes, the kernel is scatter_add_ (RuntimeError, "index 5 is out
    of bounds for dimension 0 with size 3"); any other call the IndexError."""
    if x.dim() <= 1:
        return _in_self_error
    if x.numel() == 0:
        return None
    index = args[2] if len(args) > 2 else kwargs["index"]
    source = args[3] if len(args) > 3 else kwargs.get("source")
    alpha = args[4] if len(args) > 4 else kwargs.get("alpha", 1)
    if (dim == 0 or dim == x.dim() - 1) and alpha == 1 and index.dtype == torch.int64 \
            and isinstance(source, torch.Tensor) and source.dim() == x.dim() \
            and all(a == b for i, (a, b) in enumerate(zip(x.shape, source.shape)) if i != dim):
        return _runtime_error
    return _in_self_error


def _embedding(args: tuple, kwargs: dict) -> None:
    """CPU's embedding is ``index_select`` of the weight's rows: its error
    is index_select's for an empty weight (RuntimeError, "INDICES element
    is out of DATA bounds"), else "index out of range in self"."""
    weight = args[0]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    _check(indices, weight.shape[0], 0, False, _index_select_error if weight.numel() == 0 else _embedding_error)


def _take(args: tuple, kwargs: dict) -> None:
    x = args[0]
    index = args[1] if len(args) > 1 else kwargs["index"]
    _check(index, x.numel(), 0, True, _take_error)


def _nll_loss(args: tuple, kwargs: dict) -> None:
    """``nll_loss_forward`` / ``nll_loss2d_forward(self, target, weight,
    reduction, ignore_index)``: each target is a class of ``self`` (its
    dim 1, or dim 0 of a 1-D input) or the ignore_index.  Without the
    check a wrong class count gives a NaN or a wrong loss, where CPU's
    kernels raise."""
    x = args[0]
    target = args[1] if len(args) > 1 else kwargs["target"]
    ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
    dim = 1 if x.dim() >= 2 else 0
    _check(target, x.shape[dim], dim, False, _target_error, ignore)


_MASKS = (torch.bool, torch.uint8)

# op name without namespace, overload and trailing underscore -> check
_CHECKS: dict[str, Callable[[tuple, dict], None]] = {
    "index": _advanced,
    "index_put": _advanced,
    "_index_put_impl": _advanced,
    "index_select": _along(_index_select_path, chosen=True),
    "gather": _along(_runtime_error),
    "scatter": _along(_runtime_error),
    "scatter_add": _along(_runtime_error),
    "scatter_reduce": _along(_runtime_error),
    "index_add": _along(_index_add_path, chosen=True),
    "index_copy": _along(_index_copy_error, empty_ok=True),
    "index_fill": _along(_index_error, empty_ok=True),
    "embedding": _embedding,
    "take": _take,
    "put": _take,  # put(self, index, source): the same flat index, the same error
    "nll_loss_forward": _nll_loss,
    "nll_loss2d_forward": _nll_loss,
}


def checker_for(name: str) -> Callable[[tuple, dict], None] | None:
    """The index check of ATen op ``name`` ("aten::gather.out"), or None."""
    namespace, _, rest = name.rpartition("::")
    if namespace not in ("aten", ""):  # c10d::gather_ is no aten::gather
        return None
    base = rest.split(".", 1)[0].rstrip("_")
    return _CHECKS.get(base)


_ALONG_DIM = {k for k, v in _CHECKS.items() if getattr(v, "along_dim", False)}


def indexes_along_dim(name: str) -> bool:
    """Whether ATen op ``name`` takes ``(self, dim, index, ...)``."""
    namespace, _, rest = name.rpartition("::")
    return namespace in ("aten", "") and rest.split(".", 1)[0].rstrip("_") in _ALONG_DIM
