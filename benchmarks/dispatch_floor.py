"""The floor of any device written in Python: a wrapper tensor subclass
whose ``__torch_dispatch__`` does nothing of its own -- it unwraps CPU
tensors, runs the ATen op on them and wraps the results.  A model run on
such tensors pays torch's dispatch into Python and a new wrapper tensor per
op, and computes exactly what CPU computes; a device that records or
dispatches programs from Python (pjrt_host's eager) pays this and its own
work on top, so a goal below this floor cannot be met by eager dispatch
alone.

``floor_module(model)`` wraps a CPU module's parameters and buffers in
place; ``wrap(t)`` / ``unwrap(t)`` move one tensor in and out.
"""

from __future__ import annotations

import torch

__all__ = ["CpuWrapper", "floor_module", "unwrap", "wrap"]


class CpuWrapper(torch.Tensor):
    """A CPU tensor seen through a Python ``__torch_dispatch__`` that adds
    nothing: the least a Python device pays per op."""

    inner: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "CpuWrapper":
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=inner.device, requires_grad=False)
        t.inner = inner
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        plain = []
        for x in args:
            if type(x) is CpuWrapper:
                plain.append(x.inner)
            elif type(x) is list:
                plain.append([y.inner if type(y) is CpuWrapper else y for y in x])
            else:
                plain.append(x)
        if kwargs:
            out = func(*plain, **{k: (v.inner if type(v) is CpuWrapper else v) for k, v in kwargs.items()})
        else:
            out = func(*plain)
        if type(out) is torch.Tensor:
            if args and type(args[0]) is CpuWrapper and args[0].inner is out:
                return args[0]  # an in-place op returns its own self
            return CpuWrapper(out)
        if type(out) in (tuple, list):
            return type(out)(CpuWrapper(x) if type(x) is torch.Tensor else x for x in out)
        return out


def wrap(t: torch.Tensor) -> CpuWrapper:
    return CpuWrapper(t)


def unwrap(t: torch.Tensor) -> torch.Tensor:
    return t.inner if type(t) is CpuWrapper else t


def floor_module(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (on CPU, for inference) with every parameter and buffer
    seen through :class:`CpuWrapper`."""
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = torch.nn.Parameter(CpuWrapper(p.detach()), requires_grad=False)
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = CpuWrapper(b)
    return model
