"""Vendor kernels: a plugin's own function for an op, preferred over the table's lowering.

A plugin declares kernels by strings (``DevicePlugin.kernels``); the device
passes them to every lowering in the :class:`~._invoke.LoweringContext`
(``declared_kernels``), with the device configuration's
``plugin_kernels`` setting the context was made under.  Making a context
resolves the kernels it allows (:func:`resolve`: imports each ``fn``, which
registers the custom-call targets its module needs), so every target is
registered before any program that calls it is compiled or loaded from
disk.  :func:`~._invoke.invoke` -- the one way every caller runs a lowering
-- asks :func:`matching` for a kernel whose condition holds for the call and
runs it through :func:`run`, which checks the result against the reference
lowering's shapes and dtypes (``jax.eval_shape``, no computation).

A kernel that cannot be imported, raises while traced, or returns other
shapes or dtypes is the plugin's fault: :class:`KernelError` names the
plugin, the op and the kernel; by default it is a warning, once per kernel,
and the reference lowering runs; in ``strict`` mode it is raised.

Nothing here reads pjrt_host's settings or registry: what the device knows
comes through the context, and the one setting that changes per scope
(``pjrt_host.config(plugin_kernels=...)``) through :func:`use_setting`.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

__all__ = ["ActiveKernel", "KernelError", "current_setting", "matching", "resolve", "run", "stats", "use_setting"]


class KernelError(RuntimeError):
    """A plugin's kernel failed: it names the plugin, the op and the kernel."""

    def __init__(self, plugin: str, op: str, kernel: str, cause: str) -> None:
        super().__init__(f"pjrt_host: plugin {plugin}'s kernel {kernel} for {op} {cause}")
        self.plugin, self.op, self.kernel = plugin, op, kernel


@dataclasses.dataclass(frozen=True, slots=True)
class ActiveKernel:
    """A declared kernel, imported and allowed by the setting in force."""

    #: The plugin, as messages name it (``KernelDeclarations.plugin``).
    plugin: str
    #: The normalised ATen op name it replaces the lowering of.
    op: str
    #: Its ``"module:function"``.
    spec: str
    dtypes: tuple[str, ...]
    ranks: tuple[int, ...]
    when_spec: str | None
    #: "on" or "strict": whether a failure falls back or raises.
    mode: str
    fn: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    when: Callable[..., bool] | None = dataclasses.field(repr=False, compare=False)


_lock = threading.RLock()  # a kernel module may lower ops as it is imported
_resolved: dict[tuple, tuple[ActiveKernel, ...]] = {}
_imported: dict[str, Any] = {}  # "module:function" -> the function, or the exception its import raised
_warned: set[tuple[str, str, str]] = set()
_counts: dict[str, dict[str, int]] = {}
_setting_reader: Callable[[], Any] | None = None


def use_setting(reader: Callable[[], Any]) -> None:
    """Read the scoped ``plugin_kernels`` setting with ``reader`` from now on
    (installed by the device's configuration the first time a scope sets
    it; until then every scope has the default, True)."""
    global _setting_reader
    _setting_reader = reader


def current_setting() -> Any:
    """The scoped ``plugin_kernels`` setting in force in this thread, as
    ``(mode, dropped op names)`` (``("on", ())`` when no scope ever set one)."""
    return ("on", ()) if _setting_reader is None else _setting_reader()


def resolve(declared: Any, setting: Any) -> tuple[ActiveKernel, ...]:
    """The kernels of ``declared`` (a ``KernelDeclarations``) that run under
    ``setting`` (the scoped setting, parsed as ``(mode, dropped)``),
    imported; a kernel whose import fails is left out with a warning (an
    error in strict mode).  Cached: a context is made per configuration."""
    key = (declared, setting)
    found = _resolved.get(key)
    if found is not None:
        return found
    with _lock:
        found = _resolved.get(key)
        if found is not None:
            return found
        env_mode, env_dropped = declared.mode, set(declared.dropped)
        scope_mode, scope_dropped = setting
        if "off" in (env_mode, scope_mode):
            found = ()
        else:
            mode = "strict" if "strict" in (env_mode, scope_mode) else "on"
            found = tuple(k for k in (_activate(declared.plugin, op, kernel, mode)
                                      for op, kernel in declared.kernels
                                      if op not in env_dropped and op not in scope_dropped) if k is not None)
        _resolved[key] = found
        return found


def _activate(plugin: str, op: str, kernel: Any, mode: str) -> ActiveKernel | None:
    try:
        fn = _load(kernel.fn)
        when = None if kernel.when is None else _load(kernel.when)
    except Exception as err:
        _fail(KernelError(plugin, op, kernel.fn, f"cannot be loaded ({type(err).__name__}: {err})"), mode, err)
        return None
    return ActiveKernel(plugin, op, kernel.fn, kernel.dtypes, kernel.ranks, kernel.when, mode, fn, when)


