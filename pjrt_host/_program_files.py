"""The files of the program cache: a directory only this user can write,
entries written atomically and sealed, read back only whole and of the
store's own scope, the least recently used evicted past a size.

Nothing here knows what an entry holds (``_program_cache`` decides that):
an entry is bytes under a key.  The directory rule and the sealing are what
make a cache of executables safe to load: an entry is code every process
of this user runs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import warnings
import weakref

__all__ = ["DiskStore", "private_directory", "safe_name"]

logger = logging.getLogger("pjrt_host._program_cache")
_damaged = False  #: an entry on disk was damaged or foreign (warned once a process)


#: Stores whose size scan has not finished: a child forked meanwhile has
#: no scanning thread, so it starts its own (:func:`_after_fork_in_child`).
_unscanned: "weakref.WeakSet[DiskStore]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_unscanned):
        store._size = 0
        store._lock = threading.Lock()
        store._start_count()


os.register_at_fork(after_in_child=_after_fork_in_child)


class DiskStore:
    """Programs as files named by their key in one directory.

    Writes are atomic (a temporary file renamed into place), so a process
    reading while another writes sees a whole entry or none.  Each file is
    the entry behind a header: a magic line, a digest of the store's
    ``scope`` (the caller's: entry format, jaxlib version, plugin; and the
    machine) and a SHA-256 of the
    scope, the key and the entry.  A file without the magic, of another
    scope, or whose checksum does not match (truncated, corrupted, renamed
    from another key) is never returned: it is removed, and the program is
    compiled again and written anew.  A hit touches
    the file's modification time, which orders eviction.  The directory's
    size is read once per process, on a thread of its own, from the record
    the processes before kept of it (:attr:`_SIZE_FILE`; a stat of every
    entry once a day), and kept up to date from this process's own writes;
    past ``max_bytes`` the least recently used entries go until it is under
    3/4 of it (the writes of processes running meanwhile are seen at that
    scan).
    """

    _TMP = ".tmp-"
    _MAGIC = b"pjrt_host-entry-1\n"
    #: The directory of this entry format, under the plugin's and jaxlib's.
    LAYOUT = "entries-1"

    def __init__(self, path: str, max_bytes: int, scope: str = "") -> None:
        import hashlib
        import pathlib
        import platform
        import sys

        self._path = pathlib.Path(path)
        self._scope = f"{scope} {sys.platform} {platform.machine()}".encode()
        self._scope_digest = hashlib.sha256(self._scope).digest()[:16]
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        #: The directory's size: this process's writes, and what was there
        #: once the scan (:meth:`_count`) is done.
        self._size = 0
        self._scanned = threading.Event()
        self._start_count()

    def _start_count(self) -> None:
        """Read the directory's size on a thread of its own: a stat of each
        entry, which took 3.3 s at every process start for a directory of
        376,000 entries, never on the way to the first program."""
        _unscanned.add(self)
        threading.Thread(target=self._count, name="pjrt_host-program-cache-size", daemon=True).start()

    #: The file in the directory that keeps its size between processes: a
    #: line ``v1 <bytes> <time of the scan>``, then a line ``+<bytes>`` per
    #: entry written since (appended: processes that write at once add
    #: theirs without a lock).  A stat of every entry at every process start
    #: took 2.7 s of a CPU in a directory of 505,000 entries (1.7 GiB), and
    #: a GPT-2 training step beside it ran 1.8x slower for its first 6 s.
    _SIZE_FILE = ".size"
    #: How old the recorded scan may be before a process scans again (the
    #: record misses what evictions of other processes removed, and entries
    #: written by a process that could not append).
    RESCAN_S = 24 * 3600

    def _count(self) -> None:
        total = self._recorded_size()
        if total is None:
            total = self._scan()[1]
            self._record_size(total)
        with self._lock:
            # (an entry written while the scan listed the directory may be
            # counted twice: the next eviction's own scan sets it right)
            self._size += total
            over = self._size > self.max_bytes
            _unscanned.discard(self)
        if over:
            self._evict()
        self._scanned.set()

    def get(self, key: str) -> bytes | None:
        file = os.path.join(self._path, key)
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError:  # absent, or evicted by another process meanwhile
            return None
        data = self._open(key, data)
        if data is None:
            return None
        try:
            os.utime(file)
        except OSError:
            pass
        return data

    def remove(self, key: str) -> None:
        try:
            os.unlink(os.path.join(self._path, key))
        except OSError:
            pass

    def put(self, key: str, value: bytes, replace: bool = False) -> None:
        file = os.path.join(self._path, key)
        if not replace and os.path.exists(file):
            return
        tmp = os.path.join(self._path, f"{self._TMP}{os.getpid()}-{threading.get_ident()}-{key}")
        value = self._sealed(key, value)
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
        self._add_to_recorded_size(len(value))
        with self._lock:
            self._size += len(value)
            over = self._scanned.is_set() and self._size > self.max_bytes  # else the scan's end checks it
        if over:
            self._evict()

    def _checksum(self, key: str, value: bytes) -> bytes:
        import hashlib

        h = hashlib.sha256(self._scope)
        h.update(b"\0" + key.encode() + b"\0")
        h.update(value)
        return h.digest()

    def _sealed(self, key: str, value: bytes) -> bytes:
        return b"".join((self._MAGIC, self._scope_digest, self._checksum(key, value), value))

    def _open(self, key: str, data: bytes) -> bytes | None:
        """The entry in file ``data`` of ``key``; None (and the file gone)
        when it is not a whole entry of this store's scope."""
        head = len(self._MAGIC)
        if not data.startswith(self._MAGIC):
            problem = None  # an older pjrt_host's entry (removed quietly), or not pjrt_host's
        elif len(data) < head + 48:
            problem = "it is truncated"
        elif data[head:head + 16] != self._scope_digest:
            problem = "it was written for another jaxlib version, plugin, machine or entry format"
        elif data[head + 16:head + 48] != self._checksum(key, data[head + 48:]):
            problem = "its checksum does not match (truncated or corrupted)"
        else:
            return data[head + 48:]
        file = os.path.join(self._path, key)
        if problem is None:
            logger.debug("pjrt_host: %s is not an entry of this cache: compiling its program again", file)
        else:
            global _damaged
            if not _damaged:  # once a process: the rest go quietly
                _damaged = True
                warnings.warn(f"pjrt_host: the program cache entry {file} is not used: {problem}. It is removed "
                              "and its program compiled again.", RuntimeWarning, stacklevel=3)
        self.remove(key)
        return None

    def _recorded_size(self) -> int | None:
        """The directory's size as :attr:`_SIZE_FILE` records it; None when
        it is absent, not of this form, or its scan is older than
        :attr:`RESCAN_S` (the directory is then scanned)."""
        import time

        try:
            with open(os.path.join(self._path, self._SIZE_FILE), "rb") as f:
                data = f.read((1 << 20) + 1)
            if len(data) > 1 << 20:
                return None  # (a year of writes: scanned again, and started anew)
            lines = data.split(b"\n")
            version, total, when = lines[0].split()
            if version != b"v1" or not -300 <= time.time() - int(when) < self.RESCAN_S:
                return None
            return int(total) + sum(int(line[1:]) for line in lines[1:] if line.startswith(b"+"))
        except (OSError, ValueError):
            return None

    def _record_size(self, total: int) -> None:
        """Record ``total``, just scanned, in :attr:`_SIZE_FILE` (written
        atomically: appends to the file it replaces are lost, and the next
        scan counts them)."""
        import time

        tmp = os.path.join(self._path, f"{self._TMP}{os.getpid()}-{threading.get_ident()}-size")
        try:
            with open(tmp, "wb") as f:
                f.write(f"v1 {total} {int(time.time())}\n".encode())
            os.replace(tmp, os.path.join(self._path, self._SIZE_FILE))
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _add_to_recorded_size(self, n: int) -> None:
        """Append this write's ``n`` bytes to :attr:`_SIZE_FILE`, where it
        exists (one ``write`` of a short line to a file opened to append:
        a whole line, whatever other processes append at once)."""
        try:
            fd = os.open(os.path.join(self._path, self._SIZE_FILE), os.O_WRONLY | os.O_APPEND)
        except OSError:
            return
        try:
            os.write(fd, b"+%d\n" % n)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _scan(self) -> tuple[list[tuple[float, int, str]], int]:
        entries = []
        total = 0
        try:
            names = os.listdir(self._path)
        except OSError:
            return [], 0
        for name in names:
            if name.startswith("."):  # a write under way (``_TMP``), the size record
                continue
            try:
                info = os.stat(os.path.join(self._path, name))
            except OSError:
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
            self._record_size(total)


