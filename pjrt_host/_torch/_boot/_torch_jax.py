"""``torch.jax``: the device module of the 'jax' device, with the same
functions as torch's built-in accelerator modules.

Registered with ``torch._register_device_module`` at autoload.  Cheap to
import; jax is imported by the calls that need the devices
(:func:`device_count`, :func:`synchronize`), never by :func:`is_available`,
which torch.accelerator and dynamo call in CPU-only programs too.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _registry, _runtime
from . import _amp as amp
from .. import _devices, _rng
from .._devices import DEVICE_NAME
from ._streams import Event, Stream, current_stream, set_stream, stream

__all__ = [
    "amp",
    "Event",
    "Stream",
    "current_stream",
    "default_stream",
    "get_device_name",
    "get_device_properties",
    "is_bf16_supported",
    "memory_summary",
    "set_stream",
    "stream",
    "current_device",
    "device",
    "device_count",
    "empty_cache",
    "fused_eager_stats",
    "get_amp_supported_dtype",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_source",
    "program_cache_stats",
    "dynamic_shape_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "synchronize",
]

_available: bool | None = None


def is_available() -> bool:
    """Whether a plugin is installed and reports a device on this machine.
    Does not create the client (and so imports no jax)."""
    global _available
    if _runtime.is_initialized():
        return True
    if torch.compiler.is_compiling():
        # Dynamo asks (as torch.accelerator.is_available()) at the start of
        # every trace; with an accelerator available it stashes the
        # accelerator's current stream on every call of the compiled code
        # (~2.5 us: +10% on a small CPU graph).  A process that has not used
        # the device compiles CPU code exactly as without pjrt_host.
        return False
    if _available is None:
        try:
            record = _registry.selected_record()
            _available = bool(record.plugin is not None and record.plugin.physical_chip_count() > 0)
        except Exception:
            _available = False
    return _available


def is_initialized() -> bool:
    """Whether the plugin's client exists."""
    return _runtime.is_initialized()


def __getattr__(name: str) -> Any:
    # ``torch.jax._initialized``, read by torch's device-generic code as
    # torch.cuda's module attribute (torch.utils.checkpoint saves and
    # restores the device's RNG state only when it is true).
    if name == "_initialized":
        return _runtime.is_initialized()
    raise AttributeError(f"module 'torch.{DEVICE_NAME}' has no attribute {name!r}")


def default_stream(device: Any = None) -> Stream:
    """The device's queue (its only stream)."""
    return Stream(device)


