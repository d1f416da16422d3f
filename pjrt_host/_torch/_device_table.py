"""'jax:N' -> the selected plugin's N-th jax device (creates the client)."""

from __future__ import annotations

from typing import Any

__all__ = ["device", "count", "sharding"]

_devices: list[Any] | None = None
_shardings: dict[int, Any] = {}


def _all() -> list[Any]:
    global _devices
    if _devices is None:
        import jax

        from .. import _runtime

        devs = _runtime.devices()
        # torch keeps int64 and float64 as they are: jax must too.
        jax.config.update("jax_enable_x64", True)
        _devices = devs
    return _devices


def count() -> int:
    return len(_all())


def device(index: int) -> Any:
    devs = _all()
    if not 0 <= index < len(devs):
        from . import DEVICE_NAME

        raise RuntimeError(
            f"Invalid device '{DEVICE_NAME}:{index}': the selected plugin has {len(devs)} device(s) "
            f"({DEVICE_NAME}:0 ... {DEVICE_NAME}:{len(devs) - 1})")
    return devs[index]


def sharding(index: int) -> Any:
    s = _shardings.get(index)
    if s is None:
        import jax

        s = _shardings[index] = jax.sharding.SingleDeviceSharding(device(index))
    return s
