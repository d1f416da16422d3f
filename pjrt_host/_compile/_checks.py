"""Index and value checks inside compiled programs (``pjrt_host.config(checks=...)``).

An XLA gather or scatter cannot fail: it clips or drops an out-of-range
index.  Eager mode checks each indexing op's indices on the device and reads
the verdict at the next synchronisation point (``_torch._index_checks``).
A compiled program does the same inside itself: for every indexing op of the
graph (advanced indexing and index puts, index_select, gather, scatter,
index_add / index_copy / index_fill, embedding, take, put -- the ops and bounds
eager checks, read from the graph's fake tensors) it computes one row
``[any index out of range, the first such index, the bound]`` and returns
the rows as one extra output.  The caller queues that output with eager's
deferred checks, so the error is torch's, names the op (and the line of the
user's code the graph recorded) and surfaces at the next ``.item()``,
``.cpu()``, print or ``torch.jax.synchronize()``; with ``checks='sync'``
it is read, and raised, right after the call; ``checks=False``
compiles programs without the rows.

Value checks are eager's too (``_torch._value_checks``: an integer division
by zero, a probability outside [0, 1], an SVD of NaNs ...): the program
computes each checked op's verdict code from the same verdict function, one
row ``[code, 0, 0]`` beside the index rows, and the error is CPU's type and
text for that code.

Under a JAX transformation (``call_torch`` / ``extract_jax`` inside
``jax.jit``) no host code runs per call: the checks are
``checkify.debug_check``s there, reported by ``checkify.checkify`` and free
without it.
"""

from __future__ import annotations

import os

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx

from .._jax_settings import x64_mode
from . import _door

__all__ = ["Site", "ValueSite", "debug_checks", "report", "sites_of", "stack"]


class Site(NamedTuple):
    """One index check of a graph: ``index`` (a graph node) must lie in
    ``[-size if negative_ok else 0, size)`` or equal ``ignore``."""

    op: str  #: the ATen op, "aten::index.Tensor"
    index: torch.fx.Node
    size: Any  #: an int, or a SymInt of a symbolic graph
    dim: int
    negative_ok: bool
    error: Callable[[int, int, int], Exception]  #: torch's exception for (value, dim, size)
    source: str  #: "file.py:12 in fn", where the user's code called the op ("" unknown)
    ignore: int | None = None  #: a value allowed wherever it lies (a loss's ignore_index)

    def row(self, index: Any, size: int) -> Any:
        """Traceable: the verdict row of the index values ``index``."""
        from ._interpreter import index_row

        return index_row(index, size, self.negative_ok, self.ignore)

    def failure(self, row: list[int], where: str, when: str) -> Exception:
        """The exception of a failed ``row`` (read back), called ``where``."""
        _, value, size = row
        return _door.index_failure(self.error, value, self.dim, size, self.op, where, when)

    def debug_check(self, row: Any, size: int, where: str) -> None:
        from jax.experimental import checkify

        # torch's text names the value: put the traced value there.
        text = str(self.error(-987654321, self.dim, size)).replace("{", "{{").replace("}", "}}") \
            .replace("-987654321", "{}")
        checkify.debug_check(row[0] == 0, f"{text} (raised by {self.op} {where})", row[1].astype(jnp.int32))


class ValueSite(NamedTuple):
    """One value check of a graph: ``verdict`` of ``index``'s values (a
    graph node, named as :class:`Site`'s for the interpreter; None: the
    call is refused whatever it holds) must be 0."""

    op: str
    index: torch.fx.Node | None
    verdict: Callable[[Any], Any]  #: traceable, array -> int32 code
    error: Callable[[int], tuple[type, str]]  #: CPU's exception type and text for a code
    source: str
    size: int = 0

    def row(self, value: Any, size: int) -> Any:
        code = self.verdict(value)
        return jnp.stack([code, jnp.zeros_like(code), jnp.zeros_like(code)])

    def failure(self, row: list[int], where: str, when: str) -> Exception:
        exc, text = self.error(row[0])
        return exc(f"{text} (raised by {self.op} {where}, {when})")

    def debug_check(self, row: Any, size: int, where: str) -> None:
        from jax.experimental import checkify

        # a text that names the code (the first bad length ...): the traced code there
        text = self.error(-987654321)[1].replace("{", "{{").replace("}", "}}")
        named = "-987654321" in text
        message = f"{text.replace('-987654321', '{}')} (raised by {self.op} {where})"
        checkify.debug_check(row[0] == 0, message, *((row[0],) if named else ()))


