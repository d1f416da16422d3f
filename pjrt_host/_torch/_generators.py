"""``torch.Generator(device='jax')``.

torch makes a device generator through its C++ PrivateUse1 hooks
(``PrivateUse1HooksInterface::getNewGenerator``, registered with
``REGISTER_GENERATOR_PRIVATEUSE1``); the Python hooks a Python backend can
register (``torch._C._acc.PrivateUse1Hooks``) expose only ``is_available``,
``is_built`` and ``has_primary_context``, so without this module the call
fails with torch's internal "You should register PrivateUse1HooksInterface".

A 'jax' generator here is a :class:`JaxGenerator`: a real torch generator
(torch's CPU Philox/MT engine underneath) whose ``device`` is the 'jax'
device.  Everything a generator does works as torch documents it --
``manual_seed``, ``seed``, ``initial_seed``, ``get_state`` / ``set_state``,
``generator=`` on random factories and in-place random ops on 'jax' tensors,
where each draw takes its key from the generator (advancing it), so draws
are reproducible per seed.  The numbers differ from those of the device's
default random state (``torch.manual_seed``), as cuda's per-generator
streams differ too.

Construction goes through ``torch.Generator``'s metaclass (torch's
``OpaqueBaseMeta``, a Python class; ``torch._C.Generator`` itself is an
immutable type): its ``__call__`` is given one that makes a JaxGenerator
for a 'jax' device and calls ``type.__call__`` unchanged for everything
else.  Cheap to import: no jax.
"""

from __future__ import annotations

from typing import Any

import torch

from ._devices import DEVICE_NAME, device_index

__all__ = ["JaxGenerator", "wrap_generator_call"]


class JaxGenerator(torch._C.Generator):
    """``torch.Generator(device='jax')`` (users never name this class)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device(DEVICE_NAME, self._jax_index)

    def __repr__(self) -> str:
        return f"<torch.Generator device={self.device}>"

    def __reduce__(self):
        return (_rebuild, (self._jax_index, self.get_state()))


def _rebuild(index: int, state: torch.Tensor) -> JaxGenerator:
    g = _new(index)
    g.set_state(state)
    return g


def _new(index: int) -> JaxGenerator:
    g = type.__call__(JaxGenerator)
    g._jax_index = index
    return g


def _device_of_call(args: tuple, kwargs: dict) -> Any:
    if "device" in kwargs:
        return kwargs["device"]
    return args[0] if args else None


def wrap_generator_call(base_call: Any) -> Any:
    """torch.Generator's metaclass ``__call__`` knowing 'jax' (``_patches``
    installs it)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is torch._C.Generator:
            device = _device_of_call(args, kwargs)
            if device is not None and not isinstance(device, int) and torch.device(device).type == DEVICE_NAME:
                return _new(device_index(device))
        return base_call(cls, *args, **kwargs)

    return __call__
