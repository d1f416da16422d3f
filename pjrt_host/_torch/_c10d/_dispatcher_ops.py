"""``c10d::*`` dispatcher ops on 'jax' tensors: torch.distributed calls
some collectives through the dispatcher (boxed arguments, a boxed
ProcessGroup and ReduceOp); each is run by the 'pjrt' process group it
names."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..._jax_settings import x64_scope as _x64_scope
from .._devices import DEVICE_NAME
from ._group import BACKEND_NAME, ProcessGroupJax

__all__ = ["run_op"]


@_x64_scope
def run_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """A ``c10d::*`` op on 'jax' tensors (torch.distributed calls some
    collectives through the dispatcher): run by the process group it
    names, which must be a 'pjrt' one."""
    schema = func._schema
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    name = schema.name.split("::", 1)[1]
    pg = bound.get("process_group")
    if isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    if not isinstance(pg, ProcessGroupJax):
        backend = pg.name() if hasattr(pg, "name") else type(pg).__name__
        raise RuntimeError(
            f"pjrt_host: torch.distributed's {name} got 'jax' tensors on a process group of backend {backend!r}, "
            f"which cannot hold them. Use the '{BACKEND_NAME}' backend: dist.init_process_group() with no backend "
            f"(it is the 'jax' device's default), backend='{BACKEND_NAME}', or 'cpu:gloo,{DEVICE_NAME}:"
            f"{BACKEND_NAME}'.")
    handler = _OPS.get(name)
    if handler is None:
        raise NotImplementedError(f"pjrt_host: torch.distributed's {name} is not supported on 'jax' tensors by the "
                                  f"'{BACKEND_NAME}' backend")
    return _boxed(handler(pg, bound))


def _boxed(result: Any) -> Any:
    """Work objects as the dispatcher's IValues (``Work.boxed()``)."""
    if isinstance(result, dist.Work):
        return result.boxed()
    if isinstance(result, tuple):
        return tuple(_boxed(r) for r in result)
    return result


def _options(bound: dict, **values: Any) -> Any:
    """What ProcessGroupJax's methods read of c10d's option objects
    (``AllreduceOptions`` ...: the dispatcher hands a boxed ReduceOp that
    those objects do not take), with the caller's ``async_op``."""
    import types

    return types.SimpleNamespace(asyncOp=bound.get("async_op", True), **values)


_OPS = {
    "allreduce_": lambda pg, b: (b["tensors"], pg.allreduce(
        b["tensors"], _options(b, reduceOp=b["reduce_op"]))),
    "allreduce_coalesced_": lambda pg, b: pg.allreduce(
        b["tensors"], _options(b, reduceOp=b["reduce_op"])),
    "allgather_": lambda pg, b: (b["output_tensors"], pg.allgather(b["output_tensors"], b["input_tensors"],
                                                                   _options(b))),
    "_allgather_base_": lambda pg, b: (b["output_tensor"], pg._allgather_base(
        b["output_tensor"], b["input_tensor"], _options(b))),
    "allgather_coalesced_": lambda pg, b: pg.allgather(b["output_lists"], b["input_list"],
                                                       _options(b)),
    "allgather_into_tensor_coalesced_": lambda pg, b: pg.allgather_into_tensor_coalesced(
        b["outputs"], b["inputs"], _options(b)),
    "reduce_scatter_": lambda pg, b: (b["output_tensors"], pg.reduce_scatter(
        b["output_tensors"], b["input_tensors"], _options(b, reduceOp=b["reduce_op"]))),
    "_reduce_scatter_base_": lambda pg, b: (b["output_tensor"], pg._reduce_scatter_base(
        b["output_tensor"], b["input_tensor"], _options(b, reduceOp=b["reduce_op"]))),
    "reduce_scatter_tensor_coalesced_": lambda pg, b: pg.reduce_scatter_tensor_coalesced(
        b["outputs"], b["inputs"], _options(b, reduceOp=b["reduce_op"])),
    "broadcast_": lambda pg, b: (b["tensors"], pg.broadcast(
        b["tensors"], _options(b, rootRank=b["root_rank"], rootTensor=b["root_tensor"]))),
    "alltoall_base_": lambda pg, b: pg.alltoall_base(b["output"], b["input"], b["output_split_sizes"],
                                                     b["input_split_sizes"], _options(b)),
    "barrier": lambda pg, b: pg.barrier(),
    "reduce_": lambda pg, b: pg.reduce_to_root(b["tensors"], b["reduce_op"], b["root_rank"],
                                               _options(b)),
    "gather_": lambda pg, b: pg.gather_to_root(b["output_tensors"], b["input_tensors"], b["root_rank"],
                                               _options(b)),
    "scatter_": lambda pg, b: (b["output_tensors"], pg.scatter_from_root(
        b["output_tensors"], b["input_tensors"], b["root_rank"], _options(b))),
    "send": lambda pg, b: pg.send(b["tensors"], b["dst"], b["tag"]),
    "recv_": lambda pg, b: pg.recv(b["tensors"], b["src"], b["tag"]),
}
