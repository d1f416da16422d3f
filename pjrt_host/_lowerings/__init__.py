"""The ATen -> JAX lowering table: one small function per ATen op (or family).

A lowering is registered by decorator under ATen op *names* (strings), never
under ``torch.ops.aten.*`` attributes, so a torch release that renames or
drops an overload cannot break import: an unknown name is simply never
looked up.  Lookup goes from the exact overload (``"aten::add.Tensor"``) to
the overload packet (``"aten::add"``).

A lowering receives the op's arguments with every torch tensor replaced by a
``jax.Array`` (Python scalars, dtypes, lists, ... unchanged) and returns
jax arrays (or a tuple / list of them, mirroring the op's outputs).  It must
be traceable by ``jax.jit`` (no Python branching on array values), because
the same table serves eager execution, torch.compile and assume_pure.

Modules that define lowerings (``pjrt_host._lowerings.ops_*``) are imported
by :func:`load_all` when the first op is dispatched, never at ``import torch``.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from typing import Any, Callable

__all__ = ["lookup", "lowering", "load_all", "registered_names"]

logger = logging.getLogger("pjrt_host")

Lowering = Callable[..., Any]

_TABLE: dict[str, Lowering] = {}
_loaded = False


def lowering(*names: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function for each ATen op name, e.g.
    ``@lowering("aten::add.Tensor", "aten::add.Scalar")`` or a whole packet
    ``@lowering("aten::relu")``.  A later registration replaces an earlier."""

    def register(fn: Lowering) -> Lowering:
        for name in names:
            _TABLE[_normalise(name)] = fn
        return fn

    return register


def lookup(op: Any) -> Lowering | None:
    """The lowering for an ``OpOverload`` (or anything with ``name()``), or
    None.  Never raises."""
    load_all()
    try:
        full = op.name()  # "aten::add.Tensor" (or "aten::add" for default)
    except Exception:
        return None
    fn = _TABLE.get(full)
    if fn is None:
        packet = full.split(".", 1)[0]
        fn = _TABLE.get(packet)
        if fn is None and full.endswith(".default"):
            fn = _TABLE.get(full[: -len(".default")])
    return fn


def registered_names() -> list[str]:
    load_all()
    return sorted(_TABLE)


def load_all() -> None:
    """Import every ``ops_*`` module of this package once.  A module that
    fails to import is logged and skipped: one broken family of lowerings
    must not take the device down."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("ops_"):
            try:
                importlib.import_module(f"{__name__}.{info.name}")
            except Exception as err:  # pragma: no cover - defensive
                logger.warning("pjrt_host: lowerings in %s failed to load: %s", info.name, err)


def _normalise(name: str) -> str:
    name = name.strip()
    if "::" not in name:
        name = "aten::" + name.removeprefix("aten.")
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name
