"""Traced scalars: whether an op's Python scalars can be run-time values.

An optimizer passes a new step size every step, ``nn.init`` new bounds for
each layer: compiling them in as constants would compile a program per
value.  An op whose scalars change is *tried* with them traced: run once
with them static and once traced, and kept traced when both give the same
result (a lowering that branches on a scalar's value cannot trace it).
The verdict is kept beside the programs on disk.  A random op whose scalars
are traced has torch's value checks run here for each new set of values.

The functions take the engine's op (``_engine.CompiledOp``): they call it,
and set its ``dynamic`` / ``in_trial`` state and its cache.
"""

from __future__ import annotations

import logging
from typing import Any

import jax.numpy as jnp
import numpy as np

from .. import _program_cache
from .._lowerings import op_name
from . import _config, _meta, _rng
from ._signatures import first_jax_device, has_dynamic
from ._tensor import JaxTensor, read

__all__ = ["check_scalars", "drop_traced", "same_draw_again", "trial"]

logger = logging.getLogger("pjrt_host._torch._engine")


def trial(op: Any, args: tuple, kwargs: dict) -> Any:
    """Try tracing ``op``'s scalars instead of compiling per value: keep
    them traced if the lowering traces and gives the same result (a lowering that
    branches on a scalar's value cannot).  The verdict is kept beside the
    programs on disk: a later process of the same setting takes it
    without running the op twice (op by op)."""
    signature = (op.name, op_name(op.meta_op), op.inplace, op.lowering.where)
    # Not in fused eager: there the trial ends the open segment, and a
    # process that skips it records other segments than the one that
    # made the programs on disk (new programs to compile, not fewer).
    verdict = _program_cache.remembered("traced-scalars", signature) \
        if _config.current().eager != "fused" else None
    if verdict in (b"traced", b"static"):
        op.dynamic = verdict == b"traced"
        return op(args, kwargs)
    target = args[op.inplace] if op.inplace is not None else None
    saved = target._storage.get() if target is not None else None
    redraw = same_draw_again(op, args, kwargs)  # a random op: both runs draw the same numbers
    op.in_trial = True
    try:
        static_out = op(args, kwargs)
    finally:
        op.in_trial = False
    if redraw is not None:
        redraw()
    if target is not None:
        static_value = target._storage.array
        if _nbytes(static_value) > _TRIAL_BYTES:
            return target  # too large to run twice: judged at a later, smaller call
        target._storage.array = saved
    elif _nbytes(static_out) > _TRIAL_BYTES:
        return static_out
    op.dynamic = True
    op.in_trial = True  # the second run too: run now, never recorded by fused eager
    try:
        try:
            dyn_out = op(args, kwargs)
        finally:
            op.in_trial = False
        if target is not None:
            same = _same(static_value, target._storage.array)
        else:
            same = _same_outputs(static_out, dyn_out)
    except Exception as err:
        logger.debug("%s keeps static scalars: %s", op.name, err)
        same = False
    _program_cache.remember("traced-scalars", signature, b"traced" if same else b"static")
    if same:
        return dyn_out
    drop_traced(op)
    if target is not None:
        target._storage.array = static_value
    return static_out


def check_scalars(op: Any, args: tuple, kwargs: dict) -> None:
    """A random op whose scalars are traced reuses one program for every
    bound, mean, std or p, so the checks torch makes on their values
    (``normal_(std=-1)``: its meta kernel; ``uniform_(3, -1)``,
    ``bernoulli_(1.5)``: its CPU kernel) would run only for the first:
    they run for each new set of values (a model's dropout repeats its p,
    so once per layer, not per call)."""
    values = tuple(v for i, v in enumerate(args) if i in op.scalar_slots and type(v) in (int, float)) + \
        tuple((k, v) for k, v in kwargs.items() if k in op.scalar_slots and type(v) in (int, float))
    seen = op.checked_scalars
    if values in seen:
        return
    _meta.run_meta(op.meta_op, args, kwargs)
    _meta.check_cpu_kernel(op.func, args, kwargs)
    if len(seen) > 256:
        seen.clear()
    seen.add(values)


def same_draw_again(op: Any, args: tuple, kwargs: dict) -> Any:
    """For a random op: a function that rewinds the random state the
    next call draws from (the device's counter, or a generator passed
    to the op), so a second run draws what the first did."""
    if not op.lowering.needs_rng:
        return None
    generator = kwargs.get("generator")
    if generator is not None:
        snapshot = generator.get_state()
        return lambda: generator.set_state(snapshot)
    device = first_jax_device(list(args) + list(kwargs.values()))
    st = _rng.state(device.index or 0 if device is not None else 0)
    counter = st.counter
    return lambda: setattr(st, "counter", counter)


def drop_traced(op: Any) -> None:
    """The op's scalars compile as constants from now on: its programs with
    traced scalars go."""
    op.dynamic = False
    for k in [k for k in op.cache if has_dynamic(k)]:
        del op.cache[k]


#: The trial of traced scalars runs an op twice and compares the results;
#: an op whose results are larger than this is not tried (a later call is).
_TRIAL_BYTES = 1 << 24


def _nbytes(x: Any) -> int:
    if isinstance(x, JaxTensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return getattr(x, "nbytes", 0)


def _values(t: JaxTensor) -> Any:
    """``t``'s values to compare: a padded result (a trial on the padded
    route) cut on the host, its storage left padded for the ops after it."""
    storage = t._storage
    if storage.padded is None or t._view is not None:
        return read(t)
    comps = [c for dim in storage.padded for c in dim]
    a = np.asarray(storage.computed()).reshape(tuple(c[0] for c in comps))
    return a[tuple(slice(0, c[1]) for c in comps)].reshape(storage.shape)


def _same(a: Any, b: Any) -> bool:
    """Equal values (float: within 1e-6 relative, NaN equal to NaN),
    compared on the host: a trial's results are at most _TRIAL_BYTES, and
    copying them costs less than compiling a comparison for each new shape
    (about 0.1 s each on XLA:CPU: 12 of them were 1.2 s of a GPT-2 training
    step's 16 s cold start)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return bool(np.array_equal(a, b))
    wide = np.complex128 if jnp.issubdtype(a.dtype, jnp.complexfloating) else np.float64
    a, b = a.astype(wide), b.astype(wide)
    with np.errstate(all="ignore"):
        close = np.abs(a - b) <= 1e-6 * np.abs(b)
        return bool(np.all((a == b) | close | (np.isnan(a) & np.isnan(b))))


def _same_outputs(x: Any, y: Any) -> bool:
    if isinstance(x, JaxTensor) and isinstance(y, JaxTensor):
        return x.dtype == y.dtype and x.shape == y.shape and _same(_values(x), _values(y))
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and all(_same_outputs(a, b) for a, b in zip(x, y))
    return x == y
