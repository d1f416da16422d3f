"""What is queued on the devices, and waiting for it: the latest result of
each device, the checks whose verdicts are read at the next
synchronisation point, and fused eager's open segments.

:func:`synchronize` is ``torch.jax.synchronize()``: it runs the open
segments, waits for the device's queue and raises what the deferred checks
found.  Nothing here knows tensors: callers note arrays.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable

import jax
import numpy as np

from .. import _program_cache
from ._devices import jax_device

__all__ = ["defer_check", "flush_segments", "forget_results", "last_result", "note_result", "open_segments",
           "run_deferred_checks", "synchronize", "wait_queued", "withdraw_checks"]


#: Segments fused eager has open, in any thread: synchronisation runs them.
open_segments: weakref.WeakSet = weakref.WeakSet()


def flush_segments() -> None:
    """Run every open fused-eager segment (all threads)."""
    for seg in list(open_segments):
        seg.flush()



# device index -> weak reference to the last array produced there.  Weak: a
# tensor's memory is released when its last reference goes (``del x``), as
# on cuda; a result nobody holds any more is nothing to wait for.
_last: dict[int, Any] = {}
_weak = weakref.ref


def note_result(index: int, array: Any) -> None:
    """Record ``array`` as the latest result on device ``index``, for
    :func:`synchronize` (a device runs its computations in order)."""
    _last[index] = _weak(array)


def last_note(index: int) -> Any:
    """A token of the latest :func:`note_result` on device ``index``: the
    same object until another result is noted there."""
    return _last.get(index)


def last_result(index: int) -> Any:
    """The last array produced on device ``index`` that is still alive
    (None: none, or nobody holds it any more)."""
    ref = _last.get(index)
    return None if ref is None else ref()


# Checks whose verdict is computed on the device and read at the next
# synchronisation point (index checks: see _index_checks), so they do not
# stall the queue.  Each is a callable that raises if its check failed.
_deferred: list[Callable[[bool], bool]] = []
_DEFERRED_LIMIT = 64


def defer_check(check: Callable[[bool], bool]) -> None:
    """Queue ``check(wait)``: it returns False while its values are not
    ready (only with ``wait`` False) and raises if they show an error."""
    _deferred.append(check)
    if len(_deferred) > _DEFERRED_LIMIT:
        run_deferred_checks(wait=False)


def withdraw_checks(queued: list) -> None:
    """Drop the deferred checks in ``queued`` (those of an op that raised
    its own error: theirs would surface again at the next synchronisation)."""
    for check in queued:
        try:
            _deferred.remove(check)
        except ValueError:  # already run
            pass


def run_deferred_checks(wait: bool = True) -> None:
    """Run queued checks (all of them, waiting, with ``wait``; else those
    whose values are ready).  The first failure raises; the rest are dropped
    (as torch drops work queued after a device-side assert)."""
    if not _deferred:
        return
    pending = list(_deferred)
    _deferred.clear()
    for i, check in enumerate(pending):
        if not check(wait):
            _deferred.extend(pending[i:])
            return


def forget_results(index: int | None = None) -> None:
    """Drop the last result kept for :func:`synchronize` (all devices with
    None), so no array stays alive only because of it."""
    for i in list(_last):
        if index is None or i == index:
            _last.pop(i, None)


_barrier_program: Any = None


def _barrier(index: int) -> Any:
    """A tiny computation on device ``index``: queued behind everything
    already queued there, so waiting for it waits for them.  Its operand is
    made for the call and dropped with it: nothing of the host's stays on
    the device, so ``torch.jax.memory_allocated()`` counts the user's
    tensors only."""
    global _barrier_program
    if _barrier_program is None:
        _barrier_program = _program_cache.Kept("pjrt_host.barrier", lambda x: x + 1)
    return _barrier_program(jax.device_put(np.zeros((), np.int32), jax_device(index)))


def names_failed_collectives(fn: Callable) -> Callable:
    """``fn`` (a place where a device value is read: a copy to the host,
    ``item()``, ``synchronize()``) with a failure that came from a
    collective of the 'pjrt' process group -- one issued asynchronously
    (DDP's buckets, FSDP2's), whose result only shows it where it is read
    -- raised as that group's named error (the collective, the ranks that
    did not answer), jax's error as its cause.  Other failures, and any
    program that never ran a collective, are untouched; nothing is added to
    the path that does not fail."""

    @functools.wraps(fn)
    def reading(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            mesh = sys.modules.get("pjrt_host._torch._c10d._mesh")
            named = mesh.named_failure(err) if mesh is not None else None
            if named is None:
                raise
            raise named from err

    return reading


@names_failed_collectives
def _wait(arr: Any) -> None:
    arr.block_until_ready()


def synchronize(index: int | None = None) -> None:
    """Block until the computations queued so far on the device (all devices
    with None) have finished, as torch.cuda.synchronize: also those whose
    results were already dropped (a timing loop that discards its outputs).
    A failed collective raises here, named, unless its process group has
    raised a failure already: the job is known broken, and a survivor that
    caught it and saves its state (DCP's writer synchronizes) must not get
    it again.  Reading a value computed from the failure still raises."""
    if open_segments:
        flush_segments()
    for i, ref in list(_last.items()):
        if index is None or i == index:
            arr = ref()
            # the latest result is gone (or was given to a later program that
            # failed, donated): its computation maybe not
            if arr is None or arr.is_deleted():
                arr = _barrier(i)
            try:
                _wait(arr)
            except Exception as err:
                mesh = sys.modules.get("pjrt_host._torch._c10d._mesh")
                if mesh is None or not mesh.known_failure(err):
                    raise
                _last.pop(i, None)
                _barrier(i).block_until_ready()
    run_deferred_checks()


def wait_queued() -> None:
    """Wait for every device's latest result still held (and so for all
    work queued before it), then raise what the deferred checks found."""
    for ref in list(_last.values()):
        arr = ref()
        if arr is not None and not arr.is_deleted():  # a donated array's program was waited for by its reader
            arr.block_until_ready()
    run_deferred_checks()
