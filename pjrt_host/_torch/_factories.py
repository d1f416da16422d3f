"""Tensors made from nothing on the 'jax' device: ``torch.zeros(...,
device='jax')``, ``torch.randn``, ``torch.arange`` ...

torch's meta kernel of the factory gives the result's shape and dtype (and
its errors for bad arguments); the values are computed by one compiled
function per factory and static arguments, placed directly on the target
device.  Random factories draw from the device's random state.  A factory
without a builder here is computed on torch CPU and moved (one copy), which
is exact for every factory torch has.

Builders are declared with :func:`factory`; ``_registration.FACTORY_OPS``
names the overloads that get a device kernel (it cannot import this module:
registration runs inside ``import torch`` and must not import jax), and a
test keeps the two in step.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from .._lowerings._dtypes import jax_dtype
from .._lowerings._util import arange_values, linspace_values
from . import _memory, _rng
from ._conversion import to_jax_array
from ._devices import DEVICE_NAME, device_index, sharding
from ._dtype_policy import device_dtype
from ._tensor import new_tensor, wrap_array

__all__ = ["BUILDERS", "bucket", "factory", "run", "run_named"]

logger = logging.getLogger(__name__)

# A builder takes (overload name, args, shape, jax dtype) and returns a
# traceable key -> array, or None to compute the factory on torch CPU.
Builder = Callable[[str, tuple, tuple, Any], Callable[[Any], Any] | None]


class _Factory:
    __slots__ = ("build", "random", "elementwise")

    def __init__(self, build: Builder, random: bool, elementwise: bool) -> None:
        self.build = build
        self.random = random
        #: Each element drawn alike whatever the shape: a small tensor is
        #: drawn flat in a power-of-two bucket and cut to its shape, so a
        #: program compiles per bucket, not per shape (a random program
        #: takes XLA about 0.5 s to compile on a CPU).
        self.elementwise = elementwise


#: packet name ("zeros", "arange") -> its builder.
BUILDERS: dict[str, _Factory] = {}


def factory(*packets: str, random: bool = False, elementwise: bool = False) -> Callable[[Builder], Builder]:
    """Declare the builder of the factories ``packets``; ``random`` ones get
    a key drawn from the device's random state (see _Factory for
    ``elementwise``)."""

    def register(fn: Builder) -> Builder:
        for packet in packets:
            BUILDERS[packet] = _Factory(fn, random, elementwise)
        return fn

    return register


@factory("zeros")
def _zeros(name, args, shape, dtype):
    return lambda key: jnp.zeros(shape, dtype)


@factory("ones")
def _ones(name, args, shape, dtype):
    return lambda key: jnp.ones(shape, dtype)


@factory("full")
def _full(name, args, shape, dtype):
    fill = args[1]
    return lambda key: jnp.full(shape, fill, dtype)


@factory("scalar_tensor")
def _scalar_tensor(name, args, shape, dtype):
    value = args[0]
    return lambda key: jnp.asarray(value, dtype)


@factory("eye")
def _eye(name, args, shape, dtype):
    n = args[0]
    m = args[1] if len(args) > 1 else n
    return lambda key: jnp.eye(n, m, dtype=dtype)


@factory("arange")
def _arange(name, args, shape, dtype):
    if name == "arange":
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else 1
    return lambda key: arange_values(start, step, shape[0], dtype)


@factory("linspace")
def _linspace(name, args, shape, dtype):
    start, end, steps = args[0], args[1], args[2]
    return lambda key: linspace_values(start, end, steps, dtype)


@factory("randn", random=True, elementwise=True)
def _randn(name, args, shape, dtype):
    return lambda key: jax.random.normal(key, shape, dtype)


@factory("rand", random=True, elementwise=True)
def _rand(name, args, shape, dtype):
    if jnp.issubdtype(dtype, jnp.complexfloating):  # torch: real and imaginary parts each uniform in [0, 1)
        part = jnp.finfo(dtype).dtype
        return lambda key: jax.lax.complex(*jax.random.uniform(key, (2,) + tuple(shape), part))
    return lambda key: jax.random.uniform(key, shape, dtype)


@factory("randint", random=True, elementwise=True)
def _randint(name, args, shape, dtype):
    low, high = (0, args[0]) if name in ("randint", "randint.generator") else (args[0], args[1])
    return lambda key: jax.random.randint(key, shape, low, high, jnp.int64).astype(dtype)


@factory("randperm", random=True)
def _randperm(name, args, shape, dtype):
    n = args[0]
    return lambda key: jax.random.permutation(key, n).astype(dtype)


# ---------------------------------------------------------------- running them

_compiled: dict[Any, Any] = {}


def _target_index(kwargs: dict) -> int:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != DEVICE_NAME:
        raise RuntimeError(f"pjrt_host: factory reached the '{DEVICE_NAME}' device with device={device}")
    return device_index(device)


def _aten(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, (bool, int, float, complex)):
        return (type(v), v)
    return v


def run_named(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The device kernel of the factory overload ``name`` ("arange.start")."""
    try:
        return _run_named(name, args, kwargs)
    except (MemoryError, RuntimeError) as err:
        oom = _memory.as_out_of_memory(err, f"aten::{name}", (), kwargs)
        if oom is None:
            raise
        raise oom from err


