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
import pickle
from typing import Any, Callable

import torch

from .._jax_settings import x64_scope as _x64_scope
from .. import _lowerings
from . import _checks, _door, _graph_ops
from ._interpreter import Program
from ._graph_runtime import REPORT, CompiledGraph, EagerGraph, aliased_layouts, output_aliases, warn_once

__all__ = ["JaxCompiled", "backend", "compile_dynamo_graph", "compile_graph"]

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
    aliases, added, layouts = (), 0, ()
    if what != "backward":
        aliases, added, layouts = _output_aliases(gm)
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
        return EagerGraph(gm, len(_graph_outputs(gm)) - added if added else None)
    return CompiledGraph(gm, program, what, aliases, added, layouts)


def _graph_outputs(gm: torch.fx.GraphModule) -> list:
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(torch.fx.node.map_aggregate(out_node.args[0], lambda x: x))


def _output_aliases(gm: torch.fx.GraphModule) -> tuple:
    """The outputs of an inference or forward graph to make again from
    another's result after the call (``_graph_runtime.output_aliases``),
    read against AOTAutograd's metadata of the graph being compiled: which
    outputs it regenerates itself.  The graph's outputs are the input
    mutations it returns (none kept in the graph:
    ``num_mutated_inp_runtime_indices``), then the user's outputs
    (``output_info``, one each), then intermediate bases (a forward graph's
    saved values after them).  Without that metadata (AOTAutograd called outside torch.compile,
    no TracingContext) outputs come back as the program returns them."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = None if ctx is None else ctx.fw_metadata
    if meta is None:
        return (), 0, ()
    first = meta.num_mutated_inp_runtime_indices
    layouts = aliased_layouts(gm, meta.output_info, first)  # (before output_aliases adds outputs)
    return (*output_aliases(gm, meta.output_info, first), layouts)


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
    options = kwargs.pop("options", None) or {}
    if kwargs or options:
        unknown = sorted(set(kwargs) | set(options))
        raise TypeError(f"pjrt_host: torch.compile(backend='jax') takes no options; got {', '.join(unknown)}. "
                        "Device settings (matmul precision) come from pjrt_host.config(...) around the call.")
    # serializable: torch's AOT path (aot_compile, save_compiled_function)
    # takes it as it is; torch.compile calls it
    return serializable(gm, compile_dynamo_graph(gm, example_inputs))


@_x64_scope
def compile_dynamo_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
    """Dynamo's graph through AOTAutograd, each ATen graph one jitted call."""
    global _aot_backend
    from torch._functorch import config as functorch_config

    _door.load_device()
    custom = _custom_op_decompositions(gm)
    if custom:
        aot = _make_aot_backend(custom)
    else:
        if _aot_backend is None:
            _aot_backend = _make_aot_backend()
        aot = _aot_backend
    if functorch_config.force_autograd_cache or functorch_config.bundled_autograd_cache:
        # torch's AOT path (aot_compile) turns AOTAutograd's cache on, whose
        # entries hold inductor OutputCode only: it would refuse these graphs
        # (docs/compile.md, "A second process"); _serialize.JaxCompiled
        # serializes dynamo's graph instead
        with functorch_config.patch(force_autograd_cache=False, bundled_autograd_cache=False):
            return aot(gm, example_inputs)
    return aot(gm, example_inputs)


# ------------------------------------------------------------ torch's AOT path
#
# torch's AOT path for the jax backend: a second process skips dynamo.
#
# ``torch.compile(fn, backend='jax', fullgraph=True).aot_compile(((args), {}))``
# traces ``fn`` with dynamo once and asks the backend for a callable that
# implements ``SerializableCallable`` (torch 2.13,
# ``torch._dynamo.aot_compile_types``): ``serialize_compile_artifacts`` /
# ``deserialize_compile_artifacts``.  ``save_compiled_function(path)`` writes
# it with dynamo's guards and bytecode, and
# ``torch.compiler.load_compiled_function(file)`` in another process gives a
# function that runs without dynamo's trace.
#
# What :class:`JaxCompiled` serializes is dynamo's graph (torch's
# ``GraphPickler``, as torch's own ``GraphModuleSerializableCallable``), not
# AOTAutograd's result: torch 2.13 serializes AOTAutograd's forward, backward
# and runtime wrappers only as a bundled cache entry whose compiled graphs are
# inductor ``OutputCode`` objects (docs/compile.md, "A second process").  So
# the loading process runs AOTAutograd and this backend again on the graph's
# symbolic fake inputs, once, at the first call; XLA's programs come from the
# disk cache (``PJRT_HOST_CACHE_DIR``) when the first process left them there.

try:
    from torch._dynamo.aot_compile_types import SerializableCallable as _Base
except ImportError:  # a torch without the AOT path: nothing to implement
    _Base = None

#: Node metadata the graph pickler cannot take and the backend does not read.
_DROPPED_META = ("nn_module_stack", "source_fn_stack", "example_value", "stack_trace", "grapharg",
                 "fwd_nn_module_stack", "fwd_source_fn_stack")


def serializable(gm: torch.fx.GraphModule, compiled: Callable) -> Any:
    """``compiled`` (the backend's callable for dynamo's ``gm``) as a
    ``SerializableCallable`` where torch has the interface, else itself."""
    if _Base is None:
        return compiled
    return JaxCompiled(gm, compiled)


class JaxCompiled(_Base or object):  # type: ignore[misc]
    """The jax backend's result for one dynamo graph, serializable."""

    def __init__(self, graph_module: torch.fx.GraphModule, compiled: Callable | None = None,
                 fake_mode: Any = None) -> None:
        self.graph_module = graph_module
        self._compiled = compiled
        self._fake_mode = fake_mode

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._load()
        return compiled(*args)

    def _load(self) -> Callable:
        """The backend run again on the loaded graph, with its placeholders'
        fake values (symbolic where dynamo made them so) as the example
        inputs, in their fake mode."""
        from torch._guards import TracingContext, tracing

        example = [n.meta.get("val", n.meta.get("example_value")) for n in self.graph_module.graph.nodes
                   if n.op == "placeholder"]
        with tracing(TracingContext(self._fake_mode)):
            return compile_dynamo_graph(self.graph_module, example)

    @classmethod
    def serialize_compile_artifacts(cls, fn: Any) -> bytes:
        from torch.fx._graph_pickler import GraphPickler, Options

        gm = fn.graph_module
        for node in gm.graph.nodes:
            for key in _DROPPED_META:
                if key == "example_value" and node.op == "placeholder":
                    continue  # the loaded graph's example inputs (fake, symbolic where dynamo made them)
                node.meta.pop(key, None)
        return pickle.dumps(GraphPickler.dumps(gm, Options(ops_filter=None)))

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        gm = GraphPickler.loads(pickle.loads(data), fake_mode)
        # AOTAutograd reads dynamo's sources of a graph dynamo marked
        # (for its own guards and cudagraphs' static inputs), which the
        # pickle does not keep; the loaded function's guards are dynamo's,
        # saved with it
        gm.meta.pop("dynamo_compile_id", None)
        gm.recompile()
        return cls(gm, None, fake_mode)
