"""Dynamic dimensions in compiled graphs: a symbolic graph runs one jax
program per *bucket* of its sizes, not per concrete shape.

Dynamo hands the backend a graph whose sizes are symbols (automatic dynamic
at the second size, ``torch._dynamo.mark_dynamic``, ``dynamic=True``), and
every node's fake tensor says each of its dims as an expression of them
(``s0``, ``2*s0``, ``s0 - 1``).  This module evaluates such a graph on
*padded* arrays, with eager's representation and rules
(docs/dynamic-shapes.md):

* each symbol's physical size is its bucket (``_padding.bucket``), and its
  logical value goes into the program as a run-time int32 scalar, so the
  program is keyed by buckets;
* a value's dims are *components* ``(physical, logical expression,
  dynamic)``, outermost first, as a padded storage's (``Storage.padded``):
  a dim that merged a batch dim with a padded one (``x.view(-1, C)``) has
  two, its padding between the rows;
* an op runs on padded values when eager's rule table
  (``_dynamic_dims._RULES`` and the pointwise tag: ``rule_for``) says how:
  its inputs' padding takes the rule's fill (zeros before a sum or a
  contraction, the lowest value before a softmax, ``ignore_index`` for a
  loss's targets) before the unchanged lowering reads them, and the rule's
  exact dims must not be padded.  The graph's own data movement (views,
  permutations, splits and slices along exact dims, prefix slices of a
  padded dim, expands, reshapes that merge or split whole components) is
  done here, on the physical arrays, because in a graph these are
  functional ops rather than a storage's views;
* a result's dims take the components of the input dims with the same
  expression (eager's ``result_padding``, by expression instead of size);
* the graph's tensor results are returned padded (``Storage.padded``, as
  eager's padded ops return them): a backward graph takes the forward's
  saved values as they are, and anything else reading them gets them cut.

Anything the padded route cannot describe -- an op without a rule, a random
op, a write into an input, a view that splits a padded dim -- raises
:class:`Unpaddable` (statically from :func:`plan`, or while the program is
traced), and the graph falls back to one program per shape: the cost it had
before, never a wrong value.  The reason is counted in
``torch.jax.dynamic_shape_stats()`` and logged to ``pjrt_host.recompiles``.
"""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import jax
import sympy
import torch

from .._lowerings import invoke, op_name
from . import _door

__all__ = ["BucketTooLarge", "Plan", "Unpaddable", "anchored", "bindings_of", "concrete_padding", "concrete_value", "input_metas", "input_padding", "logical_shape",
           "physical", "plan", "run", "size_expression"]


class Unpaddable(Exception):
    """The graph cannot run on padded values: ``str(self)`` says why."""


class BucketTooLarge(Unpaddable):
    """This call's sizes have a bucket past what an int32 holds (sizes
    travel into the program as int32 scalars): it runs per shape; the
    graph's other sizes still run in buckets."""


#: Data movement done here on physical arrays, by kind.
_SAME = frozenset({"aten::detach", "aten::alias", "aten::lift_fresh_copy", "aten::clone", "aten::contiguous",
                   "aten::_to_copy"})
_MOVES = frozenset({"aten::t", "aten::transpose.int", "aten::permute", "aten::unsqueeze", "aten::squeeze.dim",
                    "aten::squeeze.dims", "aten::squeeze", "aten::numpy_T", "aten::movedim.int"})
_ALONG = frozenset({"aten::split.Tensor", "aten::split_with_sizes", "aten::chunk", "aten::unbind.int",
                    "aten::narrow", "aten::select.int", "aten::slice.Tensor", "aten::split.sizes"})
_RESHAPES = frozenset({"aten::view", "aten::_unsafe_view", "aten::reshape"})
_EXPANDS = frozenset({"aten::expand"})
#: Ops whose values depend on each element's position in the last two dims
#: only (not on the sizes): on a padded array whose padding is at the end of
#: those dims, every logical position keeps its index.
_POSITIONAL = frozenset({"aten::tril", "aten::triu"})
#: The gradient of a slice: along an exact dim as it is, along a padded dim
#: (a prefix slice's) the gradient with zeros in its padding.
_SLICE_BACKWARD = "aten::slice_backward"
#: The gradient of a select: zeros, the gradient at the position (from the
#: logical end for a negative one).
_SELECT_BACKWARD = "aten::select_backward"
#: A pad with a constant (``F.pad(labels, (0, 1), value=-100)``, what
#: transformers' causal-LM loss does before it shifts its labels): along
#: exact dims as it is, along a padded dim at its end only.
_PADS = frozenset({"aten::constant_pad_nd"})
#: A write through a view, as functionalization leaves it
#: (``shifted[:, 1:] = ids[:, :-1]``: a ``copy`` into the view's value,
#: then a ``slice_scatter`` of it into the base), what an encoder-decoder's
#: ``shift_tokens_right`` does to its labels.
_COPY = "aten::copy"
_SCATTERS = frozenset({"aten::slice_scatter", "aten::select_scatter"})
#: A mean over padded dims: eager's (``_dispatch._summed_when_padded``), the
#: padded sum over the logical count, a run-time scalar.
_MEANS = frozenset({"aten::mean.dim", "aten::mean"})


def _short(name: str) -> str:
    return name[: -len(".default")] if name.endswith(".default") else name


class Plan(NamedTuple):
    """What :func:`plan` found in a graph: its symbols (in the order the
    program takes their logical sizes) and per step how it runs padded."""

    symbols: tuple  #: sympy symbols, sorted by name
    #: node -> ("rule", Rule), or (how it moves data / what it is: "same", "moves", "along", "reshape",
    #: "expand", "positional", "slice_backward", "select_backward", "pad", "copy", "scatter", "mean", "factory",
    #: "write": a copy_ into an exact input; None)
    kinds: dict
    #: per placeholder: ("tensor", its dims' sizes, ((dim, symbol) where a dim is one)), ("size", symbol or
    #: None) or ("value",): read once, so that a call binds its sizes without sympy
    inputs: tuple = ()
    #: buckets -> (buckets by symbol, per placeholder its components or None)
    layouts: dict = {}