def _run_named(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    index = _target_index(kwargs)
    meta_kwargs = dict(kwargs, device="meta")
    meta_kwargs.pop("pin_memory", None)
    if "generator" in meta_kwargs:
        meta_kwargs["generator"] = None  # the meta kernel needs no random state
    meta = _aten(name)(*args, **meta_kwargs)
    dtype = device_dtype(meta.dtype)
    shape = tuple(meta.shape)
    if name.startswith("empty"):
        # Made lazily (zeros on first use): a size the device can never hold
        # fails here, as it would on cuda, not at some later op.
        _memory.check_fits(math.prod(shape) * meta.element_size(), index, f"aten::{name}")
        return new_tensor(shape, dtype, index)
    builder = BUILDERS.get(name.split(".", 1)[0])
    if builder is None or any(isinstance(a, torch.Tensor) for a in args):
        return _on_cpu(_aten(name), args, kwargs, index)
    numel = math.prod(shape)
    drawn = shape
    if builder.elementwise and 0 < numel <= _BUCKETED:
        drawn = (bucket(numel),)
    try:  # a bucketed draw is keyed without its size (its only list argument)
        key = (name, _freeze(args if drawn == shape else tuple(a for a in args if not isinstance(a, (list, tuple)))),
               dtype, drawn, index)
        fn = _compiled.get(key)
    except TypeError:
        key, fn = None, None
    if fn is None:
        values = builder.build(name, args, drawn, jax_dtype(dtype))
        if values is None:
            return _on_cpu(_aten(name), args, kwargs, index)
        if builder.random:
            def body(key_data, counter):
                return values(jax.random.fold_in(jax.random.wrap_key_data(key_data, impl="threefry2x32"), counter))
        else:
            def body():
                return values(None)
        body.__name__ = body.__qualname__ = f"aten.{name}"  # what jax's compile logs and events name
        fn = jax.jit(body, out_shardings=sharding(index))
        if key is not None:
            _compiled[key] = fn
    arr = fn(*_rng.next_key_args(index, kwargs.get("generator"))) if builder.random else fn()
    if drawn != shape:
        arr = _cut(arr, shape)
    return wrap_array(arr, index, dtype)


#: Elementwise random factories and in-place draws (``uniform_``,
#: ``normal_`` ...) of at most this many elements are drawn in power-of-two
#: buckets (see _Factory).
_BUCKETED = 1 << 16


def bucket(numel: int) -> int | None:
    """The power-of-two bucket a draw of ``numel`` elements is made in
    (None: drawn at its own size)."""
    return max(16, 1 << (numel - 1).bit_length()) if 0 < numel <= _BUCKETED else None


@functools.partial(jax.jit, static_argnums=1)
def _cut(flat: Any, shape: tuple[int, ...]) -> Any:
    return flat[:math.prod(shape)].reshape(shape)


def _on_cpu(op: Any, args: tuple, kwargs: dict, index: int) -> torch.Tensor:
    cpu_kwargs = dict(kwargs, device="cpu")
    cpu_kwargs.pop("pin_memory", None)
    out = op(*args, **cpu_kwargs)
    if isinstance(out, torch.Tensor):
        dtype = device_dtype(out.dtype)
        return wrap_array(to_jax_array(out, index, dtype), index, dtype)
    return out


def run(op: Any, args: tuple, kwargs: dict) -> Any:
    """The device-key fallback: any factory without a kernel of its own."""
    name = op.name().split("::", 1)[1] if hasattr(op, "name") else str(op)
    if name in ("empty.memory_format", "empty_strided"):
        return run_named(name, args, kwargs)
    index = _target_index(kwargs)
    logger.debug("factory %s computed on torch CPU and moved to the device", name)
    try:
        return _on_cpu(op, args, kwargs, index)
    except (MemoryError, RuntimeError) as err:
        oom = _memory.as_out_of_memory(err, f"aten::{name}", (), kwargs, index)
        if oom is None:
            raise
        raise oom from err
