"""torch ``UntypedStorage`` objects on the 'jax' device.

A 'jax' tensor keeps its values in a :class:`~._tensor.Storage` (a jax
array), which torch's C++ side cannot see: torch has no allocator for a
Python backend, so ``torch.UntypedStorage(n, device='jax')`` would have
nothing behind it.  Yet the code users run everywhere speaks in torch
storages: ``torch.load`` restores every tensor through a storage moved to
its device and ``tensor.set_(storage, offset, size, stride)``; safetensors
and distributed checkpoints find shared tensors by ``untyped_storage()``
pointers; ``torch.save`` writes ``storage.cpu()``.

This module gives those storages a body.  Every torch storage on 'jax' is
made with ``torch._C._construct_storage_from_data_pointer`` over memory the
host owns, and is found again by its data pointer:

* a *staged* storage lies over host bytes: a CPU storage read from a
  checkpoint (``torch.load(map_location='jax')``: no copy is made), or a new
  host buffer (``torch.UntypedStorage(n, device='jax')``, ``storage.to('jax')``).
  The bytes go to the device when a tensor is set on the storage;
* a *device* storage is what ``tensor.untyped_storage()`` returns for a 'jax'
  tensor: its pointer starts a read-only reservation of address space as
  long as the storage (no memory is committed), so pointers and extents of
  distinct storages never overlap and shared tensors show the same pointer,
  as on any device.  Its values are the tensor's Storage.

Tensors set on the same torch storage with the same dtype share one device
Storage (views come back views, as on CPU).  No jax here: the device is
touched only by ``_storage_ops``'s ``set_``.
"""

from __future__ import annotations

import ctypes
import mmap
import re
import threading
import weakref
from typing import Any

import numpy as np
import torch

from ._devices import DEVICE_NAME

__all__ = ["Entry", "device_storage", "entry_of", "new_staged", "register_serialization", "staged", "wrap_pin_memory",
           "wrap_storage_constructor", "wrap_storage_nbytes", "wrap_storage_new", "wrap_storage_resize"]

_lock = threading.Lock()
_entries: dict[int, "Entry"] = {}  #: data pointer -> entry


class Entry:
    """What a torch storage on 'jax' holds.

    ``host``: the CPU storage whose bytes a staged storage lies over (None
    for a device storage).  ``storages``: per jax dtype, the device Storage
    of the tensors set on it with that dtype.  A staged storage owns them,
    as a torch storage owns its memory (``storage.to('jax')`` writes one
    through a uint8 tensor that is gone before the real tensor is set on
    it); a device storage holds its tensor's Storage weakly (the Storage
    holds it).  ``latest``: the dtype whose Storage was last handed out,
    the one to convert from when another dtype is asked for."""

    __slots__ = ("nbytes", "device_index", "host", "storages", "latest", "owner", "freed", "__weakref__")

    def __init__(self, nbytes: int, device_index: int, host: Any = None) -> None:
        self.nbytes = nbytes
        self.device_index = device_index
        self.host = host
        self.storages: dict[Any, Any] = {}
        self.latest: Any = None
        #: a device storage's own dtype: the only one whose Storage is shared
        #: (another is a snapshot of its bytes, made anew each time).
        self.owner: Any = None
        #: resize_(0) released the data (FSDP2 frees unsharded parameters so)
        self.freed = False

    def put(self, dtype: Any, storage: Any) -> None:
        dtype = np.dtype(dtype)
        self.storages[dtype] = storage if self.host is not None else weakref.ref(storage)
        self.latest = dtype

    def storage(self, dtype: Any) -> Any:
        """The live device Storage of ``dtype`` (a jax dtype), or None."""
        dtype = np.dtype(dtype)
        if self.owner is not None and dtype != self.owner:
            return None
        found = self.storages.get(dtype)
        if found is None or self.host is not None:
            return found
        return found()

    def newest(self) -> Any:
        """The Storage values are converted from (None: the host bytes):
        a device storage's own, else the last one handed out, else any that
        is still alive."""
        if self.owner is not None:
            return self.storage(self.owner)
        found = None if self.latest is None else self.storage(self.latest)
        if found is None:
            for dtype in list(self.storages):
                found = self.storage(dtype)
                if found is not None:
                    break
        return found


def entry_of(storage: torch.UntypedStorage) -> Entry | None:
    """The entry of a torch storage on 'jax' made here, or None."""
    if storage.device.type != DEVICE_NAME:
        return None
    try:
        return _entries.get(storage.data_ptr())
    except RuntimeError:  # a storage-less tensor's placeholder storage
        return None


