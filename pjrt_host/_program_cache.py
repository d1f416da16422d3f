"""Compiled programs kept on disk, so that a script run a second time, or the
other processes of a job, start warm.

Eager ops, fused segments and compiled graphs all become XLA programs
through ``jax.jit``; jax's persistent compilation cache stores the
executables under a key of the unoptimised program, jaxlib's version, the
XLA flags and the devices (kind, count, topology).  This module chooses its
directory -- one per plugin, jaxlib version and entry format under a per-user root, made
private to the user -- turns it on for programs of any compile time, and
counts what happened (``torch.jax.program_cache_stats()``).  It runs once,
just before the plugin's client is created; nothing here imports jax at
module level.

jax's key is the lowered program, so a hit there still traces and lowers
the op in Python first: on a warm cache that was most of a second process's
first step (a GPT-2 training step: ~1.2 s tracing and ~2.7 s lowering
against ~0.9 s loading 147 executables).  :func:`compiled` keeps the
device's own programs a second way, keyed by what pjrt_host knows before
tracing -- the op and its static signature, in a fingerprint of the
setting (pjrt_host's source, torch / jax / jaxlib versions, the plugin, the
device, jax's trace-time configuration) -- and loads them with no tracing at
all.

Loading an executable is most of what a warm process still spends (1-2 ms
for an op's on XLA:CPU, 15-20 ms for a random draw's), and jaxlib loads
without holding Python's lock: :func:`prefetch` loads, on a thread, the
programs the last run of the same script used, in the order it used them,
while the script does its own Python work (a manifest per script and set
of devices, written at exit).

Settings: ``PJRT_HOST_PROGRAM_CACHE=0`` (off), ``PJRT_HOST_CACHE_DIR``,
``PJRT_HOST_CACHE_MAX_BYTES``, ``PJRT_HOST_CACHE_PREFETCH=0`` (see
:mod:`pjrt_host._env`).  A directory that
cannot be made, or that anyone but this user could write into or replace
(``_program_files.private_directory``), leaves the cache off with a warning: the
device works the same, only colder.  An entry file that is not whole, or
not of this setting, is compiled again, never loaded (``_program_files.DiskStore``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import warnings
from typing import Any

from . import _env, _jax_settings
from ._program_files import DiskStore, private_directory, safe_name

__all__ = ["DiskStore", "Kept", "Spelt", "compile_options", "compiled", "configure", "directory", "jit", "learnt", "prefetch",
           "remember", "remembered", "stats", "try_options",
           "with_retrace"]

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_local = threading.local()  #: jax_entry: the key of the entry jax loaded in this thread's last compile
_directory: str | None = None
_counts = {"programs": 0, "disk_hits": 0, "disk_writes": 0, "untraced": 0, "prefetched": 0}
_seconds = {"compile_seconds": 0.0}
_listening = False
_refused = False  #: the directory was refused (warned once)

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # jax records it as it writes an entry


def directory() -> str | None:
    """The directory this process reads and writes programs in; None when
    the cache is off."""
    return _directory


def configure(plugin_name: str, plugin_identity: str = "", sources: tuple[str, ...] = (),
              options: dict[str, Any] | None = None) -> str | None:
    """Turn the cache on for the selected plugin (before its client
    exists), and start counting compilations.  ``plugin_identity`` (its
    distribution, version and class) and the source of the modules
    ``sources`` names (its vendor kernels) key the programs :func:`compiled`
    keeps; ``options`` (its ``compile_options``) go to every compile of
    the device's programs (:func:`compile_options`) and key them too.
    Returns the directory, or None when the cache stays off."""
    global _directory, _plugin, _sources, _options
    _plugin = f"{plugin_name} {plugin_identity}"
    _sources = sources
    _options = dict(options) if options else None
    _listen()
    if not _env.program_cache_enabled():
        return None
    import jaxlib

    if _jax_settings.persistent_cache_dir() is not None:
        return None  # the user gave jax a cache directory of their own: it is used as they set it
    root = _env.program_cache_dir()
    # The entry format names a directory of its own: a pjrt_host of another
    # format (an older one in another environment) keeps its entries apart,
    # instead of each removing the other's as foreign.
    path = os.path.join(root, safe_name(plugin_name), f"jaxlib-{jaxlib.__version__}", DiskStore.LAYOUT)
    problem = private_directory(path)
    if problem is not None:
        global _refused
        if not _refused:  # once a process
            _refused = True
            warnings.warn(f"pjrt_host: compiled programs are not kept on disk: {problem}, or set "
                          "PJRT_HOST_CACHE_DIR to another directory (PJRT_HOST_PROGRAM_CACHE=0 silences this).",
                          RuntimeWarning, stacklevel=3)
        return None
    global _disk
    store = _store(path, _env.program_cache_max_bytes(), f"jaxlib {jaxlib.__version__} {plugin_name}")
    if not _jax_settings.use_persistent_cache(path, store):
        return None  # the user gave jax a cache directory of their own: it is used as they set it
    _directory, _disk = path, store
    return path


def stats() -> dict[str, Any]:
    """What this process compiled: ``programs`` (XLA executables made,
    loaded from disk included), ``compiled`` (of those, compiled here),
    ``disk_hits``, ``disk_writes``, ``compile_seconds`` (time spent in XLA
    compiling or loading), ``untraced`` (of the disk hits, programs loaded
    without tracing their op again, :func:`compiled`), ``prefetched`` (of
    those, loaded ahead of use by :func:`prefetch`) and the cache
    ``directory`` (None when off)."""
    with _lock:
        counts = dict(_counts)
        seconds = _seconds["compile_seconds"]
    return {**counts, "compiled": counts["programs"] - counts["disk_hits"], "compile_seconds": round(seconds, 6),
            "directory": _directory}


# ---------------------------------------------------------------- programs kept untraced

#: Bumped when what an entry holds changes.
_FORMAT = "pjrt_host-program-1"
_disk: Any = None
_setting: str | None = None
_plugin = ""
_sources: tuple[str, ...] = ()  #: the plugin's modules whose source keys the programs too (its kernels)
_unserializable = False  #: the plugin cannot serialize executables: stop trying
_options: dict[str, Any] | None = None  #: the plugin's compile_options (None: the compiler's defaults)


def compile_options() -> dict[str, Any] | None:
    """The selected plugin's XLA compile options (None: the compiler's
    defaults), which :func:`jit` gives every program of the device."""
    return _options


def jit(fn: Any, **kwargs: Any) -> Any:
    """``jax.jit(fn, **kwargs)`` with the plugin's compile options: every
    program the host makes for the device is jitted here.  Another trace may
    call the result (:class:`_TopLevelJit`)."""
    import jax

    if _options is None:
        return jax.jit(fn, **kwargs)
    return _TopLevelJit(fn, kwargs)


# jax's words when a jit with compile options is called inside another trace
# (tests/test_runtime.py pins them: a change fails a test, not a user).
_NESTED = "can only be passed to top-level `jax.jit`"


class _TopLevelJit:
    """``jax.jit`` with the plugin's compile options where it runs as its own
    program; called inside another trace, where jax refuses options on a
    nested jit, the same function without them (the outer program is compiled
    with them).  Everything else (``lower``, ``trace`` ...) is the top-level
    jit's."""

    __slots__ = ("_fn", "_kwargs", "_top", "_nested")

    def __init__(self, fn: Any, kwargs: dict[str, Any]) -> None:
        import jax

        self._fn, self._kwargs, self._nested = fn, kwargs, None
        self._top = jax.jit(fn, compiler_options=_options, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._top(*args, **kwargs)
        except ValueError as err:
            if _NESTED not in str(err):
                raise
        if self._nested is None:
            import jax

            self._nested = jax.jit(self._fn, **self._kwargs)
        return self._nested(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._top, name)


def compiled(name: str, signature: Any, jitted: Any, args: tuple, device: Any) -> Any:
    """``jitted`` (a ``jax.jit`` function) compiled for ``args`` on jax
    ``device``: loaded from disk without tracing when a process of the same
    setting compiled it before, else traced, compiled, and kept for the next.

    ``signature`` identifies the program within ``name`` (an op: its static
    arguments, settings and form); its ``repr`` is the key, so it must hold
    every value the trace depends on, and only values whose ``repr`` is
    stable (one that shows a memory address keeps the program in memory
    only).  The result is a ``jax.stages.Compiled`` for exactly these
    argument types on ``device``.  With the cache off, or where the plugin
    cannot serialize executables, it is compiled as usual."""
    key = _key(name, signature, device) if _disk is not None and _kernels_ready() else None
    if key is not None:
        loading = _used_here(key, device)
        if loading is not None:  # the prefetch thread is loading it: a few milliseconds
            loading.wait()
        program = _made.get(key)
        if program is not None:  # made earlier in this process (for another in-memory key, or ahead)
            return program
        data = _disk.get(key)
        if data is not None:
            loaded = _load(key, data, device)
            if loaded is not None:
                return _made_here(key, loaded)
    _local.jax_entry = _local.written = None
    # jax's entry of a module this process has not met is not read: the
    # program is compiled, so that it can be kept under this key.  (An
    # executable loaded from jax's entry cannot be kept; after an upgrade of
    # pjrt_host the first process loaded every program from jax's entries
    # and kept none, and the second compiled them all.)  A program that
    # cannot be kept (constants closed over) takes jax's entry as before.
    _local.fresh = key is not None and not _unserializable and remembered("unkept", key) is None
    try:
        program = jitted.lower(*args).compile(compiler_options=_options)
    finally:
        _local.fresh = False
    if key is not None and not _unserializable:
        hit, written = _local.jax_entry, _local.written
        if hit is None:
            _keep(key, program)
            if written is not None:
                if len(_ours_for_jax) > 4096:
                    _ours_for_jax.clear()
                _ours_for_jax[written] = key
        else:
            # jax loaded it from its own entry: another program lowered to
            # the same.  Neither that executable nor a fresh compile of the
            # same module in this process can be serialized whole on every
            # backend (XLA:CPU loses its functions: "Function ... not
            # found" when run).  Where this process kept the first one, its
            # bytes serve this key too; else jax's entry goes, so the next
            # process compiles the program and keeps it
            # (tests/test_program_cache.py).
            first = _ours_for_jax.get(hit)
            data = None if first is None else _disk.get(first)
            if data is not None:
                _disk.put(key, data)
            else:
                _disk.remove(hit)
    return program if key is None else _made_here(key, program)


#: jax's entry -> the key this process kept the same program under
_ours_for_jax: dict[str, str] = {}
#: jax's entries this process read or wrote: modules it compiled or loaded,
#: whose second compile in this process could not be kept whole
_jax_met: set[str] = set()


def _of_jax(key: str) -> bool:
    """Whether ``key`` names one of jax's own entries (or a manifest), not a
    program or fact pjrt_host keeps."""
    return not key.startswith("pjrt_host-")


#: The programs this process made or loaded, by key: a second request for
#: the same program (two in-memory keys of one op or segment) takes the
#: same executable, without even jax's cache (whose entry, once loaded,
#: cannot be kept here).
_made: dict[str, Any] = {}


def _made_here(key: str, program: Any) -> Any:
    with _lock:
        if len(_made) > 4096:  # programs of signatures long gone: bound the memory
            _made.clear()
        _made[key] = program
    return program


def with_retrace(compiled: Any, jitted: Any) -> Any:
    """A function that runs ``compiled`` (from :func:`compiled`, for one set
    of argument types) and falls back to ``jitted``, which retraces, when a
    call brings other types (a Python int where a numpy int was compiled:
    one in-memory key can meet both)."""
    def program(*args: Any) -> Any:
        try:
            return compiled(*args)
        except TypeError:
            return jitted(*args)

    return program


class Kept:
    """``jax.jit(fn, **options)`` whose executables are kept like the ops'
    (:func:`compiled`): the small programs the host runs around ops --
    reading a view, casting, checking indices -- load untraced in a warm
    process instead of tracing and lowering again (what a second process's
    first step still spent on them).

    ``signature`` stands for ``fn`` within ``name`` (every value its trace
    depends on, besides the arguments' types, with a stable ``repr``).
    Arguments are jax arrays on one device and Python scalars; anything
    else (arrays over several devices, numpy values) runs through
    ``jax.jit`` as usual."""

    __slots__ = ("name", "signature", "_named", "_options", "_jitted", "_top", "_programs")

    def __init__(self, name: str, fn: Any, signature: Any = (), **options: Any) -> None:
        self.name, self.signature = name, signature

        @functools.wraps(fn)
        def named(*args: Any) -> Any:
            return fn(*args)

        # jax names the program after the function: compile logs, profiles and
        # jax.monitoring events then say jit(pjrt_host.read), not jit(<lambda>).
        named.__name__ = named.__qualname__ = name
        self._named, self._options, self._jitted, self._top = named, options, None, None
        self._programs: dict[tuple, Any] = {}

    @property
    def jitted(self) -> Any:
        """The ``jax.jit`` of the function, which another traced function
        may call (jax refuses compile options on a nested jit: they are
        given where it is compiled, :func:`compiled`)."""
        if self._jitted is None:
            import jax

            self._jitted = jax.jit(self._named, **self._options)
        return self._jitted

    def _run(self, *args: Any) -> Any:
        """The function run as its own program, with the plugin's compile
        options (:func:`jit`), made at first use: a module makes its Kept
        functions at import, before the plugin is chosen."""
        if self._top is None:
            self._top = jit(self._named, **self._options)
        return self._top(*args)

    def __call__(self, *args: Any) -> Any:
        if _disk is None:
            return self._run(*args)
        device = None
        spec = []
        for a in args:
            if type(a) in _SCALARS:
                spec.append(type(a))
                continue
            try:
                devices = a.devices()
                aval = (a.shape, a.dtype, a.weak_type)
            except AttributeError:
                return self._run(*args)
            if len(devices) != 1:
                return self._run(*args)
            (d,) = devices
            if device is None:
                device = d
            elif d != device:
                return self._run(*args)
            spec.append(aval)
        if device is None:
            return self._run(*args)
        key = (*spec, device.id)
        program = self._programs.get(key)
        if program is None:
            import jax

            types = tuple(str(jax.typeof(a)) for a in args)
            made = compiled(self.name, (self.signature, types), self.jitted, args, device)
            if len(self._programs) > 256:  # shapes that never repeat: bound the memory
                self._programs.clear()
            program = self._programs[key] = with_retrace(made, self._run)
        return program(*args)


_SCALARS = (int, float, bool)


def remembered(name: str, signature: Any) -> bytes | None:
    """What a process of the same setting learnt about ``name`` /
    ``signature`` and kept with :func:`remember` (None: nothing, or the
    cache is off)."""
    key = _key(name, signature, None) if _disk is not None else None
    return None if key is None else _disk.get(key)


class Spelt:
    """A signature whose ``repr`` (what keys it on disk) is worked out once:
    one call's signature keys its program, what its meta kernel answered
    and CPU's verdict, each a ``repr`` of nested tuples of dtypes and
    shapes (about 0.4 ms)."""

    __slots__ = ("text",)

    def __init__(self, value: Any) -> None:
        self.text = repr(value)

    def __repr__(self) -> str:
        return self.text


def learnt(name: str, signature: Any, find: Any) -> bool:
    """``find()`` (a yes or no this process finds out by running something),
    kept with :func:`remember` so that a later process of the same setting
    takes it without running it; ``signature`` None: found, not kept.  A
    ``find`` that raises keeps nothing."""
    if signature is not None:
        value = remembered(name, signature)
        if value in (b"yes", b"no"):
            return value == b"yes"
    found = bool(find())
    if signature is not None:
        remember(name, signature, b"yes" if found else b"no")
    return found


def remember(name: str, signature: Any, value: bytes) -> None:
    """Keep a small fact (``value``) about ``name`` / ``signature`` for the
    next process of the same setting: what this one had to find out by
    running (whether an op's scalars can be traced)."""
    key = _key(name, signature, None) if _disk is not None else None
    if key is not None:
        _disk.put(key, value)


def _key(name: str, signature: Any, device: Any) -> str | None:
    import hashlib

    text = repr(signature)
    if " at 0x" in text:
        return None
    # jax's trace-time settings (64-bit types, promotion, matmul precision,
    # ...), as jax.jit keys its own traces; an object among them (the axis
    # environment, empty outside a trace) by its type.  A jax without them
    # keeps programs in memory only (pjrt_host/_internals.py).
    try:
        from jax._src.config import trace_context

        values = trace_context()
    except Exception:
        return None
    context = []
    for value in values:
        r = repr(value)
        context.append(type(value).__name__ if " at 0x" in r else r)
    h = hashlib.sha256()
    where = () if device is None else (str(device.id), device.device_kind, device.client.platform,
                                       device.client.platform_version)
    for part in (_setting_text(), repr(context), *where, name, text):
        h.update(part.encode())
        h.update(b"\0")
    return f"pjrt_host-{safe_name(name)}-{h.hexdigest()[:48]}"


def _setting_text() -> str:
    """What every program of this process depends on beyond its own key:
    pjrt_host's source (a changed lowering is a new program), the versions
    of torch, jax and jaxlib, the selected plugin (its distribution,
    version and class, its vendor kernels' source, its compile options)
    and the XLA flags;
    computed once (about 10 ms)."""
    global _setting
    if _setting is None:
        import hashlib
        import pathlib

        import jax
        import jaxlib
        import torch

        h = hashlib.sha256(_FORMAT.encode())
        root = pathlib.Path(__file__).resolve().parent
        for file in sorted(root.rglob("*.py")):
            h.update(str(file.relative_to(root)).encode())
            h.update(file.read_bytes())
        for module in _sources:
            h.update(module.encode() + b"\0" + _module_source(module))
        flags = sorted((k, v) for k, v in os.environ.items() if k.startswith(("XLA_", "LIBTPU_", "TPU_")))
        _setting = "|".join([h.hexdigest(), torch.__version__, jax.__version__, jaxlib.__version__, _plugin,
                             repr(flags), repr(sorted((_options or {}).items()))])
    return _setting


def _module_source(name: str) -> bytes:
    """The bytes of module ``name``'s file (found, not imported: its
    packages are the plugin's, imported already); empty when not found."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin and os.path.isfile(origin):
            with open(origin, "rb") as f:
                return f.read()
    except (ImportError, ValueError, OSError):
        pass
    return b""


_kernels = None  #: whether jaxlib's lazily bound kernels are bound in this process


def _kernels_ready() -> bool:
    """Bind the kernels jaxlib binds only as it lowers a program that calls
    them -- XLA:CPU's LAPACK (``linalg.eigvals``, ``cholesky``, ``svd`` ...),
    whose function pointers jaxlib takes from scipy -- as jax's own loader
    of serialized programs does (``jax.export``).  An executable loaded
    untraced calls them without any lowering in this process: a second
    process's first ``linalg.eigvals`` ended in a segmentation fault.  False
    (programs are then traced as before) when jax has no such call."""
    global _kernels
    if _kernels is None:
        try:
            from jax._src.lax.linalg import initialize_lapack

            initialize_lapack()
            _kernels = True
        except Exception as err:
            logger.debug("pjrt_host: programs are not loaded untraced: %s", err)
            _kernels = False
    return _kernels


# ---------------------------------------------------------------- loading ahead

#: key -> device id of the programs this process asked for, first use first
#: (the next run's manifest; kept only while prefetching is on)
_used: dict[str, int] = {}
_USED_MAX = 4096
_manifest: str | None = None  #: this script's manifest file (None: not prefetching)
_plan: dict[str, int] = {}  #: key -> its place in the manifest being prefetched
_reached = -1  #: the furthest place in the manifest the script itself has asked for
_next = 0  #: the next place in the manifest a prefetch thread takes
_loading: dict[str, threading.Event] = {}  #: keys a prefetch thread is loading now
_stop = threading.Event()
_threads: list[threading.Thread] = []


def _used_here(key: str, device: Any) -> threading.Event | None:
    """Note that the script asks for ``key`` (for the next run's manifest,
    and so that prefetch threads skip past it); the event of its load when
    a prefetch thread is loading it now."""
    global _reached
    if _manifest is not None and key not in _used and len(_used) < _USED_MAX:
        _used[key] = device.id
    if not _plan:
        return None
    with _lock:
        place = _plan.get(key)
        if place is not None and place > _reached:
            _reached = place
        return _loading.get(key)


def prefetch(devices: list) -> None:
    """Start loading, on a background thread, the programs the last run of
    this script on these ``devices`` used (the client has just been
    created); from here on, remember what this run uses, for the next.  A
    program the script asks for before the thread reaches it is loaded by
    the script as before, and the thread skips past it."""
    global _manifest
    import sys

    # a process that has not imported torch (a probe, jax code through
    # pjrt_host) runs no ops: it neither reads nor writes a manifest
    if _disk is None or _manifest is not None or not _env.program_cache_prefetch() or "torch" not in sys.modules:
        return
    import atexit
    import hashlib

    ids = ",".join(str(d.id) for d in devices)
    # of this setting too: after an upgrade the old run's programs are of no use
    name = hashlib.sha256(f"{_setting_text()}\0{_script()}\0{ids}".encode()).hexdigest()[:32]
    _manifest = f"manifest-{name}"
    atexit.register(_finish, os.getpid())
    data = _disk.get(_manifest)
    if not data:
        return
    by_id = {d.id: d for d in devices}
    entries = []
    for line in data.decode(errors="replace").splitlines():
        did, _, key = line.partition(" ")
        device = by_id.get(int(did)) if did.isdigit() else None
        if device is not None and key:
            _plan.setdefault(key, len(entries))
            entries.append((key, device))
    if entries and _kernels_ready():
        # loading runs mostly outside Python's lock: a thread per spare core (up to 2)
        for n in range(max(1, min(2, (os.cpu_count() or 1) - 1))):
            thread = threading.Thread(target=_load_ahead, args=(entries,), name=f"pjrt_host-prefetch-{n}",
                                      daemon=True)
            _threads.append(thread)
            thread.start()


def _load_ahead(entries: list) -> None:
    global _next
    while not _stop.is_set():
        with _lock:
            place = max(_next, _reached + 1)  # what the script asked for itself is behind it
            if place >= len(entries):
                return
            _next = place + 1
            key, device = entries[place]
            if key in _made or key in _loading:
                continue
            done = _loading[key] = threading.Event()
        try:
            data = _disk.get(key)
            program = None if data is None else _load(key, data, device, ahead=True)  # None: evicted
            if program is not None:
                _made_here(key, program)
        finally:
            with _lock:
                del _loading[key]
            done.set()


def _finish(pid: int) -> None:
    """At exit: stop the loading thread (before jaxlib is torn down), and
    keep what this run used as the next run's manifest (not a forked
    child's: it ran none of it)."""
    if os.getpid() != pid:
        return
    _stop.set()
    for thread in _threads:
        thread.join(timeout=10)
    if _disk is None or _manifest is None or not _used:
        return
    text = "\n".join(f"{did} {key}" for key, did in list(_used.items()))
    _disk.put(_manifest, text.encode(), replace=True)


def _script() -> str:
    """What identifies the script this process runs: its file (a module run
    with -m included), the code given with -c, else the interpreter."""
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path:
        return os.path.abspath(path)
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "-c" in argv[:-1]:
        return "-c " + argv[argv.index("-c") + 1]
    return "<interactive>"


def _load(key: str, data: bytes, device: Any, ahead: bool = False) -> Any:
    import pickle
    import time

    from jax.experimental import serialize_executable

    start = time.perf_counter()
    try:
        payload, in_tree, out_tree = pickle.loads(data)
        program = serialize_executable.deserialize_and_load(payload, in_tree, out_tree, backend=device.client,
                                                             execution_devices=[device])
    except Exception as err:  # a damaged or foreign entry: compiled again and replaced
        logger.debug("pjrt_host: program %s could not be loaded (%s): compiling it again", key, err)
        _disk.remove(key)
        return None
    with _lock:
        _counts["programs"] += 1
        _counts["disk_hits"] += 1
        _counts["untraced"] += 1
        _counts["prefetched"] += ahead
        _seconds["compile_seconds"] += time.perf_counter() - start
    return program


def _keep(key: str, program: Any) -> None:
    global _unserializable
    import pickle

    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = serialize_executable.serialize(program)
        data = pickle.dumps((payload, in_tree, out_tree))
    except (NotImplementedError, ValueError) as err:  # constants closed over, mutable refs: this program only
        logger.debug("pjrt_host: program %s is kept in memory only: %s", key, err)
        remember("unkept", key, b"yes")  # later processes take jax's entry of it (:func:`compiled`)
        return
    except Exception as err:  # the plugin cannot serialize executables
        logger.debug("pjrt_host: programs are kept in memory only: %s", err)
        _unserializable = True
        return
    _disk.put(key, data)


def _listen() -> None:
    global _listening
    if _listening:
        return
    import jax

    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _listening = True


def try_options(device: Any) -> None:
    """Compile an empty program with the plugin's compile options on
    ``device`` (raising what the compiler raises), uncounted: the host's
    own check, not one of the device's programs."""
    _local.quiet = True
    try:
        jit(lambda: 0, device=device).lower().compile()
    finally:
        _local.quiet = False


def _on_event(event: str, **_: Any) -> None:
    if getattr(_local, "quiet", False):
        return
    if event == _HIT_EVENT:
        _local.jax_entry = getattr(_local, "read", None)
        with _lock:
            _counts["disk_hits"] += 1
    elif event == _WRITE_EVENT:
        with _lock:
            _counts["disk_writes"] += 1


def _on_duration(event: str, duration: float, **_: Any) -> None:
    if event == _COMPILE_EVENT and not getattr(_local, "quiet", False):
        with _lock:
            _counts["programs"] += 1
            _seconds["compile_seconds"] += duration


def _store(path: str, max_bytes: int, scope: str = "") -> Any:
    """The program cache's store: ``_program_files.DiskStore`` as jax's
    cache interface (its base class is jax's), noting which entry each
    thread's compile read or wrote (:func:`compiled` keeps it a second way)."""
    from jax._src.compilation_cache_interface import CacheInterface

    global _Store
    if _Store is None:
        _Store = type("DiskStore", (_Entries, CacheInterface), {})
    return _Store(path, max_bytes, f"{_FORMAT} {scope}")


_Store: Any = None


class _Entries(DiskStore):
    """The store, with what :func:`compiled` needs to know of jax's entries:
    the key a thread's compile read or wrote, and jax's keys met in this
    process (a fresh compile of the device's own is not answered from
    jax's entry: it is compiled, to be kept untraced)."""

    def get(self, key: str) -> bytes | None:
        if _of_jax(key):
            if getattr(_local, "fresh", False) and key not in _jax_met:
                return None  # compiled instead, to be kept (:func:`compiled`)
            _jax_met.add(key)
        data = super().get(key)
        if data is not None:
            _local.read = key
        return data

    def put(self, key: str, value: bytes, replace: bool = False) -> None:
        _local.written = key
        if _of_jax(key):
            _jax_met.add(key)
        super().put(key, value, replace)


