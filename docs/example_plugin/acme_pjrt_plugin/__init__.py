"""pjrt_host device plugin for the Acme accelerator (an example to copy).

A real vendor ships its PJRT C API library (the shared object exporting
``GetPjrtApi``) inside this package, under ``lib/``, and returns its path
from ``library_path()``.  This example has no hardware behind it, so when no
library is bundled it runs on jaxlib's built-in CPU backend: everything else
(discovery, selection, create options, multi-process set-up) works the same.
"""

from __future__ import annotations

import os
from pathlib import Path

from pjrt_host import DevicePlugin, Kernel, env

__all__ = ["AcmePlugin"]

_BUNDLED = Path(__file__).parent / "lib" / "libacme_pjrt.so"


def _library_override() -> str | None:
    """``ACME_PJRT_LIBRARY``: use this library instead of the bundled one.
    Default: unset, the bundled library."""
    return env.text("ACME_PJRT_LIBRARY")


def _visible_chips() -> str | None:
    """``ACME_VISIBLE_CHIPS``: comma-separated chip ids this process may use.
    Default: unset, every chip.  A value that is not a list of chip ids
    raises pjrt_host.EnvironmentSettingError naming the variable."""
    chips = env.integers("ACME_VISIBLE_CHIPS", minimum=0, expected="a chip id (the list is comma-separated, e.g. 0,1)")
    return None if chips is None else ",".join(map(str, chips))


class AcmePlugin(DevicePlugin):
    display_name = "Acme accelerator"
    priority = 200  # chosen over cpu_ref (0) when PJRT_DEVICE is unset
    unsupported_dtypes = {"float64": "float32"}  # Acme has no fp64 units
    # Vendor kernels, by strings: "on Acme, aten::silu is this function"
    # (imported only once the client exists; docs/writing-a-plugin.md).
    kernels = {"aten::silu": Kernel("acme_pjrt_plugin.kernels:silu", dtypes=("float32",))}

    def library_path(self) -> str | None:
        override = _library_override()
        if override:
            return override
        if _BUNDLED.exists():
            return str(_BUNDLED)
        return None  # example only: fall back to jaxlib's CPU backend

    def physical_chip_count(self) -> int:
        if self.library_path() is None:
            return 1  # the CPU stand-in of this example
        # Count chips without initialising the runtime: here, device nodes.
        return len(list(Path("/dev").glob("acme[0-9]*")))

    def client_create_options(self) -> dict[str, object]:
        chips = _visible_chips()
        return {"visible_chips": chips} if chips else {}

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        # One chip per process, unless the user already chose.
        os.environ.setdefault("ACME_VISIBLE_CHIPS", str(local_rank))
