"""View ops: results that share their input's storage.

A view op never computes: torch's meta kernel gives the result's sizes,
strides and offset (cached per signature), and the result is a new tensor
over the input's storage whose :class:`~._tensor.View` reads it.  In-place
view ops (``transpose_``, ``as_strided_`` ...) change the tensor's own
metadata the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._mode_utils import no_dispatch

from .. import _lowerings
from .._lowerings._dtypes import jax_dtype
from ._engine import CompiledOp, missing_lowering, op_name
from . import _strided
from ._meta import meta_view_of
from ._tensor import JaxTensor, make, read, view_for, wrap_array

__all__ = ["run_inplace_view", "run_same_view", "run_view"]


class _ViewResult(NamedTuple):
    size: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    offset: int
    lazy_bit: str | None  #: "conj" / "neg": torch marks such a view instead of computing it
    #: Its View into a storage of the key's shape and dtype, for a result of
    #: self's dtype (None: the storage as it is, or another dtype's result).
    view: Any = None


_view_cache: dict[Any, tuple[bool, list[_ViewResult]]] = {}


def _static_key(values: Any) -> tuple:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.append((list, _static_key(v)))
        elif isinstance(v, (bool, int, float)):
            out.append((type(v), v))
        elif isinstance(v, torch.Tensor):
            raise TypeError("tensor in view arguments")
        else:
            out.append(v)
    return tuple(out)


def _results(func: Any, self: JaxTensor, args: tuple, kwargs: dict) -> tuple[bool, list[_ViewResult]]:
    storage = self._storage
    view = self._view
    # The storage's shape and dtype and the element type self reads it as:
    # the results' Views into it are made once here, not per call.  self's
    # sizes, strides and offset are its View's (Python attributes: reading
    # them from torch cost 1.7 us a view); a tensor that is its whole
    # storage has the storage's sizes, and strides torch's contiguous ones
    # except at one element or none, where they are asked for.
    # Where the arguments are ints, None and lists of ints (a decoding step
    # runs ~80 such views a token), the key is cheaper: a View names its
    # storage's shape and element type and its own layout (Views are made
    # once per layout, below), and a tensor of more than one element that is
    # its whole storage has the storage's layout.
    rest = None if kwargs else _args_key(args[1:])
    if rest is not None and view is not None:
        key: Any = (view, func, self.dtype, rest)
    elif rest is not None and storage.numel > 1:
        key = (func, storage.shape, storage.jax_dtype, self.dtype, rest)
    else:
        if view is not None:
            layout = (view.size, view.stride, view.offset, view.elem)
        elif storage.numel > 1:
            layout = None
        else:
            layout = (tuple(self.shape), self.stride(), self.storage_offset(), None)
        key = (func, storage.shape, storage.jax_dtype, self.dtype, layout, _static_key(args[1:]),
               _static_key(tuple(kwargs.items())) if kwargs else None)
    elem = None if view is None else view.elem
    try:
        cached = _view_cache.get(key)
    except TypeError:  # an unhashable argument: computed every time
        key, cached = None, None
    if cached is None:
        out = func(meta_view_of(self), *args[1:], **kwargs)
        single = isinstance(out, torch.Tensor)
        metas = [out] if single else list(out)
        results = []
        for m in metas:
            r = _ViewResult(tuple(m.shape), m.dtype, tuple(m.stride()), m.storage_offset(),
                            "conj" if m.is_conj() else "neg" if m.is_neg() else None)
            _check_in_storage(self, r)
            if r.dtype == self.dtype:
                r = r._replace(view=view_for(storage, r.size, r.stride, r.offset, elem))
            results.append(r)
        cached = (single, results)
        if key is not None:
            if len(_view_cache) > 8192:  # x[i] for ever new i: bound the memory
                _view_cache.clear()
            _view_cache[key] = cached
    return cached


def _check_in_storage(self: JaxTensor, r: _ViewResult) -> None:
    """torch's refusal of a view reaching beyond its storage
    (``as_strided`` with sizes, strides or an offset too large), which meta
    tensors do not check."""
    if 0 in r.size:
        return
    itemsize = torch.empty((), dtype=r.dtype, device="meta").element_size()
    have = self._storage.nbytes
    need = (r.offset + sum((n - 1) * st for n, st in zip(r.size, r.stride)) + 1) * itemsize
    if need > have:
        raise RuntimeError(f"setStorage: sizes {list(r.size)}, strides {list(r.stride)}, storage offset {r.offset}, "
                           f"and itemsize {itemsize} requiring a storage size of {need} are out of bounds for "
                           f"storage of size {have}")


def _args_key(rest: tuple) -> tuple | None:
    """The view op's arguments after self as a key, where they are ints,
    None and lists of ints (sizes, dims, a slice's bounds); None where one
    is anything else (the full key of :func:`_results` then)."""
    key = []
    for v in rest:
        t = type(v)
        if t is int or v is None:
            key.append(v)
        elif t is list or t is tuple:
            for x in v:
                if type(x) is not int:
                    return None
            key.append(tuple(v))
        else:
            return None
    return tuple(key)


def run_view(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if not isinstance(self, JaxTensor):
        raise TypeError(f"pjrt_host: view op {op_name(func)} expects a 'jax' tensor first")
    single, metas = _results(func, self, args, kwargs)
    if single:
        r = metas[0]
        if r.lazy_bit is None and r.dtype == self.dtype and not torch.is_inference_mode_enabled():
            return make(self._storage, r.size, r.dtype, r.stride, r.offset, r.view)  # (the hot path: a plain view)
    if single and metas[0].lazy_bit:
        # conj() / _neg_view(): the device computes the values (a new tensor).
        arr = read(self)
        arr = jnp.conj(arr) if metas[0].lazy_bit == "conj" else -arr
        return wrap_array(arr, self._storage.device_index, self.dtype, self._storage.place)
    for r in metas:
        if r.dtype != self.dtype:
            if func._schema.name == "aten::view":
                # view(dtype): the same bytes read as another element type.
                return _outside_inference_mode(self, _view_dtype, self, r)
            # view_as_real / view_as_complex and friends: computed by their
            # lowering as a new tensor (writes through it do not reach self).
            lowering = _lowerings.lookup(func)
            if lowering is None:
                raise missing_lowering(func)
            return CompiledOp(func, lowering)(args, kwargs)
    return _outside_inference_mode(self, _views_of, self, metas, single)


def run_same_view(args: tuple, kwargs: dict) -> Any:
    """``detach(self)`` / ``alias(self)``: a new tensor over self's storage
    with self's own view, made directly (6.4 -> 3.5 us: no meta kernel, no
    view key; the result's metadata is self's)."""
    self = args[0] if args else kwargs["self"]
    if not isinstance(self, JaxTensor):
        raise TypeError("pjrt_host: detach/alias expects a 'jax' tensor first")
    return _outside_inference_mode(self, _same_view_of, self)


def _same_view_of(self: JaxTensor) -> JaxTensor:
    storage, view = self._storage, self._view
    if view is None:
        return make(storage, storage.shape, self.dtype)
    return make(storage, view.size, self.dtype, view.stride, view.offset, view)


def _outside_inference_mode(self: JaxTensor, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, making views of ``self``.  A view of a normal tensor
    is a normal tensor, whose version counter autograd then shares with its
    base: made in inference mode, the wrapper would be an inference tensor,
    which refuses that."""
    if torch.is_inference_mode_enabled() and not self.is_inference():
        with torch.inference_mode(False):
            return fn(*args)
    return fn(*args)


