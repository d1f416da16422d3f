"""Every process-wide jax setting pjrt_host changes, in one place.

jax's configuration is global to the process, so a user's own jax code sees
these too; each function says why the host needs its setting.  The runtime
(which creates the client) and the multi-process set-up (which runs before
it) call them; nothing else touches ``jax.config``.
"""

from __future__ import annotations

import threading

__all__ = ["disable_preemption_service", "enable_x64", "use_platforms"]

_lock = threading.Lock()
_x64 = False


def enable_x64() -> None:
    """``jax_enable_x64``: torch keeps int64 and float64 as they are, so the
    torch device needs jax to (set before its first array)."""
    global _x64
    if not _x64:
        with _lock:
            if not _x64:
                import jax

                jax.config.update("jax_enable_x64", True)
                _x64 = True


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
