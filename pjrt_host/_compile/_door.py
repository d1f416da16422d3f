"""Everything the compile backend needs of the 'jax' torch device, in one
place: taking a tensor's storage array and view, putting new values back,
wrapping results, the device's random state, configuration and transfers.

The rest of the backend works on jax arrays and these few functions only, so
a change of the device's internals is a change here: only this module
imports ``_torch`` and reads a tensor's storage or view
(``tests/test_layers.py`` checks both).
"""

from __future__ import annotations

from typing import Any

import torch

from .._lowerings import LoweringContext
from .._lowerings._dtypes import jax_dtype, torch_dtype
from .._torch import (DEVICE_NAME, _config, _conversion, _devices, _dtype_policy, _dynamic_dims, _index_checks,
                      _lowering_context, _padding, _rng, _sharding, _strided, _sync, _tensor, _value_checks)
from .._torch._hiding import dynamo_compiling, our_trace
from .._torch._tensor import DONATE, JaxTensor, TensorSpec, dense_layout

__all__ = [
    "DEVICE_NAME", "DONATE", "JaxTensor", "TensorSpec", "argument", "check_results_fit", "check_writable", "config",
    "constraint_sharding", "current_index", "custom_op_kernel", "defer_check", "dense_layout", "device_dtype",
    "device_index",
    "draw_key", "dynamo_compiling", "eager_dispatch_hooks", "load_device", "has_index_check", "has_value_check", "host_values",
    "index_failure", "index_of_array", "index_sites", "jax_device", "lowering_context", "next_key_args",
    "note_result", "our_trace", "out_of_memory", "put_storage", "read", "storage", "storage_of", "to_device_array",
    "to_torch", "torch_device", "torch_dtype", "value_sites", "wrap", "write",
    # dynamic dimensions (_padded_graph)
    "bucket", "device_scalar", "fill", "fill_of", "max_bucket", "note_fallback", "note_padded", "pad_as", "padded_array",
    "padded_rule", "place_of", "placed", "positions", "wrap_padded",
]


def unwrap(args: list) -> tuple[tuple, list, list, list, Any, bool]:
    """What one compiled call takes from its arguments, without a copy:
    ``(layout, arrays, offsets, owners, place, mixed)``: ``place`` is the
    first storage's (its device index, or a mesh placement when sharded),
    ``mixed`` whether another storage lives elsewhere.

    ``arrays`` holds each distinct storage's jax array once (a view and its
    base share one); ``layout`` has one entry per argument: the storage's
    slot (an int) for a tensor that is its whole storage, ``("v", slot,
    static)`` for a view (its run-time offset appended to ``offsets``),
    ``("c", slot)`` for a torch tensor of another device (copied to the
    device), ``("s", value)`` for a Python number (a size, in dynamic
    graphs).  ``owners[slot]`` is the storage (or the foreign tensor)."""
    layout: list[Any] = []
    arrays: list[Any] = []
    offsets: list[Any] = []
    owners: list[Any] = []
    seen: dict[int, int] = {}
    place = None
    mixed = False
    for a in args:
        if isinstance(a, JaxTensor):
            st = a._storage
            slot = seen.get(id(st))
            if slot is None:
                slot = seen[id(st)] = len(arrays)
                arr = st.array
                arrays.append(arr if arr is not None else st.get())
                owners.append(st)
                p = st.place
                if place is None:
                    place = p
                elif p != place:
                    mixed = True
            vw = a._view
            if vw is None:
                layout.append(slot)
            else:
                layout.append(("v", slot, vw.static))
                offsets.append(vw.run_offset)
        elif isinstance(a, torch.Tensor):
            layout.append(("c", len(arrays)))
            arrays.append(a)  # converted by the caller, once the device is known
            owners.append(a)
        else:
            layout.append(("s", a))
    return tuple(layout), arrays, offsets, owners, place, mixed


def index_of(place: Any) -> int:
    """The torch device index of a place (a device index or a mesh placement)."""
    return place if type(place) is int else place.index


def onto_mesh(arrays: list, owners: list, place: Any, required: Any = None) -> Any:
    """Put every array of one compiled call on one mesh when any is sharded
    (or the graph constrains values onto ``required``'s mesh): arrays on a
    single device are replicated over it.  Returns the call's place."""
    places = [required, place] + [o.place for o in owners if isinstance(o, _tensor.Storage)]
    found = _sharding.unify(places, arrays)
    return place if found is None else found


