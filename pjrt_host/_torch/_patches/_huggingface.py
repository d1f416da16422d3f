"""accelerate's default device, for a process whose plugin is an accelerator.

accelerate (and transformers' Trainer, which asks accelerate) picks its
device from a fixed list of vendor modules and falls back to ``'cpu'``
(``PartialState.default_device``); it never asks ``torch.accelerator``.
So on a machine whose selected plugin is a real accelerator, a training
script that names no device would train on the CPU without a word.

This module makes that fallback ``'jax'`` when the selected plugin declares
it is not the host's CPU (``DevicePlugin.is_host_cpu`` False) and reports a
device here.  Everything else of accelerate's choice stands: a device of its
list (cuda, mps, ...), ``ACCELERATE_TORCH_DEVICE`` (read before the
fallback), ``Accelerator(cpu=True)`` and ``TrainingArguments(use_cpu=True)``
(which never reach it).  transformers' ``TrainingArguments`` takes the
state's device, except that for one process it names the device again
itself (from ``ACCELERATE_TORCH_DEVICE``, else 'cpu'); there the device
accelerate was given is kept.

accelerate's documented variable ``ACCELERATE_TORCH_DEVICE`` is not set for
the user, though both libraries read it: it outranks ``cpu=True`` (a script
asking accelerate for the CPU gets 'jax', and ``use_cpu=True`` puts the
model on the CPU and accelerate's state on 'jax', whose first op fails).

Neither library is imported here (``import torch`` must stay cheap): an
import hook (:mod:`._import_hooks`) waits for ``accelerate.state`` and
``transformers.training_args`` and wraps what they define when each has run.
``PJRT_HOST_SKIP_PATCHES=accelerate`` turns both off.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any

import torch

from ... import _registry, _runtime
from .._boot import _torch_jax
from .._devices import DEVICE_NAME
from . import _import_hooks

__all__ = ["PATCHERS", "chosen_device", "install", "is_patched"]

logger = logging.getLogger(__name__)


_lock = threading.Lock()
_announced = False


def _accelerator_record() -> Any:
    """The selected plugin's record if it is an accelerator (not
    ``is_host_cpu``) with a device on this machine, else None (also when no
    plugin can be selected)."""
    try:
        if not _torch_jax.is_available():
            return None
        record = _runtime.runtime().record if _runtime.is_initialized() else _registry.selected_record()
        return None if getattr(record.plugin, "is_host_cpu", False) else record
    except Exception as err:  # a broken selection is reported where the device is used, not here
        logger.debug("no '%s' default for accelerate: %s", DEVICE_NAME, err)
        return None


def chosen_device() -> str | None:
    """'jax' where accelerate's CPU fallback should become the device (the
    selected plugin is an accelerator with a device here), else None."""
    return DEVICE_NAME if _accelerator_record() is not None else None


def _announce(plugin_name: str) -> None:
    global _announced
    with _lock:
        if _announced:
            return
        _announced = True
    logger.info(
        "pjrt_host: accelerate knows no device of this machine and would use 'cpu'; it uses '%s' instead "
        "(plugin %r is an accelerator). ACCELERATE_TORCH_DEVICE=cpu, Accelerator(cpu=True) or "
        "TrainingArguments(use_cpu=True) keep the CPU; PJRT_HOST_SKIP_PATCHES=accelerate leaves accelerate's "
        "choice alone", DEVICE_NAME, plugin_name)


def _patch_state(module: Any) -> None:
    """Wrap ``accelerate.state.PartialState.default_device`` (once)."""
    cls = getattr(module, "PartialState", None)
    prop = getattr(cls, "__dict__", {}).get("default_device")
    if not isinstance(prop, property) or prop.fget is None:
        logger.warning("pjrt_host: this accelerate has no PartialState.default_device property; it keeps its own "
                       "device choice (set ACCELERATE_TORCH_DEVICE=%s to train on the device)", DEVICE_NAME)
        return
    original = prop.fget
    if getattr(original, "_pjrt_host", False):
        return

    @functools.wraps(original)
    def default_device(self: Any) -> torch.device:
        device = original(self)
        if getattr(device, "type", None) == "cpu":
            record = _accelerator_record()
            if record is not None:
                _announce(record.name)
                return torch.device(DEVICE_NAME)
        return device

    default_device._pjrt_host = True  # type: ignore[attr-defined]
    cls.default_device = property(default_device, prop.fset, prop.fdel, prop.__doc__)


def _patch_training_args(module: Any) -> None:
    """Wrap ``transformers.training_args.TrainingArguments._setup_devices``
    (a cached property; once): where accelerate's state holds 'jax' and the
    arguments did not ask for the CPU, that is the device, not the 'cpu'
    that the single-process branch names from the environment."""
    cls = getattr(module, "TrainingArguments", None)
    prop = getattr(cls, "__dict__", {}).get("_setup_devices")
    if not isinstance(prop, functools.cached_property):
        logger.warning("pjrt_host: this transformers' TrainingArguments has no cached _setup_devices; it keeps its "
                       "own device choice (set ACCELERATE_TORCH_DEVICE=%s to train on the device)", DEVICE_NAME)
        return
    original = prop.func
    if getattr(original, "_pjrt_host", False):
        return

    @functools.wraps(original)
    def _setup_devices(self: Any) -> torch.device:
        device = original(self)
        state = getattr(getattr(self, "distributed_state", None), "device", None)
        if (getattr(device, "type", None) == "cpu" and getattr(state, "type", None) == DEVICE_NAME
                and not getattr(self, "use_cpu", False)):
            return state
        return device

    _setup_devices._pjrt_host = True  # type: ignore[attr-defined]
    wrapped = functools.cached_property(_setup_devices)
    wrapped.__set_name__(cls, "_setup_devices")
    cls._setup_devices = wrapped


#: module -> what is wrapped in it once it has run.
PATCHERS = {"accelerate.state": _patch_state, "transformers.training_args": _patch_training_args}


def is_patched() -> dict[str, bool]:
    """Per module of :data:`PATCHERS`: whether it is imported and wrapped."""
    found = {}
    for name, cls, attr in (("accelerate.state", "PartialState", "default_device"),
                            ("transformers.training_args", "TrainingArguments", "_setup_devices")):
        member = getattr(getattr(sys.modules.get(name), cls, None), "__dict__", {}).get(attr)
        fn = getattr(member, "fget", None) or getattr(member, "func", None)
        found[name] = bool(getattr(fn, "_pjrt_host", False))
    return found


def install() -> None:
    """Wrap what :data:`PATCHERS` names in modules already imported, and in
    the others when they are.  Idempotent; imports nothing."""
    _import_hooks.after_import(PATCHERS)
