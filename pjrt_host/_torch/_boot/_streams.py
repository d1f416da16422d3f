"""``torch.jax.Stream`` and ``torch.jax.Event``: one ordered queue per device.

PJRT gives a device one queue of work, in the order it was issued; so a
'jax' device has one stream (id 0), and every stream operation is about
that queue: ``synchronize`` waits for everything issued so far, ``query``
tells whether it has finished, ``wait_event`` / ``wait_stream`` are already
true (work is never reordered), and an event marks the point of the queue
where it was recorded.

Both are subclasses of torch's own ``torch.Stream`` / ``torch.Event``, so
code that checks ``isinstance(s, torch.Stream)`` or passes them to
``torch.accelerator`` takes them.  torch's base classes themselves, built
for 'jax' (``torch.Event('jax')``), ask the device through C++ hooks a
Python backend cannot fill: use these (``torch.jax.Event``, or
``torch.accelerator.current_stream()``, which returns one).

An event's time is when its point of the queue finished: at ``record``
when the device was idle, else when a watcher thread (one for the process,
started by the first event recorded on a busy device) saw the work before it
complete, in record order -- so ``elapsed_time`` measures the device's work
between two events, not when the host got round to asking.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch

from .. import _devices
from .._devices import DEVICE_NAME

__all__ = ["Event", "Stream", "current_stream", "set_stream", "stream"]


def _pending(index: int) -> Any:
    """The device's last queued result still alive (None: nothing to wait for)."""
    from .. import _sync  # imports jax: only once the device is in use

    return _sync.last_result(index)


def _is_ready(array: Any) -> bool:
    return array is None or array.is_deleted() or array.is_ready()


_watch: "queue.Queue[tuple[Any, Any]] | None" = None
_watch_lock = threading.Lock()


def _watcher(q: "queue.Queue[tuple[Any, Any]]") -> None:
    while True:
        array, done = q.get()
        try:
            if not array.is_deleted():
                array.block_until_ready()
        except Exception:  # the work failed: its error surfaces where the result is read
            pass
        done.finish(time.perf_counter())
        del array, done
        q.task_done()


def _watching() -> bool:
    """Whether the watcher has points it has not stamped yet: a later point
    must wait its turn, or it would finish (and be stamped) before them."""
    return _watch is not None and _watch.unfinished_tasks > 0


def _watch_until_done(array: Any, done: "_Done") -> None:
    global _watch
    with _watch_lock:
        if _watch is None:
            _watch = queue.Queue()
            threading.Thread(target=_watcher, args=(_watch,), name="pjrt_host-events", daemon=True).start()
    _watch.put((array, done))


class _Done:
    """When one recorded point of the queue finished (set by the watcher)."""

    __slots__ = ("time", "flag")

    def __init__(self) -> None:
        self.time: float | None = None
        self.flag = threading.Event()

    def finish(self, at: float) -> None:
        self.time = at
        self.flag.set()


class Stream(torch.Stream):
    """The queue of a 'jax' device (``torch.jax.Stream(device=None,
    priority=0)``).  Every Stream of a device is the same queue."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        index = _devices.current_index() if device is None else _devices.device_index(device)
        return super().__new__(cls, device=torch.device(DEVICE_NAME, index), priority=priority)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        """Wait for all work issued to the device so far."""
        from ... import _runtime

        if _runtime.is_initialized():  # else nothing was ever issued
            from .. import _sync

            _sync.synchronize(self.device_index)

    def query(self) -> bool:
        """Whether all work issued to the device so far has finished."""
        return _is_ready(_pending(self.device_index))

    def wait_event(self, event: "torch.Event") -> None:
        """Work issued after this runs after ``event``'s point: always true
        on one ordered queue."""
        _check_event(event)

    def wait_stream(self, stream: "torch.Stream") -> None:
        if stream.device.type != DEVICE_NAME:
            raise RuntimeError(f"pjrt_host: a '{DEVICE_NAME}' stream cannot wait for a {stream.device} stream")

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event(self.device) if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.Stream) and other.device == self.device and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash((str(self.device), self.stream_id))

    def __enter__(self) -> "Stream":
        self._previous = _devices.current_index()
        _devices.set_current_index(self.device_index)
        return self

    def __exit__(self, *exc: object) -> None:
        _devices.set_current_index(self._previous)

    def __repr__(self) -> str:
        return f"torch.jax.Stream(device={self.device}, stream_id={self.stream_id})"


def _check_event(event: Any) -> None:
    if not isinstance(event, torch.Event):
        raise TypeError(f"pjrt_host: expected a torch.Event, got {type(event).__name__}")


class Event(torch.Event):
    """A point in a 'jax' device's queue (``torch.jax.Event(device=None, *,
    enable_timing=False, blocking=False, interprocess=False)``)."""

    def __new__(cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> "Event":
        if interprocess:
            raise RuntimeError(f"pjrt_host: interprocess events are not supported on the '{DEVICE_NAME}' device")
        index = _devices.current_index() if device is None else _devices.device_index(device)
        self = super().__new__(cls, device=torch.device(DEVICE_NAME, index), enable_timing=enable_timing,
                               blocking=blocking)
        self._index = index
        self._timing = enable_timing
        self._done: _Done | None = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: "torch.Stream | None" = None) -> None:
        """Mark the current end of the device's queue (of ``stream``'s device)."""
        if stream is not None:
            if stream.device.type != DEVICE_NAME:
                raise RuntimeError(f"pjrt_host: a '{DEVICE_NAME}' event cannot be recorded on a {stream.device} "
                                   "stream")
            self._index = stream.device_index
        array = _pending(self._index)
        self._done = done = _Done()
        if _is_ready(array) and not _watching():
            done.finish(time.perf_counter())
        else:
            _watch_until_done(array, done)

    @property
    def device(self) -> torch.device:  # torch's says index -1 until recorded
        return torch.device(DEVICE_NAME, self._index)

    def query(self) -> bool:
        """Whether the work before the event has finished (True if never recorded)."""
        return self._done is None or self._done.flag.is_set()

    def synchronize(self) -> None:
        """Wait for the work before the event."""
        if self._done is not None:
            self._done.flag.wait()

    def wait(self, stream: "torch.Stream | None" = None) -> None:
        """Make ``stream``'s later work wait for the event: always true on one
        ordered queue."""

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds between this event and ``end_event`` (both recorded
        with ``enable_timing=True`` and finished, as torch requires)."""
        if not isinstance(end_event, Event):
            raise TypeError("pjrt_host: elapsed_time needs another torch.jax.Event")
        if not (self._timing and end_event._timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._done is None or end_event._done is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time "
                               "(call end_event.synchronize() first).")
        return (end_event._done.time - self._done.time) * 1000.0

    def __repr__(self) -> str:
        return f"torch.jax.Event(device={self.device}, recorded={self._done is not None})"


def current_stream(device: Any = None) -> Stream:
    """The queue of ``device`` (default: the current device)."""
    return Stream(device)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream``'s device current (its queue is the device's only one)."""
    if stream.device.type != DEVICE_NAME:
        raise RuntimeError(f"pjrt_host: expected a '{DEVICE_NAME}' stream, got one of {stream.device}")
    _devices.set_current_index(stream.device_index)


class stream:
    """``with torch.jax.stream(s):`` -- work inside goes to ``s``'s device
    (None: no change), as torch's stream context does."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous = 0

    def __enter__(self) -> torch.Stream | None:
        self.previous = _devices.current_index()
        if self.stream is not None:
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        _devices.set_current_index(self.previous)