def plan(program: Any) -> Plan | str:
    """How ``program`` (an ``_interpreter.Program`` of a symbolic graph)
    runs padded, or why it cannot (a string naming the op and the cause)."""
    metas = input_metas(program)
    for i in program.mutated_inputs:
        # (a write of exact values into an exact input, batch norm's running
        # statistics: taken as the per-shape program takes it)
        if not isinstance(metas[i], torch.Tensor) or any(not isinstance(d, int) for d in metas[i].shape):
            return "it writes into an input with a symbolic size"
    if program.unsupported:
        return "an op without a graph-form lowering"
    kinds: dict = {}
    symbols: set = set()
    for step in program.steps:
        node = step.node
        if step.kind == "input":
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                symbols |= size_expression(val).free_symbols
            elif isinstance(val, torch.Tensor):
                for d in val.shape:
                    symbols |= size_expression(d).free_symbols
            elif isinstance(val, (torch.SymFloat, torch.SymBool)):
                return f"input {node.name} is a symbolic {type(val).__name__}"
            continue
        if step.kind in ("output", "getitem", "noop", "constant", "symbolic"):
            continue
        if step.kind == "python":
            if not isinstance(node.meta.get("val"), (torch.SymInt, int)):
                return f"{node.target}: a Python value that is not a size"
            continue
        if step.kind != "lowering":
            return f"{op_name(node.target)}: a {step.kind} step"
        name = op_name(node.target)
        short = _short(name)
        if short == "aten::copy_" and step.index >= 0:
            kinds[node] = ("write", None)
        elif short in _SAME:
            kinds[node] = ("same", None)
        elif short in _MOVES:
            kinds[node] = ("moves", None)
        elif short in _ALONG:
            kinds[node] = ("along", None)
        elif short in _RESHAPES:
            kinds[node] = ("reshape", None)
        elif short in _EXPANDS:
            kinds[node] = ("expand", None)
        elif short in _POSITIONAL:
            kinds[node] = ("positional", None)
        elif short == _SLICE_BACKWARD:
            kinds[node] = ("slice_backward", None)
        elif short == _SELECT_BACKWARD:
            kinds[node] = ("select_backward", None)
        elif short in _PADS:
            kinds[node] = ("pad", None)
        elif short == _COPY:
            kinds[node] = ("copy", None)
        elif short in _SCATTERS:
            kinds[node] = ("scatter", None)
        elif short in _MEANS and node.meta["val"].dtype.is_floating_point:
            kinds[node] = ("mean", None)
        elif step.fn.factory:
            if step.fn.needs_rng or short in ("aten::linspace", "aten::eye", "aten::eye.m"):
                return f"{name}: a factory whose values depend on its sizes"
            kinds[node] = ("factory", None)
        else:
            rule = _door.padded_rule(node.target, name, step.fn)
            if rule is None:
                return f"{name}: no padded rule (_dynamic_dims._RULES)"
            kinds[node] = ("rule", rule)
    if not symbols:
        return "no symbolic size among its inputs"
    inputs = []
    for val in input_metas(program):
        if isinstance(val, torch.Tensor):
            sizes = tuple(size_expression(d) for d in val.shape)
            inputs.append(("tensor", sizes, tuple((d, e) for d, e in enumerate(sizes) if e.is_Symbol),
                           tuple(d for d, e in enumerate(sizes) if not e.is_Symbol and not e.is_Integer)))
        elif isinstance(val, torch.SymInt):
            e = size_expression(val)
            inputs.append(("size", e if e.is_Symbol else None))
        else:
            inputs.append(("value",))
    return Plan(tuple(sorted(symbols, key=str)), kinds, tuple(inputs), {})


def size_expression(d: Any) -> Any:
    """A size (int or SymInt) as a sympy expression."""
    if isinstance(d, int):
        return sympy.Integer(d)
    return sympy.sympify(d.node.expr)



def bindings_of(program: Any, args: list) -> dict:
    """Each symbol of a graph's placeholders (a size argument, or a tensor
    dim, stride or offset that is the symbol) at the sizes of ``args``."""
    bindings: dict = {}
    for val, a in zip(input_metas(program), args):
        if isinstance(val, torch.SymInt):
            e = _traced_symbol(val)
            if e is not None:
                bindings[e] = int(a)
        elif isinstance(val, torch.Tensor) and isinstance(a, torch.Tensor):
            for traced, given in ((val.shape, a.shape), (val.stride(), a.stride()),
                                  ((val.storage_offset(),), (a.storage_offset(),))):
                for n, m in zip(traced, given):
                    e = _traced_symbol(n)
                    if e is not None:
                        bindings.setdefault(e, m)
    return bindings


def _traced_symbol(d: Any) -> Any:
    """The symbol a placeholder's size was traced as, or None. A symbol the
    shape environment later narrowed to one value (a guard such as
    ``as_strided``'s storage bound) still names the size in expressions
    recorded before the narrowing, so it is bound under its own name too."""
    if isinstance(d, int):
        return None
    e = size_expression(d)
    if e.is_Symbol:
        return e
    raw = d.node._expr  # (torch's SymNode: the expression as traced, before the narrowing)
    return raw if raw.is_Symbol else None


def canonical(expr: Any, buckets: dict, padded_outer: bool = False) -> tuple:
    """The components of an input dim of size ``expr``: exact for a
    number, one padded component for a symbol, a number times a symbol as
    an exact outer and a padded inner component (``padded_outer``: the
    other way round, as the input holds them); else :class:`Unpaddable`."""
    if expr.is_Integer:
        n = int(expr)
        return ((n, expr, False),)
    p = anchored(expr, buckets)
    if p is not None:
        return ((p, expr, True),)
    factored = sympy.factor(expr)  # (2*s - 2 is 2*(s - 1): a batch of 2 merged with a length of s - 1)
    if isinstance(factored, sympy.Mul) and len(factored.args) == 2 and factored.args[0].is_Integer:
        c, inner = int(factored.args[0]), factored.args[1]
        p = anchored(inner, buckets)
        if p is not None:
            if padded_outer:
                return ((p, inner, True), (c, sympy.Integer(c), False))
            return ((c, sympy.Integer(c), False), (p, inner, True))
    raise Unpaddable(f"an input dim of size {expr}")


def anchored(expr: Any, buckets: dict) -> int | None:
    """The physical size of a padded dim whose logical size is ``expr``,
    where it is a symbol plus a number (``s``, ``s + 1``, ``s - 1``): the
    symbol's bucket, and room for what the number adds.  One physical size
    per expression, however a value came to it (a pad at the end and a
    slice from 1 give ``s`` the symbol's bucket again, as a prefix slice to
    ``s - 1`` keeps it), so that values of one logical size line up, in a
    graph and between a forward and its backward.  None for any other
    expression."""
    if expr.is_Symbol:
        return buckets[expr]
    if isinstance(expr, sympy.Add) and len(expr.args) == 2:
        c, sym = expr.args
        if c.is_Integer and sym.is_Symbol:
            return buckets[sym] + max(int(c), 0)
    return None


