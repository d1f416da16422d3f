"""The torch 'jax' device: torch tensors on the selected plugin's devices.

:func:`autoload` is what torch calls at ``import torch`` through the entry
point group ``torch.backends`` (and what ``import pjrt_host`` calls when torch
is already imported).  It only names the device, registers ``torch.jax`` and
a handful of dispatcher kernels; it imports neither jax nor any plugin.  jax
is imported, and the plugin's client created, when the first 'jax' tensor is
made.

One module per concept:

- ``_registration``: the device name, the ``torch.jax`` module, the
  PrivateUse1 hooks and the factory kernels (cheap; runs at autoload).
- ``_device_module``: ``torch.jax`` itself, shaped like torch's built-in device modules.
- ``_tensor``: the tensor subclass and its storage / view model.
- ``_dispatch``: ATen op -> lowering table, decomposition, or a clear error.
- ``_factories``: tensors made from nothing (``torch.zeros(..., device='jax')``).
- ``_conversion``: torch CPU <-> device transfers (DLPack where the plugin allows).
- ``_rng``: per-device random state behind ``torch.manual_seed``.
- ``_config``: the configuration stack (``pjrt_host.config(...)``).
"""

from __future__ import annotations

__all__ = ["autoload", "DEVICE_NAME"]

#: The torch device type of the plugin's devices.
DEVICE_NAME = "jax"


def autoload() -> None:
    """Entry point of the ``torch.backends`` group: make device='jax' work.

    Idempotent.  Safe to call while ``import torch`` is still running: torch
    calls it after every public name it needs is defined.  Never raises: a
    failure here would make every ``import torch`` fail, so it is logged
    and the device is simply absent."""
    try:
        from . import _registration

        _registration.register()
    except Exception as err:  # pragma: no cover - depends on the torch build
        import logging

        logging.getLogger("pjrt_host").warning(
            "pjrt_host: the 'jax' torch device could not be registered (%s: %s); torch works without it. "
            "Please report this with your torch version; TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips the attempt.",
            type(err).__name__, err)