def sites_of(node: torch.fx.Node, name: str) -> list[Site]:
    """The index and value checks of op ``name`` at ``node`` (empty for
    other ops)."""
    indexes, values = _door.has_index_check(name), _door.has_value_check(name)
    if not (indexes or values):
        return []
    fakes: dict[int, torch.fx.Node] = {}

    def fake(a: Any) -> Any:
        if not isinstance(a, torch.fx.Node):
            return a
        val = a.meta.get("val")
        if isinstance(val, torch.Tensor):
            fakes[id(val)] = a
        return val

    args = torch.fx.node.map_aggregate(node.args, fake)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, fake)
    found: list[Any] = []
    for index, size, dim, negative_ok, error, ignore in _door.index_sites(name, args, kwargs) if indexes else ():
        at = fakes.get(id(index))
        if at is None or 0 in tuple(index.shape):  # no index values to check
            continue
        found.append(Site(name, at, size, dim, negative_ok, error, _source(node), ignore))
    for tensor, verdict, error in _door.value_sites(name, args, kwargs) if values else ():
        at = None if tensor is None else fakes.get(id(tensor))
        if tensor is not None and (at is None or 0 in tuple(tensor.shape)):  # not an argument, or no values
            continue
        found.append(ValueSite(name, at, verdict, error, _source(node)))
    return found


def _source(node: torch.fx.Node) -> str:
    """Where the user's code called the op, from the stack the trace kept:
    its innermost frame outside torch (a torch-function mode, as
    ``set_default_device`` leaves, adds torch's own frame below it)."""
    trace = node.meta.get("stack_trace") or ""
    for line in reversed(trace.splitlines()):
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[len('File "'):].partition('", line ')
            if path.startswith(_LIBRARY_DIRS):
                continue
            number, _, fn = rest.partition(", in ")
            return f"{path}:{number} in {fn}" if fn else f"{path}:{number}"
    return ""


_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,))



def stack(rows: list) -> Any:
    """Traceable: one array of the rows ``Program.run`` collected
    (``(site number, size, row)`` each), one row per check in order."""
    dtype = jnp.result_type(*(r.dtype for _, _, r in rows))
    return jnp.stack([r.astype(dtype) for _, _, r in rows])


def _raise_first(values: Any, sites: list[Site], where: str, when: str) -> None:
    for site, row in zip(sites, np.asarray(values).tolist()):
        if row[0]:
            raise site.failure(row, f"{where}, called from {site.source}" if site.source else where, when)


_DEFERRED = ("found at the next synchronisation point; pjrt_host.config(checks='sync') raises at the "
             "call itself, checks=False compiles without the check")
_SYNC = "found at the call (pjrt_host.config(checks='sync')); checks=True defers it to the next " \
        "synchronisation point"


def report(flags: Any, sites: list[Site], mode: Any, where: str) -> None:
    """After a call of a checked program: queue its verdict ``flags`` (the
    stacked rows) with eager's deferred checks, or with ``mode`` "sync"
    read it now.  ``where`` says which program ran ("in the forward graph of
    torch.compile(backend='jax') on jax:0")."""
    if mode == "sync":
        _raise_first(flags, sites, where, _SYNC)
        return

    def verdict(wait: bool) -> bool:
        if not wait and not flags.is_ready():
            return False
        _raise_first(flags, sites, where, _DEFERRED)
        return True

    _door.defer_check(verdict)


def debug_checks(rows: list, sites: list[Site], where: str) -> None:
    """Traceable, under a JAX transformation: each row as a
    ``checkify.debug_check`` (reported by ``checkify.checkify``)."""
    for number, size, r in rows:
        site = sites[number]
        at = f"{where}, called from {site.source}" if site.source else where
        # checkify keeps its error state in the caller's types, made outside
        # pjrt_host's 64-bit scope: the check is added in the caller's mode.
        with jax.enable_x64(x64_mode() == "process"):
            site.debug_check(r, size, at)
