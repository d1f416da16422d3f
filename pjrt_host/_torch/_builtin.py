"""The accelerator a torch build carries itself (CUDA, ROCm, XPU, MPS).

torch makes a registered PrivateUse1 device *the* accelerator of the
process, in place of its own; see :func:`pjrt_host._torch.autoload` for why
that decides when the 'jax' device registers.  These names are torch's
built-in device types, not plugin names.
"""

from __future__ import annotations

__all__ = ["torch_own_accelerator_available", "torch_own_accelerator_built"]


def torch_own_accelerator_built() -> str | None:
    """The accelerator this torch build carries itself ('cuda', 'hip', 'xpu',
    'mps'), or None for a CPU build.  Read from build flags only: cheap, and
    no driver is touched."""
    import torch

    version = torch.version
    for name in ("cuda", "hip", "xpu"):
        if getattr(version, name, None):
            return name
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_built():
        return "mps"
    return None


def torch_own_accelerator_available() -> str | None:
    """:func:`torch_own_accelerator_built`, if its device is usable here
    (asks the driver: only for an explicit registration)."""
    import torch

    own = torch_own_accelerator_built()
    if own in ("cuda", "hip"):
        return own if torch.cuda.is_available() else None
    if own == "xpu":
        return own if torch.xpu.is_available() else None
    if own == "mps":
        return own if torch.backends.mps.is_available() else None
    return None
