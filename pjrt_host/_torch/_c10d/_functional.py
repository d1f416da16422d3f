"""torch's functional collectives (``torch.ops._c10d_functional.*``, what
DTensor, FSDP2 and compiled graphs call) on 'jax' tensors: new result
tensors, computed by the 'pjrt' process group registered under the op's
``group_name``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..._jax_settings import x64_scope as _x64_scope
from ._group import BACKEND_NAME, ProcessGroupJax, reduce_name

__all__ = ["run_functional"]


@_x64_scope
def run_functional(func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.ops._c10d_functional.*`` on 'jax' tensors (DTensor, FSDP2 and
    compiled graphs call these): new result tensors, computed by the 'pjrt'
    group named by ``group_name``; ``wait_tensor`` returns its input (the
    work is complete on return)."""
    schema = func._schema
    name = schema.name.split("::", 1)[1]
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    if name == "wait_tensor":
        return bound["tensor"]
    if name == "_wrap_tensor_autograd":  # a new tensor with the input's values (shares the array until written)
        return bound["input"].clone()
    if "group_name" not in bound:
        raise NotImplementedError(f"pjrt_host: functional collective {name} ({schema}) is not supported on 'jax' tensors")
    pg = _group(bound["group_name"], name)
    handler = _FUNCTIONAL.get(name)
    if handler is None:
        raise NotImplementedError(f"pjrt_host: the functional collective {name} is not supported on 'jax' tensors "
                                  f"by the '{BACKEND_NAME}' backend")
    return handler(pg, bound)


def _group(group_name: Any, op: str) -> ProcessGroupJax:
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = group_name if isinstance(group_name, dist.ProcessGroup) else _resolve_process_group(group_name)
    if isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    if not isinstance(pg, ProcessGroupJax):
        raise RuntimeError(
            f"pjrt_host: the functional collective {op} got 'jax' tensors on group {group_name!r} of backend "
            f"{pg.name() if hasattr(pg, 'name') else type(pg).__name__!r}, which cannot hold them. Use the "
            f"'{BACKEND_NAME}' backend (dist.init_process_group() with no backend, or init_device_mesh('jax', ...)).")
    return pg


def _new_like(t: torch.Tensor, array: Any) -> torch.Tensor:
    from .. import _tensor

    return _tensor.wrap_array(array, t.device.index or 0, t.dtype)


def _f_all_reduce(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    return _new_like(t, pg._engine(t).reduce(pg._read(t), reduce_name(b["reduce_op"])))


def _f_all_reduce_(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    pg._write(t, pg._engine(t).reduce(pg._read(t), reduce_name(b["reduce_op"])))
    return t


def _f_all_gather(pg: ProcessGroupJax, t: torch.Tensor) -> Any:
    gathered = pg._engine(t).gather(pg._read(t))  # (ranks, *shape): dim 0 of the result joins them
    return gathered.reshape((gathered.shape[0] * (t.shape[0] if t.dim() else 1), *tuple(t.shape[1:])))


def _f_reduce_scatter(pg: ProcessGroupJax, t: torch.Tensor, op: str) -> Any:
    size = pg.getSize()
    chunks = pg._read(t).reshape((size, t.shape[0] // size, *tuple(t.shape[1:])))
    return pg._engine(t).reduce_scatter(chunks, reduce_name(op))[0]


def _f_all_to_all(pg: ProcessGroupJax, b: dict) -> Any:
    t = b["input"]
    size = pg.getSize()
    splits = [int(s) for s in (b["input_split_sizes"] or [])] + [int(s) for s in (b["output_split_sizes"] or [])]
    if splits and len(set(splits)) > 1:
        raise NotImplementedError(
            f"pjrt_host: all_to_all_single with uneven splits is not supported by the '{BACKEND_NAME}' backend "
            "(XLA collectives have static shapes)")
    chunks = pg._read(t).reshape((size, t.shape[0] // size, *tuple(t.shape[1:])))
    return _new_like(t, pg._engine(t).all_to_all(chunks).reshape(tuple(t.shape)))


_FUNCTIONAL = {
    "all_reduce": _f_all_reduce,
    "all_reduce_": _f_all_reduce_,
    "all_reduce_coalesced": lambda pg, b: [_f_all_reduce(pg, {"input": t, "reduce_op": b["reduce_op"]})
                                           for t in b["inputs"]],
    "all_gather_into_tensor": lambda pg, b: _new_like(b["input"], _f_all_gather(pg, b["input"])),
    "all_gather_into_tensor_coalesced": lambda pg, b: [_new_like(t, _f_all_gather(pg, t)) for t in b["inputs"]],
    "all_gather_into_tensor_out": lambda pg, b: _write_out(pg, b["out"], _f_all_gather(pg, b["input"])),
    "reduce_scatter_tensor": lambda pg, b: _new_like(b["input"], _f_reduce_scatter(pg, b["input"], b["reduce_op"])),
    "reduce_scatter_tensor_coalesced": lambda pg, b: [_new_like(t, _f_reduce_scatter(pg, t, b["reduce_op"]))
                                                      for t in b["inputs"]],
    "all_to_all_single": _f_all_to_all,
    "broadcast": lambda pg, b: _new_like(b["input"], pg._engine(b["input"]).broadcast(pg._read(b["input"]), b["src"])),
    "broadcast_": lambda pg, b: _write_out(pg, b["input"], pg._engine(b["input"]).broadcast(pg._read(b["input"]),
                                                                                          b["src"])),
}


def _write_out(pg: ProcessGroupJax, out: torch.Tensor, array: Any) -> torch.Tensor:
    pg._write(out, array.reshape(tuple(out.shape)))
    return out
