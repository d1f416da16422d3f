"""The torch 'jax' device: torch tensors on the selected plugin's devices.

:func:`autoload` is what torch calls at ``import torch`` through the entry
point group ``torch.backends`` (and what ``import pjrt_host`` calls when torch
is already imported).  It only names the device, registers ``torch.jax`` and
a handful of dispatcher kernels; it imports neither jax nor any plugin.  jax
is imported, and the plugin's client created, when the first 'jax' tensor is
made.

The layers of this package: the one table of them (docs/architecture.md
points here; tests/test_layers.py parses it).  Every module of ``_torch``
is a row; ``_c10d/`` is one row for its whole subpackage.  The rule: a
module imports only modules of rows at lower layers than its own, wherever
the import is written (function-level imports included); the modules of one
row (a subpackage) may import each other.  The one import upward is
:func:`autoload`'s (the package names the device; its registration is
imported only when torch calls in).  Two folders hold rules of their own,
tested in tests/test_torch_folders.py: ``_boot/`` is what runs inside
``import torch`` (no jax), and ``_patches/`` is the only code that changes
torch or another library.

=====  ===============================  ==================================================
layer  module                           job
=====  ===============================  ==================================================
14     ``_boot._privateuse1``           torch's side: PrivateUse1 named 'jax', ``torch.jax``,
                                        hooks and device guard; registers kernels and patches
13     ``_boot._autocast``              ``torch.autocast('jax')``'s op lists and kernels
12     ``_boot._kernels``               device-key kernels (factories, ``_to_copy``,
                                        ``copy_``) and the fallback; no jax
11     ``_loader``                      loads the device on first use, installs the
                                        dispatcher
10     ``_dispatch``                    routing only: which handler runs an op
10     ``_patches``                     every patch of torch and other libraries, listed
                                        (``INVENTORY``) and installed once
9      ``_storage_ops``                 copies, ``_to_copy``, ``item``, ``clone``, ``*_like``,
                                        ``set_``, ``resize_``, batch-norm statistics
9      ``_backward``                    the device inside autograd's backward: errors
                                        raised at ``backward()``, the caller's settings
8      ``_cpu_fallback``                ``config(cpu_fallback=True)``
8      ``_view_ops``                    view ops: new tensors over the same storage
8      ``_torch_accelerator``           ``torch.accelerator``'s answers for 'jax' (wrappers)
8      ``_patches._huggingface``        accelerate's / Trainer's default device 'jax' on an
                                        accelerator plugin (through an import hook)
7      ``_engine``                      an op compiled per signature, run through
                                        ``_lowerings.invoke`` with ``lowering_context``
7      ``_factories``                   ``torch.zeros(..., device='jax')`` and friends: the
                                        storage side of the factory lowerings (recorded
                                        into fused eager's segments)
7      ``_index_checks``                out-of-range indices raise torch CPU's error (in
                                        fused eager, checks recorded into the segment)
7      ``_boot._torch_jax``             ``torch.jax`` (device count, current device, seeds)
7      ``_boot._autograd_kernels``      dense sparse-gradient formulas, checked composites
                                        (attention as one op, over padded inputs too)
6      ``_dynamic_dims``                which ops run on padded inputs and when a dimension
                                        becomes dynamic; padded reads of views and writes
                                        into them
5      ``_patches._c10d_registration``  the 'pjrt' backend registered with
                                        torch.distributed
5      ``_fused``                       fused eager: ops recorded into segments, one
                                        program each
5      ``_scalar_trials``               traced scalars: whether an op's Python scalars can be
                                        run-time values
4      ``_meta``                        torch's meta kernels: result shapes, dtypes, errors
4      ``_conversion``                  torch <-> device transfers (DLPack where allowed)
4      ``_memory``                      memory figures as ``torch.cuda`` reports them; OOM
4      ``_value_checks``                argument values torch CPU refuses, refused here too
4      ``_c10d/``                       torch.distributed's 'pjrt' process group and its
                                        collectives (docs/distributed.md)
4      ``_sharded_storage``             the storage side of sharding (``spmd``'s eager half)
4      ``_signatures``                  what a compiled op is keyed on, and why it compiled
                                        again
3      ``_profile``                     ``pjrt_host.profile``: a jax trace with torch's names
3      ``_boot._streams``               ``torch.jax.Stream`` / ``Event``
3      ``_tensor``                      ``JaxTensor``, ``Storage``, ``View``; eager read,
                                        write, wrap
3      ``_patches._lightning``          ``import lightning`` imports ``pjrt_host.lightning``
                                        (named as a string: accelerator='jax')
2      ``_sharding``                    where a storage lives: a device or a mesh placement
2      ``_sdpa``                        the attention backends sdpa_kernel allows
2      ``_storage_bridge``              torch ``UntypedStorage`` objects on 'jax' (wrappers)
2      ``_modules``                     ``nn.Module._apply`` keeping parameters and ties
                                        (wrappers)
2      ``_generators``                  ``torch.Generator(device='jax')`` (wrapper)
2      ``_boot._amp``                   ``torch.jax.amp``: torch.cuda.amp's aliases for 'jax'
2      ``_patches._import_hooks``       run a hook right after a library is imported,
                                        without importing it
2      ``_padding``                     padded storages: buckets, fills, pad / cut programs,
                                        the dynamic-shape statistics
2      ``_sync``                        what is queued on the devices and waiting for it (latest
                                        results, deferred checks, open fused segments)
1      ``_devices``                     'jax:N' <-> jax device; the device-index normaliser
1      ``_lowering_context``            the ``LoweringContext`` every caller of a lowering runs
                                        with (eager ops, factories, the compile backend)
0      ``__init__``                     ``DEVICE_NAME``, :func:`autoload`, this table
0      ``_boot``                        the folder's rule (no code)
0      ``_boot._builtin``               torch's own accelerator, read before registering
0      ``_dtype_policy``                the plugin's dtype substitutions
0      ``_strided``                     traceable read / write of a strided view
0      ``_config``                      ``pjrt_host.config(...)``, a per-thread stack
0      ``_rng``                         per-device seed and counter
0      ``_printing``                    ``repr`` of a tensor
0      ``_hiding``                      keeping dynamo out of the device's code; 'jax'
                                        tensors as plain tensors while compiling
0      ``_sequences``                   rnn packing as torch ops around CPU's own checks
=====  ===============================  ==================================================

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
        from ._boot._builtin import torch_own_accelerator

        own = torch_own_accelerator()
        if own is not None:
            import logging

            logging.getLogger(__name__).info(
                "torch has its own accelerator here (%s): the 'jax' device is registered by `import pjrt_host` "
                "or with PJRT_DEVICE=NAME, not by `import torch` alone (registering makes it torch's "
                "accelerator, which breaks %s autograd in the process)", own, own)
            return
    try:
        from ._boot import _privateuse1

        _privateuse1.register()
    except Exception as err:  # pragma: no cover - depends on the torch build
        import logging

        logging.getLogger(__name__).warning(
            "the 'jax' torch device could not be registered (%s: %s); torch works without it. "
            "Please report this with your torch version; TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips the attempt.",
            type(err).__name__, err)