def _load(spec: str) -> Any:
    """The object ``"module:attribute"`` names (its import raised once, raised again)."""
    found = _imported.get(spec)
    if found is None:
        module_name, _, attribute = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                obj = getattr(obj, part)
            if not callable(obj):
                raise TypeError(f"{spec} is {type(obj).__name__}, not a function")
            found = obj
        except Exception as err:
            found = err
        _imported[spec] = found
    if isinstance(found, BaseException):
        raise found
    return found


def matching(kernels: Sequence[ActiveKernel], names: Sequence[str], args: Sequence[Any],
             kwargs: Mapping[str, Any]) -> ActiveKernel | None:
    """The first of ``kernels`` declared for one of ``names`` (the
    lowering's registered names) whose condition holds for this call.  A
    predicate that raises counts as the kernel's failure: it is warned about
    (raised in strict mode) and the kernel does not apply."""
    for kernel in kernels:
        if kernel.op not in names:
            continue
        first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")), None)
        if kernel.dtypes and (first is None or jax.numpy.dtype(first.dtype).name not in kernel.dtypes):
            continue
        if kernel.ranks and (first is None or first.ndim not in kernel.ranks):
            continue
        if kernel.when is not None:
            try:
                if not kernel.when(*args, **kwargs):
                    continue
            except Exception as err:
                _fail(KernelError(kernel.plugin, kernel.op, kernel.spec,
                                  f"has a condition {kernel.when_spec} that raised {type(err).__name__}: {err}"),
                      kernel.mode, err)
                continue
        return kernel
    return None


def run(kernel: ActiveKernel, args: Sequence[Any], kwargs: Mapping[str, Any], reference: Callable[[], Any]) -> Any:
    """``kernel`` on the call's arguments, checked against ``reference`` (the
    reference lowering's call, as the caller would return it): the same
    structure, shapes and dtypes, else the reference runs (after a warning,
    or a :class:`KernelError` in strict mode)."""
    expected = jax.eval_shape(reference)
    try:
        value = kernel.fn(*args, **kwargs)
    except Exception as err:
        return _fallback(kernel, f"raised {type(err).__name__} while traced: {err}", err, reference)
    problem = _difference(value, expected)
    if problem is not None:
        return _fallback(kernel, f"returned {problem}", None, reference)
    _count(kernel, "traced")
    return value


def _difference(value: Any, expected: Any) -> str | None:
    got_leaves = jax.tree.leaves(value)
    want_leaves = jax.tree.leaves(expected)
    if len(got_leaves) != len(want_leaves):
        return f"{len(got_leaves)} arrays where the reference lowering returns {len(want_leaves)}"
    for i, (got, want) in enumerate(zip(got_leaves, want_leaves)):
        shape, dtype = getattr(got, "shape", None), getattr(got, "dtype", None)
        where = "" if len(want_leaves) == 1 else f"result {i}: "
        if shape is None or dtype is None:
            return f"{where}{type(got).__name__}, not an array (expected shape {tuple(want.shape)}, {want.dtype})"
        if tuple(shape) != tuple(want.shape) or jax.numpy.dtype(dtype) != jax.numpy.dtype(want.dtype):
            return (f"{where}shape {tuple(shape)}, {jax.numpy.dtype(dtype)} where the reference lowering gives "
                    f"shape {tuple(want.shape)}, {jax.numpy.dtype(want.dtype)}")
    return None


def _fallback(kernel: ActiveKernel, cause: str, err: BaseException | None, reference: Callable[[], Any]) -> Any:
    _fail(KernelError(kernel.plugin, kernel.op, kernel.spec, cause), kernel.mode, err)
    _count(kernel, "fallbacks")
    return reference()


def _fail(error: KernelError, mode: str, cause: BaseException | None) -> None:
    if mode == "strict":
        raise error from cause
    key = (error.plugin, error.op, error.kernel)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"{error}; the reference lowering runs instead (PJRT_HOST_PLUGIN_KERNELS=strict or "
                      "pjrt_host.config(plugin_kernels='strict') makes this an error; "
                      f"PJRT_HOST_PLUGIN_KERNELS=-{error.op} drops the kernel)", RuntimeWarning, stacklevel=2)


def _count(kernel: ActiveKernel, what: str) -> None:
    with _lock:
        entry = _counts.setdefault(f"{kernel.op} {kernel.spec}", {"traced": 0, "fallbacks": 0})
        entry[what] += 1


def stats() -> dict[str, dict[str, int]]:
    """Per kernel (``"aten::_softmax pkg.module:function"``): ``traced``, the
    times it was traced in place of the host's lowering (once per program
    that runs it -- an eager op's, a fused segment's, a graph's -- plus the
    trial traces fused eager makes as it records an op), and ``fallbacks``,
    the times it failed and the host's lowering was traced instead."""
    with _lock:
        return {name: dict(entry) for name, entry in _counts.items()}
