"""``aten::_softmax`` as an XLA FFI custom call into C++ (``softmax.cc``).

The target is registered for the CPU platform when this module is imported:
the host imports it once the client exists, before any program that calls
it is compiled or loaded from disk.
"""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp

from ._build import library

__all__ = ["TARGET", "softmax", "softmax_applies"]

#: The custom-call target name, registered for the "cpu" platform.
TARGET = "pjrt_host_cpu_ref_softmax"

# Loaded once per process and never unloaded: XLA keeps the handler's address.
_library = ctypes.cdll.LoadLibrary(str(library("softmax.cc")))
jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_library.PjrtHostCpuRefSoftmax), platform="cpu")


def softmax_applies(x, dim, half_to_float=False, *, dtype=None) -> bool:
    """The C++ kernel's condition: float32 in and out, over the last dimension.
    (The same lowering serves ``softmax.int(x, dim, dtype)``, whose third
    argument is a dtype.)"""
    return (half_to_float is False and dtype is None and x.ndim >= 1 and x.dtype == jnp.float32
            and dim in (-1, x.ndim - 1) and x.size > 0)


def softmax(x, dim, half_to_float=False, *, dtype=None):
    """``aten::_softmax(x, dim, half_to_float)`` as one custom call."""
    return _last_dim_softmax(x)


# torch's autograd differentiates the op through aten::_softmax_backward_data
# (a kernel of its own); jax differentiates traced programs itself
# (assume_pure's backward is jax.vjp of its forward), and a custom call has
# no derivative unless it is given one.
@jax.custom_vjp
def _last_dim_softmax(x):
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype), vmap_method="broadcast_all")(x)


def _forward(x):
    y = _last_dim_softmax(x)
    return y, y


def _backward(y, g):
    return (y * (g - jnp.sum(g * y, axis=-1, keepdims=True)),)


_last_dim_softmax.defvjp(_forward, _backward)
