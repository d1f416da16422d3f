"""Make Trainer and Fabric build the 'jax' classes.

Lightning has no entry point for accelerators: its registries take them at
import.  Registering the accelerator makes the name ``'jax'`` valid, but
Lightning's connectors (``_AcceleratorConnector`` for the Trainer,
``_Connector`` for Fabric) then choose the rest from fixed lists: a
single-device strategy on 'cpu' for any accelerator but cuda / mps, the
plain ``ddp`` strategy with the gloo backend for several devices, and an
autocast on 'cuda' for ``bf16-mixed`` / ``16-mixed``.  PyTorch/XLA's classes
are named in those lists; here the connectors' choosing methods are wrapped
so that, where the accelerator is :class:`JaxAccelerator` and the user named
no strategy or precision object of their own, they choose the 'jax' ones:

- ``_choose_strategy``: :class:`SingleDeviceJaxStrategy` on the one device,
  :class:`JaxDDPStrategy` for several devices or nodes;
- ``_init_strategy``: a strategy *name* of the DDP family (``'ddp'``,
  ``'ddp_spawn'``, ``'ddp_find_unused_parameters_true'``, ...) becomes
  :class:`JaxDDPStrategy` with that name's parameters, and a plain
  ``DDPStrategy(...)`` object is refused, naming the class to pass;
- ``_check_and_init_precision``: ``'bf16-mixed'`` / ``'16-mixed'`` become
  :class:`JaxMixedPrecision`;
- ``_choose_auto_accelerator``: ``accelerator='auto'`` means 'jax' where
  Lightning would take the CPU and the selected plugin is an accelerator
  (not the host's CPU, as for accelerate: docs/integrations.md).

Everything else stays Lightning's.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

__all__ = ["register"]

logger = logging.getLogger(__name__)

_MIXED = ("16-mixed", "bf16-mixed")


def register() -> None:
    """Register 'jax' with Trainer's and Fabric's registries and wrap their
    connectors (once; idempotent)."""
    import lightning.fabric.connector as fabric_connector
    from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.fabric.strategies.ddp import DDPStrategy as FabricDDP
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry
    from lightning.pytorch.strategies.ddp import DDPStrategy as TrainerDDP
    from lightning.pytorch.trainer.connectors import accelerator_connector

    from . import _trainer, fabric

    fabric.JaxAccelerator.register_accelerators(ACCELERATOR_REGISTRY)
    _trainer.JaxAccelerator.register_accelerators(AcceleratorRegistry)
    _wrap(fabric_connector._Connector, fabric, "pjrt_host.lightning.fabric", STRATEGY_REGISTRY, FabricDDP,
          precision_instance="_precision_instance", precision_flag="_precision_input")
    _wrap(accelerator_connector._AcceleratorConnector, _trainer, "pjrt_host.lightning", StrategyRegistry, TrainerDDP,
          precision_instance="_precision_plugin_flag", precision_flag="_precision_flag")


def _wrap(connector: type, classes: Any, public: str, strategies: dict, ddp_base: type, precision_instance: str,
          precision_flag: str) -> None:
    if getattr(connector, "_pjrt_host", False):
        return
    missing = [name for name in ("_choose_auto_accelerator", "_choose_strategy", "_init_strategy",
                                 "_check_and_init_precision") if not hasattr(connector, name)]
    if missing:
        logger.warning(
            "pjrt_host: this Lightning's %s has no %s; accelerator='jax' is registered but its strategy and "
            "precision are not chosen for you: pass strategy=%s.%s(...) and plugins=[%s.%s(...)] yourself",
            connector.__name__, ", ".join(missing), public, classes.SingleDeviceJaxStrategy.__name__, public,
            classes.JaxMixedPrecision.__name__)
        return

    def on_jax(self: Any) -> bool:
        return isinstance(getattr(self, "accelerator", None), classes.JaxAccelerator)

    choose_auto = connector._choose_auto_accelerator

    @functools.wraps(choose_auto)
    def _choose_auto_accelerator(*args: Any) -> str:
        name = choose_auto(*args)
        if name == "cpu":
            from .._torch._patches import _huggingface

            if _huggingface.chosen_device() is not None:
                logger.info("pjrt_host: Lightning knows no device of this machine and would use 'cpu'; "
                            "accelerator='auto' is '%s' instead (the selected plugin is an accelerator). "
                            "accelerator='cpu' keeps the CPU", classes.JaxAccelerator.name())
                return classes.JaxAccelerator.name()
        return name

    choose_strategy = connector._choose_strategy

    @functools.wraps(choose_strategy)
    def _choose_strategy(self: Any) -> Any:
        if not on_jax(self):
            return choose_strategy(self)
        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return classes.JaxDDPStrategy()
        return classes.SingleDeviceJaxStrategy(device=self._parallel_devices[0])

    init_strategy = connector._init_strategy

    @functools.wraps(init_strategy)
    def _init_strategy(self: Any) -> None:
        flag = self._strategy_flag
        entry = strategies[flag] if isinstance(flag, str) and flag in strategies else None  # .get() builds it
        if on_jax(self) and entry is not None and entry["strategy"] is ddp_base:
            self.strategy = classes.JaxDDPStrategy(**entry["init_params"])
            return
        if on_jax(self) and type(flag) is ddp_base:
            raise ValueError(
                f"strategy={ddp_base.__name__}(...) runs on cuda or the CPU (gloo); for accelerator="
                f"'{classes.JaxAccelerator.name()}' pass {public}."
                f"{classes.JaxDDPStrategy.__name__}(...) with the same arguments, or strategy='ddp'")
        init_strategy(self)

    init_precision = connector._check_and_init_precision

    @functools.wraps(init_precision)
    def _check_and_init_precision(self: Any) -> Any:
        if on_jax(self) and getattr(self, precision_instance) is None and getattr(self, precision_flag) in _MIXED:
            validate = getattr(self, "_validate_precision_choice", None)
            if validate is not None:
                validate()
            return classes.JaxMixedPrecision(getattr(self, precision_flag))
        return init_precision(self)

    connector._choose_auto_accelerator = staticmethod(_choose_auto_accelerator)
    connector._choose_strategy = _choose_strategy
    connector._init_strategy = _init_strategy
    connector._check_and_init_precision = _check_and_init_precision
    connector._pjrt_host = True
