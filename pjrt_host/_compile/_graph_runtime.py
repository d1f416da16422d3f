"""The callables torch.compile runs: one jitted call per graph.

:class:`CompiledGraph` takes the jax arrays its 'jax' tensor arguments
already hold (views as their storage array plus an offset: no copy), makes
one call of a ``jax.jit`` of the graph, writes the graph's input mutations
back into the arguments' storages (computed inside that call) and wraps the
results.  The arrays a graph overwrites (an optimizer step's parameters and
state, batch norm's statistics) are donated to that call when nothing but
their storage holds them, so old and new values are not alive together.  The jitted function is specialised on the arguments' layout (which
arguments share a storage, which are views); jax itself keys it on shapes,
so each new shape compiles once and an earlier shape is reused.  With
``pjrt_host.config(checks=...)`` on (the default), a forward or
inference graph that indexes also returns its index checks' verdicts, which
the call queues with eager's deferred checks (:mod:`._checks`).

:class:`EagerGraph` runs a graph op by op on the device: the fallback for a
graph holding an op with no lowering.
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import warnings
from typing import Any, NamedTuple

import torch

from .._jax_settings import x64_scope as _x64_scope
from .. import _program_cache
from . import _checks, _door, _padded_graph
from ._interpreter import GraphLoweringError, Program

__all__ = ["AliasLayout", "CompiledGraph", "EagerGraph", "OutputAlias", "REPORT", "aliased_layouts", "output_aliases",
           "remake_aliases"]

logger = logging.getLogger("pjrt_host")
recompiles = logging.getLogger("pjrt_host.recompiles")

#: Where the warnings below send a user: how to report a gap and add a lowering.
REPORT = "docs/op-coverage.md in the pjrt_host sources"

#: PJRT_HOST_DONATE=0 turns buffer donation off (for comparisons).
DONATE = _door.DONATE

_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _lost_inputs(oom: BaseException, donated: tuple[int, ...], owners: list) -> BaseException:
    """``oom``, saying so when the failed call was given (donated) the
    buffers of the inputs it overwrites: their old values went with it."""
    if not donated:
        return oom
    lost = [owners[s] for s in donated]
    size = sum(getattr(st, "nbytes", 0) or 0 for st in lost)
    return type(oom)(
        f"{oom} The graph overwrites {len(lost)} of its inputs in place (parameters, optimizer state) and was "
        f"given their buffers ({size / 2**20:.1f} MiB): their values are lost with the failed call. Reload them "
        "(a checkpoint), or set PJRT_HOST_DONATE=0 to keep them through a failed step at the cost of memory.")


class _OutSpec(NamedTuple):
    kind: str  # "tensor" | "value" (a Python number / None)
    dtype: Any = None
    device: Any = None  # None: the 'jax' device; else the torch device to return on


class _Entry(NamedTuple):
    fn: Any  # the jitted function (nothing donated)
    mutated_slots: tuple[int, ...]
    static_outputs: dict  # position -> Python value, filled when traced
    foreign_slots: tuple[int, ...]  # slots holding tensors of another device (copied in per call)
    core: Any  # the function fn jits: (arrays, offsets, *rng)
    donating: dict  # donated slots -> the jitted function taking them apart (built on first use)
    checks: Any  # the checks mode when the function also returns its index checks' verdicts, else None


def _calibrate() -> int:
    """The reference count of an array only its storage and the call's
    argument list hold, as ``__call__`` reads it (inline, no call between:
    measured, not assumed, since Python versions count differently and a
    frame-evaluation hook such as dynamo's adds references to the
    arguments of calls it evaluates)."""
    class Holder:
        array: Any = None

    holder, arrays = Holder(), [object()]
    holder.array = arrays[0]
    return sys.getrefcount(arrays[0])


#: See _calibrate; compared with ``sys.getrefcount(arrays[slot])``.
_SOLE_REFS = _calibrate()


def _note_donation(overwritten: tuple[int, ...], donated: tuple[int, ...]) -> None:
    """Called with each compiled call's overwritten device arrays and those
    donated (slots; a hook for tests, nothing to do)."""


def _donating(core: Any, slots: tuple[int, ...], n: int) -> Any:
    """``core`` jitted with the arrays of ``slots`` donated: called as
    ``(donated, kept, offsets, *rng)``, ``kept`` holding None at those slots."""
    where = {s: i for i, s in enumerate(slots)}

    def split(donated: list, kept: list, offsets: list, *rng: Any) -> Any:
        arrays = [donated[where[s]] if s in where else kept[s] for s in range(n)]
        return core(arrays, offsets, *rng)

    return _program_cache.jit(split, donate_argnums=(0,))


class EagerGraph:
    """Runs the graph's ops one by one (each on the device, eagerly).
    ``num_outputs``: how many of the graph's outputs are AOTAutograd's (None:
    all); those after them are bases :func:`output_aliases` added, which
    eager's own views already share."""

    def __init__(self, gm: torch.fx.GraphModule, num_outputs: int | None = None) -> None:
        self.gm = gm
        self.num_outputs = num_outputs
        # AOTAutograd passes the argument list as it is (an instance
        # attribute: wrappers copy __dict__, not class attributes).
        self._boxed_call = True

    @_x64_scope
    def __call__(self, args: list) -> Any:
        args = list(args)
        outs = self.gm(*args)
        if self.num_outputs is not None:
            outs = list(outs)[: self.num_outputs]
        return outs


