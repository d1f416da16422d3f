"""pjrt_host_tpu: Google Cloud TPUs as a pjrt_host device (plugin name ``tpu``).

The PJRT C API library is libtpu (the ``libtpu`` extra of this
distribution).  Nothing here loads libtpu or imports jax or torch: chips are
counted on the PCI bus, and the multi-process topology is computed from the
Cloud TPU metadata server or the environment before libtpu starts.
"""

from __future__ import annotations

from ._plugin import TpuPlugin
from ._topology import TpuTopology

__all__ = ["TpuPlugin", "TpuTopology"]
