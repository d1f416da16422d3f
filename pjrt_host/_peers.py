"""Ranks of the job that died, as the coordination service's process
(:mod:`pjrt_host._coordination_service`) reports them: a rank whose
connection to it closed without a goodbye.

A rank that hears of a death goes on -- jax's coordination service no
longer ends it -- so that it can save its state: its next collective with
the dead rank raises, naming it (``_torch/_c10d/_mesh``).  A program that
never notices would run on without its peers, so it is ended
``PJRT_HOST_DEAD_PEER_GRACE`` seconds after the first death it heard of
(default 300; 0: at once), with a message saying why.
"""

from __future__ import annotations

import os
import sys
import threading
import time

__all__ = ["dead_ranks", "describe", "report_dead"]

_lock = threading.Lock()
_dead: dict[int, float] = {}  # global rank -> time.monotonic() when heard of
_timer: threading.Timer | None = None


def dead_ranks() -> tuple[int, ...]:
    """The ranks of the job this process has heard died, in order."""
    return tuple(sorted(_dead))


def describe() -> str:
    """'' when no death was heard of; else which ranks, in words."""
    dead = dead_ranks()
    if not dead:
        return ""
    return f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} of the job died"


def report_dead(rank: int, me: int) -> None:
    """The coordination service's process saw ``rank`` die (``me``: this
    process's rank)."""
    global _timer
    from . import _env

    with _lock:
        if rank in _dead:
            return
        _dead[rank] = time.monotonic()
        first = _timer is None
        if first:
            grace = _env.dead_peer_grace()
            _timer = threading.Timer(grace, _end, args=(grace,))
            _timer.daemon = True
    print(f"pjrt_host: rank {me}: rank {rank} of the job died (its connection to the coordination service's "
          "process closed without a goodbye). This process goes on so that it can save its state; its next "
          "collective with that rank raises." + (f" It is ended in {_env.dead_peer_grace():g} s if it has not "
          "exited by then (PJRT_HOST_DEAD_PEER_GRACE)." if first else ""), file=sys.stderr, flush=True)
    if first:
        assert _timer is not None
        _timer.start()


def _end(grace: float) -> None:
    print(f"pjrt_host: {describe()} {grace:g} s ago and this process has not exited: ending it "
          "(PJRT_HOST_DEAD_PEER_GRACE).", file=sys.stderr, flush=True)
    os._exit(134)
