"""Waiting for a collective's result, bounded by its process group's
timeout.

jax runs a collective asynchronously: a failure (a rank that died, a
transport that broke) shows only in its result array, and a rank that never
joins leaves the array unready for as long as the transport waits.  A
``Work.wait()`` of the 'pjrt' group waits here: a result that is already
ready is checked in the caller; one that is not is waited for on one daemon
thread while the caller waits at most the group's timeout, so a wait that
would never end returns a ``TimeoutError`` instead.  (A wait that timed out
leaves that thread blocked, and later waits behind it time out too: the
group is broken then, as a torch.distributed group is after a collective's
timeout.)
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any

__all__ = ["wait_ready"]

_jobs: "queue.SimpleQueue[tuple[Any, threading.Event, list]]" = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def wait_ready(array: Any, timeout: datetime.timedelta | None) -> BaseException | None:
    """Wait until ``array`` is computed; its failure, a ``TimeoutError``
    after ``timeout``, or None."""
    if timeout is None or array.is_ready():
        try:
            array.block_until_ready()
        except Exception as err:
            return err
        return None
    done, box = threading.Event(), []
    _jobs.put((array, done, box))
    _start()
    if not done.wait(timeout.total_seconds()):
        return TimeoutError(f"the collective's result was not ready after {timeout}")
    return box[0] if box else None


def _start() -> None:
    global _thread
    if _thread is None:
        with _lock:
            if _thread is None:
                _thread = threading.Thread(target=_serve, name="pjrt_host c10d wait", daemon=True)
                _thread.start()


def _serve() -> None:
    while True:
        array, done, box = _jobs.get()
        try:
            array.block_until_ready()
        except Exception as err:
            box.append(err)
        del array  # hold no reference to a result while idle (donation counts references)
        done.set()