def input_padding(the_plan: Plan, args: list, odd: bool) -> tuple:
    """At a call: ``(bindings, bucket key, buckets, per input its dims'
    components or None)`` -- each symbol's logical value from the inputs (a
    size argument, or a tensor dim that is the symbol), its bucket, and the
    components the program reads each tensor input with."""
    bindings: dict = {}
    # A dim of size c*s merges a dim of c with one of s in either order (a
    # [B, T] view of a batch of 2 by a length: 2 rows of the length; a ViT's
    # batch by its 17 tokens: the batch outer): an input padded so is read
    # as it is laid out, where the symbol's dim is the outer one.
    outer = ()
    for i, (spec, a) in enumerate(zip(the_plan.inputs, args)):
        kind = spec[0]
        if kind == "tensor":
            if spec[2]:
                shape = a.shape
                for d, e in spec[2]:
                    bindings[e] = shape[d]
            if spec[3]:
                padded = _door.whole_padding(a)
                if padded is not None:
                    outer += tuple((i, d) for d in spec[3] if len(padded[d]) == 2 and padded[d][0][2]
                                   and not padded[d][1][2])
        elif kind == "size" and spec[1] is not None:
            bindings[spec[1]] = int(a)
    try:
        key = tuple(_door.bucket(bindings[s], odd) for s in the_plan.symbols)
    except KeyError:
        missing = [s for s in the_plan.symbols if s not in bindings]
        raise Unpaddable(f"the sizes {missing} are not an input's size") from None
    if key and max(key) > _door.max_bucket():
        raise BucketTooLarge(f"a size whose bucket ({max(key)}) does not fit an int32")
    if outer:
        key = (*key, outer)
    found = the_plan.layouts.get(key)
    if found is None:
        buckets = dict(zip(the_plan.symbols, key))
        comps = [tuple(canonical(e, buckets, (i, d) in outer) for d, e in enumerate(spec[1]))
                 if spec[0] == "tensor" else None for i, spec in enumerate(the_plan.inputs)]
        if len(the_plan.layouts) > 256:
            the_plan.layouts.clear()
        found = the_plan.layouts[key] = (buckets, comps)
    return bindings, key, found[0], found[1]


def input_metas(program: Any) -> list:
    """What torch traced each placeholder as (fake tensor, SymInt, value)."""
    return [s.node.meta.get("val") for s in program.steps if s.kind == "input"]


def concrete_value(v: Any, bindings: dict) -> Any:
    """A graph result that is not a tensor (a size: a sympy expression)."""
    if isinstance(v, sympy.Basic):
        return _value(v, bindings)
    return v


def logical_shape(dims: tuple, bindings: dict) -> tuple:
    return tuple(math.prod(_value(c[1], bindings) if c[2] else c[0] for c in dim) for dim in dims)


def concrete_padding(dims: tuple, bindings: dict) -> tuple | None:
    """``Storage.padded`` of a value with components ``dims`` (None: exact)."""
    if not any(c[2] for dim in dims for c in dim):
        return None
    return tuple(tuple((c[0], _value(c[1], bindings), True) if c[2] else (c[0], c[0], False) for c in dim)
                 for dim in dims)


_evaluators: dict = {}


def _value(expr: Any, bindings: dict) -> int:
    """``expr`` at the call's sizes: a symbol looked up, anything else by a
    closure made once per expression (sympy's ``xreplace`` costs tens of
    microseconds a call)."""
    if expr.is_Symbol:
        return bindings[expr]
    fn = _evaluators.get(expr)
    if fn is None:
        if len(_evaluators) > 4096:
            _evaluators.clear()
        fn = _evaluators[expr] = _evaluator(expr)
    return fn(bindings)


