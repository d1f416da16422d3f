"""The one way to run a lowering: :func:`invoke` with a :class:`LoweringContext`.

Eager dispatch, the torch.compile backend and ``assume_pure`` each build a
context from what they know (the device configuration, the plugin, a random
key drawn for this call) and call :func:`invoke`; the rules for calling a
lowering -- the key goes first, torch's ``generator`` argument goes, matmul
precision is the context's, results take the dtypes torch's meta kernel
gives -- live here and nowhere else.

Lowerings run while a computation is traced (or eagerly, for data-dependent
ones), so the context is a trace-time value: helpers deep inside a lowering
(:func:`pjrt_host._lowerings._util.take`) read it with
:func:`current_context` instead of reaching for the live runtime.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from . import Lowering

__all__ = ["LoweringContext", "current_context", "invoke"]


@dataclasses.dataclass(frozen=True, slots=True)
class LoweringContext:
    """Everything a lowering may need from its caller."""

    #: ``jax.default_matmul_precision`` for float matmuls and convolutions
    #: ("highest" computes float32 fully, as torch CPU does).
    matmul_precision: str = "highest"
    #: The plugin's ``dense_gather_factor``: gathers of at most this many
    #: indices per gathered row become one-hot matmuls (0: never).
    dense_gather_factor: int = 0
    #: A jax PRNG key for lowerings that need one (drawn per call by the
    #: caller from the device's random state); None where no random op runs.
    rng_key: Any = None


_DEFAULT = LoweringContext()
_current: contextvars.ContextVar[LoweringContext] = contextvars.ContextVar("pjrt_host_lowering_context",
                                                                           default=_DEFAULT)


def current_context() -> LoweringContext:
    """The context of the lowering being invoked (defaults outside one)."""
    return _current.get()


def invoke(lowering: Lowering, args: Sequence[Any], kwargs: Mapping[str, Any], ctx: LoweringContext,
           result_dtypes: Any = None) -> Any:
    """Run ``lowering`` on jax values with context ``ctx``.

    ``result_dtypes``: None keeps the lowering's dtypes; a jax dtype casts a
    single result; a sequence casts each result of a tuple / list (None
    entries, and non-array results, stay as they are)."""
    if lowering.needs_rng:
        if ctx.rng_key is None:
            raise RuntimeError(f"pjrt_host: {lowering.names[0]} is a random op and its caller passed no random key "
                               "(LoweringContext.rng_key)")
        args = (ctx.rng_key, *args)
        if "generator" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
    token = _current.set(ctx)
    try:
        with jax.default_matmul_precision(ctx.matmul_precision):
            value = lowering.fn(*args, **kwargs)
    finally:
        _current.reset(token)
    if result_dtypes is None:
        return value
    if isinstance(value, (tuple, list)):
        return tuple(v if d is None or v is None else jnp.asarray(v).astype(d) for v, d in zip(value, result_dtypes))
    return jnp.asarray(value).astype(result_dtypes)
