"""View ops: results that share their input's storage.

A view op never computes: torch's meta kernel gives the result's sizes,
strides and offset (cached per signature), and the result is a new tensor
over the input's storage whose :class:`~._tensor.View` reads it.  In-place
view ops (``transpose_``, ``as_strided_`` ...) change the tensor's own
metadata the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._mode_utils import no_dispatch

from .. import _lowerings
from .._lowerings._dtypes import jax_dtype
from ._engine import CompiledOp, missing_lowering, op_name
from ._meta import meta_view_of
from ._tensor import JaxTensor, make, read, view_for, wrap_array

__all__ = ["run_inplace_view", "run_view"]


class _ViewResult(NamedTuple):
    size: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    offset: int
    lazy_bit: str | None  #: "conj" / "neg": torch marks such a view instead of computing it


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
    key = (func, self._storage.numel, self.dtype, tuple(self.shape), self.stride(), self.storage_offset(),
           _static_key(args[1:]), _static_key(tuple(kwargs.items())) if kwargs else None)
    try:
        cached = _view_cache.get(key)
    except TypeError:  # an unhashable argument: computed every time
        key, cached = None, None
    if cached is None:
        out = func(meta_view_of(self), *args[1:], **kwargs)
        single = isinstance(out, torch.Tensor)
        metas = [out] if single else list(out)
        cached = (single, [_ViewResult(tuple(m.shape), m.dtype, tuple(m.stride()), m.storage_offset(),
                                       "conj" if m.is_conj() else "neg" if m.is_neg() else None) for m in metas])
        if key is not None:
            if len(_view_cache) > 8192:  # x[i] for ever new i: bound the memory
                _view_cache.clear()
            _view_cache[key] = cached
    return cached


def run_view(func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if not isinstance(self, JaxTensor):
        raise TypeError(f"pjrt_host: view op {op_name(func)} expects a 'jax' tensor first")
    single, metas = _results(func, self, args, kwargs)
    if single and metas[0].lazy_bit:
        # conj() / _neg_view(): the device computes the values (a new tensor).
        arr = read(self)
        arr = jnp.conj(arr) if metas[0].lazy_bit == "conj" else -arr
        return wrap_array(arr, self._storage.device_index, self.dtype, self._storage.place)
    for r in metas:
        if r.dtype != self.dtype:
            if func._schema.name == "aten::view":
                # view(dtype): a reinterpretation; same-width ones are exact.
                return _view_dtype(self, r.dtype, r.size)
            # view_as_real / view_as_complex and friends: computed by their
            # lowering as a new tensor (writes through it do not reach self).
            lowering = _lowerings.lookup(func)
            if lowering is None:
                raise missing_lowering(func)
            return CompiledOp(func, lowering)(args, kwargs)
    if torch.is_inference_mode_enabled() and not self.is_inference():
        # A view of a normal tensor is a normal tensor, whose version counter
        # autograd then shares with its base: made in inference mode, the
        # wrapper would be an inference tensor, which refuses that.
        with torch.inference_mode(False):
            return _views_of(self, metas, single)
    return _views_of(self, metas, single)


def _views_of(self: JaxTensor, metas: list, single: bool) -> Any:
    storage = self._storage
    outs = [make(storage, r.size, r.dtype, r.stride, r.offset, view_for(storage, r.size, r.stride, r.offset))
            for r in metas]
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
    self._view = view_for(self._storage, size, stride, offset)
    return self


def _view_dtype(self: JaxTensor, dtype: torch.dtype, size: tuple[int, ...]) -> JaxTensor:
    """``view(dtype)``: the same bytes read as ``dtype`` (torch's meta
    kernel has checked the shape and given ``size``), computed as a new
    tensor: writes through it do not reach ``self``.  A different element
    size splits or joins the last dimension's elements, as torch does."""
    arr = read(self)
    target = jax_dtype(dtype)
    if arr.dtype == jnp.bool_:
        arr = arr.astype(jnp.uint8)
    old, new = np.dtype(arr.dtype).itemsize, np.dtype(target).itemsize
    if old != new and (jnp.issubdtype(arr.dtype, jnp.complexfloating) or np.dtype(target).kind in "cb"):
        raise NotImplementedError(
            f"pjrt_host: tensor.view({dtype}) of a {self.dtype} tensor (complex or bool with a different element "
            f"size) is not supported on the 'jax' device; use .cpu().view(...) instead")
    out = _bitcast(arr, target, tuple(size))
    return wrap_array(out, self._storage.device_index, dtype, self._storage.place)


_bitcast_cache: dict[tuple, Any] = {}


def _bitcast(arr: Any, target: Any, size: tuple[int, ...]) -> Any:
    key = (arr.dtype, tuple(arr.shape), np.dtype(target), size)
    fn = _bitcast_cache.get(key)
    if fn is None:
        old, new = np.dtype(arr.dtype).itemsize, np.dtype(target).itemsize

        def cast(a):
            if new > old:  # join groups of the last dimension's elements
                a = a.reshape(size + (new // old,))
            if np.dtype(target) == np.bool_:
                return jax.lax.bitcast_convert_type(a, jnp.uint8).reshape(size) != 0
            return jax.lax.bitcast_convert_type(a, target).reshape(size)

        fn = _bitcast_cache[key] = jax.jit(cast)
    return fn(arr)
