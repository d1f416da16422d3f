"""The accelerator torch itself would use in this process (its CUDA, ROCm,
XPU or MPS device), asked of torch before the 'jax' device is named.

torch makes a registered PrivateUse1 device *the* accelerator of the
process, in place of its own; see :func:`pjrt_host._torch.autoload` for why
that decides when the 'jax' device registers.  torch answers for its own
devices (``torch._C._get_accelerator``), so no device is named here.  On a
CPU build the answer is immediate; on a build with a device runtime torch
asks the driver once, as ``torch.cuda.is_available()`` does.
"""

from __future__ import annotations

__all__ = ["torch_own_accelerator"]


def torch_own_accelerator() -> str | None:
    """The device type of torch's own usable accelerator, or None (a CPU
    build, no device, or PrivateUse1 already named, when torch can no longer
    tell)."""
    import torch

    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        return None
    try:
        found = torch._C._get_accelerator()
    except Exception:  # torch could not ask its runtime: behave as on a CPU build
        return None
    return None if found is None or found.type == "cpu" else found.type