def _evaluator(expr: Any) -> Any:
    if expr.is_Integer:
        n = int(expr)
        return lambda b: n
    if expr.is_Symbol:
        return lambda b: b[expr]
    parts = [_evaluator(a) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return lambda b: sum(p(b) for p in parts)
    if isinstance(expr, sympy.Mul):
        return lambda b: math.prod(p(b) for p in parts)
    if type(expr).__name__ == "FloorDiv":
        return lambda b: parts[0](b) // parts[1](b)
    free = tuple(expr.free_symbols)

    def general(b: dict) -> int:
        missing = [s for s in free if s not in b]
        if missing:
            raise KeyError(missing[0])  # (a size no input binds: the caller's fallback)
        return int(expr.xreplace(b))
    return general


def physical(dims: tuple) -> tuple:
    return tuple(math.prod(c[0] for c in dim) for dim in dims)


def _normal(dim: tuple) -> tuple:
    """One exact component for a dim with no padded one."""
    if len(dim) > 1 and not any(c[2] for c in dim):
        n = math.prod(c[0] for c in dim)
        return ((n, sympy.Integer(n), False),)
    return dim


def _exact_dim(n: int) -> tuple:
    return ((n, sympy.Integer(n), False),)


# ------------------------------------------------------------ the trace


class _Trace:
    """One trace of the graph on padded values."""

    def __init__(self, program: Any, the_plan: Plan, buckets: dict, sizes: list, key: Any = None) -> None:
        self.key = key
        self.program = program
        self.plan = the_plan
        self.buckets = buckets
        #: symbol -> its traced logical size (int32)
        self.sizes = dict(zip(the_plan.symbols, sizes))
        #: node -> per dim its components (tensor values only)
        self.dims: dict = {}
        #: (node, fill) -> the node's value with its padding filled so
        self.fills: dict = {}
        #: (placeholder, its new value) of each write into an input, in order
        self.mutations: list = []

    # sizes ---------------------------------------------------------

    def logical(self, expr: Any) -> Any:
        """``expr`` evaluated on the traced logical sizes."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return self.sizes[expr]
        if isinstance(expr, sympy.Add):
            return _fold(operator.add, [self.logical(a) for a in expr.args])
        if isinstance(expr, sympy.Mul):
            return _fold(operator.mul, [self.logical(a) for a in expr.args])
        if type(expr).__name__ == "FloorDiv":
            return self.logical(expr.args[0]) // self.logical(expr.args[1])
        raise Unpaddable(f"a size {expr} the program cannot compute")

    def masks(self, dims: tuple) -> tuple:
        """``_padding.fill``'s masks and logical sizes of a value."""
        masks, sizes = [], []
        for dim in dims:
            terms = []
            for i, (p, n, dynamic) in enumerate(dim):
                if dynamic:
                    terms.append((math.prod(c[0] for c in dim[i + 1:]), p))
                    sizes.append(self.logical(n))
            masks.append(tuple(terms))
        return tuple(masks), sizes

    def filled(self, arr: Any, dims: tuple, value: Any) -> Any:
        if value is None or not any(c[2] for dim in dims for c in dim):
            return arr
        masks, sizes = self.masks(dims)
        return _door.fill(arr, masks, sizes, value)

    def result_dims(self, what: str, val: Any, known: dict) -> tuple:
        """The components of a result with fake tensor ``val``: per dim, those
        of an input dim of the same size, else exact for a number, else the
        symbol's bucket."""
        out = []
        for d in val.shape:
            e = size_expression(d)
            if e.is_Integer:
                out.append(_exact_dim(int(e)))
            elif e in known:
                out.append(known[e])
            elif self.anchored(e) is not None:
                out.append(((self.anchored(e), e, True),))
            else:
                raise Unpaddable(f"{what}: a result dim of size {e} that none of its inputs has")
        return tuple(out)

    def anchored(self, expr: Any) -> int | None:
        return anchored(expr, self.buckets)

    def known(self, what: str, tensors: list) -> dict:
        """size expression -> components, over the dims of ``tensors``
        (nodes); two paddings of one size: :class:`Unpaddable`."""
        found: dict = {}
        for n in tensors:
            for dim, d in zip(self.dims[n], n.meta["val"].shape):
                e = size_expression(d)
                if e.is_Integer:
                    continue
                if found.setdefault(e, dim) != dim:
                    raise Unpaddable(f"{what}: dims of size {e} padded in two ways")
        return found

    # running -------------------------------------------------------

    def run(self, inputs: list, comps: list, ctx: Any, rows: list | None) -> tuple:
        program = self.program
        env: dict = {}
        outputs: list = []
        out_dims: list = []

        def value(a: Any, sizes: bool) -> Any:
            def one(x: Any) -> Any:
                if isinstance(x, torch.fx.Node):
                    v = env[x]
                    if sizes and isinstance(v, sympy.Basic):
                        return self.logical(v)
                    return v
                return x
            return torch.fx.node.map_aggregate(a, one)

        for step in program.steps:
            node = step.node
            kind = step.kind
            if kind == "input":
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor):
                    env[node] = inputs[step.index]
                    self.dims[node] = comps[step.index]
                elif isinstance(val, torch.SymInt):
                    env[node] = size_expression(val)
                else:
                    env[node] = inputs[step.index]
            elif kind in ("symbolic", "python"):
                val = node.meta.get("val")
                env[node] = size_expression(val) if isinstance(val, (torch.SymInt, int)) else val
            elif kind == "noop":
                env[node] = None
            elif kind == "constant":
                env[node] = step.fn
                self.dims[node] = tuple(_exact_dim(int(n)) for n in step.fn.shape)
            elif kind == "getitem":
                src, i = node.args
                env[node] = env[src][i]
                if src in self.dims:
                    self.dims[node] = self.dims[src][i]
            elif kind == "output":
                for a in torch.fx.node.map_aggregate(node.args[0], lambda x: x):
                    if isinstance(a, torch.fx.Node) and a in self.dims:
                        outputs.append(env[a])
                        out_dims.append(self.dims[a])
                    elif isinstance(a, torch.fx.Node):
                        outputs.append(env[a])
                        out_dims.append(None)
                    else:
                        outputs.append(a)
                        out_dims.append(None)
            else:
                self.lowering(step, env, ctx, value, rows)
        return outputs, out_dims, self.mutations

    def lowering(self, step: Any, env: dict, ctx: Any, value: Any, rows: list | None) -> None:
        node = step.node
        what = op_name(node.target)
        kind, rule = self.plan.kinds[node]
        val = node.meta.get("val")
        tensors = [a for a in node.all_input_nodes if a in self.dims]
        known = self.known(what, tensors)
        if rows is not None and step.checks:
            self.check(step.checks, env, rows)
        if kind == "rule" and _short(what) == "aten::cat":
            # torch skips empty tensors in a cat (a cache's first torch.tensor([])):
            # one left is the result itself, whatever dim it is joined along
            tensors = node.args[0]
            full = [t for t in tensors if 0 not in [size_expression(d) for d in t.meta["val"].shape]]
            if len(full) == 1 and len(tensors) > 1:
                env[node] = env[full[0]] if step.meta is None else env[full[0]].astype(step.meta)
                self._set(node, what, env[node], val, self.dims[full[0]])
                return
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            dim %= max(len(val.shape), 1)
            if any(c[2] for t in full for c in self.dims[t][dim]):
                env[node] = self.join(node, what, env, full, dim)
                return
        if kind == "rule":
            args, kwargs = value(node.args, True), dict(value(node.kwargs, True))
            exact = rule.exact(*_fakes(node)) if rule.exact is not None else {}
            args = list(args)
            for pos, a in enumerate(node.args):
                args[pos] = self._fill_arg(what, rule, pos, a, args[pos], args, kwargs, exact)
            for k, a in node.kwargs.items():
                kwargs[k] = self._fill_arg(what, rule, k, a, kwargs[k], args, kwargs, exact)
            ctx = self.reading(node, ctx)
            if step.random >= 0:
                ctx = self.drawing(step, tensors, ctx)
            result = invoke(step.fn, args, kwargs, ctx, step.meta)
        elif kind == "factory":
            dims = self.result_dims(what, val, known)
            args, kwargs = value(node.args, True), value(node.kwargs, True)
            result = invoke(step.fn, args, kwargs, ctx, step.meta, physical(dims))
        elif kind == "positional":
            if any(len(dim) != 1 for dim in self.dims[node.args[0]][-2:]):
                raise Unpaddable(f"{what}: over a dim that merged a padded one")
            args, kwargs = value(node.args, False), value(node.kwargs, False)
            result = invoke(step.fn, args, kwargs, ctx, step.meta)
        elif kind in ("same", "moves"):
            args, kwargs = value(node.args, False), value(node.kwargs, False)
            result = invoke(step.fn, args, kwargs, ctx, step.meta)
        elif kind == "along":
            result = self.along(step, what, env, ctx, value)
            if node in self.dims:  # (a slice of a padded dim: its components set)
                env[node] = result
                return
        elif kind == "pad":
            result = env[node] = self.pad(node, what, env, value)
            return
        elif kind == "copy":
            result = env[node] = self.copy(node, what, env)
            return
        elif kind == "select_backward":
            result = env[node] = self.select_backward(node, what, env, known)
            return
        elif kind == "write":
            src = node.args[1]
            if isinstance(src, torch.fx.Node) and any(c[2] for dim in self.dims.get(src, ()) for c in dim):
                raise Unpaddable(f"{what}: padded values written into an input")
            args, kwargs = value(node.args, False), value(node.kwargs, False)
            result = env[node] = invoke(step.fn, args, kwargs, ctx, step.meta)
            self._set(node, what, result, val, self.dims[node.args[0]])
            self.mutations.append((step.index, result))
            return
        elif kind == "scatter":
            result = env[node] = self.scatter(node, what, env, ctx, step)
            return
        elif kind == "mean":
            result = self.mean(node, env, ctx, step.meta)
        elif kind == "slice_backward":
            result = self.slice_backward(step, what, env, ctx, known)
        elif kind == "reshape":
            src = node.args[0]
            dims = _reshape(self.dims[src], [size_expression(d) for d in val.shape], what)
            result = env[src].reshape(physical(dims))
            self._set(node, what, result, val, dims)
            env[node] = result
            return
        else:  # expand
            src = node.args[0]
            sdims = self.dims[src]
            rank = len(val.shape)
            dims = []
            for i, d in enumerate(val.shape):
                j = i - (rank - len(sdims))
                e = size_expression(d)
                if j >= 0 and physical((sdims[j],))[0] != 1:
                    dims.append(sdims[j])
                elif e.is_Integer:
                    dims.append(_exact_dim(int(e)))
                elif e in known:
                    dims.append(known[e])
                elif self.anchored(e) is not None:  # (``s``, ``s + 1``)
                    dims.append(((self.anchored(e), e, True),))
                else:
                    raise Unpaddable(f"{what}: an expanded dim of size {e}")
            dims = tuple(dims)
            result = jax.numpy.broadcast_to(env[src], physical(dims))
            self._set(node, what, result, val, dims)
            env[node] = result
            return
        env[node] = result
        if isinstance(val, torch.Tensor):
            dims = self.result_dims(what, val, known)
            self._set(node, what, result, val, dims)
        elif isinstance(val, (tuple, list)):
            dims = [self.result_dims(what, v, known) if isinstance(v, torch.Tensor) else None for v in val]
            for i, (v, r, d) in enumerate(zip(val, result, dims)):
                if d is not None and tuple(r.shape) != physical(d):
                    if 0 not in tuple(r.shape):
                        raise Unpaddable(f"{what}: a result of physical shape {tuple(r.shape)}, not {physical(d)}")
                    # an empty result the lowering shapes otherwise than torch's meta kernel (eval batch
                    # norm's saved statistics: empty on CPU and here) holds no padding: its own shape
                    dims[i] = tuple(_exact_dim(n) for n in r.shape)
            self.dims[node] = dims

    def reading(self, node: Any, ctx: Any) -> Any:
        """The context of an op with a rule, as eager's padded route makes
        it: per padded tensor argument, the mask of its logical positions
        (``LoweringContext.logical``), for a lowering that reads its inputs'
        logical elements (attention's key positions, batch norm's samples,
        a negative index wrapped by its dim's logical length)."""
        import dataclasses

        logical = []
        for pos, a in enumerate(node.args):
            dims = self.dims.get(a) if isinstance(a, torch.fx.Node) else None
            if dims is None or not any(c[2] for dim in dims for c in dim):
                continue
            masks, sizes = self.masks(dims)
            shape = physical(dims)
            logical.append((pos, lambda shape=shape, masks=masks, sizes=sizes: _door.inside(shape, masks, sizes)))
        return dataclasses.replace(ctx, logical=tuple(logical)) if logical else ctx

    def drawing(self, step: Any, tensors: list, ctx: Any) -> Any:
        """The context of a random op with a rule (dropout): its key, as
        the per-shape program folds it, and over each padded input the
        logical flat index of every position (``draw_positions``), so that
        each logical element draws what an exact draw gives it and a seed
        draws the same numbers with buckets and without."""
        import dataclasses

        positions = []
        for n in tensors:
            dims = self.dims[n]
            if not any(c[2] for dim in dims for c in dim):
                continue
            shape = physical(dims)
            comps = tuple(tuple((c[0], c[2]) for c in dim) for dim in dims)
            sizes = [self.logical(c[1]) for dim in dims for c in dim if c[2]]
            positions.append((shape, lambda shape=shape, comps=comps, sizes=sizes:
                              _door.positions(shape, comps, sizes)))
        return dataclasses.replace(ctx, rng_key=jax.random.fold_in(self.key, step.random),
                                   draw_positions=tuple(positions))

    def _set(self, node: Any, what: str, result: Any, val: Any, dims: tuple) -> None:
        if tuple(result.shape) != physical(dims):
            raise Unpaddable(f"{what}: a result of physical shape {tuple(result.shape)}, not {physical(dims)}")
        self.dims[node] = tuple(_normal(d) for d in dims)

    def _fill_arg(self, what: str, rule: Any, pos: Any, a: Any, v: Any, args: list, kwargs: dict,
                  exact: dict) -> Any:
        """An argument of a rule op with its padding filled."""
        if isinstance(a, (list, tuple)):
            return list(self._fill_arg(what, rule, pos, x, y, args, kwargs, exact) for x, y in zip(a, v))
        if not isinstance(a, torch.fx.Node) or a not in self.dims:
            return v
        dims = self.dims[a]
        for d in exact.get(pos, ()):
            if d < len(dims) and any(c[2] for c in dims[d]):
                raise Unpaddable(f"{what}: its dim {d} of input {pos} must be exact and is padded")
        value = _door.fill_of(rule, pos, tuple(args), kwargs)
        if value is None or not any(c[2] for dim in dims for c in dim):
            return v
        key = (a, value if isinstance(value, str) else float(value))
        found = self.fills.get(key)
        if found is None:  # a value read by several ops is filled once
            found = self.fills[key] = self.filled(v, dims, value)
        return found

    def along(self, step: Any, what: str, env: dict, ctx: Any, value: Any) -> Any:
        """Splits, slices and selections: along an exact dim as they are; a
        prefix slice of a padded dim keeps the array (its rest is padding)."""
        node = step.node
        src = node.args[0]
        sdims = self.dims[src]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if _short(what) in ("aten::split.Tensor", "aten::split_with_sizes", "aten::chunk", "aten::split.sizes"):
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        dim = dim % len(sdims)
        if not any(c[2] for c in sdims[dim]):
            args, kwargs = value(node.args, False), value(node.kwargs, False)
            if _has_symbol((args, kwargs)):
                return self.slice_to_length(node, what, env, sdims, dim)
            args = _ints((args, kwargs))
            return invoke(step.fn, args[0], args[1], ctx, step.meta)
        if _short(what) == "aten::select.int" and len(sdims[dim]) == 1 and isinstance(node.args[2], int):
            # a position from the start is where it is, one from the end
            # counts from the logical length (``logits[:, -1]``)
            index = node.args[2]
            at = index if index >= 0 else self.logical(sdims[dim][0][1]) + index
            arr = jax.lax.dynamic_index_in_dim(env[src], at, dim, keepdims=False)
            self._set(node, what, arr, node.meta["val"], sdims[:dim] + sdims[dim + 1:])
            return arr
        if _short(what) != "aten::slice.Tensor" or len(sdims[dim]) != 1:
            raise Unpaddable(f"{what}: along a padded dim (only prefix slices of one are read padded)")
        start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start", None)
        step_ = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        start = 0 if start is None else start
        out = size_expression(node.meta["val"].shape[dim])
        p, n, _ = sdims[dim][0]
        arr = env[src]
        if out.is_Integer and step_ == 1:
            # a slice of a number of positions from a run-time start: from the
            # logical end (``hidden[:, -1:]``, a model's ``logits_to_keep``), or
            # from a symbolic start (a join's gradient: ``grad[:, s:s + 1]``)
            k = int(out)
            at = None
            if isinstance(start, int) and start < 0 and k == -start:
                at = self.logical(n) + start
            elif isinstance(start, torch.fx.Node) and isinstance(env[start], sympy.Basic):
                at = self.logical(env[start])
            if at is not None:
                arr = jax.lax.dynamic_slice_in_dim(arr, at, k, dim)
                self._set(node, what, arr, node.meta["val"], sdims[:dim] + (_exact_dim(k),) + sdims[dim + 1:])
                return arr
        if step_ != 1 or not isinstance(start, int):
            raise Unpaddable(f"{what}: a slice of a padded dim with a step or a symbolic start")
        if start < 0 or (start and sympy.expand(n - start - out) != 0):
            # (from ``start`` to the logical end: the end of the padding moves with it)
            raise Unpaddable(f"{what}: a slice of a padded dim that neither starts at 0 nor runs to its end")
        idx = [slice(None)] * arr.ndim
        if out.is_Integer:
            idx[dim] = slice(start, start + int(out))
            arr = arr[tuple(idx)]
            newdim = _exact_dim(int(out))
        else:
            want = self.anchored(out)
            if want is None and start:
                raise Unpaddable(f"{what}: a slice to a length of {out}")
            want = p if want is None else want
            if start:
                idx[dim] = slice(start, None)
                arr = arr[tuple(idx)]
            arr = _resized(arr, dim, want)
            newdim = ((want, out, True),)
        dims = tuple(newdim if i == dim else d for i, d in enumerate(sdims))
        self._set(node, what, arr, node.meta["val"], dims)
        return arr

    def pad(self, node: Any, what: str, env: dict, value: Any) -> Any:
        """``constant_pad_nd``: along an exact dim as torch pads it (a
        negative amount cuts), along a padded dim at its end only, where the
        new positions take ``value`` from the logical end on and the dim's
        physical size grows to its new length's (:meth:`anchored`)."""
        src = node.args[0]
        sdims = self.dims[src]
        amounts = [int(a) for a in _ints(value(node.args[1], False))]
        fill = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
        fill = 0 if fill is None else fill
        val = node.meta["val"]
        arr = env[src]
        dims = list(sdims)
        config = [(0, 0, 0)] * arr.ndim
        for i in range(len(amounts) // 2):
            d = arr.ndim - 1 - i
            lo, hi = amounts[2 * i], amounts[2 * i + 1]
            if not any(c[2] for c in sdims[d]):
                config[d] = (lo, hi, 0)
                dims[d] = _exact_dim(physical((sdims[d],))[0] + lo + hi)
        arr = jax.lax.pad(arr, jax.numpy.asarray(fill, arr.dtype), config)
        for i in range(len(amounts) // 2):
            d = arr.ndim - 1 - i
            lo, hi = amounts[2 * i], amounts[2 * i + 1]
            if not any(c[2] for c in sdims[d]) or (lo == 0 and hi == 0):
                continue
            if len(sdims[d]) != 1 or lo != 0 or hi < 0:
                raise Unpaddable(f"{what}: a pad of a padded dim other than at its end")
            p, n, _ = sdims[d][0]
            out = size_expression(val.shape[d])
            want = self.anchored(out)
            if want is None or want < p:
                raise Unpaddable(f"{what}: a pad to a length of {out}")
            arr = _resized(arr, d, want)
            at = jax.lax.broadcasted_iota(jax.numpy.int32, arr.shape, d)
            arr = jax.numpy.where(at < self.logical(n), arr, jax.numpy.asarray(fill, arr.dtype))
            dims[d] = ((want, out, True),)
        self._set(node, what, arr, val, tuple(dims))
        return arr

    def join(self, node: Any, what: str, env: dict, parts: list, dim: int) -> Any:
        """``cat`` along a padded dim (a key/value cache growing by a
        token): eager's join (``_dynamic_dims.join``) in the graph.  The
        result's physical size is that of its length's expression
        (:meth:`anchored`: ``s + 1`` has room for the token), each part
        placed at its run-time offset, the sum of the logical lengths before
        it; the other dims must line up."""
        val = node.meta["val"]
        out = size_expression(val.shape[dim])
        want = self.anchored(out)
        if want is None:
            raise Unpaddable(f"{what}: a join along a padded dim to a length of {out}")
        pdims = [self.dims[t] for t in parts]
        if any(len(d[dim]) != 1 for d in pdims) or any(d[:dim] + d[dim + 1:] != pdims[0][:dim] + pdims[0][dim + 1:]
                                                       for d in pdims):
            raise Unpaddable(f"{what}: along a padded dim, parts whose other dims do not line up")
        dtype = jax.numpy.dtype(_door.jax_dtype_of(val.dtype))
        first = env[parts[0]]
        shape = list(first.shape)
        shape[dim] = want
        arr = jax.numpy.zeros(tuple(shape), dtype)
        offset: Any = 0
        for t, d in zip(parts, pdims):
            (p, n, dynamic), = d[dim]
            length = self.logical(n) if dynamic else p
            arr = _door.placed(env[t].astype(dtype), dim, want, offset, length, arr)
            offset = offset + length
        dims = pdims[0][:dim] + (((want, out, True),),) + pdims[0][dim + 1:]
        self._set(node, what, arr, val, dims)
        return arr

    def copy(self, node: Any, what: str, env: dict) -> Any:
        """``copy(self, src)``: ``src`` broadcast to ``self``'s shape, in its
        dtype.  Their dims must line up: the same components, or ``src``'s
        of size 1 (or missing) where it is broadcast."""
        target, src = node.args[0], node.args[1]
        tdims = self.dims[target]
        sdims = self.dims.get(src) if isinstance(src, torch.fx.Node) else None
        value = env[src] if isinstance(src, torch.fx.Node) else src
        if sdims is not None:
            for i, d in enumerate(sdims):
                t = tdims[len(tdims) - len(sdims) + i]
                if d != t and physical((d,))[0] != 1:
                    raise Unpaddable(f"{what}: a source whose dims do not line up with its target's")
        dtype = env[target].dtype
        arr = jax.numpy.broadcast_to(jax.numpy.asarray(value).astype(dtype), physical(tdims))
        self._set(node, what, arr, node.meta["val"], tdims)
        return arr

    def scatter(self, node: Any, what: str, env: dict, ctx: Any, step: Any) -> Any:
        """``slice_scatter`` and ``select_scatter``: along an exact dim as
        they are (the other dims line up); along a padded dim of one
        component, ``src`` placed from a start that is a number (a slice's
        logical length decides where it ends: the rest is the base's)."""
        base, src = node.args[0], node.args[1]
        bdims, sdims = self.dims[base], self.dims[src]
        short = _short(what)
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        dim %= len(bdims)
        arr, value = env[base], env[src].astype(env[base].dtype)
        if short == "aten::select_scatter":
            index = node.args[3] if len(node.args) > 3 else node.kwargs.get("index")
            if sdims != bdims[:dim] + bdims[dim + 1:] or not isinstance(index, int):
                raise Unpaddable(f"{what}: a source that does not line up with its base")
            if any(c[2] for c in bdims[dim]) and (index < 0 or len(bdims[dim]) != 1):
                raise Unpaddable(f"{what}: along a padded dim from its end")
            if index < 0:
                index += physical((bdims[dim],))[0]
            out = jax.lax.dynamic_update_slice_in_dim(arr, jax.numpy.expand_dims(value, dim), index, dim)
            self._set(node, what, out, node.meta["val"], bdims)
            return out
        start = node.args[3] if len(node.args) > 3 else node.kwargs.get("start", None)
        step_ = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
        start = 0 if start is None else start
        if any(s != b for i, (s, b) in enumerate(zip(sdims, bdims)) if i != dim) or len(sdims) != len(bdims) \
                or step_ != 1 or not isinstance(start, int) or start < 0:
            raise Unpaddable(f"{what}: a source that does not line up with its base")
        if not any(c[2] for c in bdims[dim]) and not any(c[2] for c in sdims[dim]):
            end = start + physical((sdims[dim],))[0]
            out = invoke(step.fn, [arr, value, dim, start, end, 1], {}, ctx, step.meta)
            self._set(node, what, out, node.meta["val"], bdims)
            return out
        if len(bdims[dim]) != 1 or len(sdims[dim]) != 1:
            raise Unpaddable(f"{what}: along a dim that merged a padded one")
        p = bdims[dim][0][0]
        n = sdims[dim][0][1]
        placed = _resized(value, dim, p - start)  # src's position j at the base's start + j
        if start:
            config = [(0, 0, 0)] * arr.ndim
            config[dim] = (start, 0, 0)
            placed = jax.lax.pad(placed, jax.numpy.zeros((), arr.dtype), config)
        at = jax.lax.broadcasted_iota(jax.numpy.int32, arr.shape, dim)
        within = (at >= start) & (at < start + (self.logical(n) if not n.is_Integer else int(n)))
        out = jax.numpy.where(within, placed, arr)
        self._set(node, what, out, node.meta["val"], bdims)
        return out

    def select_backward(self, node: Any, what: str, env: dict, known: dict) -> Any:
        """``select_backward(grad, sizes, dim, index)``: zeros of the input's
        components with the gradient at ``index`` along ``dim`` (counted
        from the logical end for a negative one)."""
        grad = node.args[0]
        gdims = self.dims[grad]
        dim, index = node.args[2], node.args[3]
        val = node.meta["val"]
        dims = self.result_dims(what, val, known)
        dim %= len(dims)
        if not isinstance(index, int) or gdims != dims[:dim] + dims[dim + 1:] \
                or (index < 0 and any(c[2] for c in dims[dim]) and len(dims[dim]) != 1):
            raise Unpaddable(f"{what}: a gradient that does not line up with its input")
        if index < 0:
            index = self.logical(dims[dim][0][1]) + index if dims[dim][0][2] else physical((dims[dim],))[0] + index
        g = env[grad]
        out = jax.lax.dynamic_update_slice_in_dim(jax.numpy.zeros(physical(dims), g.dtype),
                                                  jax.numpy.expand_dims(g, dim), index, dim)
        self._set(node, what, out, val, dims)
        return out

    def slice_to_length(self, node: Any, what: str, env: dict, sdims: tuple, dim: int) -> Any:
        """A slice of an exact dim to a symbolic length (a model's position
        ids, ``buffer[:, :seq_length]``): the physical size of that length
        (:meth:`anchored`) taken from the same start, the rest of it the
        buffer's own values, as padding."""
        start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start", None)
        step_ = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        start = 0 if start is None else start
        out = size_expression(node.meta["val"].shape[dim])
        want = self.anchored(out)
        if _short(what) != "aten::slice.Tensor" or step_ != 1 or not isinstance(start, int) or start < 0 \
                or want is None or len(sdims[dim]) != 1 or start + want > sdims[dim][0][0]:
            raise Unpaddable(f"{what}: a symbolic position along an exact dim")
        arr = env[node.args[0]]
        idx = [slice(None)] * arr.ndim
        idx[dim] = slice(start, start + want)
        arr = arr[tuple(idx)]
        dims = tuple(((want, out, True),) if i == dim else d for i, d in enumerate(sdims))
        self._set(node, what, arr, node.meta["val"], dims)
        return arr

    def slice_backward(self, step: Any, what: str, env: dict, ctx: Any, known: dict) -> Any:
        node = step.node
        grad = node.args[0]
        gdims = self.dims[grad]
        dims = self.result_dims(what, node.meta["val"], known)
        dim, start, end, stride = node.args[2:6]
        dim %= len(dims)
        if not any(c[2] for c in dims[dim]) and not any(c[2] for c in gdims[dim]):
            args = [env[grad], list(physical(dims)), dim, *_ints((start, end, stride))]
            if _has_symbol((start, end, stride)):
                raise Unpaddable(f"{what}: a symbolic position along an exact dim")
            return invoke(step.fn, args, {}, ctx, step.meta)
        if stride == 1 and len(dims[dim]) == 1 and dims[dim][0][2] and not any(c[2] for c in gdims[dim]):
            # the gradient of a number of positions from the start, the logical
            # end or a symbolic start (``hidden[:, -1:]``, a join's parts): placed there
            k = physical((gdims[dim],))[0]
            at = None
            if start is None or (isinstance(start, int) and start >= 0):
                at = start or 0  # (``h[:, :1]``: a number of positions from the start)
            elif isinstance(start, int) and k == -start:
                at = self.logical(dims[dim][0][1]) + start
            elif isinstance(start, torch.fx.Node) and isinstance(env[start], sympy.Basic):
                at = self.logical(env[start])
            if at is not None:
                g = env[grad]
                return jax.lax.dynamic_update_slice_in_dim(jax.numpy.zeros(physical(dims), g.dtype), g, at, dim)
        if start not in (0, None) or stride != 1 or len(dims[dim]) != 1 or len(gdims[dim]) != 1 \
                or dims[dim][0][0] != gdims[dim][0][0]:
            raise Unpaddable(f"{what}: the gradient of a slice of a padded dim that does not start at 0")
        return self.filled(env[grad], gdims, 0)  # the rest of the dim: zeros

    def mean(self, node: Any, env: dict, ctx: Any, dtype: Any) -> Any:
        src = node.args[0]
        sdims = self.dims[src]
        args = list(node.args[1:])
        dims = args[0] if args else node.kwargs.get("dim")
        keepdim = args[1] if len(args) > 1 else node.kwargs.get("keepdim", False)
        rank = len(sdims)
        reduced = sorted({d % max(rank, 1) for d in dims}) if dims else list(range(rank))
        count: Any = 1
        for d in reduced:
            for c in sdims[d]:
                count = count * (self.logical(c[1]) if c[2] else c[0])
        total = invoke(_lookup_sum(), [self.filled(env[src], sdims, 0), reduced, keepdim], {}, ctx)
        return (total / count).astype(dtype)

    def check(self, numbers: tuple, env: dict, rows: list) -> None:
        program = self.program
        for number in numbers:
            site = program.sites[number]
            size = size_expression(site.size) if not isinstance(site.size, int) else sympy.Integer(site.size)
            # (against a symbolic size: its logical value, traced, as torch's check reads it)
            bound = int(size) if size.is_Integer else self.logical(size)
            v = None
            if site.index is not None:
                v = env[site.index]
                dims = self.dims.get(site.index)
                if dims is not None and any(c[2] for dim in dims for c in dim):
                    if not hasattr(site, "negative_ok"):
                        raise Unpaddable(f"{site.op}: a value check over padded values")
                    v = self.filled(v, dims, 0)  # 0 is always in range
            rows.append((number, bound, site.row(v, bound)))


def _resized(arr: Any, dim: int, size: int) -> Any:
    """``arr`` cut or grown (zeros: padding) to ``size`` along ``dim``."""
    have = arr.shape[dim]
    if have > size:
        idx = [slice(None)] * arr.ndim
        idx[dim] = slice(0, size)
        return arr[tuple(idx)]
    if have < size:
        config = [(0, 0, 0)] * arr.ndim
        config[dim] = (0, size - have, 0)
        return jax.lax.pad(arr, jax.numpy.zeros((), arr.dtype), config)
    return arr


def _lookup_sum() -> Any:
    from .. import _lowerings

    return _lowerings.lookup(torch.ops.aten.sum.dim_IntList)


def _fold(fn: Any, values: list) -> Any:
    out = values[0]
    for v in values[1:]:
        out = fn(out, v)
    return out


def _has_symbol(tree: Any) -> bool:
    found = []
    torch.fx.node.map_aggregate(tree, lambda x: found.append(x) if isinstance(x, sympy.Basic)
                                and not x.is_Integer else None)
    return bool(found)


def _ints(tree: Any) -> Any:
    return torch.fx.node.map_aggregate(tree, lambda x: int(x) if isinstance(x, sympy.Basic) else x)


def _fakes(node: torch.fx.Node) -> tuple:
    """The node's arguments as torch traced them (fake tensors, sizes)."""
    def one(x: Any) -> Any:
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return (tuple(torch.fx.node.map_aggregate(node.args, one)),
            dict(torch.fx.node.map_aggregate(node.kwargs, one)))


def _reshape(dims: tuple, out: list, what: str) -> tuple:
    """The components of a reshape of a value with ``dims`` to the sizes
    ``out``: each output dim takes a run of whole components (an exact one
    may be split), else :class:`Unpaddable` (a split of a padded dim)."""
    comps = [c for dim in dims for c in dim if not (c[0] == 1 and not c[2])]
    result = []
    i = 0
    for e in out:
        if e == 1:
            result.append(_exact_dim(1))
            continue
        run: list = []
        prod = sympy.Integer(1)
        while sympy.expand(prod - e) != 0:
            if i >= len(comps):
                raise Unpaddable(f"{what}: a reshape that splits a padded dim")
            c = comps[i]
            need = sympy.simplify(e / prod)
            if not c[2] and need.is_Integer and int(need) < c[0] and c[0] % int(need) == 0:
                k = int(need)
                run.append((k, sympy.Integer(k), False))
                comps[i] = (c[0] // k, sympy.Integer(c[0] // k), False)
                prod = prod * k
                continue
            run.append(c)
            prod = prod * c[1]
            i += 1
        result.append(_normal(tuple(run)))
    if i != len(comps):
        raise Unpaddable(f"{what}: a reshape the components do not follow")
    return tuple(result)


def run(program: Any, the_plan: Plan, buckets: dict, inputs: list, comps: list, sizes: list, ctx: Any,
        rows: list | None, key: Any = None) -> tuple:
    """Traceable: the graph on padded ``inputs`` (read with ``comps``), the
    symbols' logical ``sizes`` traced, random ops drawing from ``key`` as
    the per-shape program does.  Returns ``(outputs, their dims, [(placeholder,
    new value)] of the writes into inputs)``."""
    return _Trace(program, the_plan, buckets, sizes, key).run(inputs, comps, ctx, rows)