class OutputAlias(NamedTuple):
    """An output of the graph made again from another output's result
    (:func:`output_aliases`)."""

    pos: int  # the output made again
    base: int  # the output it is made from
    #: The view ops from the base's result to it: (op, args, kwargs, which
    #: of its results or None) each; empty: the same tensor.
    chain: tuple
    #: For a chain with an ``as_strided`` (which reads storage positions,
    #: not elements): the base's layout as traced, ``(size, stride)``, which
    #: its result must have before the chain runs; None otherwise.
    layout: tuple | None = None


def _view_step(node: Any) -> Any:
    """``node`` as a step of a chain of views, ``(view node, op, its other
    arguments, its keyword arguments, which of its results or None)``: a
    view op of its first argument whose other arguments are all constants
    (so it can run again on a result), or one result of such an op that
    returns several (``unbind``, ``split``: the graph's ``getitem`` of it);
    None for anything else."""
    index = None
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
            and type(node.args[1]) is int:
        index, node = node.args[1], node.args[0]
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    if not node.target.is_view or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    if (index is None) != isinstance(node.meta.get("val"), torch.Tensor):
        return None  # a list of views not read through getitem, or getitem of one view
    found: list = []
    torch.fx.node.map_arg((node.args[1:], node.kwargs), found.append)
    if any(not isinstance(n.meta.get("val"), torch.SymInt) for n in found):
        return None
    # a size of a symbolic graph (``chunk`` of a symbolic dim): its expression,
    # evaluated at each call's sizes (:func:`remake_aliases`)
    def constant(a: Any) -> Any:
        return _Size(_padded_graph.size_expression(a.meta["val"]))
    args = torch.fx.node.map_arg(tuple(node.args[1:]), constant)
    kwargs = torch.fx.node.map_arg(dict(node.kwargs), constant)
    return node, node.target, tuple(args), dict(kwargs), index


class _Size:
    """A view op's argument that is a size of a symbolic graph."""

    __slots__ = ("expr",)

    def __init__(self, expr: Any) -> None:
        self.expr = expr


def _at_sizes(values: Any, bindings: dict | None) -> Any:
    """``values`` (a view op's arguments) with each :class:`_Size` evaluated."""
    if type(values) is _Size:
        return _padded_graph.concrete_value(values.expr, bindings)
    if isinstance(values, (list, tuple)):
        return type(values)(_at_sizes(v, bindings) for v in values)
    if isinstance(values, dict):
        return {k: _at_sizes(v, bindings) for k, v in values.items()}
    return values


