"""Acme's vendor kernels (``AcmePlugin.kernels``): the host imports this
module once Acme's client exists, never at ``python -m pjrt_host list``.

A kernel has the signature of the host's reference lowering of its op: jax
arrays for tensors, the op's other arguments as torch passes them.  This one
is plain jax; a kernel may also call ``jax.ffi.ffi_call`` into a custom-call
target this module registers on import (``jax.ffi.register_ffi_target``,
see pjrt_host_cpu_ref/_kernels/softmax.py), or a Pallas kernel.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["silu"]


def silu(x):
    """``aten::silu(x)``: x * sigmoid(x), in one expression Acme's compiler
    fuses into a single pass (declared for float32 only: torch computes
    16-bit inputs in float32, and this kernel would not)."""
    return x / (1 + jnp.exp(-x))
