"""The torch 'jax' device: torch tensors on the selected plugin's devices.

:func:`autoload` is what torch calls at ``import torch`` through the entry
point group ``torch.backends`` (and what ``import pjrt_host`` calls when torch
is already imported).  It only names the device, registers ``torch.jax`` and
a handful of dispatcher kernels; it imports neither jax nor any plugin.  jax
is imported, and the plugin's client created, when the first 'jax' tensor is
made.

Modules import strictly downward (tests/test_layers.py checks it); where a
rule lives:

=====  ===================  ====================================================
layer  module               job
=====  ===================  ====================================================
5      ``_privateuse1``    torch's side: PrivateUse1 name, ``torch.jax``, hooks
                            and device guard; registers kernels and patches
5      ``_kernels``         device-key kernels (factories, ``_to_copy``,
                            ``copy_``) and the fallback
5      ``_autocast``        ``torch.autocast('jax')``'s op lists and kernels
5      ``_autograd_kernels`` dense sparse-gradient formulas, checked composites
5      ``_patches``         every replacement of a torch function, listed once
                            and installed only from here
5      ``_loader``          loads the device on first use, installs the
                            dispatcher
5      ``_torch_jax``   ``torch.jax`` (device count, current device, seeds)
5      ``_amp``             ``torch.jax.amp``: torch.cuda.amp's aliases for 'jax'
5      ``_accelerate``      accelerate's / Trainer's default device on an
                            accelerator plugin (an import hook)
5      ``_lightning``       ``import lightning`` registers accelerator='jax'
                            (imports :mod:`pjrt_host.lightning`; an import hook)
4      ``_dispatch``        routing only: which handler runs an op
3      ``_storage_ops``     copies, ``_to_copy``, ``item``, ``clone``, ``*_like``,
                            ``set_``, ``resize_``, batch-norm statistics
3      ``_factories``       ``torch.zeros(..., device='jax')`` and friends: the
                            storage side of the factory lowerings
3      ``_cpu_fallback``    ``config(cpu_fallback=True)``
3      ``_view_ops``        view ops: new tensors over the same storage
2      ``_engine``          an op compiled per signature, run through
                            ``_lowerings.invoke`` with :func:`lowering_context`
2      ``_meta``            torch's meta kernels: result shapes, dtypes, errors
2      ``_conversion``      torch <-> device transfers (DLPack where allowed)
1      ``_tensor``          ``JaxTensor``, ``Storage``, ``View``; eager read,
                            write, wrap; ``synchronize``
0      ``_devices``         'jax:N' <-> jax device; the device-index normaliser
0      ``_dtype_policy``    the plugin's dtype substitutions
0      ``_strided``           traceable read / write of a strided view
0      ``_config``          ``pjrt_host.config(...)``, a per-thread stack
0      ``_rng``             per-device seed and counter
0      ``_printing``        ``repr`` of a tensor
0      ``_sdpa``            the attention backends sdpa_kernel allows
=====  ===================  ====================================================

The math itself is :mod:`pjrt_host._lowerings` (no torch-device imports).
"""

from __future__ import annotations

__all__ = ["DEVICE_NAME", "autoload"]

#: The torch device type of the plugin's devices.
DEVICE_NAME = "jax"


#: Set by ``import pjrt_host`` (not by torch's entry point): the user asked for the device.
explicit = False


def autoload() -> None:
    """Entry point of the ``torch.backends`` group: make device='jax' work.

    Idempotent.  Safe to call while ``import torch`` is still running: torch
    calls it after every public name it needs is defined.  Never raises: a
    failure here would make every ``import torch`` fail, so it is logged
    and the device is simply absent.

    Where torch has a usable accelerator of its own (a CUDA, ROCm, XPU or
    MPS build on a machine with that device), ``import torch`` alone leaves
    torch's accelerator in place:
    torch makes a registered PrivateUse1 device *the* accelerator, and its
    autograd engine then fails every backward over that build's own tensors
    (``opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED``,
    pytorch/pytorch#161129) -- installing pjrt_host must not break a CUDA
    program.  There the device comes with ``PJRT_DEVICE=NAME`` or
    ``import pjrt_host``."""
    import os

    if not explicit and not os.environ.get("PJRT_DEVICE"):
        from ._builtin import torch_own_accelerator

        own = torch_own_accelerator()
        if own is not None:
            import logging

            logging.getLogger(__name__).info(
                "torch has its own accelerator here (%s): the 'jax' device is registered by `import pjrt_host` "
                "or with PJRT_DEVICE=NAME, not by `import torch` alone (registering makes it torch's "
                "accelerator, which breaks %s autograd in the process)", own, own)
            return
    try:
        from . import _privateuse1

        _privateuse1.register()
    except Exception as err:  # pragma: no cover - depends on the torch build
        import logging

        logging.getLogger(__name__).warning(
            "the 'jax' torch device could not be registered (%s: %s); torch works without it. "
            "Please report this with your torch version; TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips the attempt.",
            type(err).__name__, err)
