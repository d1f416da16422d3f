"""Tensors made from nothing on the 'jax' device: ``torch.zeros(...,
device='jax')``, ``torch.randn``, ``torch.arange`` ...

torch's meta kernel of the factory gives the result's shape and dtype (and
its errors for bad arguments); the values are computed by one compiled
function per factory and static arguments, placed directly on the target
device.  Random factories draw from the device's random state.  A factory
without a kernel here is computed on torch CPU and moved (one copy), which
is exact for every factory torch has.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from .._lowerings._dtypes import jax_dtype
from . import DEVICE_NAME, _conversion, _device_module, _device_table, _dispatch, _rng

__all__ = ["run", "run_named"]

logger = logging.getLogger("pjrt_host")

_cache: dict[Any, Any] = {}


def _index(kwargs: dict) -> int:
    device = kwargs.get("device")
    if device is None:
        return _device_module.current_device()
    device = torch.device(device)
    if device.type != DEVICE_NAME:
        raise RuntimeError(f"pjrt_host: factory reached the '{DEVICE_NAME}' device with device={device}")
    return _device_module.current_device() if device.index is None else device.index


def _meta(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")
    mkw = dict(kwargs)
    mkw["device"] = "meta"
    mkw.pop("pin_memory", None)
    mkw.pop("generator", None)
    return op(*args, **mkw)


def _linspace(start, end, steps, jd):
    i = jnp.arange(steps, dtype=jnp.float64)
    step = (end - start) / max(steps - 1, 1)
    half = steps // 2
    vals = jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))
    if jnp.issubdtype(jd, jnp.integer):
        vals = jnp.trunc(vals)
    return vals.astype(jd)


def _arange(start, end, step, n, jd):
    acc = jnp.int64 if jnp.issubdtype(jd, jnp.integer) else jnp.float64
    return (start + jnp.arange(n, dtype=acc) * step).astype(jd)


def _values(name: str, args: tuple, shape: tuple, jd: Any) -> Callable[..., Any] | None:
    """A traceable (key) -> array for the factory, or None to use CPU."""
    packet = name.split(".", 1)[0]
    if packet == "zeros":
        return lambda key: jnp.zeros(shape, jd)
    if packet == "ones":
        return lambda key: jnp.ones(shape, jd)
    if packet == "full":
        fill = args[1]
        return lambda key: jnp.full(shape, fill, jd)
    if packet == "scalar_tensor":
        value = args[0]
        return lambda key: jnp.asarray(value, jd)
    if packet == "eye":
        n = args[0]
        m = args[1] if len(args) > 1 else n
        return lambda key: jnp.eye(n, m, dtype=jd)
    if packet == "arange":
        if name == "arange":
            start, end, step = 0, args[0], 1
        else:
            start, end = args[0], args[1]
            step = args[2] if len(args) > 2 else 1
        n = shape[0]
        return lambda key: _arange(start, end, step, n, jd)
    if packet == "linspace":
        start, end, steps = args[0], args[1], args[2]
        if any(isinstance(v, torch.Tensor) for v in (start, end, steps)):
            return None
        return lambda key: _linspace(start, end, steps, jd)
    if packet == "randn":
        return lambda key: jax.random.normal(key, shape, jd)
    if packet == "rand":
        return lambda key: jax.random.uniform(key, shape, jd)
    if packet == "randint":
        low, high = (0, args[0]) if name == "randint" else (args[0], args[1])
        return lambda key: jax.random.randint(key, shape, low, high, jnp.int64).astype(jd)
    if packet == "randperm":
        n = args[0]
        return lambda key: jax.random.permutation(key, n).astype(jd)
    return None


_RANDOM = ("randn", "rand", "randint", "randperm")


def run_named(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    index = _index(kwargs)
    meta = _meta(name, args, kwargs)
    dtype = _dispatch.device_dtype(meta.dtype)
    shape = tuple(meta.shape)
    if name.startswith("empty"):
        return _dispatch.new_tensor(shape, dtype, index)
    if any(isinstance(a, torch.Tensor) for a in args):
        return _on_cpu(name, args, kwargs, index)
    jd = jax_dtype(dtype)
    random = name.split(".", 1)[0] in _RANDOM
    try:
        key = (name, _freeze(args), dtype, shape, index)
        fn = _cache.get(key)
    except TypeError:
        key, fn = None, None
    if fn is None:
        values = _values(name, args, shape, jd)
        if values is None:
            return _on_cpu(name, args, kwargs, index)
        if random:
            def body(kd, counter):
                k = jax.random.fold_in(jax.random.wrap_key_data(kd, impl="threefry2x32"), counter)
                return values(k)
        else:
            def body():
                return values(None)
        fn = jax.jit(body, out_shardings=_device_table.sharding(index))
        if key is not None:
            _cache[key] = fn
    if random:
        kd, counter = _rng.next_key_args(index, kwargs.get("generator"))
        arr = fn(kd, counter)
    else:
        arr = fn()
    return _dispatch.wrap_array(arr, index, dtype)


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, (bool, int, float, complex)):
        return (type(v), v)
    return v


def _on_cpu(name_or_op: Any, args: tuple, kwargs: dict, index: int) -> torch.Tensor:
    if isinstance(name_or_op, str):
        packet, _, overload = name_or_op.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
    else:
        op = name_or_op
    ckw = dict(kwargs)
    ckw["device"] = "cpu"
    ckw.pop("pin_memory", None)
    out = op(*args, **ckw)
    if isinstance(out, torch.Tensor):
        dtype = _dispatch.device_dtype(out.dtype)
        return _dispatch.wrap_array(_conversion.to_jax_array(out, index, dtype), index, dtype)
    return out


def run(op: Any, args: tuple, kwargs: dict) -> Any:
    """The device-key fallback: any factory without a kernel of its own."""
    name = op.name().split("::", 1)[1] if hasattr(op, "name") else str(op)
    if name in ("empty.memory_format", "empty_strided"):
        return run_named(name, args, kwargs)
    index = _index(kwargs)
    logger.debug("pjrt_host: factory %s computed on torch CPU and moved to the device", name)
    return _on_cpu(op, args, kwargs, index)
