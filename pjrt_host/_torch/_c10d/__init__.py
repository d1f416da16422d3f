"""torch.distributed on 'jax' tensors: the ``pjrt`` c10d backend.

``dist.init_process_group()`` (no backend: it is the 'jax' accelerator's
default) or ``init_process_group('pjrt')`` makes a :class:`ProcessGroupJax`.
Collectives on 'jax' tensors run as XLA collectives on the plugin's devices,
the engine SPMD uses: each rank's tensor is one shard of a global jax array
over a mesh of the group's devices; collectives on CPU tensors go to a gloo
process group built beside it.

Its registration with torch.distributed is a patch of the device
(``_patches._c10d_registration``, a row of ``_patches.INVENTORY``).  One job
per module:

- ``_group``: :class:`ProcessGroupJax`, c10d's process-group methods;
- ``_p2p``: send / recv of 'jax' tensors, queued and run in pairs;
- ``_mesh``: the group's devices as a jax mesh, its compiled collectives,
  the ranks' agreement on each new collective signature, and a failed
  collective's error (a roll call names the ranks that are gone);
- ``_waiting``: waiting for a collective's result, bounded by the group's
  timeout;
- ``_dispatcher_ops``: ``c10d::*`` ops (torch.distributed's dispatcher path);
- ``_functional``: ``_c10d_functional::*`` ops (DTensor, FSDP2, compiled graphs);
- ``_tensors``: 'jax' tensors' values read and written in place.
"""

from __future__ import annotations

from ._dispatcher_ops import run_op
from ._functional import run_functional
from ._group import BACKEND_NAME, ProcessGroupJax

__all__ = ["BACKEND_NAME", "ProcessGroupJax", "run_functional", "run_op"]