def output_aliases(gm: torch.fx.GraphModule, output_info: Any, first: int) -> tuple[tuple[OutputAlias, ...], int]:
    """Outputs of an inference or forward graph that share storage in eager,
    to be made again after the call from one result (fuzz finding 3,
    docs/fuzzing.md).  In a forward graph the outputs AOTAutograd leaves to
    it are those that need no gradient or are the same tensor: views that
    need one it regenerates itself.

    One jitted program returns each output as an array of its own, so
    ``y, y.view(-1)`` would come back as two tensors a write to one does not
    reach.  AOTAutograd regenerates some aliasing outputs itself, from an
    input or from a base output (``output_info``: AOTAutograd's
    ``fw_metadata.output_info``, one per user output, which starts at graph
    output ``first``); only those it leaves to the graph (``non_alias``) are
    considered here, so none it regenerates is replaced under it.  Such
    outputs whose chains of view ops (constant arguments) start at one node
    are grouped: the node's own output, or, when it is no output, the node
    added to the graph's outputs (changing ``gm``: the number added is
    returned, to be dropped after the call), is the base; the others are
    made from its result by their view ops, or are it (the same node
    returned twice, as ``y.float()`` of a float ``y``)."""
    from torch._functorch._aot_autograd.schemas import OutputType

    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else None
    if outs is None or len(output_info) + first > len(outs):
        return (), 0
    groups: dict = {}
    for i, info in enumerate(output_info):
        pos = first + i
        node = outs[pos]
        if info.output_type is not OutputType.non_alias or not isinstance(node, torch.fx.Node) \
                or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        chain = []
        while (step := _view_step(node)) is not None:
            chain.append(step[1:])
            node = step[0].args[0]
        if node.op == "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue  # AOTAutograd's to regenerate (an input's alias), or not a tensor
        groups.setdefault(node, []).append((pos, tuple(reversed(chain))))
    aliases: list[OutputAlias] = []
    added: list = []
    for root, members in groups.items():
        base = next((pos for pos, chain in members if not chain), None)
        if base is None:
            if len(members) < 2:
                continue  # a view of a value no other output shares
            base = len(outs) + len(added)
            added.append(root)
        made = {pos: chain for pos, chain in members if pos == base}
        for pos, chain in sorted((m for m in members if m[0] != base), key=lambda m: len(m[1])):
            if _reads_storage(chain):
                aliases.append(OutputAlias(pos, base, chain, _traced_layout(root)))
                continue
            # From the output whose chain is the longest start of this one,
            # as eager made it: ``v9 = v8.flatten()`` of ``v8 = v7.detach()``
            # is a view of ``v8``, not of a second ``detach`` of ``v7``
            # (AOTAutograd asks aliased inputs of a later graph for one base).
            start, rest = base, chain
            for other, done in made.items():
                if len(chain) - len(rest) < len(done) < len(chain) and chain[:len(done)] == done:
                    start, rest = other, chain[len(done):]
            aliases.append(OutputAlias(pos, start, rest, None))
            made[pos] = chain
    if added:
        out_node.args = (type(out_node.args[0])((*outs, *added)),)
        gm.recompile()
    return tuple(aliases), len(added)


#: AOTAutograd's output types it makes again from a base with
#: ``gen_alias_from_base``, reading the graph's result as the view's layout.
_REGENERATED = frozenset({"alias_of_input", "alias_of_intermediate", "alias_of_intermediate_save_as_output",
                          "alias_of_intermediate_base_is_user_output"})


class AliasLayout(NamedTuple):
    """The traced layout of an output AOTAutograd makes again as a view of
    its base (:func:`aliased_layouts`): expressions of the graph's symbols."""

    pos: int
    size: tuple
    stride: tuple
    offset: Any


def aliased_layouts(gm: torch.fx.GraphModule, output_info: Any, first: int) -> tuple[AliasLayout, ...]:
    """The outputs of a graph that AOTAutograd makes again as views of an
    input or of another output, with their traced layouts.  It replays the
    view's ops when none took a symbolic argument; otherwise (``chunk`` of a
    symbolic dim, ``flatten().unbind()``) it calls ``as_strided`` on the base
    with the size, stride and offset *the graph's result* reports -- which
    are a fresh result's (row-major, offset 0), not the view's: a silent
    wrong value (``x.chunk(2, 1)[0]`` read ``x``'s first row twice).  A
    layout of plain ints says nothing of the ops before it: ``x.flatten()``
    of a symbolic ``x`` took a symbolic size, and its ``narrow(0, 1, 3)``
    (size 3, offset 1) read offset 0.  Each such result is replaced, after
    the call, by a tensor that reports the traced layout
    (:func:`_with_layout`, which leaves a result already laid out so);
    where AOTAutograd replays the ops instead, it reads only the shape."""
    size_expression = _padded_graph.size_expression
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else None
    if outs is None or len(output_info) + first > len(outs):
        return ()
    found = []
    for i, info in enumerate(output_info):
        node = outs[first + i]
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if info.output_type.name not in _REGENERATED or not isinstance(val, torch.Tensor):
            continue
        size = tuple(size_expression(d) for d in val.shape)
        stride = tuple(size_expression(d) for d in val.stride())
        offset = size_expression(val.storage_offset())
        found.append(AliasLayout(first + i, size, stride, offset))
    return tuple(found)


