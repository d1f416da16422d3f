"""Counting NVIDIA GPUs without initialising CUDA in the calling process.

Creating a CUDA context (or even calling ``cuInit``) before the PJRT client
exists would pin memory, break ``fork``-based launchers and make
``python -m pjrt_host list`` slow, so GPUs are counted from what the kernel
driver publishes:

* ``/dev/nvidiaN``: one character device per GPU this process may open.  In
  a container this is the container's share, so it is preferred.
* ``/proc/driver/nvidia/gpus/<pci-bus-id>/``: one folder per GPU the driver
  manages (the whole machine, even inside a container); used when the
  device nodes are not created yet (they may be created on first use).

``CUDA_VISIBLE_DEVICES`` is then applied the way the CUDA driver applies it.
Both roots are arguments, so tests point them at a fake tree.
"""

from __future__ import annotations

import os
import re

__all__ = ["DEV_ROOT", "PROC_NVIDIA_GPUS", "installed_gpus", "visible_gpu_count"]

#: The driver's per-GPU folders (``information`` holds the GPU's UUID).
PROC_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
#: Where the driver's device nodes (``nvidia0``, ``nvidia1``...) live.
DEV_ROOT = "/dev"

_DEVICE_NODE = re.compile(r"nvidia(\d+)")
_UUID_LINE = re.compile(r"^GPU UUID:\s*(\S+)", re.MULTILINE)


def installed_gpus(proc_gpus: str = PROC_NVIDIA_GPUS, dev_root: str = DEV_ROOT) -> tuple[int, list[str]]:
    """The number of GPUs this process can see before ``CUDA_VISIBLE_DEVICES``
    applies, and the UUIDs the driver reports (possibly empty)."""
    nodes = [name for name in _listdir(dev_root) if _DEVICE_NODE.fullmatch(name)]
    folders = sorted(_listdir(proc_gpus))
    uuids = []
    for folder in folders:
        try:
            with open(os.path.join(proc_gpus, folder, "information"), encoding="utf-8", errors="replace") as f:
                match = _UUID_LINE.search(f.read())
        except OSError:
            continue
        if match:
            uuids.append(match.group(1))
    return (len(nodes) if nodes else len(folders)), uuids


def visible_gpu_count(installed: int, uuids: list[str], cuda_visible_devices: str | None) -> int:
    """How many GPUs CUDA will enumerate, given ``CUDA_VISIBLE_DEVICES``.

    As in the CUDA driver: unset means every GPU; an empty value hides them
    all; otherwise entries (indices, ``GPU-<uuid>`` prefixes or ``MIG-``
    identifiers) are taken in order up to the first one that is invalid or
    repeated, which ends the list.
    """
    if cuda_visible_devices is None:
        return installed
    count = 0
    seen: set[str] = set()
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not entry or entry in seen or not _valid_entry(entry, installed, uuids):
            break
        seen.add(entry)
        count += 1
    return count


def _valid_entry(entry: str, installed: int, uuids: list[str]) -> bool:
    if re.fullmatch(r"-?\d+", entry):
        return 0 <= int(entry) < installed
    if entry.startswith("GPU-"):
        # Without the driver's UUID list the entry cannot be checked here;
        # CUDA will, when the client starts.
        return installed > 0 and (not uuids or any(u.startswith(entry) for u in uuids))
    if entry.startswith("MIG-"):
        return installed > 0
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # no driver, no /proc in a sandbox, no permission
        return []
