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
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["JaxTensor", "Storage", "View", "make", "synchronize", "torch_device"]


class Storage:
    """The data shared by a base tensor and all its views: a jax array of
    shape ``shape`` (row-major; a view's strides index it flat), or None
    while nothing has been written (an ``empty`` tensor).  ``version``
    counts writes."""

    __slots__ = ("array", "shape", "numel", "jdtype", "index", "version", "__weakref__")

    def __init__(self, array: Any, shape: tuple[int, ...], jdtype: Any, index: int) -> None:
        self.array = array
        self.shape = shape
        self.numel = math.prod(shape)
        self.jdtype = jdtype
        self.index = index  # device index
        self.version = 0

    def get(self) -> Any:
        if self.array is None:
            from . import _dispatch

            self.array = _dispatch.zeros_on(self.shape, self.jdtype, self.index)
        return self.array


class View:
    """How a tensor's values sit in its storage, as torch strides.

    ``kind`` is the cheapest way to read them: ``"reshape"`` (a contiguous
    reinterpretation of the whole storage), ``"perm"`` (a permutation of the
    storage's dims, e.g. ``.t()``: ``perm`` over ``perm_shape``) or
    ``"gather"`` (anything else: flat indices ``offset + sum(i_k *
    stride_k)``).  ``static`` is the hashable part that compiled ops are
    keyed on; the offset of a gather is passed at run time, so ``x[i]`` for
    many ``i`` compiles once."""

    __slots__ = ("kind", "size", "stride", "offset", "static")

    def __init__(self, kind: str, size: tuple[int, ...], stride: tuple[int, ...], offset: int, extra: Any) -> None:
        self.kind = kind
        self.size = size
        self.stride = stride
        self.offset = offset
        self.static = (kind, size, stride if kind == "gather" else None, extra)


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def view_for(storage: Storage, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> View | None:
    """The View of a tensor with these strides into ``storage`` (None: the
    tensor is the storage as it is)."""
    numel = math.prod(size)
    if offset == 0 and numel == storage.numel:
        if size == storage.shape and (numel <= 1 or stride == contiguous_strides(size)):
            return None
        if numel <= 1 or _is_contiguous(size, stride):
            return View("reshape", size, stride, 0, None)
        # A permutation of a contiguous layout (t(), transpose, permute).
        dims = sorted(range(len(size)), key=lambda d: (-stride[d], d))
        sorted_size = tuple(size[d] for d in dims)
        if tuple(stride[d] for d in dims) == contiguous_strides(sorted_size) and all(s > 0 for s in size):
            inverse = tuple(dims.index(d) for d in range(len(size)))
            return View("perm", size, stride, 0, (sorted_size, inverse))
    return View("gather", size, stride, offset, None)


def _is_contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for s, st in zip(reversed(size), reversed(stride)):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


_devices: dict[int, torch.device] = {}


def torch_device(index: int) -> torch.device:
    dev = _devices.get(index)
    if dev is None:
        from . import DEVICE_NAME

        dev = _devices[index] = torch.device(DEVICE_NAME, index)
    return dev


class JaxTensor(torch.Tensor):
    """A torch tensor on a 'jax' device.  Users never name this class: they
    make tensors with ``device='jax'`` or ``.to('jax')``."""

    # Skip the torch-function layer: every op reaches __torch_dispatch__
    # directly, which is where the work happens.
    __torch_function__ = torch._C._disabled_torch_function_impl

    _st: Storage
    _vw: View | None

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> JaxTensor:
        raise TypeError("pjrt_host: make 'jax' tensors with device='jax' or tensor.to('jax')")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch_fn(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        from . import _printing

        return _printing.tensor_repr(self)

    def __reduce_ex__(self, proto: int):
        # torch's own reduction for storage-less device tensors: a CPU copy
        # rebuilt with .to(device) on load, which torch.load(weights_only=True)
        # accepts (it names no class of ours).
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))

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
            self._st = value._st
            self._vw = value._vw

    def numpy(self, *, force: bool = False):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        from . import _conversion

        return _conversion.to_numpy(self)

    def tolist(self):
        return self.detach().cpu().tolist()

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __dlpack__(self, *args: Any, **kwargs: Any):
        from . import _conversion

        return _conversion.read(self).__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        from . import _conversion

        return _conversion.read(self).__dlpack_device__()


_make_wrapper = torch.Tensor._make_wrapper_subclass
_data_descriptor = torch._C.TensorBase.data


def make(storage: Storage, size: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...] | None = None,
         offset: int = 0, view: View | None = None) -> JaxTensor:
    """A new tensor over ``storage``.  With ``stride`` None it is the
    storage itself (contiguous, offset 0)."""
    device = _devices.get(storage.index) or torch_device(storage.index)
    try:
        if stride is None:
            t = _make_wrapper(JaxTensor, size, dtype=dtype, device=device)
        else:
            t = _make_wrapper(JaxTensor, size, strides=stride, storage_offset=offset, dtype=dtype, device=device)
    except TypeError:
        # This thread is compiling with dynamo, which sees the class's
        # __torch_dispatch__ hidden (pjrt_host._compile._hiding).
        from .._compile import _hiding

        with _hiding.creating_tensors():
            if stride is None:
                t = _make_wrapper(JaxTensor, size, dtype=dtype, device=device)
            else:
                t = _make_wrapper(JaxTensor, size, strides=stride, storage_offset=offset, dtype=dtype,
                                  device=device)
    t._st = storage
    t._vw = view
    return t


def synchronize(index: int | None = None) -> None:
    """Block until the computations queued so far on the device (all devices
    with None) have finished: the last array each produced is waited for
    (a device runs its computations in order)."""
    from . import _dispatch

    for i, arr in list(_dispatch._last.items()):
        if index is None or i == index:
            arr.block_until_ready()


def _dispatch_fn(func, args, kwargs):  # replaced by _dispatch on import
    from . import _dispatch

    return _dispatch.dispatch(func, args, kwargs)
