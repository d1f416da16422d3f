"""Which dtype a tensor has on the device: torch's, unless the plugin maps
it (``DevicePlugin.unsupported_dtypes``, e.g. float64 -> float32 on a chip
without 64-bit floats), which is warned once per dtype."""

from __future__ import annotations

import warnings

import torch

from .. import _runtime
from .._errors import user_stacklevel

__all__ = ["device_dtype"]

_dtype_map: dict[torch.dtype, torch.dtype] | None = None
# torch dtypes jax has no type for (lookups by name: newer torch releases add some).
_UNHELD = frozenset(getattr(torch, n) for n in ("complex32", "quint8", "qint8", "qint32", "quint4x2", "quint2x4",
                                               "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")
                    if isinstance(getattr(torch, n, None), torch.dtype))


def _unheld(dtype: torch.dtype) -> None:
    from .._lowerings._dtypes import jax_dtype  # raises the error naming the dtype and what to use

    jax_dtype(dtype)
_warned: set[torch.dtype] = set()
_bad: dict[torch.dtype, str] = {}  # mappings to a dtype the device cannot hold either: their error


def _mapping() -> dict[torch.dtype, torch.dtype]:
    global _dtype_map
    if _dtype_map is None:
        mapping = {}
        from .._lowerings._dtypes import jax_dtype

        for src, dst in dict(getattr(_runtime.plugin(), "unsupported_dtypes", {}) or {}).items():
            s, d = getattr(torch, src, None), getattr(torch, dst, None)
            if isinstance(s, torch.dtype) and isinstance(d, torch.dtype):
                try:
                    jax_dtype(d)
                except TypeError as err:  # raised when such a tensor is made, not for every tensor
                    record = _runtime.runtime().record
                    _bad[s] = (f"pjrt_host: plugin {record.name!r} ({record.origin()}) declares unsupported_dtypes "
                               f"{{{src!r}: {dst!r}}}, but {dst} cannot be held either ({err}); the plugin must "
                               f"map {src} to a dtype jax has: report it to its maintainers")
                mapping[s] = d
        _dtype_map = mapping
    return _dtype_map


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` has on the device; TypeError naming
    the dtype and what to use instead for one the device cannot hold."""
    if dtype in _UNHELD:
        _unheld(dtype)
    mapping = _mapping()
    if not mapping:
        return dtype
    if dtype in _bad:
        raise TypeError(_bad[dtype])
    mapped = mapping.get(dtype, dtype)
    if mapped is not dtype and dtype not in _warned:
        _warned.add(dtype)
        warnings.warn(
            f"pjrt_host: the {_runtime.runtime().record.name!r} device does not support {dtype}; "
            f"such tensors are {mapped} on it (warned once)", stacklevel=user_stacklevel())
    return mapped