class _DeviceProperties:
    """What ``torch.jax.get_device_properties`` reports: the PJRT device's
    name, kind, platform and memory."""

    def __init__(self, index: int) -> None:
        dev = _devices.jax_device(index)
        self.index = index
        self.name = str(getattr(dev, "device_kind", "") or dev.platform)
        self.type = DEVICE_NAME
        self.platform = str(dev.platform)
        self.plugin = _runtime.runtime().record.name
        from .. import _memory

        self.total_memory = int(_memory.limit(index) or 0)

    def __repr__(self) -> str:
        return (f"_DeviceProperties(name={self.name!r}, platform={self.platform!r}, plugin={self.plugin!r}, "
                f"total_memory={self.total_memory // 2**20}MB)")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def get_device_name(device: Any = None) -> str:
    """The PJRT device's kind (e.g. 'NVIDIA H100 80GB HBM3', 'cpu')."""
    return get_device_properties(device).name


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the plugin keeps bfloat16 as bfloat16 (not a declared
    substitution)."""
    if not is_available():
        return False
    from .._dtype_policy import device_dtype

    try:
        return device_dtype(torch.bfloat16) == torch.bfloat16
    except TypeError:  # a dtype the plugin declares it cannot hold
        return False


def device_count() -> int:
    """Number of the selected plugin's devices ('jax:0' ... 'jax:N-1').
    Creates the client."""
    if not is_available():
        return 0
    return _devices.count()


def current_device() -> int:
    """Index of the device that device='jax' (no index) means in this thread."""
    return _devices.current_index()


def set_device(device: Any) -> None:
    """Make ``device`` (int, 'jax:N' or torch.device) the current device.

    torch's launcher-aware code (``init_device_mesh``, FSDP recipes) calls
    ``set_device(LOCAL_RANK)``, assuming every process sees all of its host's
    devices, as with cuda.  A process here sees its own share (the plugin
    splits a host's devices among its processes), so that index -- this
    process's local rank, beyond its device count -- means its device
    ``LOCAL_RANK % device_count()``."""
    index = _devices.device_index(device)
    count = device_count()
    if count and index >= count and _is_local_rank(index):
        index %= count
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device index {index}: there are {count} '{DEVICE_NAME}' device(s)")
    _devices.set_current_index(index)


def _is_local_rank(index: int) -> bool:
    import os

    try:
        return int(os.environ.get("LOCAL_RANK", "-1")) == index
    except ValueError:
        return False


class device:
    """Context manager that changes the current device, like the ``device``
    context manager of torch's built-in accelerator modules."""

    def __init__(self, device: Any) -> None:
        self.index = None if device is None else _devices.device_index(device)
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index is not None:
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        _devices.set_current_index(self.previous)


def synchronize(device: Any = None) -> None:
    """Wait for all work queued on the device(s) to finish."""
    if not is_initialized():
        return
    from .. import _sync  # imports jax: loaded by the first call, not at autoload

    _sync.synchronize(None if device is None else _devices.device_index(device))


# ---------------------------------------------------------------- memory
#
# From the device's own statistics where the plugin reports them, else from
# the host's count of live arrays on the device (see _memory).


def _memory_module():
    from .. import _memory  # imports jax: loaded by the first call, not at autoload

    return _memory


def _index(device: Any) -> int:
    index = _devices.device_index(device)
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device index {index}: there are {count} '{DEVICE_NAME}' device(s)")
    return index


def memory_allocated(device: Any = None) -> int:
    """Bytes in use by tensors (arrays) on the device now."""
    return _memory_module().allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """The highest :func:`memory_allocated` since the start or the last
    :func:`reset_peak_memory_stats`.  Exact where the device reports its
    peak; on devices that report no statistics (cpu_ref) the highest value
    seen by the memory calls (sampled, not every op)."""
    return _memory_module().peak_allocated(_index(device))


def memory_reserved(device: Any = None) -> int:
    """Bytes the device's allocator holds (its ``bytes_reserved``), at least
    :func:`memory_allocated`."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _memory_module().reset_peak(_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device: Any = None) -> dict[str, int]:
    """torch.cuda.memory_stats' keys that apply (``allocated_bytes.all.current``
    / ``.peak``, ``reserved_bytes.all.*``, ``num_ooms``) and the device's own
    statistics as ``device.<name>``; every value an int, as torch.cuda's.
    Where the figures come from: :func:`memory_stats_source`."""
    return _memory_module().memory_stats(_index(device))


def memory_stats_source(device: Any = None) -> str:
    """Where :func:`memory_stats`' figures come from: ``"device"`` (the
    device's own statistics) or ``"host accounting of live arrays"`` (on
    devices that report none: a peak sampled by the memory calls and at the
    start of backward passes, a lower bound of the true one)."""
    return _memory_module().source(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device; for a device in host memory, the
    machine's available and physical memory."""
    return _memory_module().mem_get_info(_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A short table of :func:`memory_stats`, as torch.cuda.memory_summary."""
    stats = memory_stats(device)
    lines = [f"pjrt_host memory summary, {_devices.torch_device(_index(device))} ({memory_stats_source(device)})"]
    for key, value in stats.items():
        if not abbreviated or not key.startswith("device."):
            lines.append(f"  {key:<40} {value}")
    return "\n".join(lines)


def empty_cache() -> None:
    """Wait for queued work and release device memory that no tensor holds."""
    if not is_initialized():
        return
    _memory_module().empty_cache(None)


# ---------------------------------------------------------------- random state


def manual_seed(seed: int) -> None:
    """Seed the current device's random state."""
    _rng.seed_one(current_device(), int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's random state (``torch.manual_seed`` calls this)."""
    _rng.seed_all(int(seed))


def seed() -> None:
    """Seed the current device with a non-deterministic number."""
    import random

    manual_seed(random.getrandbits(63))


def seed_all() -> None:
    import random

    manual_seed_all(random.getrandbits(63))


def initial_seed() -> int:
    return _rng.state(current_device()).seed


def get_rng_state(device: Any = DEVICE_NAME) -> torch.Tensor:
    """The random state of one device as a CPU uint8 tensor."""
    data = _rng.state(_devices.device_index(device)).to_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def set_rng_state(new_state: torch.Tensor, device: Any = DEVICE_NAME) -> None:
    data = bytes(new_state.detach().cpu().to(torch.uint8).numpy().tobytes())
    _rng.set_state(_devices.device_index(device), _rng.State.from_bytes(data))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: Any) -> None:
    for i, st in enumerate(new_states):
        set_rng_state(st, i)


def _is_in_bad_fork() -> bool:
    """Whether this process is a fork() child of one that had created the
    client (as torch.cuda's): the device cannot be used here.
    torch.manual_seed -- which every DataLoader worker calls -- seeds the
    device only when this says False."""
    return _runtime.in_bad_fork()


# ---------------------------------------------------------------- autocast


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16, torch.float32]


def program_cache_stats() -> dict[str, Any]:
    """The programs this process has compiled for the device, and what the
    disk cache gave it: ``programs``, ``compiled`` (of those, compiled
    here, not loaded), ``disk_hits``, ``disk_writes``, ``compile_seconds``
    and the cache ``directory`` (None when off; docs/torch-device.md)."""
    from ... import _program_cache

    return _program_cache.stats()


def dynamic_shape_stats() -> dict[str, Any]:
    """Dynamic dimensions in this process (docs/dynamic-shapes.md):
    ``padded_calls`` (calls run on padded inputs, one program per bucket),
    ``pads`` (storages padded when a dim became dynamic), ``cuts`` (padded
    storages cut back to their logical sizes, by ``cuts_by_op``: the ops
    that do not know padding yet), ``fallbacks``, the elements the padded
    calls' first padded inputs held against their logical ones
    (``padding_overhead``: 0.1 is 10 % more) and ``calls_by_bucket``."""
    from .. import _padding

    return _padding.counts()


def fused_eager_stats() -> dict[str, int]:
    """Fused eager's counts in this process: ``segments`` run, ``ops``
    recorded, ``programs`` made (docs/torch-device.md)."""
    from .. import _fused

    return _fused.stats()