def _with_layout(results: list, layouts: tuple[AliasLayout, ...], bindings: dict) -> None:
    """Each result of ``layouts`` replaced by a tensor of its traced layout
    at the call's sizes: lazy (no array), since AOTAutograd reads only its
    layout and takes the values from the base."""
    concrete_value = _padded_graph.concrete_value
    for pos, size, stride, offset in layouts:
        t = results[pos]
        if not isinstance(t, torch.Tensor):
            continue
        try:
            size_ = tuple(concrete_value(e, bindings) for e in size)
            stride_ = tuple(concrete_value(e, bindings) for e in stride)
            offset_ = concrete_value(offset, bindings)
        except KeyError:
            continue  # a size no input binds: the result as it is
        if tuple(t.shape) == size_ and t.stride() == stride_ and t.storage_offset() == offset_:
            continue
        extent = offset_ + 1 + sum((n - 1) * st for n, st in zip(size_, stride_) if n > 0)
        if 0 in size_:
            extent = offset_
        # (detached: no view of the empty tensor, so that AOTAutograd takes the layout and not a view function)
        results[pos] = torch.empty(max(extent, 0), dtype=t.dtype, device=t.device).as_strided(
            size_, stride_, offset_).detach()


#: View ops whose arguments name storage positions, so that their result
#: depends on the layout of their input, not only on its elements.
_STORAGE_VIEWS = frozenset({"aten::as_strided"})


def _reads_storage(chain: tuple) -> bool:
    return any(op._schema.name in _STORAGE_VIEWS for op, _args, _kwargs, _index in chain)


def _traced_layout(node: torch.fx.Node) -> tuple | None:
    """``(size, stride)`` of ``node``'s value as traced, when it is dense
    (its storage is its elements, in some order) and concrete; else None."""
    val = node.meta.get("val")
    try:
        size, stride = tuple(int(d) for d in val.shape), tuple(int(d) for d in val.stride())
        offset = int(val.storage_offset())
    except (TypeError, ValueError, RuntimeError):
        return None  # a symbolic size: the layout is not known here
    if offset or not _door.dense_layout(size, stride):
        return None
    return size, stride


def _relaid(t: torch.Tensor, layout: tuple | None) -> torch.Tensor | None:
    """``t`` with the traced layout (a copy when the device returned it in
    another order), or None when that layout is not known."""
    if layout is None:
        return None
    size, stride = layout
    if tuple(t.shape) != size:
        return None
    if t.stride() == stride and t.storage_offset() == 0:
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


def remake_aliases(results: list, aliases: tuple[OutputAlias, ...], num_outputs: int,
                   bindings: Any = None) -> list:
    """``results`` with each alias made again from its base's result
    (:func:`output_aliases`), the added bases dropped.  A chain whose view
    op the base's layout refuses keeps the program's own result (its values,
    sharing nothing): the graph was traced with CPU's strides, and a result
    the device computes is row-major where CPU keeps an input's layout
    (``(x.t() * 2).t().view(-1)``; docs/torch-device.md, Limits).

    A chain with an ``as_strided`` would succeed on either layout and read
    other elements (fuzz finding 16001087): its base is first copied into
    the layout it was traced with, and replaces the base's own result so
    that the two still share storage; where that layout is not known, the
    program's own result (read through the traced layout) is kept.
    ``bindings`` (a symbolic graph's sizes at this call, or a function that
    gives them) evaluate the chains' symbolic arguments."""
    unknown = set()
    for pos, base, chain, layout in aliases:
        if _reads_storage(chain) and base not in unknown:
            t = _relaid(results[base], layout)  # before any alias is made of it, so that all share it
            if t is None:
                unknown.add(base)
            else:
                results[base] = t
    for pos, base, chain, layout in aliases:
        if base in unknown and _reads_storage(chain):
            continue
        t = results[base]
        try:  # (a size no input binds, KeyError: the program's own result is kept)
            for op, args, kwargs, index in chain:
                if _has_size((args, kwargs)):
                    if callable(bindings):
                        bindings = bindings()
                    args, kwargs = _at_sizes(args, bindings), _at_sizes(kwargs, bindings)
                t = op(t, *args, **kwargs)
                if index is not None:
                    t = t[index]
        except (RuntimeError, KeyError):
            continue
        results[pos] = t
    del results[num_outputs:]
    return results


