"""pjrt_host_gpu: NVIDIA GPUs as a pjrt_host device (plugin name ``cuda``).

The PJRT C API library is the one jax ships in its PJRT wheels
(``jax-cuda13-pjrt`` or ``jax-cuda12-pjrt``, the ``cuda13`` / ``cuda12``
extras of this distribution).  Nothing here imports jax, torch or the CUDA
runtime: GPUs are counted from the driver's files in ``/proc`` and ``/dev``.
"""

from __future__ import annotations

from ._plugin import CudaPlugin, library_candidates

__all__ = ["CudaPlugin", "library_candidates"]
