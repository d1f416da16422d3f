"""Every environment variable the GPU plugin reads, one small function each.

Where torch_xla's GPU plugin and jax's CUDA wheels each have a name for the
same setting, the torch_xla name wins and the jax name is the fallback, so
that environments written for either keep working.  A value that cannot be
parsed raises ValueError naming the variable and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "ALLOCATORS",
    "allocator",
    "cuda_visible_devices",
    "device_count_override",
    "library_path_override",
    "memory_fraction",
    "preallocate",
    "rank",
    "world_size",
]

#: Allocators the CUDA PJRT plugin accepts for its ``allocator`` option.
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def library_path_override(environ: Mapping[str, str] = os.environ) -> str | None:
    """``PJRT_HOST_CUDA_LIBRARY_PATH``: the CUDA PJRT library to load instead
    of the one from jax's PJRT wheels.  Default: unset."""
    return _get(environ, "PJRT_HOST_CUDA_LIBRARY_PATH")


def cuda_visible_devices(environ: Mapping[str, str] = os.environ) -> str | None:
    """``CUDA_VISIBLE_DEVICES``, as the CUDA driver reads it: None when unset
    (every GPU is visible); an empty string hides every GPU."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return None if value is None else value.strip()


def device_count_override(environ: Mapping[str, str] = os.environ) -> int | None:
    """``GPU_NUM_DEVICES``: the number of GPUs to report instead of counting
    them (e.g. where /proc and /dev do not show the driver).  Default: unset."""
    value = _get(environ, "GPU_NUM_DEVICES")
    if value is None:
        return None
    count = _int(value, "GPU_NUM_DEVICES", "a whole number of GPUs")
    if count < 0:
        raise ValueError(f"GPU_NUM_DEVICES={value!r} is negative; expected a whole number of GPUs")
    return count


def memory_fraction(environ: Mapping[str, str] = os.environ) -> float | None:
    """``PJRT_ALLOCATOR_FRACTION`` (else jax's ``XLA_CLIENT_MEM_FRACTION`` or
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``): the fraction of each GPU's memory
    the allocator may take, in (0, 1].  Default: unset, the plugin's own
    default (0.75)."""
    for name in ("PJRT_ALLOCATOR_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        value = _get(environ, name)
        if value is None:
            continue
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{name}={value!r} is not a fraction of GPU memory; expected a number in (0, 1], e.g. 0.5")
        return fraction
    return None


def preallocate(environ: Mapping[str, str] = os.environ) -> bool | None:
    """``PJRT_ALLOCATOR_PREALLOCATE`` (else jax's
    ``XLA_PYTHON_CLIENT_PREALLOCATE``): whether the allocator takes its whole
    memory fraction when the client is created.  Default: unset, the
    plugin's own default (true)."""
    for name in ("PJRT_ALLOCATOR_PREALLOCATE", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        value = _get(environ, name)
        if value is not None:
            return _bool(value, name)
    return None


def allocator(environ: Mapping[str, str] = os.environ) -> str | None:
    """``PJRT_ALLOCATOR`` (else torch_xla's ``PJRT_ALLOCATOR_CUDA_ASYNC=1``,
    else jax's ``XLA_PYTHON_CLIENT_ALLOCATOR``): one of :data:`ALLOCATORS`.
    Default: unset, the plugin's ``default`` (BFC)."""
    value = _get(environ, "PJRT_ALLOCATOR")
    name = "PJRT_ALLOCATOR"
    if value is None:
        cuda_async = _get(environ, "PJRT_ALLOCATOR_CUDA_ASYNC")
        if cuda_async is not None and _bool(cuda_async, "PJRT_ALLOCATOR_CUDA_ASYNC"):
            return "cuda_async"
        value, name = _get(environ, "XLA_PYTHON_CLIENT_ALLOCATOR"), "XLA_PYTHON_CLIENT_ALLOCATOR"
    if value is None:
        return None
    if value.lower() not in ALLOCATORS:
        raise ValueError(f"{name}={value!r} is not a GPU allocator; expected one of {', '.join(ALLOCATORS)}")
    return value.lower()


def rank(environ: Mapping[str, str] = os.environ) -> int:
    """``RANK`` (set by torchrun): this process's index among all processes
    of the job.  Default 0."""
    value = _get(environ, "RANK")
    return 0 if value is None else _int(value, "RANK", "a whole number")


def world_size(environ: Mapping[str, str] = os.environ) -> int:
    """``WORLD_SIZE`` (set by torchrun): the number of processes of the job,
    on all hosts.  Default 1."""
    value = _get(environ, "WORLD_SIZE")
    return 1 if value is None else max(1, _int(value, "WORLD_SIZE", "a whole number"))


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _int(value: str, name: str, expected: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not {expected}") from None


def _bool(value: str, name: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; expected 1/0, true/false, yes/no or on/off")
