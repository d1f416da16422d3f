"""Lightning's Trainer on the 'jax' device: the Trainer's versions of
:mod:`pjrt_host.lightning.fabric`'s classes (Lightning keeps one class per
library, the Trainer's adding hooks of its own)."""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
from lightning.fabric.utilities.distributed import _init_dist_connection
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
        device = torch.device(device)
        if device.type != DEVICE_NAME:
            raise ValueError(f"{type(self).__name__} runs on a '{DEVICE_NAME}' device, not {device}")
        if device.index is None:
            device = torch.device(DEVICE_NAME, 0)
        super().__init__(device=device, **kwargs)


class JaxDDPStrategy(DDPStrategy):
    """One process per 'jax' device, gradients all-reduced by DDP over the
    ``pjrt`` torch.distributed backend; see
    :class:`pjrt_host.lightning.fabric.JaxDDPStrategy`."""

    strategy_name = "ddp_jax"

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND_NAME,
                 start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, start_method=start_method, **kwargs)
        self._rank_device: Optional[torch.device] = None

    @property
    def root_device(self) -> torch.device:
        if self._rank_device is None:
            # Before the processes are set up only the index is known; asking
            # the device count would create the client too early.
            if not torch.jax.is_initialized():
                return torch.device(self.parallel_devices[self.local_rank]) if self.parallel_devices else \
                    torch.device(DEVICE_NAME, self.local_rank)
            self._rank_device = _common.rank_device()
        return self._rank_device

    def setup_environment(self) -> None:
        self.set_world_ranks()
        env = self.cluster_environment
        assert env is not None
        _common.become_rank(self.global_rank, self.world_size, self.local_rank, self.num_processes, self.node_rank,
                            self.num_nodes, env.main_address, env.main_port)
        self._rank_device = _common.rank_device()
        super().setup_environment()

    def setup_distributed(self) -> None:
        # Lightning's, without init_process_group(device_id=...): torch then
        # asks the group for a 'jax' backend to split, which c10d's device
        # map for a backend registered from Python does not hold.
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        assert self.cluster_environment is not None
        _init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout)

    def determine_ddp_device_ids(self) -> None:
        # DDP takes the module's device; device ids would make Lightning
        # open a CUDA stream around DistributedDataParallel(...).
        return None


class JaxMixedPrecision(MixedPrecision):
    """``torch.autocast('jax')`` in bfloat16 (``'bf16-mixed'``) or float16
    (``'16-mixed'``, with ``torch.amp.GradScaler('jax')``)."""

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"] = "bf16-mixed",
                 scaler: Optional[torch.amp.GradScaler] = None) -> None:
        if precision == "16-mixed" and scaler is None:
            scaler = torch.amp.GradScaler(DEVICE_NAME)
        super().__init__(precision=precision, device=DEVICE_NAME, scaler=scaler)
