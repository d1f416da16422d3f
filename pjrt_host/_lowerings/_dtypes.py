"""torch dtype <-> jax dtype, in one place.  Imports torch and jax, so only
the device and the lowerings import it (never ``import pjrt_host``)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

__all__ = ["jax_dtype", "torch_dtype"]

_TORCH_TO_JAX: dict[torch.dtype, Any] = {
    torch.bool: jnp.bool_,
    torch.uint8: jnp.uint8,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
}
for _name, _jax_name in (("uint16", "uint16"), ("uint32", "uint32"), ("uint64", "uint64"),
                         ("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")):
    # Newer dtypes: present in these versions, looked up defensively.
    if hasattr(torch, _name) and hasattr(jnp, _jax_name):
        _TORCH_TO_JAX[getattr(torch, _name)] = getattr(jnp, _jax_name)

_JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}


def jax_dtype(dtype: torch.dtype) -> Any:
    """The jax dtype for a torch dtype; TypeError naming it if there is none."""
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"pjrt_host: torch dtype {dtype} has no jax equivalent") from None


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype for a jax / numpy dtype."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"pjrt_host: jax dtype {dtype} has no torch equivalent") from None