def _make(ptr: int, nbytes: int, index: int, entry: Entry, release: Any) -> torch.UntypedStorage:
    storage = torch._C._construct_storage_from_data_pointer(ptr, torch.device(DEVICE_NAME, index), nbytes)
    with _lock:
        _entries[ptr] = entry
    weakref.finalize(storage, release, ptr)
    return storage


def _forget(ptr: int) -> None:
    with _lock:
        _entries.pop(ptr, None)


def staged(host: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    """A storage on 'jax:index' over the bytes of CPU storage ``host``
    (kept alive by it; nothing is copied)."""
    if host.device.type != "cpu":
        raise ValueError(f"pjrt_host: a staged storage lies over host memory, not {host.device}")
    nbytes = host.nbytes()
    if nbytes == 0:
        host = torch.empty(1, dtype=torch.uint8).untyped_storage()  # a pointer of its own
    return _make(host.data_ptr(), nbytes, index, Entry(nbytes, index, host), _forget)


def new_staged(nbytes: int, index: int) -> torch.UntypedStorage:
    """``torch.UntypedStorage(nbytes, device='jax:index')``: uninitialised,
    as torch's is; its host buffer is committed only where written."""
    host = torch.empty(max(int(nbytes), 1), dtype=torch.uint8).untyped_storage()
    return _make(host.data_ptr(), int(nbytes), index, Entry(int(nbytes), index, host), _forget)


# ---------------------------------------------------------------- device storages

_PAGE = mmap.PAGESIZE
_libc: Any = None


def _reserve(nbytes: int) -> int:
    """A read-only, uncommitted range of address space of ``nbytes``."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        _libc = libc
    size = max(nbytes, 1)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    ptr = _libc.mmap(None, size, mmap.PROT_READ, flags, -1, 0)
    if ptr is None or ptr == ctypes.c_void_p(-1).value:
        raise MemoryError(f"pjrt_host: could not reserve {size} bytes of address space for a 'jax' storage "
                          f"(errno {ctypes.get_errno()})")
    return ptr


def _release_reservation(nbytes: int):
    def release(ptr: int) -> None:
        _forget(ptr)
        if _libc is not None:
            _libc.munmap(ptr, max(nbytes, 1))

    return release


def device_storage(storage: Any, nbytes: int, index: int) -> torch.UntypedStorage:
    """The torch storage of device Storage ``storage`` (one per Storage,
    made on first use and kept by it)."""
    ptr = _reserve(nbytes)
    entry = Entry(nbytes, index)
    entry.put(storage.jax_dtype, storage)
    entry.owner = np.dtype(storage.jax_dtype)
    return _make(ptr, nbytes, index, entry, _release_reservation(nbytes))


def nbytes(storage: torch.UntypedStorage) -> int | None:
    """A 'jax' storage's size as torch reports it (0 once freed), or None
    for a storage not made here."""
    entry = entry_of(storage)
    if entry is None:
        return None
    return 0 if entry.freed else entry.nbytes


def resize(storage: torch.UntypedStorage, size: int) -> bool:
    """``storage.resize_(size)`` of a 'jax' storage: 0 releases the device
    memory of the tensors over it (their values become unspecified, as
    torch's are after freeing); its own size brings it back (the next write
    fills it).  False for a storage not made here."""
    entry = entry_of(storage)
    if entry is None:
        return False
    size = int(size)
    if size == 0:
        for dtype in list(entry.storages):
            found = entry.storage(dtype)
            if found is not None:
                found.array = None  # lazily zeros again; the old array is released
        entry.freed = True
    elif size == entry.nbytes:
        entry.freed = False
    else:
        raise RuntimeError(
            f"pjrt_host: a '{DEVICE_NAME}' storage of {entry.nbytes} bytes can be resized to 0 (freed) or back to "
            f"{entry.nbytes}, not to {size}: its tensors' shapes are fixed. Make a new tensor instead.")
    return True


# ---------------------------------------------------------------- torch.load

_LOCATION = re.compile(rf"{DEVICE_NAME}(:(\d+))?$")


def _tag(obj: Any) -> str | None:
    return None  # torch's own privateuse1 tagger names 'jax:N' storages


def _deserialize(obj: Any, location: str) -> torch.UntypedStorage | None:
    """torch.load's restore step for a storage whose location is 'jax[:N]'
    (as saved, or as map_location says): lay it over the bytes just read."""
    m = _LOCATION.match(location)
    if m is None:
        return None
    index = int(m.group(2) or 0)
    from . import _devices

    count = _devices.count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"Attempting to deserialize object on '{DEVICE_NAME}' device {index} but torch.{DEVICE_NAME}."
            f"device_count() is {count}. Please use torch.load with map_location to map your storages to an "
            f"existing device (e.g. map_location='{DEVICE_NAME}:0' or 'cpu').")
    if obj.device.type == DEVICE_NAME:
        return obj
    if obj.device.type != "cpu":
        obj = obj.cpu()
    return staged(obj, index)


_serialization_registered = False


def register_serialization() -> None:
    """Put the deserializer ahead of torch's generic privateuse1 one (which
    would build an allocator-less storage).  Idempotent."""
    global _serialization_registered
    if _serialization_registered:
        return
    import torch.serialization as serialization

    # Before torch's generic privateuse1 entry; torch sorts the entries by
    # priority alone, so take one no other entry has.
    taken = {entry[0] for entry in serialization._package_registry}
    generic = min((entry[0] for entry in serialization._package_registry if entry[0] >= 23), default=23)
    priority = next(p for p in range(generic - 1, -1000, -1) if p not in taken)
    serialization.register_package(priority, _tag, _deserialize)
    _serialization_registered = True


# ---------------------------------------------------------------- torch's storage API for 'jax'
#
# The wrappers below replace torch's own (``_patches`` installs them, each
# once); every device but 'jax' goes to torch's original as before.

def wrap_pin_memory(original: Any) -> Any:
    """``tensor.pin_memory()`` with no device pins for the current
    accelerator, which is now 'jax'; torch's pinned allocator for it would
    have to come from C++ hooks a Python backend cannot register, and PJRT
    copies from any host memory anyway.  So pinning for 'jax' returns the
    tensor as it is (unpinned) -- what a CPU-only program got before the
    device existed (e.g. ``DataLoader(pin_memory=True)``)."""
    def pin_memory(self, device=None):
        target = device
        if target is None:
            acc = torch._C._accelerator_getAccelerator()
            target = acc.type if acc is not None else None
        elif not isinstance(target, str):
            target = torch.device(target).type
        if target is not None and str(target).split(":", 1)[0] == DEVICE_NAME:
            return self
        return original(self) if device is None else original(self, device)

    pin_memory.__doc__ = original.__doc__
    return pin_memory


def wrap_storage_constructor(original: Any) -> Any:
    """``torch.UntypedStorage(n, device='jax')`` (and ``(sequence, device=
    'jax')``): torch's constructor asks the device's C++ allocator, which a
    Python backend cannot register, and dereferences a null one (the process
    ends).  For 'jax' it makes a storage of this module instead."""
    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == DEVICE_NAME:
            return _new_device_storage(args, kwargs)
        return original(cls, *args, **kwargs)

    return __new__


def wrap_storage_new(original: Any) -> Any:
    """``storage.new()``: an empty storage of the same device, through the
    same missing allocator."""

    def new(self):
        if self.device.type == DEVICE_NAME:
            return new_staged(0, self.device.index or 0)
        return original(self)

    new.__doc__ = original.__doc__
    return new


# resize_ / nbytes: FSDP2 frees and re-allocates unsharded parameters through
# their storage (resize_(0), resize_(n), size()); torch would ask the
# device's C++ hooks, which a Python backend cannot fill.

def wrap_storage_resize(original: Any) -> Any:
    def resize_(self, size):
        if self.device.type == DEVICE_NAME and resize(self, size):
            return self
        return original(self, size)

    resize_.__doc__ = original.__doc__
    return resize_


def wrap_storage_nbytes(original: Any) -> Any:
    def nbytes_(self):
        if self.device.type == DEVICE_NAME:
            found = nbytes(self)
            if found is not None:
                return found
        return original(self)

    nbytes_.__doc__ = original.__doc__
    nbytes_.__name__ = nbytes_.__qualname__ = "nbytes"
    return nbytes_


def _new_device_storage(args: tuple, kwargs: dict) -> Any:
    from ._devices import device_index

    extra = sorted(set(kwargs) - {"device"})
    if extra or len(args) > 1:
        raise TypeError(f"pjrt_host: torch.UntypedStorage(..., device='{DEVICE_NAME}') takes a size or a "
                        f"sequence of bytes, not {extra or args[1:]}")
    index = device_index(kwargs["device"])
    data = args[0] if args else 0
    if isinstance(data, int):
        if data < 0:
            raise RuntimeError(f"Storage size must be non-negative, got {data}")
        return new_staged(data, index)
    host = torch.UntypedStorage(data)  # torch's checks of a byte sequence, on the CPU
    return staged(host, index)
