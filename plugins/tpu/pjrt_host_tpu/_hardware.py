"""Counting TPU chips from PCI, without loading libtpu.

Every TPU chip is a PCI device with Google's vendor id.  Google's vendor id
also covers other devices (gVNIC network cards on GCE), so only the device
ids of TPU generations count.  The sysfs root is an argument, so tests point
it at a fake tree.
"""

from __future__ import annotations

import os

__all__ = ["GOOGLE_PCI_VENDOR_ID", "SYSFS_PCI_DEVICES", "TPU_PCI_DEVICE_IDS", "pci_tpu_chips", "visible_chip_count"]

#: Where the kernel lists PCI devices, one folder each with ``vendor`` and
#: ``device`` files holding hexadecimal ids.
SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"

GOOGLE_PCI_VENDOR_ID = "0x1ae0"

#: PCI device id -> TPU generation (as jax's hardware_utils lists them).
TPU_PCI_DEVICE_IDS = {
    "0x0027": "v2/v3",
    "0x0056": "plc",
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "tpu7x",
}


def pci_tpu_chips(pci_devices: str = SYSFS_PCI_DEVICES) -> list[str]:
    """The PCI addresses of the TPU chips on this host, sorted."""
    chips = []
    try:
        entries = sorted(os.listdir(pci_devices))
    except OSError:  # no sysfs (a sandbox, another OS)
        return []
    for entry in entries:
        folder = os.path.join(pci_devices, entry)
        if _read(os.path.join(folder, "vendor")) != GOOGLE_PCI_VENDOR_ID:
            continue
        if _read(os.path.join(folder, "device")) in TPU_PCI_DEVICE_IDS:
            chips.append(entry)
    return chips


def visible_chip_count(chips: int, visible: list[int] | None) -> int:
    """How many of ``chips`` chips a process sees with ``TPU_VISIBLE_CHIPS``
    set to ``visible`` (None: all); indices that do not exist do not count."""
    if visible is None:
        return chips
    return len({index for index in visible if 0 <= index < chips})


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip().lower()
    except OSError:
        return None
