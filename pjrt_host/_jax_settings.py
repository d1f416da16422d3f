"""Every jax setting pjrt_host changes, in one place.

jax's configuration is global to the process, so a user's own jax code sees
these too; each function says why the host needs its setting.  The runtime
(which creates the client) and the multi-process set-up (which runs before
it) call them; nothing else touches ``jax.config``.  64-bit types are the
exception that is *not* global: :func:`x64_scope` turns them on, per thread,
only while pjrt_host's own code runs (docs/torch-device.md, "jax's 64-bit
types").
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["disable_preemption_service", "enable_x64", "persistent_cache_dir", "use_persistent_cache", "use_platforms", "x64_api", "x64_if_loaded", "x64_mode", "x64_scope"]

_lock = threading.Lock()
_x64 = False


def x64_mode() -> str:
    """``PJRT_HOST_JAX_X64``: ``scoped`` (default) or ``process`` (:func:`pjrt_host._env.jax_x64_mode`)."""
    from . import _env

    return _env.jax_x64_mode()


def enable_x64() -> None:
    """torch keeps int64 and float64 as they are, so the torch device needs
    jax to.  By default only pjrt_host's own calls into jax run with 64-bit
    types (:func:`x64_scope`), so the user's own jax code in the same process
    keeps jax's defaults (``jnp.arange(3)`` stays int32); with
    ``PJRT_HOST_JAX_X64=process`` ``jax_enable_x64`` is switched on for the
    whole process instead (set before its first array)."""
    global _x64
    if not _x64:
        with _lock:
            if not _x64:
                if x64_mode() == "process":
                    import jax

                    jax.config.update("jax_enable_x64", True)
                _x64 = True


def x64_scope(fn: F) -> F:
    """``fn`` with jax's 64-bit types on while it runs: every entry point
    from torch or the user into pjrt_host code that calls jax wears it (the
    torch dispatcher's handler, factories, the compiled-graph backend and
    runtime, autograd Functions' backward, interop, spmd, collectives).
    Costs one flag read when already inside (nested calls), about 0.1 us
    when not.  jax is imported at the first call, not here."""

    @functools.wraps(fn)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        state = _state() if _x64_state is None else _x64_state
        if state.value:
            return fn(*args, **kwargs)
        if _swap is None:
            with state(True):
                return fn(*args, **kwargs)
        prev = _swap(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _restore(prev)

    return scoped  # type: ignore[return-value]


def x64_if_loaded(fn: F) -> F:
    """:func:`x64_scope` for entry points that reach jax only with 'jax'
    tensors (the torch.distributed backend's methods), which cannot exist
    before jax is imported: a CPU-only program passes straight through and
    never imports jax."""
    import sys

    scoped_fn = x64_scope(fn)

    @functools.wraps(fn)
    def maybe(*args: Any, **kwargs: Any) -> Any:
        if "jax" not in sys.modules:
            return fn(*args, **kwargs)
        return scoped_fn(*args, **kwargs)

    return maybe  # type: ignore[return-value]


_x64_state: Any = None
_swap: Any = None
_restore: Any = None


def _state() -> Any:
    """jax's ``enable_x64`` state, and (when this jax has them, and no hook
    runs on a thread-local change) its ``swap_local`` / ``set_local``: what
    its context manager does, at a quarter of the cost (0.1 us against 0.4
    per op); tests/test_torch_autoload.py pins that the fast form is used."""
    global _x64_state, _swap, _restore
    if _x64_state is None:
        import jax

        state = jax.enable_x64
        swap, restore = getattr(state, "swap_local", None), getattr(state, "set_local", None)
        if swap is not None and restore is not None and getattr(state, "_update_thread_local_hook", 1) is None:
            _swap, _restore = swap, restore
        _x64_state = state
    return _x64_state


def fast_x64_scope() -> bool:
    """Whether :func:`x64_scope` uses jax's state directly (for the test that pins it)."""
    _state()
    return _swap is not None


def x64_api(fn: F) -> F:
    """:func:`x64_scope` for pjrt_host's Python API (interop, spmd): the same,
    except that while dynamo traces (the call becomes part of a compiled
    graph, which runs in scope) it is a plain call dynamo can inline."""
    import torch

    compiling = torch.compiler.is_compiling
    scoped_fn = x64_scope(fn)

    @functools.wraps(fn)
    def api(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return fn(*args, **kwargs)
        return scoped_fn(*args, **kwargs)

    return api  # type: ignore[return-value]


def use_platforms(platforms: str) -> None:
    """``jax_platforms``: jax's backends are the selected plugin's (and the
    CPU), set before they exist."""
    import jax

    jax.config.update("jax_platforms", platforms)


def disable_preemption_service() -> None:
    """jax's preemption notifier catches SIGTERM (a preemption notice to
    checkpoint on); a launcher stopping the job sends SIGTERM and means it."""
    import jax

    jax.config.update("jax_enable_preemption_service", False)


def persistent_cache_dir() -> str | None:
    """The directory of jax's persistent compilation cache, if set."""
    import jax

    return jax.config.jax_compilation_cache_dir


def use_persistent_cache(directory: str, store: Any) -> bool:
    """jax's persistent compilation cache over ``store`` (a
    ``CacheInterface`` in ``directory``), for every program: an eager op or
    segment compiles in 10-100 ms, under jax's default threshold of 1 s (so
    none would be written), yet a training step compiles hundreds of them.
    jax's own store either writes entries in place (a process reading at
    that moment could load half of one) or, with a size bound, scans the
    whole directory on every write; ``store`` writes atomically and evicts
    rarely.  jax makes its store itself from ``jax_compilation_cache_dir``;
    setting ours in its place is a private step, pinned by
    tests/test_program_cache.py.  A cache directory the user gave jax is left as it is: False."""
    import jax
    from jax._src import compilation_cache

    if jax.config.jax_compilation_cache_dir is not None:
        return False
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    with compilation_cache._cache_initialized_mutex:
        if compilation_cache._cache is not None:  # made by jax already: not ours to replace
            return False
        compilation_cache._cache = store
        compilation_cache._cache_initialized = True
    jax.config.update("jax_compilation_cache_dir", directory)
    return True
