"""Compiled programs kept on disk, so that a script run a second time, or the
other processes of a job, start warm.

Eager ops, fused segments and compiled graphs all become XLA programs
through ``jax.jit``; jax's persistent compilation cache stores the
executables under a key of the unoptimised program, jaxlib's version, the
XLA flags and the devices (kind, count, topology).  This module chooses its
directory -- one per plugin and jaxlib version under a per-user root, made
private to the user -- turns it on for programs of any compile time, and
counts what happened (``torch.jax.program_cache_stats()``).  It runs once,
just before the plugin's client is created; nothing here imports jax at
module level.

Settings: ``PJRT_HOST_PROGRAM_CACHE=0`` (off), ``PJRT_HOST_CACHE_DIR``,
``PJRT_HOST_CACHE_MAX_BYTES`` (see :mod:`pjrt_host._env`).  A directory that
cannot be made, or that another user owns, leaves the cache off with a
warning: the device works the same, only colder.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from typing import Any

from . import _env, _jax_settings

__all__ = ["DiskStore", "configure", "directory", "stats"]

_lock = threading.Lock()
_directory: str | None = None
_counts = {"programs": 0, "disk_hits": 0, "disk_writes": 0}
_seconds = {"compile_seconds": 0.0}
_listening = False

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # jax records it as it writes an entry


def directory() -> str | None:
    """The directory this process reads and writes programs in; None when
    the cache is off."""
    return _directory


def configure(plugin_name: str) -> str | None:
    """Turn the cache on for the selected plugin (before its client
    exists), and start counting compilations.  Returns the directory, or
    None when the cache stays off."""
    global _directory
    _listen()
    if not _env.program_cache_enabled():
        return None
    import jaxlib

    if _jax_settings.persistent_cache_dir() is not None:
        return None  # the user gave jax a cache directory of their own: it is used as they set it
    root = _env.program_cache_dir()
    path = os.path.join(root, _safe(plugin_name), f"jaxlib-{jaxlib.__version__}")
    problem = _private_directory(path)
    if problem is not None:
        warnings.warn(f"pjrt_host: compiled programs are not kept on disk: {problem}. Set PJRT_HOST_CACHE_DIR to "
                      "a directory of your own, or PJRT_HOST_PROGRAM_CACHE=0 to silence this.", RuntimeWarning,
                      stacklevel=3)
        return None
    if not _jax_settings.use_persistent_cache(path, _store(path, _env.program_cache_max_bytes())):
        return None  # the user gave jax a cache directory of their own: it is used as they set it
    _directory = path
    return path


def stats() -> dict[str, Any]:
    """What this process compiled: ``programs`` (XLA executables made,
    loaded from disk included), ``compiled`` (of those, compiled here),
    ``disk_hits``, ``disk_writes``, ``compile_seconds`` (time spent in XLA
    compiling or loading) and the cache ``directory`` (None when off)."""
    with _lock:
        counts = dict(_counts)
        seconds = _seconds["compile_seconds"]
    return {**counts, "compiled": counts["programs"] - counts["disk_hits"], "compile_seconds": round(seconds, 6),
            "directory": _directory}


def _listen() -> None:
    global _listening
    if _listening:
        return
    import jax

    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _listening = True


def _on_event(event: str, **_: Any) -> None:
    if event == _HIT_EVENT:
        with _lock:
            _counts["disk_hits"] += 1
    elif event == _WRITE_EVENT:
        with _lock:
            _counts["disk_writes"] += 1


def _on_duration(event: str, duration: float, **_: Any) -> None:
    if event == _COMPILE_EVENT:
        with _lock:
            _counts["programs"] += 1
            _seconds["compile_seconds"] += duration


def _store(path: str, max_bytes: int) -> Any:
    """A ``DiskStore`` of jax's cache interface (its base class is jax's)."""
    from jax._src.compilation_cache_interface import CacheInterface

    global _Store
    if _Store is None:
        _Store = type("DiskStore", (DiskStore, CacheInterface), {})
    return _Store(path, max_bytes)


_Store: Any = None


class DiskStore:
    """Programs as files named by their key in one directory.

    Writes are atomic (a temporary file renamed into place), so a process
    reading while another writes sees a whole entry or none; a hit touches
    the file's modification time, which orders eviction.  The directory's
    size is read once per process and kept up to date from this process's
    own writes; past ``max_bytes`` the least recently used entries go until
    it is under 3/4 of it (another process's writes are seen at that scan).
    """

    _TMP = ".tmp-"

    def __init__(self, path: str, max_bytes: int) -> None:
        import pathlib

        self._path = pathlib.Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._size = self._scan()[1]

    def get(self, key: str) -> bytes | None:
        file = os.path.join(self._path, key)
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError:  # absent, or evicted by another process meanwhile
            return None
        try:
            os.utime(file)
        except OSError:
            pass
        return data

    def put(self, key: str, value: bytes) -> None:
        file = os.path.join(self._path, key)
        if os.path.exists(file):
            return
        tmp = os.path.join(self._path, f"{self._TMP}{os.getpid()}-{threading.get_ident()}-{key}")
        try:
            with open(tmp, "wb") as f:
                f.write(value)
            os.replace(tmp, file)
        except OSError as err:  # a full disk loses an entry, never the program
            try:
                os.unlink(tmp)
            except OSError:
                pass
            warnings.warn(f"pjrt_host: a compiled program could not be written to {self._path}: {err}",
                          RuntimeWarning, stacklevel=2)
            return
        with self._lock:
            self._size += len(value)
            over = self._size > self.max_bytes
        if over:
            self._evict()

    def _scan(self) -> tuple[list[tuple[float, int, str]], int]:
        entries = []
        total = 0
        try:
            names = os.listdir(self._path)
        except OSError:
            return [], 0
        for name in names:
            try:
                info = os.stat(os.path.join(self._path, name))
            except OSError:
                continue
            if name.startswith(self._TMP):
                continue
            entries.append((info.st_mtime, info.st_size, name))
            total += info.st_size
        return entries, total

    def _evict(self) -> None:
        with self._lock:
            entries, total = self._scan()
            entries.sort()
            target = self.max_bytes * 3 // 4
            for _, size, name in entries:
                if total <= target:
                    break
                try:
                    os.unlink(os.path.join(self._path, name))
                except OSError:
                    continue
                total -= size
            self._size = total


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "plugin"


def _private_directory(path: str) -> str | None:
    """Make ``path`` (mode 0700) if needed; the reason it cannot be used, or
    None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as err:
        return f"{path} cannot be made ({err.strerror or err})"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{path} belongs to another user"
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None
