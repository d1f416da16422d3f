"""Lightning on the 'jax' device: ``Trainer(accelerator='jax')`` and
``Fabric(accelerator='jax')`` (docs/integrations.md, Lightning).

Importing this module registers the accelerator ``'jax'`` with Trainer's
and Fabric's registries and makes both build the classes below for it; with
pjrt_host installed, ``import lightning`` imports it (an import hook set up
at ``import torch``; ``PJRT_HOST_SKIP_PATCHES=lightning`` turns that off).

- :class:`JaxAccelerator`: the selected plugin's devices; ``devices=N`` /
  ``[i, ...]`` / ``-1`` as for cuda.
- :class:`SingleDeviceJaxStrategy`: one device (``devices=1``).
- :class:`JaxDDPStrategy`: one process per device, DDP over the ``pjrt``
  torch.distributed backend (``devices=N``, or ``strategy='ddp'``).
- :class:`JaxMixedPrecision`: ``precision='bf16-mixed'`` / ``'16-mixed'``
  as ``torch.autocast('jax')``.

Fabric's versions are in :mod:`pjrt_host.lightning.fabric`.
"""

from __future__ import annotations

from ._register import register as _register
from ._trainer import JaxAccelerator, JaxDDPStrategy, JaxMixedPrecision, SingleDeviceJaxStrategy

__all__ = ["JaxAccelerator", "JaxDDPStrategy", "JaxMixedPrecision", "SingleDeviceJaxStrategy"]

_register()