def graph_placement(gm: torch.fx.GraphModule) -> Any:
    """The mesh a graph's sharding constraints name (None: it has none)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and "sharding_constraint" in str(node.target) and len(node.args) >= 2:
            return _sharding.placement(_sharding.mesh_by_key(node.args[1]))
    return None


def storage_of(t: JaxTensor) -> tuple[Any, Any, tuple | None, Any]:
    """(storage object, its array, the view's static layout or None, the
    view's run-time offset) of a 'jax' tensor: what a compiled function
    needs to read the tensor's values without a copy."""
    st = t._storage
    arr = st.array
    if arr is None:
        arr = st.get()
    vw = t._view
    if vw is None:
        return st, arr, None, 0
    return st, arr, vw.static, vw.run_offset


def storage(t: JaxTensor) -> Any:
    """The storage of a 'jax' tensor, as a handle to pass back here
    (``onto_mesh``, ``put_storage``); never read into outside this module."""
    return t._storage


def argument(t: JaxTensor) -> tuple[int, Any, Any, TensorSpec | None]:
    """What a traced call takes of a 'jax' tensor argument: ``(device index,
    its values as a jax array, its storage's place, its key)``: for a tensor
    that is its whole storage the storage's own array (no copy) and spec,
    for a view its values read through the view and None."""
    st = t._storage
    if t._view is None:
        arr = st.array
        return st.device_index, (arr if arr is not None else st.get()), st.place, st.spec
    return st.device_index, _tensor.read(t), st.place, None


def view_read(array: Any, static: tuple | None, offset: Any) -> Any:
    """Traceable: a view's values from its storage array."""
    return _strided.read(array, static, offset)


def view_write(array: Any, static: tuple | None, offset: Any, value: Any) -> Any:
    """Traceable: the storage array with a view's elements replaced."""
    return _strided.write(array, static, offset, value)


def check_writable(st: Any) -> None:
    """Raise eager's refusal if a compiled call must not write storage ``st``
    (a read-only snapshot): asked before the call runs, as eager asks."""
    st.check_writable()


def put_storage(st: Any, array: Any, settle: bool = False) -> None:
    """A storage's new values, written by a compiled call (one write:
    ``Storage.commit``; ``settle``: laid out as its previous values, for a
    value computed on a mesh)."""
    st.commit(array, settle)


def device_index(t: JaxTensor) -> int:
    return t._storage.device_index


def place_of(t: JaxTensor) -> Any:
    """Where a 'jax' tensor's storage lives: its device index, or a mesh placement."""
    return t._storage.place


def current_index() -> int:
    return _devices.current_index()


def wrap(array: Any, index: int, dtype: torch.dtype, place: Any = None) -> JaxTensor:
    """A new 'jax' tensor owning ``array`` (on device ``index``, or on
    ``place``'s mesh)."""
    shape = tuple(array.shape)
    return _tensor.result_tensor(array, shape, dtype, index, place)


def note_result(index: int, array: Any) -> None:
    """``torch.jax.synchronize()`` waits for ``array``."""
    _sync.note_result(index, array)


def last_result(index: int) -> Any:
    """The array ``torch.jax.synchronize()`` would wait for on ``index``
    (None: none, or nobody holds it any more)."""
    return _sync.last_result(index)


def has_index_check(name: str) -> bool:
    """Whether eager mode checks the indices of ATen op ``name``."""
    return _index_checks.checker_for(name) is not None


def index_sites(name: str, args: tuple, kwargs: dict) -> list[tuple]:
    """The index checks eager mode makes for ATen op ``name``, read from a
    graph's fake tensors: ``[(index, size, dim, negative_ok, error, ignore)]``."""
    return _index_checks.sites(name, args, kwargs)


def has_value_check(name: str) -> bool:
    """Whether eager mode checks the argument values of ATen op ``name``."""
    return _value_checks.checker_for(name) is not None


def value_sites(name: str, args: tuple, kwargs: dict) -> list[tuple]:
    """The value checks eager mode makes for ATen op ``name``, read from a
    graph's fake tensors: ``[(tensor or None, verdict, error)]``."""
    return _value_checks.sites(name, args, kwargs)


def index_failure(error: Any, value: int, dim: int, size: int, op: str, where: str, when: str) -> Exception:
    """The exception of a failed index check, worded as eager's deferred one."""
    return _index_checks.failure(error, value, dim, size, op, where, when)


def defer_check(verdict: Any) -> None:
    """Queue ``verdict(wait)`` with eager's deferred checks (run at the next
    synchronisation point: ``.item()``, ``.cpu()``, ``torch.jax.synchronize()``)."""
    _sync.defer_check(verdict)


def jax_device(index: int) -> Any:
    return _devices.jax_device(index)


def index_of_array(array: Any) -> int | None:
    """The 'jax' device index of an array on one of the selected plugin's
    devices (None for an array elsewhere, or on several devices)."""
    devices = array.devices()
    if len(devices) != 1:
        return None
    (device,) = devices
    for i in range(_devices.count()):
        if _devices.jax_device(i) == device:
            return i
    return None


def torch_device(index: int) -> torch.device:
    return _devices.torch_device(index)


def read(t: JaxTensor) -> Any:
    """A 'jax' tensor's values as a jax array (its storage array itself for
    a tensor that is its whole storage: no copy)."""
    return _tensor.read(t)


def write(t: JaxTensor, value: Any) -> None:
    """Replace a 'jax' tensor's values (through its view) with ``value``."""
    _tensor.write(t, value)


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    return _dtype_policy.device_dtype(dtype)


def config() -> Any:
    return _config.current()


def lowering_context(cfg: Any, one_device: bool = False) -> LoweringContext:
    """The context eager ops run lowerings with under ``cfg`` (no key);
    ``one_device``: the program runs on one device, not over a mesh."""
    return _lowering_context.lowering_context(cfg, one_device)


def next_key_args(index: int) -> tuple[Any, int]:
    """(key data uint32[2], counter) of the next draw from device ``index``'s
    generator; advances it."""
    return _rng.next_key_args(index)


def draw_key(key_data: Any, counter: Any) -> Any:
    """Traceable: the jax key of one draw from ``next_key_args``' pair."""
    return _rng.draw_key(key_data, counter)


def to_device_array(t: torch.Tensor, index: int) -> Any:
    """A jax array on device ``index`` with a (non-'jax') torch tensor's
    values in the dtype the device holds it in (the plugin's dtype policy;
    DLPack where the plugin allows it)."""
    return _conversion.to_jax_array(t, index, device_dtype(t.dtype))


def host_values(t: torch.Tensor) -> Any:
    """A numpy array of the jax dtype with a copy of CPU tensor ``t``'s
    values, bit for bit (the bytes of the host transfer path of
    :func:`to_device_array`: bfloat16, float8s, float64, NaN payloads and
    large integers exactly).  On no device: for a graph's constants, which
    the program it is traced into puts where it runs."""
    import numpy as np

    t = t.detach().resolve_conj().resolve_neg()
    return np.array(_conversion.host_array(t), copy=True)


def to_torch(array: Any, index: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor on ``device`` (not 'jax') with ``array``'s values."""
    return _conversion.to_torch(wrap(array, index, dtype), device, dtype)


def jax_dtype_of(dtype: torch.dtype) -> Any:
    return jax_dtype(device_dtype(dtype))


def constraint_sharding(mesh: str, spec: str) -> Any:
    """The jax sharding of ``pjrt_host::sharding_constraint(mesh, spec)``."""
    return _sharding.constraint_sharding(mesh, spec)


def custom_op_kernel(op: Any) -> Any:
    """The one implementation for every device of a custom op (outside
    aten), or None (see ``_dispatch.custom_op_kernel``)."""
    from .._torch._dispatch import custom_op_kernel

    return custom_op_kernel(op)


def load_device() -> None:
    """Load the device (its dispatcher on the tensor class) if no eager op
    has yet: a compiled function may be the first to make a 'jax' tensor
    (``x.to('jax')`` inside it), and its results must work outside it."""
    from .._torch import _loader

    _loader.device()


def eager_dispatch_hooks() -> list[tuple[Any, str]]:
    """(object, attribute) of every function through which an eager op
    reaches the device: ``__torch_dispatch__``'s target and the C++
    kernels' targets.  Tests wrap them to count eager ops."""
    from .._torch import _factories, _loader

    return [(_tensor, "_dispatch"), (_loader, "_dispatch_fn"), (_factories, "run_factory"), (_factories, "run")]


def out_of_memory(err: BaseException, what: str, index: int) -> Exception | None:
    """``torch.OutOfMemoryError`` naming ``what`` for an allocation failure
    (jax's RESOURCE_EXHAUSTED), None for any other error."""
    from .._torch import _memory

    return _memory.as_out_of_memory(err, what, index=index)


def check_results_fit(arrays: Any, index: int, what: str) -> None:
    """Raise ``torch.OutOfMemoryError`` naming ``what`` when ``arrays``
    together exceed what device ``index`` can hold."""
    from .._torch import _memory

    _memory.check_fits(sum(a.nbytes for a in arrays), index, what)


# ------------------------------------------------------------ dynamic dimensions


def bucket(n: int, odd: bool = False) -> int:
    """The physical size a logical size ``n`` is padded to (eager's buckets)."""
    return _padding.bucket(n, odd)


def max_bucket() -> int:
    """The largest bucket a size may have: sizes travel as int32 scalars
    (``_padding.MAX_SIZE``, read at each call)."""
    return _padding.MAX_SIZE


def fill(arr: Any, masks: tuple, sizes: Any, value: Any) -> Any:
    """Traceable: ``arr`` with its padding set to ``value`` (eager's fill)."""
    return _padding.fill(arr, masks, sizes, value)


def positions(shape: tuple, comps: tuple, sizes: Any) -> Any:
    """Traceable: the logical flat index of every position of a padded
    array (eager's, for draws over padding)."""
    return _padding.positions(shape, comps, sizes)


def inside(shape: tuple, masks: tuple, sizes: Any) -> Any:
    """Traceable: the mask of the logical positions of a padded array
    (eager's ``LoweringContext.logical``)."""
    return _padding.inside(shape, masks, sizes)


def placed(a: Any, dim: int, physical: int, at: Any, count: Any, otherwise: Any) -> Any:
    """Traceable: ``a`` placed along ``dim`` of a bucket of ``physical``
    from the run-time offset ``at`` (eager's joins and pads)."""
    return _dynamic_dims.placed_at(a, dim, physical, at, count, otherwise)


def padded_rule(target: Any, name: str, lowering: Any) -> Any:
    """Eager's rule for reading padded inputs of the functional op
    ``target`` (None: it has none)."""
    return _dynamic_dims.rule_for(target, name, lowering, None, ())


def fill_of(rule: Any, position: Any, args: tuple, kwargs: dict) -> Any:
    return _dynamic_dims.fill_of(rule, position, args, kwargs)


def note_fallback(who: str, why: str) -> None:
    """Counted in ``torch.jax.dynamic_shape_stats()["fallbacks_by_reason"]``."""
    _padding.note_fallback(who, why)


def note_padded(event: str, physical: tuple | None = None, logical: tuple | None = None) -> None:
    """A padded graph call (``physical`` / ``logical`` shapes of its first
    padded input) or another event counted in the statistics."""
    if physical is not None:
        _padding.note_padded_call(physical, logical)
    else:
        _padding.note(event)


def device_scalar(n: int, index: int) -> Any:
    """``n`` as an int32 array on device ``index``, made once per value."""
    return _padding.device_scalar(n, index)


def whole_exact_storage(t: Any) -> Any:
    """The storage of a 'jax' tensor that is all of it, laid out exact (what
    a padded graph may write an input's new values into); else None."""
    if type(t) is not JaxTensor or t._view is not None or t._storage.padded is not None:
        return None
    return t._storage


def whole_padding(t: Any) -> tuple | None:
    """``Storage.padded`` of a 'jax' tensor that is its whole storage (None:
    exact, a view, or not a 'jax' tensor)."""
    if type(t) is not JaxTensor or t._view is not None:
        return None
    return t._storage.padded


def padded_array(t: JaxTensor, padded: tuple) -> Any:
    """The array of ``t`` laid out as ``padded`` (per dim its components
    ``(physical, logical, dynamic)``): its storage's own array when ``t`` is
    a whole storage padded so, else its values padded (a copy)."""
    st = t._storage
    if t._view is None and st.padded == padded:
        return st.computed()  # (a fused-eager result still pending runs its segment)
    if t._view is None and st.padded is not None:
        moved = _padding.relayout(st.computed(), st.padded, padded)  # (another bucket of the same sizes)
        if moved is not None:
            _padding.note("pads")
            return moved
    values = _tensor.read(t)  # logical (a padded storage is cut)
    if _padding.physical_shape(padded) == tuple(values.shape):
        return values
    _padding.note("pads")
    return _padding.pad_as(values, padded)


def pad_as(arr: Any, padded: tuple) -> Any:
    return _padding.pad_as(arr, padded)


def wrap_padded(array: Any, shape: tuple, index: int, dtype: torch.dtype, padded: tuple) -> JaxTensor:
    """A new 'jax' tensor of logical ``shape`` over the padded ``array``."""
    _padding.live = True
    return _tensor.result_tensor(array, tuple(shape), dtype, index, None, padded)
