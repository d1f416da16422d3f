"""Configuration of the 'jax' device as a stack of scopes.

``pjrt_host.config(...)`` is a context manager: inside it the given values
win, and leaving the scope restores what was there before (scopes nest, each
thread has its own stack).  Reading a value walks the stack from the top
down to the defaults below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Config", "config", "current", "DEFAULTS"]


@dataclasses.dataclass(frozen=True, eq=False)
class Config:
    """The device's settings.  Every field has the default that matches torch
    CPU results most closely."""

    #: Precision of float32 matmuls and convolutions: "highest" (full float32,
    #: the default, as torch CPU computes), "high" or "default" (faster,
    #: bfloat16-based passes where the device has them).
    matmul_precision: str = "highest"
    #: Run an op that has no lowering and no decomposition on torch CPU
    #: (moving its inputs and outputs) with a one-time warning, instead of
    #: raising NotImplementedError.  Off by default: a silent round trip
    #: hides missing lowerings and costs two transfers per call.
    cpu_fallback: bool = False
    #: Compile each op (jax.jit, cached per op and static arguments).  Off
    #: runs the lowerings op by op in jax eager mode, for debugging.
    jit: bool = True
    #: The checks torch CPU makes on values only the device holds, as torch
    #: CPU raises them: out-of-range indices of indexing, gather/scatter,
    #: index_* and embedding ops (IndexError / RuntimeError instead of the
    #: clipped / wrapped values of an XLA gather) and bad values (invalid
    #: probabilities, class indices, ``_assert_async``).  True: found on the
    #: device, raised at the next synchronisation point (.item(), .cpu(),
    #: print, torch.jax.synchronize()), never stalling the queue; "sync":
    #: raised at the op (waits for the device per checked op); False:
    #: unchecked.  ``config(check_indices=...)``, its first name (it always
    #: switched the value checks too), is accepted as an alias.
    checks: bool | str = True
    #: How eager ops run: "fused" records them and runs each segment of ops
    #: as one program when a value is needed (``_fused``); "op" compiles and
    #: runs each op as it comes; "sync" runs op by op and makes every op a
    #: synchronisation point (debugging, as CUDA_LAUNCH_BLOCKING=1): the op's
    #: work is waited for, and its index and value checks raise at the op
    #: (checks=True acts as "sync"; False still turns them off).
    #: Default: ``PJRT_HOST_EAGER``, else "fused".
    eager: str = dataclasses.field(default_factory=lambda: _eager_default())
    #: The selected plugin's vendor kernels (``DevicePlugin.kernels``) run
    #: instead of the host's lowerings of their ops: True (the default, as
    #: ``PJRT_HOST_PLUGIN_KERNELS`` allows), False (none: the reference
    #: lowerings), "strict" (a kernel that fails is an error instead of a
    #: warning and the reference lowering), or "-aten::OP" entries,
    #: comma-separated, dropping those kernels (with "strict" or alone).
    #: Narrows ``PJRT_HOST_PLUGIN_KERNELS``, never widens it.
    plugin_kernels: bool | str = True
    #: Dynamic dimensions (docs/dynamic-shapes.md): True, a dimension that
    #: takes a third size at the same place becomes dynamic: its storage
    #: is padded to a bucket and the ops that know padding compile once per
    #: bucket, not once per size; False, every shape compiles its own
    #: programs; "all", every dimension is dynamic, padded to odd buckets (a
    #: test mode).  Every eager mode (fused eager records padded ops).
    #: Default: ``PJRT_HOST_DYNAMIC_SHAPES``, else True.
    dynamic_shapes: bool | str = dataclasses.field(default_factory=lambda: _dynamic_default())

    @property
    def check_mode(self) -> bool | str:
        """The index / value check mode in force: ``checks``, made "sync"
        (at the op) by ``eager="sync"``.  Every reader of the checks asks
        this, so the debugging mode reaches eager ops, compiled graphs and
        ``assume_pure`` alike."""
        if self.eager == "sync" and self.checks is True:
            return "sync"
        return self.checks

    @property
    def check_indices(self) -> bool | str:
        """``checks`` under its first name (kept for code that reads it)."""
        return self.checks


def _eager_default() -> str:
    from .._env import eager_mode

    return eager_mode()


def _dynamic_default() -> bool | str:
    from .._env import dynamic_shapes

    return dynamic_shapes()


def _plugin_kernel_setting(value: Any) -> tuple[str, tuple[str, ...]]:
    """``plugin_kernels`` as the lowerings read it: (mode, dropped op names,
    sorted so that its ``repr`` keys programs on disk)."""
    from .._env import parse_plugin_kernels

    try:
        mode, dropped = parse_plugin_kernels(value, "pjrt_host.config: plugin_kernels")
    except ValueError as err:
        raise ValueError(str(err)) from None
    return mode, tuple(sorted(dropped))


def _lowerings_read_plugin_kernels() -> None:
    """Let the lowerings read this thread's ``plugin_kernels`` (once a scope
    sets it; before, every scope has the default and nothing need be read).
    The lowering table imports nothing of the device, so the device hands
    it the reader."""
    global _reader_installed
    if not _reader_installed:
        from .._lowerings import _kernels

        _kernels.use_setting(lambda: _plugin_kernel_setting(current().plugin_kernels))
        _reader_installed = True


_reader_installed = False

_VALID = {"matmul_precision": ("highest", "high", "default"), "checks": (True, False, "sync"),
          "eager": ("op", "fused", "sync"), "dynamic_shapes": (True, False, "all")}

#: Settings' earlier names -> their names now (``config`` accepts both).
ALIASES = {"check_indices": "checks"}

DEFAULTS = Config()

# Equal settings are one object, so compiled ops keyed on the settings hash
# them by identity (cheap on every op) yet hit the same cache entry in every
# scope that sets the same values.
_interned: dict[tuple, Config] = {dataclasses.astuple(DEFAULTS): DEFAULTS}


#: Whether any thread may be in ``eager="sync"``: the dispatcher asks only
#: then which mode the thread is in, so the other modes pay nothing for it.
sync_used = DEFAULTS.eager == "sync"


def _intern(cfg: Config) -> Config:
    global sync_used
    if cfg.eager == "sync":
        sync_used = True
    return _interned.setdefault(dataclasses.astuple(cfg), cfg)

_local = threading.local()


def _stack() -> list[Config]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = [DEFAULTS]
    return stack


#: Settings lent by a thread running a backward to threads that set none
#: (autograd's engine threads); see :func:`lent_to_other_threads`.
_lent: Config | None = None


def current() -> Config:
    """The settings in force in this thread."""
    stack = _stack()
    if _lent is not None and len(stack) == 1:
        return _lent
    return stack[-1]


@contextlib.contextmanager
def lent_to_other_threads() -> Iterator[None]:
    """While this thread runs autograd's engine, its settings apply in the
    engine's threads (which have set none), so ``with pjrt_host.config(...):
    loss.backward()`` means what it says."""
    global _lent
    mine = _stack()[-1]
    previous, _lent = _lent, (mine if mine is not DEFAULTS else None)
    try:
        yield
    finally:
        _lent = previous


@contextlib.contextmanager
def config(**changes: Any) -> Iterator[Config]:
    """Change settings for the duration of a ``with`` block::

        with pjrt_host.config(matmul_precision="high"):
            y = model(x)

    Unknown names and values raise ValueError listing the valid ones;
    ``check_indices`` is ``checks`` under its first name."""
    fields = {f.name for f in dataclasses.fields(Config)}
    for name, value in changes.items():
        if ALIASES.get(name, name) not in fields:
            raise ValueError(f"pjrt_host.config: unknown setting {name!r}; settings are: {', '.join(sorted(fields))}")
        valid = _VALID.get(ALIASES.get(name, name))
        if valid is not None and value not in valid:
            raise ValueError(f"pjrt_host.config: {name}={value!r} is not one of {', '.join(map(repr, valid))}")
    if "plugin_kernels" in changes:
        _plugin_kernel_setting(changes["plugin_kernels"])  # a bad value raises here, not at the first op
        _lowerings_read_plugin_kernels()
    for old, new in ALIASES.items():
        if old in changes:
            if new in changes:
                raise ValueError(f"pjrt_host.config: {old}= is {new}= under its first name; give one of them")
            changes = {**changes, new: changes[old]}
            del changes[old]
    stack = _stack()
    new = _intern(dataclasses.replace(stack[-1], **changes))
    stack.append(new)
    try:
        yield new
    finally:
        stack.pop()
