"""The ATen -> JAX lowering table: one small function per ATen op (or family).

A lowering is registered by decorator under ATen op *names* (strings), never
under ``torch.ops.aten.*`` attributes, so a torch release that renames or
drops an overload cannot break import: an unknown name is simply never
looked up.  Lookup goes from the exact overload (``"aten::add.Tensor"``) to
the overload packet (``"aten::add"``).

Each registration is a :class:`Lowering` record: the function plus what it
needs from its caller (a random key, concrete values).  A lowering receives
the op's arguments with every torch tensor replaced by a ``jax.Array``
(Python scalars, dtypes, lists, ... unchanged) and returns jax arrays (or a
tuple / list of them, mirroring the op's outputs).  It must be traceable by
``jax.jit`` unless it is marked ``data_dependent``.

Every caller -- eager dispatch, the torch.compile backend, ``assume_pure`` --
runs a lowering through :func:`invoke` with a :class:`LoweringContext` it
builds; nothing else calls ``Lowering.fn``.  This package imports nothing of
pjrt_host outside itself: what a lowering needs of the device reaches it
through that context.

Modules that define lowerings (``ops_*``) are imported by :func:`load_all`
when the first op is looked up, never at ``import torch``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
import threading
from typing import Any, Callable

from ._invoke import LoweringContext, Result, current_context, invoke

__all__ = [
    "DuplicateLoweringError", "Lowering", "LoweringContext", "Result", "current_context", "invoke", "load_all",
    "lookup", "lowering", "op_name", "registered_names",
]

logger = logging.getLogger(__name__)


def op_name(op: Any) -> str:
    """An op's name as messages and the table write it (``aten::add.Tensor``);
    for a Python callable in a graph, its qualified name."""
    try:
        return op.name()
    except Exception:
        return getattr(op, "__qualname__", None) or str(op)


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    """One registration of the table."""

    #: The traceable function: ``fn(*args, **kwargs)`` with jax arrays for tensors
    #: (``fn(key, *args, **kwargs)`` when ``needs_rng``).
    fn: Callable[..., Any]
    #: Normalised ATen names it is registered under (``"aten::add.Tensor"``).
    names: tuple[str, ...]
    #: Takes a jax PRNG key as its first argument; :func:`invoke` passes the
    #: context's ``rng_key`` and drops torch's ``generator`` argument.
    needs_rng: bool = False
    #: Its output *shape* depends on input values (nonzero, unique, boolean
    #: masks): it needs concrete arrays, so it runs outside ``jax.jit`` and a
    #: compiled graph cannot hold it.
    data_dependent: bool = False
    #: ``module:function`` where it was defined, for duplicate-registration errors.
    where: str = ""
    #: Computes bfloat16 / float16 inputs in float32 and rounds its results
    #: once (torch's "opmath" rule, :func:`invoke`).  False for lowerings
    #: whose meaning is the input's dtype itself (bit views, ``nextafter``,
    #: the dtype's own limits) and for the matmul family, which keeps 16-bit
    #: operands and accumulates in float32 itself (``preferred_element_type``).
    opmath: bool = True
    #: Traces its float / Scalar arguments from the first call (a new value
    #: never compiles a new program): for lowerings written not to branch on
    #: them, whose outputs are too large for the engine's trial (the fused
    #: optimizers: a learning-rate schedule gives a new lr every step).
    traced_scalars: bool = False
    #: Makes its result from its arguments alone (``zeros``, ``arange``,
    #: ``randn``, ``*_like``): it takes a :class:`Result` first (after the
    #: key of a random one), the shape and dtype torch's meta kernel gives,
    #: which :func:`invoke` passes from its caller.
    factory: bool = False
    #: A random draw made element by element, each alike whatever the
    #: result's shape (``rand``, ``uniform_``; not ``randperm``): a caller may
    #: draw a small one in a larger flat buffer and cut it (eager does, so a
    #: new shape does not compile a new random program).
    per_element: bool = False


class DuplicateLoweringError(RuntimeError):
    """An ATen name registered twice: import order would silently pick one."""


_TABLE: dict[str, Lowering] = {}
_load_lock = threading.RLock()
_loaded = False


def lowering(*names: str, needs_rng: bool = False, data_dependent: bool = False, opmath: bool = True,
             traced_scalars: bool = False, factory: bool = False,
             per_element: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function for each ATen op name, e.g.
    ``@lowering("aten::add.Tensor", "aten::add.Scalar")`` or a whole packet
    ``@lowering("aten::relu")``.  Returns the function unchanged, so lowerings
    can call each other.  A name registered twice raises
    :class:`DuplicateLoweringError` naming both places.  ``opmath=False``:
    see :attr:`Lowering.opmath` (random ops never take it: a draw rounded
    from float32 could reach the top of its range).  ``factory``,
    ``per_element``: see :class:`Lowering`."""

    def register(fn: Callable) -> Callable:
        where = f"{fn.__module__}:{fn.__qualname__}"
        record = Lowering(fn, tuple(_normalise(n) for n in names), needs_rng, data_dependent, where,
                          opmath and not needs_rng, traced_scalars, factory, per_element)
        for name in record.names:
            previous = _TABLE.get(name)
            if previous is not None and previous.fn is not fn:
                raise DuplicateLoweringError(
                    f"pjrt_host: the ATen op {name} has two lowerings, {previous.where} and {where}; "
                    "keep one (which would win depends on import order)")
            _TABLE[name] = record
        return fn

    return register


def lookup(op: Any) -> Lowering | None:
    """The lowering for an ``OpOverload`` (or anything with ``name()``), or
    None.  Never raises."""
    if not _loaded:
        load_all()
    try:
        full = op.name()  # "aten::add.Tensor" (or "aten::add" for default)
    except Exception:
        return None
    found = _TABLE.get(full)
    if found is None:
        found = _TABLE.get(full.split(".", 1)[0])
        if found is None and full.endswith(".default"):
            found = _TABLE.get(full[: -len(".default")])
    return found


def registered_names() -> list[str]:
    load_all()
    return sorted(_TABLE)


def load_all() -> None:
    """Import every ``ops_*`` module of this package once.  A module that
    fails to import is logged and skipped: one broken family of lowerings
    must not take the device down (tests import each one strictly)."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("ops_"):
                try:
                    importlib.import_module(f"{__name__}.{info.name}")
                except DuplicateLoweringError:
                    raise
                except Exception as err:  # pragma: no cover - defensive
                    logger.warning("lowerings in %s failed to load: %s", info.name, err)
        _loaded = True


def _normalise(name: str) -> str:
    name = name.strip()
    if "::" not in name:
        name = "aten::" + name.removeprefix("aten.")
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name
