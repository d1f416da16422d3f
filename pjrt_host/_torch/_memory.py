"""Device memory as ``torch.cuda`` reports it, and out-of-memory errors as
torch users catch them.

Where the plugin's PJRT device reports memory statistics
(``device.memory_stats()``: ``bytes_in_use``, ``peak_bytes_in_use``,
``bytes_limit`` ...), the figures are the device's.  Where it reports none
(cpu_ref and jaxlib's CPU client), they come from the host's own accounting:
the bytes of the live jax arrays on the device, counted when asked.  That
count is exact for the moment it is taken; its peak is the highest count
seen by these calls (and by allocation failures), because counting on every
op would cost every op -- a true high-water mark needs the device's own
statistics.

Nothing here runs per op: errors are converted only when an op has failed.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import jax
import torch

from .. import _runtime
from . import _sync, _tensor
from ._devices import DEVICE_NAME, current_index, jax_device, torch_device

__all__ = [
    "allocated", "as_out_of_memory", "check_fits", "device_stats", "empty_cache", "mem_get_info", "memory_stats",
    "note_backward", "peak_allocated", "reset_peak", "limit", "source",
]

_lock = threading.Lock()
_peak: dict[int, int] = {}  #: highest allocated count seen since the last reset (host accounting and samples)
_device_peak_at_reset: dict[int, int] = {}  #: the device's peak_bytes_in_use when the peak was last reset
_ooms: dict[int, int] = {}
_limits: dict[int, int | None] = {}


def device_stats(index: int) -> dict[str, int] | None:
    """The PJRT device's own statistics, or None where it reports none."""
    if _sync.open_segments:  # fused eager: what the queued ops make counts, as on cuda
        _sync.flush_segments()
    try:
        stats = jax_device(index).memory_stats()
    except Exception:  # a plugin without the PJRT memory-stats extension
        return None
    return dict(stats) if stats else None


def _live_bytes(index: int, flush: bool = True) -> int:
    if flush and _sync.open_segments:
        _sync.flush_segments()
    device = jax_device(index)
    cap = _cached_limit(index)
    total = 0
    for arr in device.client.live_arrays():
        try:
            if arr.is_deleted():
                continue
            devices = arr.sharding.device_set
            if device in devices:
                n = arr.nbytes // len(devices) if len(devices) > 1 else arr.nbytes
                # An array larger than the device is the result of a failed
                # (out-of-memory) computation: it holds no memory.
                if cap is None or n <= cap:
                    total += n
        except Exception:  # an array being deleted concurrently
            continue
    return total


def _sample(index: int, current: int) -> None:
    with _lock:
        if current > _peak.get(index, 0):
            _peak[index] = current


def allocated(index: int) -> int:
    """Bytes of device memory in use by arrays (torch: memory_allocated)."""
    stats = device_stats(index)
    current = stats["bytes_in_use"] if stats and "bytes_in_use" in stats else _live_bytes(index)
    _sample(index, current)
    return current


def peak_allocated(index: int) -> int:
    """The highest allocated count since the start or the last reset."""
    current = allocated(index)
    peak = max(_peak.get(index, 0), current)
    stats = device_stats(index)
    if stats and "peak_bytes_in_use" in stats:
        # The device's peak cannot be reset: it counts once it has risen
        # above what it was at the last reset.
        device_peak = stats["peak_bytes_in_use"]
        if device_peak > _device_peak_at_reset.get(index, 0):
            peak = max(peak, device_peak)
    return peak


def reset_peak(index: int) -> None:
    global _backwards
    stats = device_stats(index)
    _backwards = 0  # the next backward is sampled (note_backward)
    with _lock:
        _peak[index] = 0
        _device_peak_at_reset[index] = stats.get("peak_bytes_in_use", 0) if stats else 0
    allocated(index)


def limit(index: int) -> int | None:
    """Bytes the device can hold: the device's ``bytes_limit``, or for a
    host-memory device the machine's physical memory."""
    stats = device_stats(index)
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def mem_get_info(index: int) -> tuple[int, int]:
    """(free, total) bytes, as torch.cuda.mem_get_info."""
    stats = device_stats(index)
    if stats and "bytes_limit" in stats:
        total = int(stats["bytes_limit"])
        return max(total - int(stats.get("bytes_in_use", 0)), 0), total
    total = limit(index) or 0
    free = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return free, total


_backwards = 0  #: backward calls seen by note_backward
_reports: dict[int, bool] = {}  #: device index -> whether the device reports its own peak


def note_backward(tensors: Any) -> None:
    """Sample the allocated bytes as a backward over ``tensors`` starts,
    where the device reports no peak of its own: every activation the
    forward saved is still alive then, the usual high-water mark of a
    training step, so ``max_memory_allocated`` after a training run counts
    it (before, only the memory calls themselves sampled: a peak read after
    the model was freed was 4 bytes).  Counting live arrays costs about
    4 microseconds an array, so it runs at the 1st, 2nd, 4th, 8th ... and
    then every 64th backward (counted from the last :func:`reset_peak`);
    queued fused segments are not run for it."""
    global _backwards
    _backwards += 1
    n = _backwards
    if n & (n - 1) and n % 64:
        return
    for t in tensors if isinstance(tensors, (tuple, list)) else (tensors,):
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE_NAME:
            index = t.device.index or 0
            break
    else:
        return
    if index not in _reports:
        try:
            stats = jax_device(index).memory_stats()
        except Exception:
            stats = None
        _reports[index] = bool(stats) and "peak_bytes_in_use" in stats
    if not _reports[index]:
        _sample(index, _live_bytes(index, flush=False))


