"""The tensor subclass behind every 'jax' tensor, and its storage model.

A :class:`JaxTensor` is a wrapper tensor (no torch storage) whose metadata
(sizes, strides, storage offset, dtype, device) is torch's own, so
``x.stride()``, ``x.is_contiguous()`` and autograd's view tracking behave as
on CPU.  Its data lives in a :class:`Storage`: one jax array that every view
of the same base shares.  A tensor reads its values from the storage through
its :class:`View` (none for the common case of a tensor that *is* its
storage), and an in-place op writes them back through the same view, so a
write through a slice changes exactly the elements it changes on CPU.

jax arrays are immutable: a write replaces the storage's array, and every
tensor sharing the storage sees the new values on its next read.

The functions here are the eager primitives every layer above uses: make a
tensor over a storage, read a tensor's values, write them, wrap a result.
Which function runs an ATen op is decided above (``_dispatch``), and
installed on :class:`JaxTensor` once by ``_loader`` (:func:`install_dispatcher`).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import torch

from .. import _env, _program_cache
from .._lowerings._dtypes import jax_dtype, torch_dtype
from . import _padding, _printing, _sharding, _strided
from ._devices import jax_device, torch_device
from ._dtype_policy import device_dtype
from ._sync import note_result, wait_queued

__all__ = [
    "DONATE", "JaxTensor", "Pending", "Storage", "TensorSpec", "View", "contiguous_strides", "dense_layout",
    "finish_op", "install_dispatcher", "make", "new_tensor", "read", "read_through", "result_tensor", "view_for",
    "wrap_array", "write",
]


class TensorSpec(tuple):
    """What a compiled op is keyed on for one tensor argument (the values
    are passed at run time): ``(storage jax dtype, storage shape,
    View.static or None)``.  A tuple subclass rather than a NamedTuple: one
    is made per op result, and this costs a third as much."""

    __slots__ = ()

    @property
    def view(self) -> tuple | None:
        """``View.static``; None: the tensor is its storage."""
        return self[2]


class Storage:
    """The data shared by a base tensor and all its views: a jax array of
    shape ``shape`` (row-major; a view's strides index it flat), or None
    while nothing has been written (an ``empty`` tensor).

    ``place`` is where the array lives (``_sharding``): ``device_index``
    itself for one device, a ``MeshPlacement`` for an array sharded over a
    mesh (``device_index`` is then the torch device the tensor reports)."""

    __slots__ = ("_array", "shape", "jax_dtype", "device_index", "place", "spec", "torch_storage",
                 "read_only", "padded", "__weakref__")

    @property
    def array(self) -> Any:
        """The jax array (None before the first write), of ``shape``.  Under
        fused eager a result may still be :class:`Pending` in its segment:
        reading it runs the segment (``_fused``).  A padded array is cut to
        ``shape`` first, for good (``_padding``)."""
        a = self._array
        if type(a) is Pending:  # (computed(), inline: every read passes here)
            a.segment.flush()
            a = self._array
        if self.padded is not None:
            a = self.unpad("a read without padding")
        return a

    def computed(self) -> Any:
        """The array as it is laid out (padded ones too), a fused-eager
        result computed first (its segment runs)."""
        a = self._array
        if type(a) is Pending:
            a.segment.flush()
            a = self._array
        return a

    @array.setter
    def array(self, value: Any) -> None:
        self.padded = None
        self._array = value

    def unpad(self, who: str) -> Any:
        """Cut a padded array to the logical ``shape`` (``who``: the op or
        path that cannot read padding, counted in the statistics); the
        storage keeps the cut array.  Returns the array."""
        if self.padded is not None:
            self._array = _padding.cut(self.computed(), self.padded, self.shape)
            self.padded = None
            _padding.note_cut(who)
        return self._array

    @property
    def pending(self) -> bool:
        """Whether the array is a result fused eager has not computed yet."""
        return type(self._array) is Pending

    def __init__(self, array: Any, shape: tuple[int, ...], dtype: Any, device_index: int, place: Any = None,
                 padded: tuple | None = None) -> None:
        self._array = array
        #: None, or per dim its components ``(physical, logical, dynamic)``:
        #: ``array`` is padded beyond ``shape`` (``_padding``)
        self.padded = padded
        self.shape = shape
        self.jax_dtype = dtype
        self.device_index = device_index
        self.place = device_index if place is None else place
        self.spec = TensorSpec((dtype, shape, None))
        self.torch_storage: Any = None  #: the torch UntypedStorage naming it (_storage_bridge), made on first use
        #: Why a write is refused (a byte-level snapshot of another Storage, see _storage_ops.set_), else None.
        self.read_only: str | None = None

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.jax_dtype).itemsize

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def get(self) -> Any:
        """The array, made (zeros) on first use for an ``empty`` tensor."""
        if self.array is None:
            place = self.place
            if type(place) is int and 0 in self.shape:
                self.array = _no_elements(self.shape, self.jax_dtype, place)
            else:
                target = jax_device(place) if type(place) is int else place.replicated
                self.array = _sharding.device_put(np.zeros(self.shape, dtype=self.jax_dtype), target)
        return self.array

    @property
    def sharded(self) -> bool:
        return type(self.place) is not int

    def check_writable(self) -> None:
        """Raise why this storage refuses writes (a byte-level snapshot of
        another storage), if it does."""
        if self.read_only is not None:
            raise RuntimeError(self.read_only)

    def commit(self, array: Any, settle: bool = False) -> None:
        """Make ``array`` this storage's values: the one way a write lands
        (eager ops, writes through views, fused eager's pending results,
        compiled graphs' input mutations).  Refused for a read-only storage;
        laid out as the previous array when the storage is sharded or
        ``settle`` (the value was computed on a mesh); the latest result
        :func:`synchronize` waits for.  (torch counts the write in the
        tensors' ``_version`` itself.)"""
        if self.read_only is not None:
            raise RuntimeError(self.read_only)
        self.padded = None
        if settle or type(self.place) is not int:
            previous = self._array
            if previous is not None and type(previous) is not Pending:
                array = _sharding.settle(array, previous)
        self._array = array
        if type(array) is not Pending:
            note_result(self.device_index, array)

    def take(self, source: "Storage") -> None:
        """Make ``source``'s whole array (padding included) this storage's
        values, laid out as ``source`` is: under fused eager a result still
        pending is shared, not computed (its segment goes on recording)."""
        value = source._array
        if type(value) is not Pending or not value.segment.share(value, self):
            self.commit(source.computed() if value is not None else source.get())  # (get: an empty's zeros)
        self.padded = source.padded


_empty_arrays: dict[tuple, Any] = {}


def _no_elements(shape: tuple[int, ...], dtype: Any, place: int) -> Any:
    """An array of no elements, shared by every storage of its shape, dtype
    and device (nothing can be written into it): a transfer costs about 35
    us, and transformers' DynamicCache cats its keys onto an empty tensor
    per layer in every forward."""
    key = (shape, dtype, place)
    arr = _empty_arrays.get(key)
    if arr is None or arr.is_deleted():  # (a program given it as donated deletes it)
        if len(_empty_arrays) > 256:
            _empty_arrays.clear()
        arr = _empty_arrays[key] = _sharding.device_put(np.zeros(shape, dtype=dtype), jax_device(place))
    return arr


class Pending:
    """A result fused eager recorded and has not computed yet: the
    ``index``-th result of ``segment`` (a ``_fused.Segment``), of ``shape``
    and jax ``dtype``.  Held by a Storage in place of its array."""

    __slots__ = ("segment", "index", "shape", "dtype")

    def __init__(self, segment: Any, index: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.segment = segment
        self.index = index
        self.shape = shape
        self.dtype = dtype


class View:
    """How a tensor's values sit in its storage, as torch strides.

    ``kind`` is the cheapest way to read them: ``"reshape"`` (a contiguous
    reinterpretation of the whole storage), ``"perm"`` (a permutation of the
    storage's dims, e.g. ``.t()``: ``perm`` over ``perm_shape``) or
    ``"range"`` (a contiguous run of the storage at ``offset``: a slice) or
    ``"gather"`` (anything else: flat indices ``offset + sum(i_k *
    stride_k)``).  ``elem`` is None, or the element type the view reads the
    storage's bytes as (``view(dtype)``: sizes, strides and offset count
    those elements).  ``static`` is the hashable part that compiled ops are
    keyed on; the offset of a gather is passed at run time (``run_offset``),
    so ``x[i]`` for many ``i`` compiles once."""

    __slots__ = ("kind", "size", "stride", "offset", "run_offset", "static", "spec", "elem")

    def __init__(self, storage: Storage, kind: str, size: tuple[int, ...], stride: tuple[int, ...], offset: int,
                 permutation: tuple | None = None, elem: Any = None) -> None:
        self.kind = kind
        self.size = size
        self.stride = stride
        self.offset = offset
        self.elem = elem
        self.run_offset = offset if kind in ("gather", "range") else 0
        self.static = (kind, size, stride if kind == "gather" else None, permutation, elem)
        self.spec = TensorSpec((storage.jax_dtype, storage.shape, self.static))


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def dense_layout(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``size`` out without overlap or gaps (torch's
    ``is_non_overlapping_and_dense``: the dimensions of size 2 or more,
    by increasing stride, each step the product of the sizes before; an
    empty tensor is contiguous, whatever its strides)."""
    if 0 in size:
        return True
    expected = 1
    for d in sorted(range(len(size)), key=lambda d: stride[d]):
        if size[d] < 2:
            continue
        if stride[d] != expected:
            return False
        expected *= size[d]
    return True


def view_for(storage: Storage, size: tuple[int, ...], stride: tuple[int, ...], offset: int,
             elem: Any = None) -> View | None:
    """The View of a tensor with these strides into ``storage`` (None: the
    tensor is the storage as it is).  ``elem``: the element type a
    ``view(dtype)`` reads the storage as (None: the storage's own)."""
    if elem is not None and np.dtype(elem) == np.dtype(storage.jax_dtype):
        elem = None
    numel = math.prod(size)
    if elem is None:
        whole, shape = storage.numel, storage.shape
    else:
        elem = np.dtype(elem)
        whole = storage.nbytes // elem.itemsize
        shape = (whole,)
    if offset == 0 and numel == whole:
        if elem is None and size == shape and (numel <= 1 or stride == contiguous_strides(size)):
            return None
        if numel <= 1 or _is_contiguous(size, stride):
            return View(storage, "reshape", size, stride, 0, elem=elem)
        # A permutation of a contiguous layout (t(), transpose, permute).
        dims = sorted(range(len(size)), key=lambda d: (-stride[d], d))
        sorted_size = tuple(size[d] for d in dims)
        if tuple(stride[d] for d in dims) == contiguous_strides(sorted_size) and all(s > 0 for s in size):
            inverse = tuple(dims.index(d) for d in range(len(size)))
            return View(storage, "perm", size, stride, 0, (sorted_size, inverse), elem=elem)
    if numel > 0 and _is_contiguous(size, stride) and offset + numel <= whole:
        # A contiguous run of the storage (x[i], x[a:b]): a slice, not a gather.
        return View(storage, "range", size, stride, offset, elem=elem)
    return View(storage, "gather", size, stride, offset, elem=elem)


def _is_contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for s, st in zip(reversed(size), reversed(stride)):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


# Instance attributes that are this class's own (the data, and torch's mark
# of a Parameter), not a user's: pickling leaves them out of the state.
_OWN_ATTRIBUTES = frozenset(("_storage", "_view", "_is_param"))


def _no_dispatcher(func: Any, args: tuple, kwargs: dict) -> Any:
    raise RuntimeError("pjrt_host: the 'jax' device is not registered with torch (import pjrt_host)")


class JaxTensor(torch.Tensor):
    """A torch tensor on a 'jax' device.  Users never name this class: they
    make tensors with ``device='jax'`` or ``.to('jax')``."""

    # Skip the torch-function layer: every op reaches __torch_dispatch__
    # directly, which is where the work happens.
    __torch_function__ = torch._C._disabled_torch_function_impl

    # No slots: ``_storage`` and ``_view`` live in the instance dict, so
    # torch.utils.swap_tensors can swap a 'jax' tensor with a CPU Parameter
    # (it refuses classes with different slots) -- which keeps parameter
    # objects and ties through module.to('jax') (see _modules).  Measured:
    # making a tensor costs ~0.1 us more than with slots, of ~8 us per op.
    __slots__ = ()
    _storage: Storage
    _view: View | None

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> JaxTensor:
        raise TypeError("pjrt_host: make 'jax' tensors with device='jax' or tensor.to('jax')")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _no_dispatcher(func, args, kwargs)  # replaced by install_dispatcher

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return _printing.tensor_repr(self)

    def __reduce_ex__(self, proto: int):
        # As torch reduces a tensor with a storage: its typed storage (one
        # per Storage, so views and tied tensors are saved once and come
        # back sharing it), offset, size and stride.  The storage is tagged
        # 'jax:N', so torch.load's map_location applies as for cuda, and
        # torch.save writes it through storage.cpu().
        #
        # A Parameter on 'jax' is this class with ``_is_param`` set (torch's
        # nn.Parameter path for tensor subclasses), so it reduces as
        # nn.Parameter.__reduce_ex__ does: torch._utils._rebuild_parameter
        # over the detached data, with requires_grad, no hooks, and the
        # user's attributes, if any (_rebuild_parameter_with_state).  Both
        # are on torch.load's weights_only list, and rebuild a Parameter on
        # whatever device map_location puts the data (a CPU Parameter with
        # map_location='cpu').
        import collections

        attrs = self.__dict__
        if attrs.get("_is_param", False):
            state = {k: v for k, v in attrs.items() if k not in _OWN_ATTRIBUTES}
            data = torch.Tensor.detach(self)
            if state:
                return (torch._utils._rebuild_parameter_with_state,
                        (data, self.requires_grad, collections.OrderedDict(), state))
            return (torch._utils._rebuild_parameter, (data, self.requires_grad, collections.OrderedDict()))
        args = (self.storage_offset(), tuple(self.size()), self.stride(), self.requires_grad,
                collections.OrderedDict())
        if self.dtype in torch.storage._new_dtypes():
            # torch's rule (Tensor._reduce_ex_internal): dtypes TypedStorage
            # does not know (float8s, uint16/32/64, ...) are saved as the
            # untyped storage with the dtype beside it (_rebuild_tensor_v3).
            return (torch._utils._rebuild_tensor_v3, (self.untyped_storage(), *args, self.dtype))
        storage = torch.storage.TypedStorage(wrap_storage=self.untyped_storage(), dtype=self.dtype, _internal=True)
        return (torch._utils._rebuild_tensor_v2, (storage, *args))

    # ``z.real = v`` / ``z.imag = v``: torch writes through the real view of
    # a complex tensor, which the device computes as a new tensor (see
    # docs/torch-device.md), so the assignment would be lost.  Assigning
    # the attribute writes the tensor itself; reading is torch's.
    @property
    def real(self) -> torch.Tensor:
        return torch.real(self)

    @real.setter
    def real(self, value: Any) -> None:
        self._set_part(value, imag=False)

    @property
    def imag(self) -> torch.Tensor:
        return torch.imag(self)

    @imag.setter
    def imag(self, value: Any) -> None:
        self._set_part(value, imag=True)

    def _set_part(self, value: Any, imag: bool) -> None:
        if not self.is_complex():  # torch's own behaviour (and error, for imag)
            (torch.Tensor.imag if imag else torch.Tensor.real).__set__(self, value)
            return
        part = torch.as_tensor(value, device=self.device).to(torch.real(self).dtype).expand(self.shape)
        self.copy_(torch.complex(torch.real(self), part) if imag else torch.complex(part, torch.imag(self)))

    def untyped_storage(self) -> torch.UntypedStorage:
        """A torch storage on this tensor's device, the same object for
        every tensor over the same data: its ``data_ptr()`` identifies the
        data (an address range of the storage's size that no other storage
        overlaps, with no memory behind it) and ``nbytes()`` is its size.
        ``storage.cpu()`` copies the values; torch.save / torch.load go
        through it."""
        storage = self._storage
        found = storage.torch_storage
        if found is None:
            from . import _storage_bridge

            found = storage.torch_storage = _storage_bridge.device_storage(storage, storage.nbytes,
                                                                           storage.device_index)
        return found

    def data_ptr(self) -> int:
        """The storage's ``data_ptr()`` plus this tensor's offset: equal for
        tensors over the same data, as on any device (not dereferenceable)."""
        return self.untyped_storage().data_ptr() + self.storage_offset() * self.element_size()

    @property
    def data(self):
        return _data_descriptor.__get__(self, type(self))

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # torch swaps the metadata (sizes, dtype); the values live in Python
        # attributes torch does not know about, so they follow here
        # (nn.Module.double() / .to(dtype) on a 'jax' module come this way).
        _data_descriptor.__set__(self, value)
        if isinstance(value, JaxTensor):
            self._storage = value._storage
            self._view = value._view

    def numpy(self, *, force: bool = False):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self.dtype == torch.bfloat16:
            return self.cpu().numpy()  # raises torch's own TypeError
        return np.array(_read_here(self), copy=True)

    def tolist(self):
        return self.detach().cpu().tolist()

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __dlpack__(self, *args: Any, **kwargs: Any):
        return _read_here(self).__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return _read_here(self).__dlpack_device__()


def install_dispatcher(dispatch: Callable[[Any, tuple, dict], Any]) -> None:
    """Make ``dispatch(func, args, kwargs)`` run every ATen op on 'jax'
    tensors.  Called once, by ``_loader`` when the device loads, before the
    first tensor.

    ``__torch_dispatch__`` becomes the descriptor of
    :mod:`pjrt_host._torch._hiding`: dynamo, while it compiles in a
    thread, sees 'jax' tensors as plain tensors there, and never traces the
    handler.  AOTAutograd's tangent hook treats them as plain tensors too."""
    global _dispatch
    from .. import _jax_settings
    from . import _hiding

    _dispatch = _hiding.never_traced(_jax_settings.x64_scope(dispatch))

    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})

    JaxTensor.__torch_dispatch__ = _hiding.DispatchDescriptor(__torch_dispatch__)  # type: ignore[assignment]
    JaxTensor.__coerce_same_metadata_as_tangent__ = _coerce_tangent  # type: ignore[attr-defined]


_dispatch: Callable[[Any, tuple, dict], Any] = _no_dispatcher


def _reduce_for_process(t: JaxTensor) -> tuple:
    # How a 'jax' tensor crosses processes through multiprocessing's
    # ForkingPickler (DataLoader workers, torch.multiprocessing queues and
    # pipes): as a CPU copy of its values, which torch then sends through
    # shared memory like any CPU tensor, rebuilt on the same device index
    # by the receiver.  A PJRT buffer has no handle another process can open
    # (cuda's IPC), so the receiver gets a copy of the values, not memory
    # shared with the sender.  Without this the storage reduction fails in
    # the queue's feeder thread and the receiver waits forever.
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(  # torch's own refusal (reduce_tensor)
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
            "support crossing process boundaries.  If you just want to transfer the data, call detach() on "
            "the tensor before serializing (e.g., putting it on the queue).")
    values = torch.Tensor.detach(t).cpu()
    return (_rebuild_from_process,
            (values, t.device.index, t.requires_grad, bool(t.__dict__.get("_is_param", False))))


def _rebuild_from_process(values: torch.Tensor, index: int, requires_grad: bool, is_param: bool) -> torch.Tensor:
    t = values.to(torch_device(index))
    if is_param:
        return torch.nn.Parameter(t, requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _register_process_reduction() -> None:
    # multiprocessing.reduction is loaded by ``import torch`` already.
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(JaxTensor, _reduce_for_process)


_register_process_reduction()


_forked = False  # a fork() child of a process with a client (_after_fork_in_child)


def _forked_dispatcher(func: Any, args: tuple, kwargs: dict) -> Any:
    from .. import _runtime

    raise _runtime.forked_error()


def _read_here(t: JaxTensor) -> Any:
    """read(t) for the reads outside dispatch (numpy(), DLPack)."""
    if _forked:
        from .. import _runtime

        raise _runtime.forked_error()
    return read(t)


def _after_fork_in_child() -> None:
    # A fork() child of a process with a client: every op on a 'jax' tensor
    # raises the runtime's error instead of calling into the inherited
    # client (which would hang).  Swapping the function costs the parent
    # nothing per op.  New tensors (factories, .to('jax')) reach the
    # runtime through _devices, which raises the same error.
    global _dispatch, _forked
    from .. import _runtime

    if _runtime.in_bad_fork():
        _dispatch = _forked_dispatcher
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _coerce_tangent(self, expected_metadata: Any = None, expected_type: Any = None) -> JaxTensor:
    return self


_make_wrapper = torch.Tensor._make_wrapper_subclass
_data_descriptor = torch._C.TensorBase.data


def make(storage: Storage, size: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...] | None = None,
         offset: int = 0, view: View | None = None) -> JaxTensor:
    """A new tensor over ``storage``.  With ``stride`` None it is the
    storage itself (contiguous, offset 0)."""
    device = torch_device(storage.device_index)
    try:
        if stride is None:
            t = _make_wrapper(JaxTensor, size, dtype=dtype, device=device)
        else:
            t = _make_wrapper(JaxTensor, size, strides=stride, storage_offset=offset, dtype=dtype, device=device)
    except TypeError:
        # This thread is compiling with dynamo, which sees the class's
        # __torch_dispatch__ hidden (pjrt_host._torch._hiding).
        from . import _hiding

        with _hiding.creating_tensors():
            if stride is None:
                t = _make_wrapper(JaxTensor, size, dtype=dtype, device=device)
            else:
                t = _make_wrapper(JaxTensor, size, strides=stride, storage_offset=offset, dtype=dtype,
                                  device=device)
    t._storage = storage
    t._view = view
    return t


def result_tensor(array: Any, shape: tuple[int, ...], dtype: torch.dtype, index: int, place: Any = None,
                  padded: tuple | None = None) -> JaxTensor:
    """A new tensor owning ``array``, an op's result of ``shape`` and torch
    ``dtype`` (a jax array, or fused eager's :class:`Pending`), on device
    ``index`` (on ``place``'s mesh, when sharded, with ``index`` its torch
    device).  The caller notes a computed result for :func:`synchronize`.
    The engine's hot path: one wrapper and one Storage, no view."""
    try:
        t = _make_wrapper(JaxTensor, shape, dtype=dtype, device=torch_device(index))
    except TypeError:  # this thread is compiling with dynamo: make() knows the way
        return make(Storage(array, shape, array.dtype, index, place, padded), shape, dtype)
    t._storage = Storage(array, shape, array.dtype, index, place, padded)
    t._view = None
    return t


def wrap_array(array: Any, index: int, dtype: torch.dtype | None = None, place: Any = None,
               padded: tuple | None = None, shape: tuple | None = None) -> JaxTensor:
    """A new tensor owning ``array`` (already on device ``index``, or on
    ``place``'s mesh with ``index`` its torch device), noted as the
    device's latest result; of logical ``shape`` where ``array`` is laid
    out ``padded``."""
    if dtype is None:
        dtype = torch_dtype(array.dtype)
    note_result(index, array)
    return result_tensor(array, tuple(array.shape) if shape is None else shape, dtype, index, place, padded)


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype, index: int) -> JaxTensor:
    """An uninitialised (lazily zero) tensor, as ``torch.empty`` makes."""
    dtype = device_dtype(dtype)
    shape = tuple(shape)
    return make(Storage(None, shape, jax_dtype(dtype), index), shape, dtype)


# ---------------------------------------------------------------- eager read / write


_read_cache: dict[tuple, Any] = {}
_write_cache: dict[tuple, Any] = {}


def read(t: JaxTensor) -> Any:
    """The values of a 'jax' tensor as a jax array (for a view: computed
    from its storage by one cached jitted function)."""
    view = t._view
    arr = t._storage.get()
    if view is None:
        return arr
    return read_through(arr, view.static, view.run_offset)


def read_through(arr: Any, static: tuple, offset: Any) -> Any:
    """The values of the view ``static`` at ``offset`` of storage array
    ``arr`` (one cached jitted function per view layout)."""
    fn = _read_cache.get(static)
    if fn is None:
        fn = _read_cache[static] = _program_cache.Kept("pjrt_host.read",
                                                       lambda a, off: _strided.read(a, static, off), static)
    return fn(arr, offset)


def write(t: JaxTensor, value: Any) -> None:
    """Replace the values of ``t`` (through its view) with ``value``, an
    array broadcastable to t's shape, cast here to the storage's dtype."""
    storage = t._storage
    view = t._view
    storage.check_writable()
    dtype = storage.jax_dtype if view is None or view.elem is None else view.elem
    if value.dtype != dtype:
        value = value.astype(dtype)
    if type(storage.place) is not int:
        _write_sharded(storage, view, value)
        return
    if view is None:
        if tuple(value.shape) != storage.shape:
            value = jnp.broadcast_to(value, storage.shape)
        storage.commit(value)
    else:
        arr = storage.get()
        # Nothing else holds the array (the attribute, ``arr``, getrefcount's
        # argument): donated, so XLA writes the view's elements in place.
        sole = DONATE and sys.getrefcount(arr) <= 3 and value is not arr
        new = _view_writer(view.static, sole)(arr, view.run_offset, value)
        del arr
        storage.commit(new)


#: Writes give up the array they overwrite when nothing else holds it (eager
#: in-place / out= ops, writes through views, compiled graphs' input
#: mutations); PJRT_HOST_DONATE=0 never does, for comparisons.
DONATE = _env.donate_buffers()


def _view_writer(static: tuple, donate: bool = False) -> Any:
    """jit: (storage array, run-time offset, value) -> the storage array with
    the view's elements replaced (one per view layout; ``donate``: the
    storage array given up to the result)."""
    fn = _write_cache.get((static, donate))
    if fn is None:
        def body(a, off, v):
            return _strided.write(a, static, off, jnp.broadcast_to(v, static[1]))

        fn = _write_cache[(static, donate)] = _program_cache.Kept("pjrt_host.write", body, (static, donate),
                                                                  donate_argnums=(0,) if donate else ())
    return fn


def _write_sharded(storage: Storage, view: View | None, value: Any) -> None:
    """write() into a storage sharded over a mesh: the storage keeps its
    sharding whatever the value's placement."""
    previous = storage.get()
    value = _sharding.put(value, storage)
    if view is None:
        if tuple(value.shape) != storage.shape:
            value = jnp.broadcast_to(value, storage.shape)
        new = value
    else:
        new = _view_writer(view.static)(previous, view.run_offset, value)
    storage.commit(new)  # laid out as ``previous``: the storage is sharded


def finish_op(result: Any) -> None:
    """``eager="sync"`` (debugging): every op a synchronisation point.  Wait
    for ``result`` (an op's return value) and for all work queued before it,
    so an error the device finds surfaces at the op that caused it, and raise
    the deferred checks found so far (the op's own are already run at it)."""
    for t in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(t, JaxTensor):
            arr = t._storage.computed()  # as laid out: ``array`` would cut a padded result
            if arr is not None:
                arr.block_until_ready()
    wait_queued()
