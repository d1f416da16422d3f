"""A torch function, traced once for given argument shapes, as a jax function.

:func:`trace` runs ``fn`` on fake 'jax' tensors through AOTAutograd's export
(the same functionalisation, decompositions and input-mutation handling as
``torch.compile(backend='jax')``) and reads the ATen graph into a
:class:`~._interpreter.Program`.  The result, :class:`Traced`, evaluates the
graph on jax values: traceable, so it works under ``jax.jit``, ``jax.vjp``,
``jax.grad`` and ``jax.vmap``.  ``@assume_pure``, ``jax_jit``,
``call_torch`` and ``extract_jax`` all run torch code this way.

``_aot_export_function`` and ``_compiling_state_context`` are private torch
API; tests/test_interop.py pins the behaviour used here (input writes kept
as ``copy_`` into the inputs; ``torch.compiler.is_compiling()`` true while
tracing).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .._lowerings import LoweringContext
from . import _checks, _door
from ._dynamo_backend import decompositions
from ._interpreter import Program

__all__ = ["NotTraceable", "Traced", "call_with_leaves", "fake_tensors", "trace"]


class NotTraceable(RuntimeError):
    """``fn`` cannot be one jax function (an op with no lowering in graph
    form, a data-dependent shape, Python control flow on values)."""


@dataclasses.dataclass
class Traced:
    """``fn`` as a jax function of its flat tensor arguments."""

    program: Program
    #: Per output leaf: its torch dtype (None for a non-tensor output).
    out_dtypes: list[Any]
    #: Non-tensor output leaves (position -> value), fixed at trace time.
    static_outputs: dict[int, Any]
    out_spec: Any  # torch pytree spec of fn's result
    #: Which tensor arguments (their order among the tensor leaves) fn writes in place.
    mutated: list[int]
    #: The mesh placement the graph's sharding constraints name (None: none).
    mesh: Any = None

    def run(self, arrays: list[Any], key: Any, ctx: LoweringContext,
            checks: list | None = None) -> tuple[list[Any], list[tuple[int, Any]]]:
        """``arrays``: the tensor arguments' values, in order.  Returns (tensor
        outputs in order, [(tensor argument number, new value)]).  With a
        list ``checks``, the graph's index checks are appended to it
        (:meth:`Program.run`)."""
        outs, mutations = self.program.run(arrays, key, ctx, checks)
        return [o for o, d in zip(outs, self.out_dtypes) if d is not None], mutations

    @property
    def needs_rng(self) -> bool:
        return self.program.num_random > 0

    def unflatten(self, tensors: list[Any]) -> Any:
        """fn's result structure with ``tensors`` at the tensor positions."""
        if len(self.out_dtypes) == 1 and self.out_spec.is_leaf():
            return tensors[0] if tensors else self.static_outputs.get(0)
        it = iter(tensors)
        leaves = [next(it) if d is not None else self.static_outputs.get(i) for i, d in enumerate(self.out_dtypes)]
        return pytree.tree_unflatten(leaves, self.out_spec)


#: torch's tracing state (fake modes, functionalisation) is process-wide: one trace at a time.
_trace_lock = threading.RLock()


def fake_tensors(specs: list[tuple[tuple[int, ...], torch.dtype, int]]) -> list[torch.Tensor]:
    """Fake 'jax' tensors (shape, dtype, device index) in one fresh fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    out = []
    with mode:
        for shape, dtype, index in specs:
            out.append(torch.empty(shape, dtype=dtype, device=_door.torch_device(index)))
    return out


def call_with_leaves(fn: Callable, leaves: list, treedef: Any, positions: list[int]) -> Callable:
    """``flat_fn(*tensors)``: ``fn(*args, **kwargs)`` where ``(args, kwargs)``
    is the jax pytree ``treedef`` over ``leaves`` with ``tensors`` put at
    ``positions`` (the non-tensor leaves stay as they are)."""
    import jax

    def flat_fn(*ts: Any) -> Any:
        ls = list(leaves)
        for p, t in zip(positions, ts):
            ls[p] = t
        args, kwargs = jax.tree_util.tree_unflatten(treedef, ls)
        return fn(*args, **kwargs)

    return flat_fn


def trace(flat_fn: Callable, tensors: list[torch.Tensor], what: str) -> Traced:
    """Trace ``flat_fn(*tensors)`` (``tensors``: fake tensors, from
    :func:`fake_tensors`); ``what`` names the function in errors."""
    from torch._export.utils import _compiling_state_context
    from torch._functorch.aot_autograd import _aot_export_function

    try:
        # torch.compiler.is_compiling() is true while tracing, as under
        # torch.export's (equally make_fx-based) non-strict tracing: library
        # code (transformers' masks) takes its traceable paths.
        with _trace_lock, torch.no_grad(), _compiling_state_context(), _door.our_trace():
            gm, meta, _, out_spec = _aot_export_function(flat_fn, tuple(tensors),
                                                         decompositions=decompositions(),
                                                         keep_input_mutations=True)
    except Exception as err:
        raise NotTraceable(f"{what} could not be traced into one graph: {type(err).__name__}: "
                           f"{_first_line(err)}") from err
    program = Program(gm, _door.jax_dtype_of, _checks.sites_of)
    if program.unsupported:
        ops = ", ".join(f"{op} ({why})" for op, why in sorted(program.unsupported.items()))
        raise NotTraceable(f"{what} uses ops that have no lowering to JAX in graph form: {ops}")
    if any(info.mutates_metadata for info in meta.input_info):
        raise NotTraceable(f"{what} changes the metadata (shape, strides) of an argument in place")
    out_dtypes = []
    static_outputs = {}
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    for i, a in enumerate(out_node.args[0]):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if isinstance(val, torch.Tensor):
            out_dtypes.append(_door.device_dtype(val.dtype))
        else:
            out_dtypes.append(None)
            static_outputs[i] = val if not isinstance(a, torch.fx.Node) else None
    return Traced(program, out_dtypes, static_outputs, out_spec, list(program.mutated_inputs),
                  _door.graph_placement(gm))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
