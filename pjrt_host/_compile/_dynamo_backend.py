"""The ``jax`` torch.compile backend: AOTAutograd to ATen graphs, each graph
one jax.jit.

Dynamo hands over a torch-level graph; AOTAutograd functionalises it, splits
forward from backward (each compiled here, the backward on first use) and
keeps input mutations in the graph (``keep_inference_input_mutations``: a
BatchNorm's running statistics, an optimizer's state are written inside the
compiled call).  Ops that have a lowering stay as they are; torch's core
ATen decompositions break down the others.  A graph holding an op that still
has no lowering runs op by op, with a warning naming the op.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from .._jax_settings import x64_scope as _x64_scope
from .. import _lowerings
from . import _checks, _door, _graph_ops
from ._interpreter import Program
from ._graph_runtime import REPORT, CompiledGraph, EagerGraph, warn_once

__all__ = ["backend", "compile_graph"]

logger = logging.getLogger("pjrt_host")


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """torch's core ATen decompositions, less those of ops this backend
    lowers directly (a lowering is one fused op; its decomposition several)."""
    from torch._decomp import core_aten_decompositions

    table = {}
    for op, fn in core_aten_decompositions().items():
        if _graph_form(op):
            continue
        table[op] = fn
    return table


def _graph_form(op: Any) -> bool:
    """Whether the interpreter runs ``op`` as it is (a graph handler, an
    opaque call or a lowering)."""
    name = _short(op)
    return name in _graph_ops.HANDLERS or name in _graph_ops.OPAQUE or _lowerings.lookup(op) is not None


def _short(op: Any) -> str:
    try:
        name = op.name()
    except Exception:
        return str(op)
    return name[: -len(".default")] if name.endswith(".default") else name


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any, what: str) -> Any:
    """fw / bw / inference compiler: the ATen graph as a callable."""
    # A backward graph's indices are the forward's (saved or recomputed from
    # its inputs), checked there: it runs unchecked.
    program = Program(gm, _door.jax_dtype_of, _checks.sites_of if what != "backward" else None)
    if program.unsupported:
        ops = ", ".join(f"{op} ({why})" for op, why in sorted(program.unsupported.items()))
        for op in program.unsupported:
            warn_once(f"unsupported:{op}",
                      f"pjrt_host: torch.compile(backend='jax'): {op} has no lowering to JAX in graph form, so a "
                      f"{what} graph holding it ({program.num_ops} ops) runs op by op on the device instead of "
                      f"as one jax.jit. How to report it or add a lowering: {REPORT} (warned once per op). All such ops of this "
                      f"graph: {ops}.")
        return EagerGraph(gm)
    return CompiledGraph(gm, program, what)


_aot_backend: Any = None


def _make_aot_backend(extra: dict | None = None) -> Any:
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(
        # What the backward needs: inductor's choice, recomputing cheap
        # pointwise values in the backward instead of saving them (XLA fuses
        # them into their consumers there), so fewer activations are written
        # by the forward and read back.
        partition_fn=min_cut_rematerialization_partition,
        fw_compiler=functools.partial(compile_graph, what="forward"),
        bw_compiler=functools.partial(compile_graph, what="backward"),
        inference_compiler=functools.partial(compile_graph, what="inference"),
        decompositions={**decompositions(), **extra} if extra else decompositions(),
        keep_inference_input_mutations=True,
    )


def _custom_op_decompositions(gm: torch.fx.GraphModule) -> dict:
    """Custom ops (outside aten) in dynamo's graph that have one
    implementation for every device: AOTAutograd traces through it, so the
    op's torch code becomes part of the jitted graph (its autograd formula,
    registered above, still gives the backward)."""
    table = {}
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function":
            continue
        if isinstance(target, torch._ops.OpOverloadPacket):
            overloads = [getattr(target, name) for name in target.overloads()]
        elif isinstance(target, torch._ops.OpOverload):
            overloads = [target]
        else:
            continue
        for op in overloads:
            if _graph_form(op):
                continue  # pjrt_host's own ops (sharding constraints, call_jax) stay nodes
            kernel = _door.custom_op_kernel(op)
            if kernel is not None:
                table[op] = kernel
    return table


_OPTIONS: dict[str, str] = {}


@_x64_scope
def backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Any:
    """``torch.compile(model, backend='jax')``."""
    global _aot_backend
    options = kwargs.pop("options", None) or {}
    if kwargs or options:
        unknown = sorted(set(kwargs) | set(options))
        raise TypeError(f"pjrt_host: torch.compile(backend='jax') takes no options; got {', '.join(unknown)}. "
                        "Device settings (matmul precision) come from pjrt_host.config(...) around the call.")
    _door.load_device()
    custom = _custom_op_decompositions(gm)
    if custom:
        return _make_aot_backend(custom)(gm, example_inputs)
    if _aot_backend is None:
        _aot_backend = _make_aot_backend()
    return _aot_backend(gm, example_inputs)
