"""``pjrt_host.config(cpu_fallback=True)``: an op the device cannot run runs
on torch CPU (its inputs moved there, its results and mutated arguments
moved back), with a one-time warning per op."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .._errors import user_stacklevel
from ._devices import torch_device
from ._engine import op_name
from ._tensor import JaxTensor

__all__ = ["run_on_cpu"]

_warned: set[str] = set()


def run_on_cpu(func: Any, args: tuple, kwargs: dict) -> Any:
    name = op_name(func)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"pjrt_host: {name} has no lowering; running it on torch CPU (warned once)",
                      stacklevel=user_stacklevel())
    index = None

    def to_cpu(v: Any) -> Any:
        nonlocal index
        if isinstance(v, JaxTensor):
            index = v._storage.device_index
            return v.cpu()
        if isinstance(v, (list, tuple)):
            return type(v)(to_cpu(x) for x in v)
        return v

    cpu_args = to_cpu(args)
    cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    out = func(*cpu_args, **cpu_kwargs)
    device = torch_device(index or 0)
    # Mutated arguments are written back.
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        original = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        moved = cpu_args[i] if i < len(args) and not a.kwarg_only else cpu_kwargs.get(a.name)
        if isinstance(original, JaxTensor):
            original.copy_(moved)

    def back(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, (list, tuple)):
            return type(v)(back(x) for x in v)
        return v

    return back(out)
