"""``repr`` of a 'jax' tensor: torch's own formatting of a CPU copy (one
transfer, instead of the dozens of small ops torch's printer runs), with
the device and autograd suffixes torch would add."""

from __future__ import annotations

import torch
from torch import _tensor_str

__all__ = ["tensor_repr"]


def tensor_repr(t: torch.Tensor) -> str:
    with torch.no_grad():
        cpu = t.detach().cpu()
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if cpu.numel() == 0 and cpu.shape != (0,):
        suffixes.append("size=" + str(tuple(cpu.shape)))
        body = "[]"
    else:
        body = _tensor_str._tensor_str(cpu, indent)
    suffixes.append("device='" + str(t.device) + "'")
    default = (torch.get_default_dtype(), torch.int64, torch.bool,
               torch.cdouble if torch.get_default_dtype() == torch.double else torch.cfloat)
    if t.dtype not in default:
        suffixes.append("dtype=" + str(t.dtype))
    if t.grad_fn is not None:
        name = type(t.grad_fn).__name__
        if name == "CppFunction":
            name = t.grad_fn.name().rsplit("::", 1)[-1]
        suffixes.append(f"grad_fn=<{name}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _tensor_str._add_suffixes(prefix + body, suffixes, indent, force_newline=False)
