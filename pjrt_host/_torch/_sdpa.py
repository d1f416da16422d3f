"""Which ``scaled_dot_product_attention`` backend 'jax' runs, against the
backends ``torch.nn.attention.sdpa_kernel`` allows.

torch picks a backend per device (``_fused_sdp_choice``), reading the flags
that ``sdpa_kernel`` and ``torch.backends.cuda.enable_*_sdp`` set; for a
PrivateUse1 device it asks a C++ dispatch stub that Python cannot register,
and without one it runs the math formulation whatever the flags say.  The
device has that one backend, ``SDPBackend.MATH`` (torch's math formulation,
run as XLA programs), so it is what 'jax' runs while the flags allow it;
with MATH turned off nothing is left, and 'jax' raises torch's own error as
CPU does when the backends allowed are ones it lacks.
``torch._fused_sdp_choice`` of 'jax' tensors answers the same way.

Checked by a kernel at ``AutogradPrivateUse1`` (the composite's entry with
autograd on) and by the dispatcher in inference mode, where the op reaches
the device undecomposed.  That kernel runs the math formulation as one op
forward and one backward on the device's own tensors
(``_boot._autograd_kernels._Attention``), and as torch's composite of ops
elsewhere.
"""

from __future__ import annotations

import torch

from ._devices import DEVICE_NAME

__all__ = ["BACKENDS", "check_backends", "choice", "enabled_backends"]

#: The SDPBackend names the device has.
BACKENDS = ("MATH",)

#: SDPBackend name -> torch's flag for it (what sdpa_kernel sets).
_FLAGS = (("MATH", "_get_math_sdp_enabled"), ("FLASH_ATTENTION", "_get_flash_sdp_enabled"),
          ("EFFICIENT_ATTENTION", "_get_mem_efficient_sdp_enabled"), ("CUDNN_ATTENTION", "_get_cudnn_sdp_enabled"),
          ("OVERRIDEABLE", "_get_overrideable_sdp_enabled"))

#: torch's words when no backend is left (CPU's error, as its kernels raise it).
NO_BACKEND = ("No viable backend for scaled_dot_product_attention was found. This is likely due to turning off "
              "both the math kernel and the fused kernels.")


def enabled_backends() -> list[str]:
    """The SDPBackend names torch's flags allow now."""
    return [name for name, flag in _FLAGS if getattr(torch._C, flag, lambda: False)()]


def check_backends() -> None:
    """Raise torch's RuntimeError where the flags allow none of
    :data:`BACKENDS`; the message says what the device has and the fix."""
    if torch._C._get_math_sdp_enabled():
        return
    asked = ", ".join(f"SDPBackend.{name}" for name in enabled_backends()) or "none"
    raise RuntimeError(
        f"{NO_BACKEND} (pjrt_host: on the '{DEVICE_NAME}' device scaled_dot_product_attention has one backend, "
        f"SDPBackend.MATH (torch's math formulation, run as XLA programs), and the backends allowed "
        f"(torch.nn.attention.sdpa_kernel, torch.backends.cuda.enable_*_sdp) are: {asked}. Add SDPBackend.MATH "
        f"to sdpa_kernel's list.)")


def choice() -> int:
    """``torch._fused_sdp_choice`` on the device: MATH's number, or torch's
    error where the flags turn it off."""
    check_backends()
    return int(torch._C._SDPBackend.MATH)
