"""Registration of the 'jax' device with torch, done once at autoload:
PrivateUse1 named 'jax', ``torch.jax``, the accelerator hooks and device
guard, then the kernels (``_kernels``, ``_autocast``, ``_autograd_kernels``)
and the patches of the 'import' phase (``_patches``).

Everything here must stay cheap (it runs inside ``import torch``): no jax,
no plugin code, no op tables.  The kernels are thin and load the device
(``_loader``) on their first call.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading

import torch

from . import _autocast, _autograd_kernels, _torch_jax, _kernels
from .. import _backward, _patches
from .._devices import DEVICE_NAME

__all__ = ["is_registered", "register"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_registered = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """What torch's C++ side asks a registered accelerator.  Answers without
    touching the device: torch.accelerator and dynamo call these on CPU-only
    programs too."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


#: CPython's PyErr_Occurred, called as Python's own API (a prototype of our
#: own: ctypes.pythonapi's shared function is left as it is), which raises
#: the pending exception when one is set
_error_pending = ctypes.PYFUNCTYPE(ctypes.c_void_p)(("PyErr_Occurred", ctypes.pythonapi))


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):  # noqa: D401 - torch's name
        # torch's guard calls this from noexcept C++ (a stream guard's
        # destructor in autograd's engine), also while a Python exception
        # unwinds it: a hook or a fake kernel that raised inside a backward.
        # CPython refuses a call while an exception is pending, and the
        # failed call ended the process ("terminate called without an active
        # exception").  The pending exception is taken here instead and
        # raised by backward() (``_backward.unwinding``).
        try:
            _error_pending()
        except BaseException as err:  # noqa: BLE001 - the pending exception itself
            _backward.unwinding(err)
        return torch._C._autograd.DeviceType.PrivateUse1


def is_registered() -> bool:
    return _registered


def register() -> None:
    """Name PrivateUse1 'jax', register ``torch.jax``, the accelerator hooks
    and the kernels.  Idempotent; a PrivateUse1 already taken by another
    backend is logged and left alone (torch has only one)."""
    global _registered
    with _lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", DEVICE_NAME):
            logger.warning(
                "torch's PrivateUse1 device is already named %r by another backend; "
                "the 'jax' device is not available in this process. Uninstall that backend or "
                "disable it to use pjrt_host's device.", current)
            return
        if current != DEVICE_NAME:
            from ._builtin import torch_own_accelerator

            own = torch_own_accelerator()
            if own is not None:
                logger.warning(
                    "pjrt_host: the 'jax' device becomes torch's accelerator in this process, in place of %s: "
                    "torch's autograd then fails backward passes over %s tensors (opt_ready_stream && "
                    "opt_parent_stream INTERNAL ASSERT FAILED, pytorch/pytorch#161129). Use %s and 'jax' "
                    "tensors in separate processes for training; DLPack and .to() between them work.",
                    own, own, own)
            torch.utils.rename_privateuse1_backend(DEVICE_NAME)
        # tensor.jax(), tensor.is_jax, module.jax(), as torch's built-in devices have.
        if not hasattr(torch.Tensor, f"is_{DEVICE_NAME}"):  # a failed earlier attempt may have made them
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
        if not hasattr(torch, DEVICE_NAME):
            torch._register_device_module(DEVICE_NAME, _torch_jax)
        # torch.jax.amp as torch.cuda.amp: `from torch.jax.amp import autocast`.
        sys.modules.setdefault(f"torch.{DEVICE_NAME}.amp", _torch_jax.amp)
        # Without hooks and a device guard, torch.accelerator reports the
        # device but cannot answer current_stream(), and dynamo (which asks
        # for it on every compile, CPU included) fails.
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())
        aten = _kernels.register()
        _autocast.register(aten)
        _autograd_kernels.register(aten)
        _patches.install("import")
        _registered = True


for _entry in (_Hooks.is_available, _Hooks.has_primary_context, _Hooks.is_built, _DeviceGuard.type_):
    _kernels.never_traced(_entry)