def memory_stats(index: int) -> dict[str, int]:
    """torch.cuda.memory_stats' keys that mean something here, plus the
    device's own numeric statistics as ``device.<name>``: every value an
    int, as torch.cuda's (loggers take numbers only), in an OrderedDict
    sorted by key.  Where the figures come from: :func:`source`."""
    import collections

    current = allocated(index)
    peak = peak_allocated(index)
    stats = device_stats(index) or {}
    reserved = int(stats.get("bytes_reserved", current)) if stats else current
    out: dict[str, Any] = {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": max(reserved, current),
        "reserved_bytes.all.peak": max(int(stats.get("peak_bytes_reserved", 0)), peak),
        "num_ooms": _ooms.get(index, 0),
        "num_alloc_retries": 0,
    }
    for k, v in sorted(stats.items()):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"device.{k}"] = int(v)
    return collections.OrderedDict(sorted(out.items()))


def source(index: int) -> str:
    """Where :func:`memory_stats`' figures come from: ``"device"`` (the
    PJRT device's own statistics) or ``"host accounting of live arrays"``
    (sampled: see the module's docstring)."""
    stats = device_stats(index) or {}
    return "device" if "bytes_in_use" in stats else "host accounting of live arrays"


def empty_cache(index: int | None = None) -> None:
    """Wait for queued work and drop the host's own references to device
    arrays (the last result kept per device for ``synchronize``), so memory
    that no tensor holds is released."""
    _sync.synchronize(index)
    _sync.forget_results(index)


# ---------------------------------------------------------------- out of memory

_JAX_OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory")
_BYTES = re.compile(r"allocat\w*\s+(\d+)\s*bytes")
_NUMPY = re.compile(r"Unable to allocate ([\d.]+\s*\w+) for an array with shape (\([^)]*\))")


def _cached_limit(index: int) -> int | None:
    if index not in _limits:
        _limits[index] = limit(index)
    return _limits[index]


def check_fits(nbytes: int, index: int, op: str) -> None:
    """Raise torch.OutOfMemoryError if ``nbytes`` exceed what the device can
    hold at all (its bytes_limit, or the machine's memory)."""
    cap = _cached_limit(index)
    if cap is not None and nbytes > cap:
        raise as_out_of_memory(MemoryError(f"allocating {nbytes} bytes, more than the device's {cap}"), op,
                               index=index, requested=nbytes)


def _size_text(n: int | None) -> str:
    if n is None:
        return "an unknown size"
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} bytes"  # pragma: no cover


def _device_of(args: Any, kwargs: dict | None) -> int:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, _tensor.JaxTensor):
            return a._storage.device_index
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, _tensor.JaxTensor):
                    return x._storage.device_index
    device = (kwargs or {}).get("device")
    if device is not None and torch.device(device).type == DEVICE_NAME:
        return torch.device(device).index or 0
    return current_index()


def as_out_of_memory(err: BaseException, op: str, args: Any = (), kwargs: dict | None = None,
                     index: int | None = None, requested: int | None = None) -> torch.OutOfMemoryError | None:
    """``torch.OutOfMemoryError`` for an allocation failure (a jax
    RESOURCE_EXHAUSTED, a numpy MemoryError), None for any other error."""
    if isinstance(err, torch.OutOfMemoryError):
        return None
    text = str(err)
    requested_text = None if requested is None else _size_text(requested)
    if requested_text is not None:
        pass
    elif isinstance(err, MemoryError):
        m = _NUMPY.search(text)
        if m:
            requested_text = f"{m.group(1)} (shape {m.group(2)})"
    elif isinstance(err, jax.errors.JaxRuntimeError) and _JAX_OOM.search(text):
        m = _BYTES.search(text)
        requested_text = _size_text(int(m.group(1))) if m else None
    else:
        return None
    if index is None:
        index = _device_of(args, kwargs)
    with _lock:
        _ooms[index] = _ooms.get(index, 0) + 1
    try:
        in_use = _size_text(allocated(index))
        total = limit(index)
        plugin = _runtime.runtime().record.name
    except Exception:
        in_use, total, plugin = "an unknown amount", None, "?"
    capacity = f" of {_size_text(total)}" if total else ""
    cause = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return torch.OutOfMemoryError(
        f"pjrt_host: out of memory on {torch_device(index)} (plugin {plugin!r}) running {op}: "
        f"tried to allocate {requested_text or 'an unknown size'}; {in_use}{capacity} is in use by live arrays "
        f"on the device. Free tensors you no longer need (del them, then torch.{DEVICE_NAME}.empty_cache()), "
        f"use smaller batches or a smaller model; torch.{DEVICE_NAME}.memory_stats() shows the figures. "
        f"The device keeps working. (cause: {cause})")
