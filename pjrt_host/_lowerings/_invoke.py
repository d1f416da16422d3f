"""The one way to run a lowering: :func:`invoke` with a :class:`LoweringContext`.

Eager dispatch, the torch.compile backend and ``assume_pure`` each build a
context from what they know (the device configuration, the plugin, a random
key drawn for this call) and call :func:`invoke`; the rules for calling a
lowering -- the key goes first, torch's ``generator`` argument goes, matmul
precision is the context's, bfloat16 / float16 compute in float32 and round
once (torch's "opmath"), results take the dtypes torch's meta kernel gives
-- live here and nowhere else.

Lowerings run while a computation is traced (or eagerly, for data-dependent
ones), so the context is a trace-time value: helpers deep inside a lowering
(:func:`pjrt_host._lowerings._util.take`) read it with
:func:`current_context` instead of reaching for the live runtime.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from . import _kernels

if TYPE_CHECKING:
    from . import Lowering

__all__ = ["LoweringContext", "Result", "current_context", "invoke", "stored_dtype"]


class Result(NamedTuple):
    """What a factory lowering makes: the shape and jax dtype torch's meta
    kernel (or a traced graph's fake tensor) gives its result."""

    shape: tuple[int, ...]
    dtype: Any


@dataclasses.dataclass(frozen=True, slots=True)
class LoweringContext:
    """Everything a lowering may need from its caller."""

    #: ``jax.default_matmul_precision`` for float matmuls and convolutions
    #: ("highest" computes float32 fully, as torch CPU does).
    matmul_precision: str = "highest"
    #: The plugin's ``dense_gather_factor``: gathers of at most this many
    #: indices per gathered row become one-hot matmuls (0: never).
    dense_gather_factor: int = 0
    #: The plugin's ``conv_as_matmul_max_positions`` (0: never).
    conv_as_matmul_max_positions: int = 0
    #: The plugin's ``widen_16bit_matmul_operands``: 16-bit float matmul
    #: operands are widened to float32 before the product.
    widen_16bit_matmul_operands: bool = False
    #: A jax PRNG key for lowerings that need one (drawn per call by the
    #: caller from the device's random state); None where no random op runs.
    rng_key: Any = None
    #: The program runs on one device, not partitioned over a mesh: a random
    #: draw of several dimensions is made over a flat counter and reshaped
    #: (:func:`pjrt_host._lowerings._util.draw`).  The values are the same
    #: either way; XLA:CPU compiles the flat draw 2-5x faster, and a
    #: partitioner would have to replicate it.
    one_device: bool = False
    #: The plugin's vendor kernels (``DevicePlugin.declared_kernels``, a
    #: ``KernelDeclarations``); None or empty: the table's lowerings only.
    declared_kernels: Any = None
    #: The scoped ``pjrt_host.config(plugin_kernels=...)`` setting as
    #: ``(mode, dropped op names)``.  None: the setting in force where the
    #: context is made (:func:`_kernels.current_setting`) -- the device makes
    #: one context per configuration, under that configuration, so the
    #: context keeps its configuration's setting when its programs are traced
    #: later (a fused segment runs when a value is read, perhaps outside the
    #: ``with`` block its ops were recorded in).
    kernel_setting: Any = None
    #: Draws over padded inputs (dynamic dimensions): physical shape -> the
    #: logical flat index of every position, so that a draw over a padded
    #: array gives each logical element the value an exact draw gives it
    #: (:func:`pjrt_host._lowerings._util.draw`).  Empty: none.
    draw_positions: Any = ()
    #: The op's padded tensor arguments (dynamic dimensions), as ``(position
    #: in its arguments, a function giving the mask of the logical
    #: elements)``: for a lowering whose padding a fill cannot make harmless
    #: (attention masks the key positions past the logical length:
    #: :func:`pjrt_host._lowerings._util.logical_elements`).  Empty: none.
    logical: Any = ()
    #: The kernels that run under this context: ``declared_kernels`` allowed
    #: by the settings, imported (their custom-call targets registered), in
    #: declaration order.  Made with the context, never passed.
    kernels: tuple = dataclasses.field(init=False, default=())

    def __post_init__(self) -> None:
        if not self.declared_kernels or not self.declared_kernels.kernels:
            return
        if self.kernel_setting is None:
            object.__setattr__(self, "kernel_setting", _kernels.current_setting())
        object.__setattr__(self, "kernels", _kernels.resolve(self.declared_kernels, self.kernel_setting))


_DEFAULT = LoweringContext()
_current: contextvars.ContextVar[LoweringContext] = contextvars.ContextVar("pjrt_host_lowering_context",
                                                                           default=_DEFAULT)


_stored: contextvars.ContextVar[Any] = contextvars.ContextVar("pjrt_host_stored_dtype", default=None)


def stored_dtype() -> Any:
    """The 16-bit float dtype the running lowering's inputs had before they
    were widened to float32 (None: nothing was widened, or the inputs mixed
    in a wider float).  For the few kernels torch writes an intermediate in
    the input dtype and reads it back (batch norm's statistics on CPU)."""
    return _stored.get()


def current_context() -> LoweringContext:
    """The context of the lowering being invoked (defaults outside one)."""
    return _current.get()


def invoke(lowering: Lowering, args: Sequence[Any], kwargs: Mapping[str, Any], ctx: LoweringContext,
           result_dtypes: Any = None, result_shape: tuple[int, ...] | None = None) -> Any:
    """Run ``lowering`` on jax values with context ``ctx``.

    ``result_dtypes``: None keeps the lowering's dtypes; a jax dtype casts a
    single result; a sequence casts each result of a tuple / list (None
    entries, and non-array results, stay as they are).  ``result_shape``:
    the result's shape, which a factory lowering (``Lowering.factory``)
    needs with its single result dtype."""
    if lowering.factory:
        if result_shape is None or result_dtypes is None or isinstance(result_dtypes, (tuple, list)):
            raise RuntimeError(f"pjrt_host: {lowering.names[0]} makes a tensor from its arguments alone and its "
                               "caller passed no result shape and dtype (invoke's result_shape, result_dtypes)")
        args = (Result(tuple(result_shape), result_dtypes), *args)
    if lowering.needs_rng:
        if ctx.rng_key is None:
            raise RuntimeError(f"pjrt_host: {lowering.names[0]} is a random op and its caller passed no random key "
                               "(LoweringContext.rng_key)")
        args = (ctx.rng_key, *args)
        if "generator" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
    if ctx.kernels and not lowering.data_dependent:
        kernel = _kernels.matching(ctx.kernels, lowering.names, args, kwargs)
        if kernel is not None:
            # the kernel takes the call's own dtypes (no opmath widening):
            # a vendor's bfloat16 kernel is written for bfloat16
            token = _current.set(ctx)
            try:
                with jax.default_matmul_precision(ctx.matmul_precision):
                    return _kernels.run(kernel, args, kwargs,
                                        lambda: _reference(lowering, args, kwargs, ctx, result_dtypes))
            finally:
                _current.reset(token)
    return _reference(lowering, args, kwargs, ctx, result_dtypes)


def _reference(lowering: Lowering, args: Sequence[Any], kwargs: Mapping[str, Any], ctx: LoweringContext,
               result_dtypes: Any) -> Any:
    """The table's lowering on the prepared arguments, opmath and the
    caller's result dtypes applied."""
    narrow = None
    if lowering.opmath:
        args, kwargs, narrow = _opmath(args, kwargs)
    token = _current.set(ctx)
    stored = _stored.set(narrow)
    try:
        with jax.default_matmul_precision(ctx.matmul_precision):
            value = lowering.fn(*args, **kwargs)
    except (TypeError, ValueError, IndexError, OverflowError) as err:
        if type(err) in (TypeError, ValueError, IndexError, OverflowError) and not _raised_here(err):
            # jax's (or numpy's) complaint about arguments torch let through: a
            # torch error naming the op, never jax's type with jax's words alone
            raise RuntimeError(
                f"{lowering.names[0]}: jax cannot compute this call with these arguments ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); torch accepted them, so this is a gap in "
                "pjrt_host's lowering: pass the dtypes and shapes torch documents for the op, and report it") from err
        raise
    finally:
        _stored.reset(stored)
        _current.reset(token)
    if result_dtypes is None:
        if narrow is not None:  # no meta dtypes: float32 results go back to the one 16-bit input dtype
            return _narrow(value, narrow)
        return value
    if isinstance(value, (tuple, list)):
        return tuple(v if d is None or v is None else jnp.asarray(v).astype(d) for v, d in zip(value, result_dtypes))
    return jnp.asarray(value).astype(result_dtypes)


def _raised_here(err: BaseException) -> bool:
    """Whether pjrt_host's own code raised ``err`` (its torch-worded
    refusals), not jax's or numpy's called from it."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and os.path.realpath(frames[-1].filename).startswith(_PACKAGE_ROOT)


# pjrt_host's own directory (not any path that merely contains "pjrt_host":
# a virtual environment inside a checkout named so holds jax too).
_PACKAGE_ROOT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


# ------------------------------------------------------------------ opmath
#
# torch computes bfloat16 and float16 in float32 and rounds each result once
# (its CPU and CUDA kernels' "opmath" type; its _refs say the same through
# each elementwise ref's computation dtype).  A lowering written as several
# jax ops would round after each one in 16 bits (addcmul, cumsum, the norms,
# logaddexp2 ... differ from torch by an ulp or more), so every lowering
# gets its 16-bit float arguments as float32; the caller's result dtypes (or
# _narrow) round the results once.  Converting a 16-bit value to float32 is
# exact, so ops that only move or compare values are unchanged by it.

#: The 16-bit float dtypes opmath computes in float32.
REDUCED_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_WIDE = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))


def _opmath(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(args, kwargs) with 16-bit float arrays as float32, and the 16-bit
    dtype the results return to when no caller dtype is given (None when
    nothing was widened, or inputs already mixed in a wider float)."""
    seen: dict = {}  # 16-bit dtype -> seen on an array with dimensions
    wide = [False, False]  # a wider float array: [0-dim, with dimensions]

    def up(x: Any) -> Any:
        dtype = getattr(x, "dtype", None)
        if dtype is None or not hasattr(x, "shape"):
            if isinstance(x, (list, tuple)) and x and any(hasattr(v, "dtype") for v in x):
                return type(x)(up(v) for v in x)
            return x
        if dtype in REDUCED_FLOATS:
            seen[dtype] = seen.get(dtype, False) or x.ndim > 0
            return x.astype(jnp.float32)
        if dtype in _WIDE:
            wide[x.ndim > 0] = True
        return x

    new_args = tuple(up(a) for a in args)
    new_kwargs = {k: up(v) for k, v in kwargs.items()}
    if not seen:
        return args, kwargs, None
    # torch's promotion: a 0-dim float32 tensor does not widen a bfloat16
    # tensor with dimensions (the result stays bfloat16), one with does.
    has_dims = any(seen.values())
    mixed = wide[1] or (wide[0] and not has_dims)
    narrow = next(iter(seen)) if len(seen) == 1 and not mixed else None
    return new_args, new_kwargs, narrow


def _narrow(value: Any, dtype: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_narrow(v, dtype) for v in value)
    if getattr(value, "dtype", None) == jnp.float32:
        return value.astype(dtype)
    return value
