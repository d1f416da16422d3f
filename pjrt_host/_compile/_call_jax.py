"""``call_jax``: a JAX function called on 'jax' tensors inside a torch program.

Eagerly, a call takes the arrays its tensors already hold (no copy), makes
one call of a ``jax.jit`` of the function (cached per argument signature:
the function, the arguments' structure, shapes and dtypes, which tensors
require grad, the non-tensor arguments' values) and wraps the results; when
a gradient is needed the call is one autograd node whose backward is
``jax.vjp``'s.  Inside a traced torch program (an ``@assume_pure`` trace,
``torch.compile``) the call is the op ``pjrt_host::call_jax``, which the
graph interpreter runs as the jax function itself.
"""

from __future__ import annotations

import collections
import threading
import warnings
from typing import Any, Callable

import jax
import torch

from .._jax_settings import x64_api as _x64_api
from .._lowerings._dtypes import torch_dtype
from . import _door, _handles
from ._pure import CacheInfo, _Entry, _unhashable, read_arguments, run

__all__ = ["call_jax", "cache_info", "cache_clear"]

MAXSIZE = 512
#: Traces of one function (code object) before a warning (then at 2x, 4x, ...).
RETRACE_WARNING = 8

_lock = threading.Lock()
_cache: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()
_counts = {"hits": 0, "misses": 0, "traces": 0}
_per_code: dict[Any, list[int]] = {}  # code object -> [traces, next warning at]


def cache_info() -> CacheInfo:
    with _lock:
        return CacheInfo(_counts["hits"], _counts["misses"], _counts["traces"], len(_cache), MAXSIZE)


def cache_clear() -> None:
    with _lock:
        _cache.clear()
        _per_code.clear()
        for k in _counts:
            _counts[k] = 0


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


@_x64_api
def call_jax(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with 'jax' tensors passed as jax arrays and
    the results returned as 'jax' tensors (see the module docstring)."""
    if _door.dynamo_compiling():
        # dynamo cannot trace into jax; the call runs eagerly, between two
        # compiled graphs (a graph break).
        return _outside_dynamo(fn, *args, **kwargs)
    return _call(fn, args, kwargs)


@_x64_api
def _call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    if not callable(fn):
        raise TypeError(f"pjrt_host.interop.call_jax: the first argument must be a JAX function, got "
                        f"{type(fn).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    grad = torch.is_grad_enabled()
    what = f"pjrt_host.interop.call_jax({_name(fn)})"
    read = read_arguments(leaves, treedef, what, grad)
    if read is None:  # inside a trace (fake / functional tensors)
        return _as_op(fn, args, kwargs)
    tensors, statics, index = read.tensors, read.statics, read.index
    sig = (fn, treedef, read.parts)
    try:
        entry = _cache.get(sig)
    except TypeError:
        raise _unhashable(what, leaves, treedef) from None
    if entry is None:
        entry = _build(sig, fn, treedef, statics, tensors, index, grad)
    else:
        with _lock:
            _counts["hits"] += 1
            try:
                _cache.move_to_end(sig)
            except KeyError:
                pass
    return run(entry, read)


def _build(sig: Any, fn: Callable, treedef: Any, statics: tuple, tensors: list, index: int, grad: bool) -> _Entry:
    call = _handles.JaxCall(fn, treedef, statics)
    name = call.name
    with _lock:
        _counts["misses"] += 1
    specs = [jax.ShapeDtypeStruct(tuple(t.shape), _door.jax_dtype_of(t.dtype)) for t in tensors]
    try:
        out = jax.eval_shape(call.flat, specs)
    except Exception as err:
        raise RuntimeError(f"pjrt_host.interop.call_jax({name}) failed while JAX traced it for arguments "
                           f"{[f'{tuple(s.shape)} {s.dtype}' for s in specs]}: {type(err).__name__}: {err}") from err
    out_treedef = call.out_treedef
    out_dtypes = [torch_dtype(o.dtype) for o in out]
    diff = tuple(n for n, t in enumerate(tensors) if grad and t.requires_grad)

    def body(arrays: list, key: Any) -> Any:
        return call.flat(arrays), []

    entry = _Entry(body, out_dtypes, [t.dtype for t in tensors], [], False,
                   lambda outs: jax.tree_util.tree_unflatten(out_treedef, outs), index, diff, name)
    code = getattr(fn, "__code__", fn)
    with _lock:
        _counts["traces"] += 1
        _cache[sig] = entry
        while len(_cache) > MAXSIZE:
            _cache.popitem(last=False)
        count = _per_code.setdefault(code, [0, RETRACE_WARNING])
        count[0] += 1
        warn = count[0] >= count[1]
        if warn:
            count[1] *= 2
    if warn:
        warnings.warn(f"pjrt_host.interop.call_jax({name}) has been traced {count[0]} times. Each new argument "
                      f"signature (shapes, dtypes, non-tensor values) traces and compiles again, and so does each new "
                      f"function object: define the function once, outside the loop, rather than as a lambda or "
                      f"nested def per call.", RuntimeWarning, stacklevel=3)
    return entry


@torch._disable_dynamo
def _outside_dynamo(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return _call(fn, args, kwargs)


# ---------------------------------------------------------------- as a torch op

def _as_op(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """call_jax inside a traced torch program: the op ``pjrt_host::call_jax``."""
    from . import _call_jax_ops

    return _call_jax_ops.call(fn, args, kwargs)
