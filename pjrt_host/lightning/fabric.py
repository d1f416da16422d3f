"""Lightning Fabric on the 'jax' device: ``Fabric(accelerator='jax')``.

The classes Fabric builds for ``accelerator='jax'`` (registered when
:mod:`pjrt_host.lightning` is imported, which ``import lightning`` does
through pjrt_host's import hook): :class:`JaxAccelerator`,
:class:`SingleDeviceJaxStrategy` for one device, :class:`JaxDDPStrategy`
for several (one process per device, over the ``pjrt`` torch.distributed
backend) and :class:`JaxMixedPrecision` for ``precision='bf16-mixed'`` /
``'16-mixed'``.  Each can also be passed as an instance.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import torch
from lightning.fabric.accelerators.accelerator import Accelerator
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.plugins.precision.amp import MixedPrecision
from lightning.fabric.strategies.ddp import DDPStrategy
from lightning.fabric.strategies.single_device import SingleDeviceStrategy

from . import _common
from ._common import BACKEND_NAME, DEVICE_NAME

__all__ = ["JaxAccelerator", "JaxDDPStrategy", "JaxMixedPrecision", "SingleDeviceJaxStrategy"]


class JaxAccelerator(Accelerator):
    """The selected pjrt_host plugin's devices, as torch device 'jax'."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != DEVICE_NAME:
            raise ValueError(f"{type(self).__name__} runs on '{DEVICE_NAME}' devices, not {device}")
        torch.jax.set_device(device)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Union[int, str, list[int]]) -> Union[int, list[int]]:
        return _common.parse_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Union[int, str, list[int]]) -> list[torch.device]:
        return _common.get_parallel_devices(devices)

    @staticmethod
    def auto_device_count() -> int:
        return _common.auto_device_count()

    @staticmethod
    def is_available() -> bool:
        return _common.is_available()

    @staticmethod
    def name() -> str:
        return DEVICE_NAME

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        if cls.name() not in accelerator_registry:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__)


class SingleDeviceJaxStrategy(SingleDeviceStrategy):
    """One 'jax' device in this process."""

    def __init__(self, device: Any = DEVICE_NAME, **kwargs: Any) -> None:
        super().__init__(device=_common.single_device(device, type(self).__name__), **kwargs)


class JaxDDPStrategy(_common.RankDevice, DDPStrategy):
    """One process per 'jax' device, gradients all-reduced by DDP over the
    ``pjrt`` torch.distributed backend.  Processes are started by Lightning
    (``start_method='popen'``: the script is run again per rank) or by a
    launcher (``python -m pjrt_host launch``, torchrun), whose variables
    Lightning reads."""

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND_NAME,
                 start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen", **kwargs: Any) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, start_method=start_method, **kwargs)

    def _world_ranks(self) -> None:
        self._set_world_ranks()

    def _setup_distributed(self) -> None:
        self._connect()

    def _determine_ddp_device_ids(self) -> None:
        # DDP takes the module's device; device ids would make Lightning
        # open a CUDA stream around DistributedDataParallel(...).
        return None


class JaxMixedPrecision(MixedPrecision):
    """``torch.autocast('jax')`` in bfloat16 (``'bf16-mixed'``) or float16
    (``'16-mixed'``, with ``torch.amp.GradScaler('jax')``)."""

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"] = "bf16-mixed",
                 scaler: Optional[torch.amp.GradScaler] = None) -> None:
        super().__init__(precision=precision, device=DEVICE_NAME, scaler=_common.grad_scaler(precision, scaler))
