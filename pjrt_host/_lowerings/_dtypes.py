"""torch dtype <-> jax dtype, in one place.  Imports torch and jax, so only
the device and the lowerings import it (never ``import pjrt_host``)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

__all__ = ["instead_of", "jax_dtype", "torch_dtype"]

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
                         ("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
                         ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float8_e5m2fnuz", "float8_e5m2fnuz"),
                         ("float8_e8m0fnu", "float8_e8m0fnu")):
    # Newer dtypes: present in these versions, looked up defensively.
    if hasattr(torch, _name) and hasattr(jnp, _jax_name):
        _TORCH_TO_JAX[getattr(torch, _name)] = getattr(jnp, _jax_name)
# As numpy dtype objects, the form a jax array's ``.dtype`` has: a storage's
# dtype then keys programs the same way whether it came from a torch dtype
# (a factory, a fused-eager result) or from an array (an op's result).
# ``np.dtype('int64') == jnp.int64`` but their hashes and reprs differ, so
# the two forms made two in-memory keys and two disk entries of one program.
_TORCH_TO_JAX = {k: np.dtype(v) for k, v in _TORCH_TO_JAX.items()}

_JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}


def instead_of(dtype: torch.dtype) -> str:
    """What to use for a torch dtype jax cannot hold (for error messages)."""
    if dtype.is_complex:
        return "torch.complex64 (convert with .to(torch.complex64) before moving to the device)"
    if "float8" in str(dtype) or dtype.is_floating_point:
        return "torch.float16, torch.bfloat16 or torch.float32"
    if "int" in str(dtype) and not dtype.is_signed:
        return "the next wider integer type, e.g. torch.int64"
    return "a dtype jax has (float16/bfloat16/float32/float64, int8...int64, uint8, bool, complex64/complex128)"


def jax_dtype(dtype: torch.dtype) -> Any:
    """The jax dtype for a torch dtype; TypeError naming it, and what to use
    instead, if there is none."""
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"pjrt_host: torch dtype {dtype} has no jax equivalent, so tensors on the 'jax' device "
                        f"cannot hold it; use {instead_of(dtype)}") from None


_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``str(dtype)`` of a jax / numpy or torch dtype, kept: numpy builds a
    dtype's name in Python (about 2 us), and program keys built per call
    (a cast's, a join's, an index check's) name theirs."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype)
    return name


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype for a jax / numpy dtype."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"pjrt_host: jax dtype {dtype} has no torch equivalent") from None