def _has_size(values: Any) -> bool:
    if type(values) is _Size:
        return True
    if isinstance(values, (list, tuple)):
        return any(_has_size(v) for v in values)
    if isinstance(values, dict):
        return any(_has_size(v) for v in values.values())
    return False


class CompiledGraph:
    """One ATen graph as one jitted jax function."""

    def __init__(self, gm: torch.fx.GraphModule, program: Program, what: str,
                 aliases: tuple[OutputAlias, ...] = (), added: int = 0,
                 alias_layouts: tuple[AliasLayout, ...] = ()) -> None:
        self.gm = gm
        #: Outputs AOTAutograd makes again through their layout (:func:`aliased_layouts`).
        self.alias_layouts = alias_layouts
        #: Outputs made again from another's result, and how many bases
        #: were added to the graph's outputs for them (:func:`output_aliases`).
        self.aliases = aliases
        self.num_outputs = None if not (aliases or added) else len(_output_specs(gm)) - added
        self._boxed_call = True  # see EagerGraph
        self.program = program
        self.what = what  # "forward", "backward", "inference"
        self.cache: dict[Any, _Entry] = {}
        self.eager: EagerGraph | None = None
        self.out_specs = _output_specs(gm)
        self._fitting: set = set()  # ids of entries (self.cache keeps them) whose results were checked to fit
        self.random = program.num_random > 0
        #: The mesh the graph's sharding constraints name (None: none).
        self.mesh = _door.graph_placement(gm)
        self._lock = threading.Lock()
        #: Dynamic dimensions (_padded_graph): None until a symbolic graph's
        #: first call, then its Plan, or why it compiles per shape (a str).
        self.padded_plan: Any = None
        self.padded_cache: dict[Any, Any] = {}

    @_x64_scope
    def __call__(self, args: list) -> Any:
        if self.eager is not None:
            return self.eager(args)
        if self.program.symbolic:
            cfg = _door.config()
            if cfg.dynamic_shapes:
                result = self._padded(args, cfg)
                if result is not None:
                    return result
        layout, arrays, offsets, owners, place, mixed = _door.unwrap(args)
        if place is None:
            place = _door.current_index()
        index = _door.index_of(place)
        cfg = _door.config()
        # Sharded arguments (or constraints): one mesh for the whole call, a
        # program of its own (partitioned).
        partitioned = mixed or type(place) is not int or self.mesh is not None
        key = (layout, cfg, partitioned)
        if self.program.symbolic:
            key += (tuple(getattr(a, "shape", None) for a in args),)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._build(key, layout, cfg, owners, not partitioned)
        for slot in entry.foreign_slots:
            arrays[slot] = _door.to_device_array(arrays[slot], index)
        if partitioned:
            place = _door.onto_mesh(arrays, owners, place, self.mesh)
        sharded = type(place) is not int
        for slot in entry.mutated_slots:
            if not isinstance(owners[slot], torch.Tensor):
                _door.check_writable(owners[slot])  # eager's refusal, before anything is given up
        rng = _door.next_key_args(index) if self.random else ()
        donated: tuple[int, ...] = ()
        if DONATE and entry.mutated_slots:
            # Donate what the graph overwrites unless another holder (a
            # clone sharing the array, an array lent out through interop)
            # still needs the old values.
            candidates, sole = [], []
            for s in entry.mutated_slots:
                if not isinstance(owners[s], torch.Tensor):  # a torch tensor of another device is copied back
                    candidates.append(s)
                    if sys.getrefcount(arrays[s]) <= _SOLE_REFS:
                        sole.append(s)
            donated = tuple(sole)
            _note_donation(tuple(candidates), donated)
        try:
            if donated:
                fn = entry.donating.get(donated)
                if fn is None:
                    fn = entry.donating[donated] = _donating(entry.core, donated, len(arrays))
                give = [arrays[s] for s in donated]
                for s in donated:
                    arrays[s] = None
                with warnings.catch_warnings():
                    # A donated buffer XLA cannot reuse for an output is freed all the same.
                    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                    result = fn(give, arrays, offsets, *rng)
                del give
            else:
                result = entry.fn(arrays, offsets, *rng)
        except GraphLoweringError as err:
            return self._go_eager(err, args)
        except (MemoryError, RuntimeError) as err:  # jax's RESOURCE_EXHAUSTED is a RuntimeError
            oom = _door.out_of_memory(err, self._oom_name(), index)
            if oom is None:
                raise
            raise _lost_inputs(oom, donated, owners) from err
        if entry.checks is None:
            outs, new = result
        else:
            outs, new, flags = result
        if not sharded and id(entry) not in self._fitting:
            # A plugin that runs asynchronously reports a failed allocation
            # only in the results (read later, by whatever op comes next):
            # results larger than the device are that failure, said here,
            # before they replace any input's values.  Once per signature:
            # the results' sizes are the signature's.
            try:
                _door.check_results_fit((*outs, *new), index, self._oom_name())
            except torch.OutOfMemoryError as oom:
                raise _lost_inputs(oom, donated, owners) from None
            self._fitting.add(id(entry))
        for slot, arr in zip(entry.mutated_slots, new):
            owner = owners[slot]
            if isinstance(owner, torch.Tensor):  # a tensor of another device: copy the values back
                with torch.no_grad():
                    owner.copy_(_door.to_torch(arr, index, owner.device, owner.dtype))
            else:
                _door.put_storage(owner, arr, sharded)
        results = []
        it = iter(outs)
        last = None
        for pos, spec in enumerate(self.out_specs):
            if spec.kind != "tensor":
                results.append(entry.static_outputs.get(pos))
                continue
            arr = next(it)
            if spec.device is None:
                results.append(_door.wrap(arr, index, spec.dtype, place))
                last = arr
            else:
                results.append(_door.to_torch(arr, index, spec.device, spec.dtype))
        if last is not None:
            _door.note_result(index, last)
        elif new:
            _door.note_result(index, new[-1])
        if entry.checks is not None:
            _checks.report(flags, self.program.sites, entry.checks,
                           f"in the {self.what} graph of torch.compile(backend='jax') on {_door.DEVICE_NAME}:{index}")
        if self.alias_layouts:
            _with_layout(results, self.alias_layouts, _padded_graph.bindings_of(self.program, args))
        if self.num_outputs is not None:
            return remake_aliases(results, self.aliases, self.num_outputs,
                                  lambda: _padded_graph.bindings_of(self.program, args))
        return results

    # ------------------------------------------------------------ buckets

    def _give_up(self, why: str) -> None:
        """The padded route cannot run this graph (``why``): from now on it
        compiles per shape, as before buckets."""
        self.padded_plan = why
        recompiles.info("torch.compile(backend='jax'): the %s graph (symbolic sizes) compiles once per shape, not "
                        "per bucket: %s", self.what, why)

    def _padded(self, args: list, cfg: Any) -> Any:
        """The call through the program of its sizes' buckets
        (:mod:`._padded_graph`), or None: it runs per shape (counted)."""
        plan = self.padded_plan
        if plan is None:
            plan = _padded_graph.plan(self.program)
            if not isinstance(plan, str) and any(spec.device is not None for spec in self.out_specs):
                plan = "a result on another device"
            if isinstance(plan, str):
                self._give_up(plan)
            else:
                self.padded_plan = plan
        if isinstance(plan, str):
            _door.note_fallback(f"torch.compile {self.what} graph", plan)
            return None
        index = None
        for a in args:
            if isinstance(a, _door.JaxTensor):
                p = _door.place_of(a)
                if type(p) is not int or (index is not None and p != index):
                    _door.note_fallback(f"torch.compile {self.what} graph", "a mesh or several devices")
                    return None
                index = p
            elif isinstance(a, torch.Tensor):
                _door.note_fallback(f"torch.compile {self.what} graph", "a tensor of another device")
                return None
        if index is None:
            index = _door.current_index()
        if self.mesh is not None:
            self._give_up("a sharding constraint")
            return None
        program = self.program
        try:
            bindings, bkey, buckets, comps = _padded_graph.input_padding(plan, args, cfg.dynamic_shapes == "all")
        except _padded_graph.Unpaddable as why:
            if not isinstance(why, _padded_graph.BucketTooLarge):  # (that one is this call's sizes alone)
                self._give_up(str(why))
            _door.note_fallback(f"torch.compile {self.what} graph", str(why))
            return None
        targets = {}
        for slot in program.mutated_inputs:
            # the graph writes exact values into this input: a whole storage of
            # its own, laid out exact (a view, or padding, runs per shape)
            st = targets[slot] = _door.whole_exact_storage(args[slot])
            if st is None:
                _door.note_fallback(f"torch.compile {self.what} graph", "a write into a view or a padded input")
                return None
            _door.check_writable(st)
        statics = tuple(a if spec[0] == "value" else None for a, spec in zip(args, plan.inputs))
        checking = cfg.check_mode if program.sites and cfg.check_mode else None
        key = (bkey, statics, cfg, index)
        entry = self.padded_cache.get(key)
        fresh = entry is None
        if fresh:
            entry = self._build_padded(plan, buckets, comps, statics, cfg, checking)
        arrays = []
        first = None
        for a, c in zip(args, comps):
            if c is None:
                arrays.append(None)
                continue
            padded = _padded_graph.concrete_padding(c, bindings)
            if padded is None:
                arrays.append(_door.read(a))
            else:
                arrays.append(_door.padded_array(a, padded))
                if first is None:
                    first = (_padded_graph.physical(c), tuple(a.shape))
        sizes = [_door.device_scalar(bindings[s], index) for s in plan.symbols]
        fn, out_info = entry[0], entry[1]
        rng = _door.next_key_args(index) if self.random else ()  # the key the per-shape program would draw
        try:
            result = fn(arrays, sizes, *rng)
        except Exception as err:
            if not fresh:
                raise
            why = str(err) if isinstance(err, _padded_graph.Unpaddable) else \
                f"{type(err).__name__} on padded values: {str(err).splitlines()[0] if str(err) else ''}"
            logger.debug("pjrt_host: the padded graph failed", exc_info=err)
            self._give_up(why)
            _door.note_fallback(f"torch.compile {self.what} graph", why)
            return None
        if fresh:
            _door.note_padded("graph_programs")
            with self._lock:
                if len(self.padded_cache) > 64:
                    self.padded_cache.clear()
                self.padded_cache[key] = entry
        if checking is None:
            outs, new = result
        else:
            outs, new, flags = result
        for slot, arr in zip(entry[2], new):
            _door.put_storage(targets[slot], arr)
        if first is not None:
            _door.note_padded("padded_calls", *first)
        results = []
        it = iter(outs)
        last = None
        for pos, spec in enumerate(self.out_specs):
            info = out_info.get(pos)
            if spec.kind != "tensor":
                results.append(_padded_graph.concrete_value(info, bindings))
                continue
            arr = last = next(it)
            padded = _padded_graph.concrete_padding(info, bindings)
            if padded is None:
                results.append(_door.wrap(arr, index, spec.dtype))
            else:
                shape = _padded_graph.logical_shape(info, bindings)
                results.append(_door.wrap_padded(arr, shape, index, spec.dtype, padded))
        if last is not None:
            _door.note_result(index, last)
        if checking is not None:
            _checks.report(flags, program.sites, checking,
                           f"in the {self.what} graph of torch.compile(backend='jax') on {_door.DEVICE_NAME}:{index}")
        if self.alias_layouts:
            _with_layout(results, self.alias_layouts, bindings)
        if self.num_outputs is not None:
            return remake_aliases(results, self.aliases, self.num_outputs, bindings)
        return results

    def _build_padded(self, plan: Any, buckets: dict, comps: list, statics: tuple, cfg: Any, checking: Any) -> tuple:
        program = self.program
        out_specs = self.out_specs
        ctx = _door.lowering_context(cfg, True)
        out_info: dict[int, Any] = {}
        written: list = []  # the inputs the graph writes into, in the order of its new values

        def fn(arrays: list, sizes: list, *rng: Any) -> Any:
            inputs = [s if a is None else a for a, s in zip(arrays, statics)]
            rows: list | None = [] if checking else None
            key = _door.draw_key(*rng) if rng else None
            outs, dims, writes = _padded_graph.run(program, plan, buckets, inputs, comps, sizes, ctx, rows, key)
            last = {}  # (a second write into one input replaces the first)
            for slot, v in writes:
                last[slot] = v
            written[:] = list(last)
            arrays_out = []
            for pos, (spec, v, d) in enumerate(zip(out_specs, outs, dims)):
                if spec.kind == "tensor":
                    arrays_out.append(v)
                    out_info[pos] = d
                else:
                    out_info[pos] = None if hasattr(v, "shape") else v
            new = tuple(last.values())
            if rows is not None:
                return tuple(arrays_out), new, _checks.stack(rows)
            return tuple(arrays_out), new

        if recompiles.isEnabledFor(logging.INFO):
            recompiles.info("torch.compile(backend='jax'): the %s graph compiles a program for the buckets %s",
                            self.what, ", ".join(f"{s}: {b}" for s, b in buckets.items()))
        return _program_cache.jit(fn), out_info, written

    def _oom_name(self) -> str:
        return f"the {self.what} graph of torch.compile(backend='jax')"

    # ------------------------------------------------------------ building

    def _build(self, key: Any, layout: tuple, cfg: Any, owners: list, one_device: bool) -> _Entry:
        program = self.program
        ctx = _door.lowering_context(cfg, one_device)
        # Where each placeholder's values live: (slot, view static, offset position).
        where: list[Any] = []
        n_off = 0
        for spec in layout:
            if type(spec) is int:
                where.append((spec, None, -1))
            elif spec[0] == "v":
                where.append((spec[1], spec[2], n_off))
                n_off += 1
            elif spec[0] == "c":
                where.append((spec[1], None, -1))
            else:
                where.append(None)
        mutated_slots: list[int] = []
        for ph in program.mutated_inputs:
            w = where[ph]
            if w is None:
                raise RuntimeError(f"pjrt_host: the {self.what} graph writes to its input {ph}, which is not a tensor")
            if w[0] not in mutated_slots:
                mutated_slots.append(w[0])
        static_outputs: dict[int, Any] = {}
        out_specs = self.out_specs
        random = self.random
        checking = cfg.check_mode if program.sites and cfg.check_mode else None

        def fn(arrays: list, offsets: list, *rng: Any) -> Any:
            inputs = []
            for spec, w in zip(layout, where):
                if w is None:
                    inputs.append(spec[1])
                elif w[1] is None:
                    inputs.append(arrays[w[0]])
                else:
                    inputs.append(_door.view_read(arrays[w[0]], w[1], offsets[w[2]]))
            rng_key = None
            if random:
                kd, counter = rng
                rng_key = _door.draw_key(kd, counter)
            rows: list | None = [] if checking else None
            # The storage each input tensor lives in (a view's is its base's):
            # what an as_strided of it reads.
            storages = [arrays[w[0]] if w is not None and (type(spec) is int or spec[0] == "v") else None
                        for spec, w in zip(layout, where)]
            outs, mutations = program.run(inputs, rng_key, ctx, rows, storages)
            new: dict[int, Any] = {}
            for ph, value in mutations:
                slot, static, off = where[ph]
                base = new.get(slot, arrays[slot])
                value = value.astype(base.dtype)
                if static is None:
                    new[slot] = value.reshape(base.shape)
                else:
                    new[slot] = _door.view_write(base, static, offsets[off], value)
            arrays_out = []
            for pos, (spec, v) in enumerate(zip(out_specs, outs)):
                if spec.kind == "tensor":
                    arrays_out.append(v)
                else:
                    static_outputs[pos] = v if not hasattr(v, "shape") else None
            if rows is not None:
                return tuple(arrays_out), tuple(new[s] for s in mutated_slots), _checks.stack(rows)
            return tuple(arrays_out), tuple(new[s] for s in mutated_slots)

        foreign = tuple(spec[1] for spec in layout if type(spec) is tuple and spec[0] == "c")
        entry = _Entry(_program_cache.jit(fn), tuple(mutated_slots), static_outputs, foreign, fn, {}, checking)
        with self._lock:
            if len(self.cache) > 64:  # layouts that never repeat: bound the memory
                self.cache.clear()
                self._fitting.clear()
            self.cache[key] = entry
        return entry

    def _go_eager(self, err: GraphLoweringError, args: list) -> Any:
        warn_once(f"lowering-failed:{err.op}",
                  f"pjrt_host: torch.compile(backend='jax'): {err.op} failed in graph form ({err.error}); this "
                  f"{self.what} graph runs op by op on the device instead of as one jax.jit. How to report it "
                  f"(with the op name and your torch version): {REPORT} (warned once per op).")
        logger.debug("pjrt_host: graph-form lowering failed", exc_info=err)
        self.eager = EagerGraph(self.gm, self.num_outputs)
        return self.eager(args)


def _output_specs(gm: torch.fx.GraphModule) -> list[_OutSpec]:
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    specs = []
    for a in torch.fx.node.map_aggregate(out_node.args[0], lambda x: x):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if isinstance(val, torch.Tensor):
            device = None if val.device.type == _door.DEVICE_NAME else val.device
            specs.append(_OutSpec("tensor", _door.device_dtype(val.dtype), device))
        else:
            specs.append(_OutSpec("value"))
    return specs
