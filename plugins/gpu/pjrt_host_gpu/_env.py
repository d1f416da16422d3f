"""Every environment variable the GPU plugin reads, one small function each.

Where torch_xla's GPU plugin and jax's CUDA wheels each have a name for the
same setting, the torch_xla name wins and the jax name is the fallback, so
that environments written for either keep working.  The values are read by
the host's parsers (:mod:`pjrt_host.env`): one that cannot be read raises
``pjrt_host.EnvironmentSettingError`` (a ValueError) naming the variable
and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pjrt_host import env

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

def library_path_override(environ: Mapping[str, str] = os.environ) -> str | None:
    """``PJRT_HOST_CUDA_LIBRARY_PATH``: the CUDA PJRT library to load instead
    of the one from jax's PJRT wheels.  Default: unset."""
    return env.text("PJRT_HOST_CUDA_LIBRARY_PATH", environ=environ)


def cuda_visible_devices(environ: Mapping[str, str] = os.environ) -> str | None:
    """``CUDA_VISIBLE_DEVICES``, as the CUDA driver reads it: None when unset
    (every GPU is visible); an empty string hides every GPU."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return None if value is None else value.strip()


def device_count_override(environ: Mapping[str, str] = os.environ) -> int | None:
    """``GPU_NUM_DEVICES``: the number of GPUs to report instead of counting
    them (e.g. where /proc and /dev do not show the driver).  Default: unset."""
    return env.integer("GPU_NUM_DEVICES", minimum=0, expected="a whole number of GPUs", environ=environ)


def memory_fraction(environ: Mapping[str, str] = os.environ) -> float | None:
    """``PJRT_ALLOCATOR_FRACTION`` (else jax's ``XLA_CLIENT_MEM_FRACTION`` or
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``): the fraction of each GPU's memory
    the allocator may take, in (0, 1].  Default: unset, the plugin's own
    default (0.75)."""
    for name in ("PJRT_ALLOCATOR_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        fraction = env.number(name, above=0, maximum=1, expected="a fraction of GPU memory, e.g. 0.5",
                              environ=environ)
        if fraction is not None:
            return fraction
    return None


def preallocate(environ: Mapping[str, str] = os.environ) -> bool | None:
    """``PJRT_ALLOCATOR_PREALLOCATE`` (else jax's
    ``XLA_PYTHON_CLIENT_PREALLOCATE``): whether the allocator takes its whole
    memory fraction when the client is created.  Default: unset, the
    plugin's own default (true)."""
    for name in ("PJRT_ALLOCATOR_PREALLOCATE", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        value = env.flag(name, None, environ=environ)
        if value is not None:
            return value
    return None


def allocator(environ: Mapping[str, str] = os.environ) -> str | None:
    """``PJRT_ALLOCATOR`` (else torch_xla's ``PJRT_ALLOCATOR_CUDA_ASYNC=1``,
    else jax's ``XLA_PYTHON_CLIENT_ALLOCATOR``): one of :data:`ALLOCATORS`.
    Default: unset, the plugin's ``default`` (BFC)."""
    chosen = env.choice("PJRT_ALLOCATOR", ALLOCATORS, expected="a GPU allocator", environ=environ)
    if chosen is not None:
        return chosen
    if env.flag("PJRT_ALLOCATOR_CUDA_ASYNC", False, environ=environ):
        return "cuda_async"
    return env.choice("XLA_PYTHON_CLIENT_ALLOCATOR", ALLOCATORS, expected="a GPU allocator", environ=environ)


def rank(environ: Mapping[str, str] = os.environ) -> int:
    """``RANK`` (set by torchrun): this process's index among all processes
    of the job.  Default 0."""
    return env.integer("RANK", 0, environ=environ)


def world_size(environ: Mapping[str, str] = os.environ) -> int:
    """``WORLD_SIZE`` (set by torchrun): the number of processes of the job,
    on all hosts.  Default 1."""
    return max(1, env.integer("WORLD_SIZE", 1, environ=environ))