def _views_of(self: JaxTensor, metas: list, single: bool) -> Any:
    storage = self._storage  # each result's View was made for this storage's shape and dtype (_results' key)
    outs = [make(storage, r.size, r.dtype, r.stride, r.offset, r.view) for r in metas]
    return outs[0] if single else outs


def run_inplace_view(func: Any, args: tuple, kwargs: dict) -> Any:
    """transpose_, squeeze_, unsqueeze_, t_, as_strided_ ...: torch's meta
    kernel changes self's metadata in place (as torch does for its own
    wrapper subclasses), and self's view into its storage follows."""
    self = args[0]
    with no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    size, stride, offset = tuple(self.shape), tuple(self.stride()), self.storage_offset()
    self._view = view_for(self._storage, size, stride, offset, self._view.elem if self._view is not None else None)
    return self


def _view_dtype(self: JaxTensor, r: _ViewResult) -> JaxTensor:
    """``view(dtype)``: the same bytes read as ``r.dtype`` (torch's meta
    kernel has checked the shape and given ``r``'s sizes, strides and
    offset, counted in the new elements): a view, whose writes reach
    ``self`` and the other way round.  Where the storage's size is not a
    multiple of the new element's, the result is computed as a new tensor;
    where the device holds either dtype in another width (a plugin's
    ``unsupported_dtypes``), the bytes torch would read do not exist there
    and the error says to convert."""
    storage = self._storage
    target = np.dtype(jax_dtype(r.dtype))
    held = np.dtype(storage.jax_dtype if self._view is None or self._view.elem is None else self._view.elem)
    if held.itemsize != self.element_size() or target.itemsize != r.dtype.itemsize:
        held_as = f"{self.dtype} as {held}" if held.itemsize != self.element_size() else f"{r.dtype} as {target}"
        raise NotImplementedError(
            f"pjrt_host: tensor.view({r.dtype}) of a {self.dtype} tensor: this device holds {held_as} (the "
            f"plugin's unsupported_dtypes), so the bytes torch would read do not exist there; convert the values "
            f"instead (t.to({r.dtype}))")
    if storage.nbytes % target.itemsize == 0:
        return make(storage, r.size, r.dtype, r.stride, r.offset, view_for(storage, r.size, r.stride, r.offset, target))
    values = _strided.as_elements(read(self).reshape(-1) if self.numel() else read(self).reshape(0), target)
    return wrap_array(values.reshape(r.size), storage.device_index, r.dtype, storage.place)