def safe_name(name: str) -> str:
    """``name`` as a file name (a plugin's, in a path)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "plugin"


def private_directory(path: str) -> str | None:
    """Make ``path`` (mode 0700) if needed; why it cannot be trusted with
    programs, or None.

    An entry is a pickled executable that every process of this user loads
    and runs: whoever can write into the directory, or replace it or one of
    the directories above it, can run code in those processes.  The rule,
    as OpenSSH's StrictModes: ``path`` and every directory above it (the
    real ones, symbolic links followed, and those the path names) belong to
    this user or to root, and none can be written by its group or by
    others -- except a directory above with the sticky bit (``/tmp``),
    where others may add names but not remove or rename this user's."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as err:
        return f"{path} cannot be made ({err.strerror or err}). Fix: make it a directory this user can write"
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        return f"{path} is not writable. Fix: give this user write access to it"
    if not hasattr(os, "getuid"):
        return None  # no POSIX owners and modes to check
    import stat

    me = os.getuid()
    chain = []
    for start in (os.path.realpath(path), os.path.abspath(path)):
        here = start
        while True:
            if here not in chain:
                chain.append(here)
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    for here in chain:
        try:
            info = os.stat(here)
        except OSError as err:
            return f"{here} cannot be read ({err.strerror or err})"
        ours = here in (os.path.realpath(path), os.path.abspath(path))
        if info.st_uid != me and (ours or info.st_uid != 0):
            return (f"{here} belongs to another user (uid {info.st_uid}), who could replace the programs "
                    f"every process here loads. Fix: use a directory of your own")
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (ours or not info.st_mode & stat.S_ISVTX):
            who = "its group and others" if writable == stat.S_IWGRP | stat.S_IWOTH else \
                "its group" if writable == stat.S_IWGRP else "others"
            return (f"{here} can be written by {who} (mode {stat.S_IMODE(info.st_mode):04o}), who could "
                    f"replace the programs every process here loads. Fix: chmod go-w {here}")
    return None
