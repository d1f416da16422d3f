"""Lightning's Trainer on the 'jax' device: the Trainer's versions of
:mod:`pjrt_host.lightning.fabric`'s classes (Lightning keeps one class per
library, the Trainer's adding hooks of its own)."""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators.accelerator import Accelerator
from lightning.pytorch.plugins.precision.amp import MixedPrecision
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy

from . import _common, fabric
from ._common import BACKEND_NAME, DEVICE_NAME

__all__ = ["JaxAccelerator", "JaxDDPStrategy", "JaxMixedPrecision", "SingleDeviceJaxStrategy"]


class JaxAccelerator(Accelerator, fabric.JaxAccelerator):
    """The selected pjrt_host plugin's devices, as torch device 'jax'."""

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """The numbers of ``torch.jax.memory_stats`` for the device (what
        DeviceStatsMonitor logs; loggers take numbers only)."""
        return {k: v for k, v in torch.jax.memory_stats(device).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}


class SingleDeviceJaxStrategy(SingleDeviceStrategy):
    """One 'jax' device in this process."""

    strategy_name = "single_jax"

    def __init__(self, device: Any = DEVICE_NAME, **kwargs: Any) -> None:
        super().__init__(device=_common.single_device(device, type(self).__name__), **kwargs)


class JaxDDPStrategy(_common.RankDevice, DDPStrategy):
    """One process per 'jax' device, gradients all-reduced by DDP over the
    ``pjrt`` torch.distributed backend; see
    :class:`pjrt_host.lightning.fabric.JaxDDPStrategy`."""

    strategy_name = "ddp_jax"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND_NAME,
                 start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, start_method=start_method, **kwargs)

    def _world_ranks(self) -> None:
        self.set_world_ranks()

    def setup_distributed(self) -> None:
        reset_seed()
        self._connect()

    def determine_ddp_device_ids(self) -> None:
        # DDP takes the module's device; device ids would make Lightning
        # open a CUDA stream around DistributedDataParallel(...).
        return None


class JaxMixedPrecision(MixedPrecision):
    """``torch.autocast('jax')`` in bfloat16 (``'bf16-mixed'``) or float16
    (``'16-mixed'``, with ``torch.amp.GradScaler('jax')``)."""

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"] = "bf16-mixed",
                 scaler: Optional[torch.amp.GradScaler] = None) -> None:
        super().__init__(precision=precision, device=DEVICE_NAME, scaler=_common.grad_scaler(precision, scaler))
