"""An ATen FX graph as one traceable jax function.

:class:`Program` reads a graph once (which ops it has, which of them have no
lowering, which inputs it writes to) and :meth:`Program.run` evaluates it on
jax values, to be traced by ``jax.jit``: every op goes through the lowering
table's :func:`~pjrt_host._lowerings.invoke` (the few ops that are not
lowerings are in :mod:`._graph_ops`), results take the dtype of torch's fake
tensor for the node (a factory gets its shape too), random ops get
``fold_in(key, node number)``.  Nothing here knows about
torch tensors or the device: inputs and outputs are jax values.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, NamedTuple

import jax
import torch
import torch.fx

from .. import _lowerings
from .._lowerings import LoweringContext, invoke, op_name
from . import _graph_ops
from ._graph_ops import Out

__all__ = ["GraphLoweringError", "Program", "index_row"]


class GraphLoweringError(Exception):
    """An op of the graph failed while the graph was traced into jax."""

    def __init__(self, op: str, node: str, error: BaseException) -> None:
        super().__init__(f"{op} (node {node}): {type(error).__name__}: {error}")
        self.op = op
        self.node = node
        self.error = error


class _InplaceName:
    """Looks up the in-place lowering of a functional op (``aten::uniform``
    -> ``aten::uniform_``): functionalization turns ``x.uniform_()`` into
    the functional overload, which the table registers under the in-place
    name (its lowering returns self's new value)."""

    def __init__(self, name: str) -> None:
        packet, _, overload = name.partition(".")
        self._name = packet + "_" + ("." + overload if overload else "")

    def name(self) -> str:
        return self._name


class _Step(NamedTuple):
    kind: str  # input | lowering | strided | graph | symbolic | noop | getitem | python | constant | output
    node: torch.fx.Node
    fn: Any = None  # the Lowering, GraphOp or callable
    random: int = -1  # index of the random op (its key is fold_in(key, random))
    meta: Any = None  # result dtypes (lowering) / Out template (graph)
    index: int = -1  # placeholder position (input), or the placeholder a lowering writes (copy_ into an input)
    checks: tuple[int, ...] = ()  # the op's index and value checks (numbers into Program.sites)


_PYTHON_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
               operator.pow, operator.neg, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
               operator.ge, operator.and_, operator.or_, operator.not_, abs, min, max}


def _python_callable(target: Any) -> bool:
    if target in _PYTHON_OPS:
        return True
    module = getattr(target, "__module__", "") or ""
    return module in ("math", "_operator", "operator") or module.startswith("torch.fx.experimental.sym_node") or \
        getattr(target, "__name__", "") in ("sym_max", "sym_min", "sym_not", "sym_float", "sym_int", "sym_ite",
                                            "sym_sqrt", "sym_sum")


class Program:
    """One ATen graph, read once.  ``dtype_of(torch dtype) -> jax dtype``
    maps result dtypes (the device may map some, e.g. float64 -> float32).
    ``sites_of(node, op name) -> [site]`` gives the index and value checks
    of an op (``_checks.sites_of``; each site has ``.index``, the checked
    tensor's node or None, ``.size``, and ``.row(value, size)``, its
    traceable verdict row): :meth:`run` computes them on request."""

    def __init__(self, gm: torch.fx.GraphModule, dtype_of: Callable[[torch.dtype], Any],
                 sites_of: Callable[[torch.fx.Node, str], list] | None = None) -> None:
        self.gm = gm
        self.dtype_of = dtype_of
        self._sites_of = sites_of
        #: The index and value checks of the graph's ops, in graph order.
        self.sites: list[Any] = []
        self.steps: list[_Step] = []
        #: Ops with no lowering (name -> why): the graph cannot be one jax function.
        self.unsupported: dict[str, str] = {}
        self.num_inputs = 0
        self.num_random = 0
        #: Placeholders that the graph writes (copy_ into an input), in order.
        self.mutated_inputs: list[int] = []
        #: Per placeholder: the fake tensor torch traced with (None for sizes / scalars).
        self.input_meta: list[Any] = []
        self.symbolic = False
        self.num_ops = 0
        placeholders: dict[torch.fx.Node, int] = {}
        for node in gm.graph.nodes:
            step = self._read(node, placeholders)
            if step is not None:
                self.steps.append(step)

    def fingerprint(self) -> str | None:
        """A digest equal for two programs that compute the same function of
        their inputs: the graph's code (ops, their order and arguments), its
        inputs' shapes, dtypes and strides, and its constants' values.  None
        when the graph holds an opaque Python step, whose code says nothing
        of what it calls."""
        import hashlib

        import numpy as np

        digest = hashlib.sha256(self.gm.code.encode())
        for meta in self.input_meta:
            digest.update(repr(None if meta is None else (tuple(meta.shape), meta.dtype, tuple(meta.stride())))
                          .encode())
        for step in self.steps:
            if step.kind == "python":
                return None
            if step.kind == "constant":
                values = np.asarray(step.fn)
                digest.update(repr((values.shape, values.dtype.str)).encode())
                digest.update(values.tobytes())
        return digest.hexdigest()

    # ------------------------------------------------------------ reading

    def _read(self, node: torch.fx.Node, placeholders: dict) -> _Step | None:
        if node.op == "placeholder":
            index = placeholders[node] = self.num_inputs
            self.num_inputs += 1
            val = node.meta.get("val")
            self.input_meta.append(val if isinstance(val, torch.Tensor) else None)
            if isinstance(val, torch.SymInt) or (isinstance(val, torch.Tensor) and _has_symbols(val)):
                self.symbolic = True
            return _Step("input", node, index=index)
        if node.op == "output":
            return _Step("output", node)
        if node.op == "get_attr":
            constant = self._constant(node)
            if constant is None:
                self.unsupported.setdefault(f"get_attr {node.target}", "a graph attribute that is not a tensor")
                return None
            return _Step("constant", node, constant)
        if node.op != "call_function":
            self.unsupported.setdefault(f"{node.op} {node.target}", "not an ATen call")
            return None
        target = node.target
        if target is operator.getitem:
            return _Step("getitem", node)
        if isinstance(target, torch._ops.OpOverload):
            self.num_ops += 1
            name = op_name(target)
            short = name[: -len(".default")] if name.endswith(".default") else name
            if short in _graph_ops.NO_OP:
                return _Step("noop", node)
            opaque = _graph_ops.OPAQUE.get(short)
            if opaque is not None:
                return _Step("python", node, opaque)
            sym = _graph_ops.SYMBOLIC.get(short)
            if sym is not None:
                return _Step("symbolic", node, sym)
            graph_op = _graph_ops.HANDLERS.get(short)
            if graph_op is not None:
                return _Step("graph", node, graph_op, checks=self._checks(node, name))
            lowering = _lowerings.lookup(target)
            if short == "aten::copy_" and lowering is not None:
                # The one write a functional graph keeps: copy_ into an input
                # (its lowering gives the input's new value, returned as a
                # mutation).
                index = -1
                dst = node.args[0]
                if isinstance(dst, torch.fx.Node) and dst in placeholders:
                    index = placeholders[dst]
                    if index not in self.mutated_inputs:
                        self.mutated_inputs.append(index)
                return _Step("lowering", node, lowering, meta=self._result_dtypes(node), index=index,
                             checks=self._checks(node, name))
            writes = any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)
            if lowering is None and not writes:
                lowering = _lowerings.lookup(_InplaceName(name))
            if lowering is None and short.startswith("aten::_foreach_") and not writes:
                element = _foreach_element(short)
                if element is not None:
                    return _Step("foreach", node, element, meta=self._result_dtypes(node))
            if lowering is None:
                self.unsupported.setdefault(name, "no lowering")
                return None
            if lowering.data_dependent:
                self.unsupported.setdefault(name, "its result's shape depends on the values")
                return None
            if writes:
                self.unsupported.setdefault(name, "it writes to an argument")
                return None
            if short in _STRIDED_READS:
                return _Step("strided", node, _storage_root(node, placeholders), meta=self._result_dtypes(node))
            if short in _STRIDED_WRITES:
                return _Step("strided_scatter", node, meta=self._result_dtypes(node))
            return _Step("lowering", node, lowering, self._next_random(lowering.needs_rng),
                         meta=self._result_dtypes(node), checks=self._checks(node, name))
        if isinstance(target, torch._ops.HigherOrderOperator):
            self.unsupported.setdefault(f"higher-order op {target.name()}", "not supported in graph form")
            return None
        if _python_callable(target):
            return _Step("python", node, target)
        self.unsupported.setdefault(op_name(target), "not an ATen op")
        return None

    def _constant(self, node: torch.fx.Node) -> Any:
        """A tensor constant of the graph (what a factory such as
        ``torch.tensor(data)`` in the traced code left: AOTAutograd's
        ``_tensor_constantN``) as a jax array, read once; None for anything
        else (a fake tensor has no values to read)."""
        from torch.utils._mode_utils import no_dispatch

        from . import _door

        value = getattr(self.gm, node.target, None)
        if isinstance(value, _door.JaxTensor):
            return _door.read(value).astype(self.dtype_of(value.dtype))
        if type(value) is not torch.Tensor or value.device.type != "cpu":
            return None
        with no_dispatch():  # compilers run inside the trace's fake mode; a plain host tensor needs none
            # The bytes as they are: a float64 constant stays float64 (not
            # through float32), NaN payloads and large int64s survive.
            array = _door.host_values(value)
        return jax.numpy.asarray(array).astype(self.dtype_of(value.dtype))

    def _checks(self, node: torch.fx.Node, name: str) -> tuple[int, ...]:
        if self._sites_of is None:
            return ()
        found = self._sites_of(node, name)
        self.sites.extend(found)
        return tuple(range(len(self.sites) - len(found), len(self.sites)))

    def _next_random(self, random: bool) -> int:
        if not random:
            return -1
        self.num_random += 1
        return self.num_random - 1

    def _result_dtypes(self, node: torch.fx.Node) -> Any:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return self.dtype_of(val.dtype)
        if isinstance(val, (tuple, list)):
            return [self.dtype_of(v.dtype) if isinstance(v, torch.Tensor) else None for v in val]
        return None

    # ------------------------------------------------------------ running

    def run(self, inputs: list[Any], key: Any, ctx: LoweringContext,
            checks: list | None = None, storages: list | None = None) -> tuple[list[Any], list[tuple[int, Any]]]:
        """Evaluate the graph on jax values (traceable).  Returns (outputs,
        [(placeholder, new value)] for each write into an input, in order).
        With a list ``checks``, appends ``(site number, size, row)`` for each
        check of :attr:`sites` (``row``: see :func:`index_row`).
        ``storages``, per placeholder, the array of the whole storage its
        tensor lives in (None where there is none): what an ``as_strided``
        of an input reads (its storage offset and strides are the
        storage's, not the input's own elements)."""
        env: dict[torch.fx.Node, Any] = {}
        mutations: list[tuple[int, Any]] = []
        bindings: dict[Any, int] = {}
        outputs: list[Any] = []

        def value(a: Any) -> Any:
            return torch.fx.node.map_aggregate(a, lambda x: env[x] if isinstance(x, torch.fx.Node) else x)

        for step in self.steps:
            node = step.node
            kind = step.kind
            try:
                if kind == "input":
                    v = inputs[step.index]
                    env[node] = v
                    _bind(node.meta.get("val"), v, bindings)
                elif kind == "lowering":
                    args, kwargs = value(node.args), value(node.kwargs)
                    if checks is not None and step.checks:
                        self._check(step.checks, env, bindings, checks)
                    c = ctx if step.random < 0 else dataclasses.replace(ctx, rng_key=jax.random.fold_in(key, step.random))
                    shape = self._out(node, bindings).shape if step.fn.factory else None
                    result = env[node] = invoke(step.fn, args, kwargs, c, step.meta, shape)
                    if step.index >= 0:
                        mutations.append((step.index, result))
                elif kind == "strided":
                    env[node] = _strided_read(node, step.fn, env, bindings, storages)
                elif kind == "strided_scatter":
                    env[node] = _strided_scatter(node, env, bindings)
                elif kind == "graph":
                    args, kwargs = value(node.args), value(node.kwargs)
                    if checks is not None and step.checks:
                        self._check(step.checks, env, bindings, checks)
                    with jax.default_matmul_precision(ctx.matmul_precision):
                        result = step.fn.fn(self._out(node, bindings), *args, **kwargs)
                    env[node] = result
                    if step.index >= 0:
                        mutations.append((step.index, result))
                elif kind == "foreach":
                    args, kwargs = value(node.args), value(node.kwargs)
                    env[node] = _foreach(step.fn, args, kwargs, ctx, step.meta)
                elif kind == "getitem":
                    seq, i = value(node.args)
                    env[node] = seq[i]
                elif kind in ("symbolic", "python"):
                    env[node] = step.fn(*value(node.args), **value(node.kwargs))
                elif kind == "noop":
                    env[node] = None
                elif kind == "constant":
                    env[node] = step.fn
                elif kind == "output":
                    outputs = list(value(node.args[0]))
            except GraphLoweringError:
                raise
            except Exception as err:
                raise GraphLoweringError(op_name(node.target) if kind != "output" else "output", node.name,
                                         err) from err
        return outputs, mutations

    def _check(self, numbers: tuple[int, ...], env: dict, bindings: dict, checks: list) -> None:
        for number in numbers:
            site = self.sites[number]
            size = _concrete(site.size, bindings)
            checks.append((number, size, site.row(None if site.index is None else env[site.index], size)))

    def _out(self, node: torch.fx.Node, bindings: dict) -> Out:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise TypeError(f"no fake tensor recorded for {node.name}")
        shape = tuple(_concrete(d, bindings) for d in val.shape)
        return Out(shape, self.dtype_of(val.dtype))


# _foreach_NAME.OVERLOAD -> the overload of NAME it applies per element.
_FOREACH_ELEMENT = {"List": "Tensor", "ScalarList": "Scalar", "Scalar": "Scalar", "Tensor": "Tensor",
                    "ScalarAndTensor": "Scalar", "": ""}


def _foreach_element(name: str) -> Any:
    """The lowering of the per-element op of a ``_foreach_`` op the table
    has no lowering for (``_foreach_pow.ScalarAndTensor`` -> ``pow.Scalar``)."""
    packet, _, overload = name.partition(".")
    base = "aten::" + packet[len("aten::_foreach_"):]
    element = _FOREACH_ELEMENT.get(overload)
    if element is None:
        return None
    for candidate in ([f"{base}.{element}"] if element else []) + [base]:
        found = _lowerings.lookup(_Named(candidate))
        if found is not None and not found.needs_rng and not found.data_dependent:
            return found
    return None


class _Named:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


def _foreach(lowering: Any, args: tuple, kwargs: dict, ctx: LoweringContext, dtypes: Any) -> list:
    """The per-element lowering over the lists of a ``_foreach_`` op (lists
    are indexed, everything else passed to each element as it is)."""
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))
    out = []
    for i in range(n):
        elem = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
        dtype = dtypes[i] if isinstance(dtypes, list) else dtypes
        out.append(invoke(lowering, elem, kwargs, ctx, dtype))
    return out


def index_row(index: Any, size: int, negative_ok: bool, ignore: int | None = None) -> Any:
    """Traceable: ``[any value out of range, an out-of-range value (the
    largest if one is too large, else the smallest), size]`` of the index
    values ``index``, in the index's dtype; in range is ``[-size, size)``
    with ``negative_ok``, else ``[0, size)``, and ``ignore`` wherever it
    lies.  One small vector per check: a min/max reduction over the index
    (as eager's check), no read of the indexed data."""
    jnp = jax.numpy
    if ignore is not None:
        index = jnp.where(index == ignore, 0, index)
    lo, hi = jnp.min(index), jnp.max(index)
    too_high = hi >= size
    bad = too_high | (lo < (-size if negative_ok else 0))
    return jnp.stack([bad.astype(index.dtype), jnp.where(too_high, hi, lo), jnp.asarray(size, index.dtype)])


def _has_symbols(val: torch.Tensor) -> bool:
    return any(not isinstance(d, int) for d in val.shape)


def _bind(meta: Any, v: Any, bindings: dict) -> None:
    """Record the concrete value of each symbolic size an input carries."""
    if isinstance(meta, torch.SymInt):
        expr = meta.node.expr
        if getattr(expr, "is_Symbol", False):
            bindings[expr] = int(v)
    elif isinstance(meta, torch.Tensor):
        for d, n in zip(meta.shape, getattr(v, "shape", ())):
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                if getattr(expr, "is_Symbol", False):
                    bindings[expr] = int(n)


def _concrete(d: Any, bindings: dict) -> int:
    if isinstance(d, int):
        return d
    expr = d.node.expr
    value = expr.xreplace(bindings)
    try:
        return int(value)
    except TypeError:
        raise TypeError(f"the size {expr} is not determined by the inputs' sizes") from None


# ------------------------------------------------ as_strided reads the storage

#: Ops that read a strided window of their input's *storage* (their offset
#: and strides are the storage's, not the input's own elements).
_STRIDED_READS = frozenset({"aten::as_strided", "aten::as_strided_copy"})
#: ... and the functional write through such a window (functionalization's
#: ``as_strided_scatter`` of a view's base).
_STRIDED_WRITES = frozenset({"aten::as_strided_scatter"})


class _Root(NamedTuple):
    """The tensor an ``as_strided``'s input is a view of (through the graph's
    view ops): a placeholder (``placeholder``: its position) or an op's
    result (``placeholder`` -1), whose storage the ``as_strided`` reads."""

    node: torch.fx.Node
    placeholder: int


def _is_view(node: Any) -> bool:
    """Whether ``node`` is a view of its first argument (its schema says its
    result aliases that argument without writing it: ``slice``, ``t``,
    ``split``, ``as_strided`` ...), or an element of such a view's list."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return _is_view(node.args[0])
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if not schema.returns or not schema.arguments:
        return False
    out, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return out is not None and not out.is_write and first is not None and not first.is_write


def _storage_root(node: torch.fx.Node, placeholders: dict) -> _Root:
    x = node.args[0]
    while _is_view(x):
        x = x.args[0].args[0] if x.target is operator.getitem else x.args[0]
    return _Root(x, placeholders.get(x, -1))


class StridedStorageError(NotImplementedError):
    """An ``as_strided`` in a graph reads storage the graph does not hold
    (the run then goes op by op, where the device reads the storage)."""


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _geometry(node: torch.fx.Node, env: dict, first: int, bindings: dict) -> tuple:
    """(size, stride, storage offset) of an ``as_strided`` (or its scatter,
    ``first`` = 2): a missing offset is the input's own, as torch has it."""
    def arg(i: int, name: str) -> Any:
        a = node.args[i] if len(node.args) > i else node.kwargs.get(name)
        return torch.fx.node.map_aggregate(a, lambda x: env[x] if isinstance(x, torch.fx.Node) else x)

    size, stride, offset = arg(first, "size"), arg(first + 1, "stride"), arg(first + 2, "storage_offset")
    if offset is None:
        offset = _concrete(node.args[0].meta["val"].storage_offset(), bindings)
    return _ints(size), _ints(stride), int(offset)


def _positions(size: tuple, stride: tuple, offset: int) -> Any:
    """The storage positions of a strided layout (numpy, shape ``size``)."""
    import numpy as np

    index = np.full(size, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + np.arange(n, dtype=np.int64).reshape(shape) * s
    return index


def _elements_at(val: torch.Tensor, bindings: dict, positions: Any, what: str) -> Any:
    """For each storage position, the index of the element of ``val`` (a
    fake tensor: its traced layout) that lies there, in ``val``'s row-major
    order (what its jax value holds); StridedStorageError for a position
    no element of ``val`` covers."""
    import numpy as np

    size = tuple(_concrete(d, bindings) for d in val.shape)
    stride = tuple(_concrete(d, bindings) for d in val.stride())
    own = _positions(size, stride, _concrete(val.storage_offset(), bindings)).reshape(-1)
    if positions.size == 0:
        return positions
    table = np.full(int(own.max()) + 1 if own.size else 0, -1, dtype=np.int64)
    table[own] = np.arange(own.size, dtype=np.int64)
    inside = (positions >= 0) & (positions < table.size)
    found = np.where(inside, table[np.clip(positions, 0, max(table.size - 1, 0))] if table.size else -1, -1)
    if (found < 0).any():
        raise StridedStorageError(
            f"{what} reads storage positions {sorted(set(positions[found < 0].tolist()))[:8]} that no element of the "
            f"tensor it views covers in the graph (its layout: size {size}, stride {stride}, storage offset "
            f"{val.storage_offset()})")
    return found


def _strided_read(node: torch.fx.Node, root: _Root, env: dict, bindings: dict, storages: list | None) -> Any:
    """``as_strided(x, size, stride, offset)``: the elements at those storage
    positions of the storage ``x`` shares with ``root`` (an input's storage
    array as the caller holds it, or a value's traced layout): not ``x``'s
    own elements, which are all of the storage only when ``x`` is not a view."""
    jnp = jax.numpy
    size, stride, offset = _geometry(node, env, 1, bindings)
    positions = _positions(size, stride, offset)
    val, root_val = node.args[0].meta.get("val"), root.node.meta.get("val")
    if not isinstance(root_val, torch.Tensor) or not isinstance(val, torch.Tensor):
        raise StridedStorageError(f"as_strided of {node.args[0]}: no traced tensor for {root.node}")
    if root_val.dtype != val.dtype:
        raise StridedStorageError(f"as_strided of a {val.dtype} view of a {root_val.dtype} tensor")
    storage = None if storages is None or root.placeholder < 0 else storages[root.placeholder]
    if storage is not None and storage.dtype == env[node.args[0]].dtype:
        flat = storage.reshape(-1)
        if positions.size and (positions.min() < 0 or positions.max() >= flat.shape[0]):
            raise RuntimeError(
                f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset} are out of bounds "
                f"for storage of size {flat.shape[0]} elements")
        return flat[jnp.asarray(positions)]
    elements = _elements_at(root_val, bindings, positions, f"as_strided{(size, stride, offset)}")
    return jnp.ravel(env[root.node])[jnp.asarray(elements)]


def _strided_scatter(node: torch.fx.Node, env: dict, bindings: dict) -> Any:
    """``as_strided_scatter(x, src, size, stride, offset)``: ``x`` with the
    elements at those storage positions of its layout replaced by ``src``."""
    jnp = jax.numpy
    x, src = env[node.args[0]], env[node.args[1]]
    size, stride, offset = _geometry(node, env, 2, bindings)
    positions = _positions(size, stride, offset)
    elements = _elements_at(node.args[0].meta["val"], bindings, positions,
                            f"as_strided_scatter{(size, stride, offset)}")
    flat = jnp.ravel(x).at[jnp.asarray(elements)].set(jnp.reshape(src, size).astype(x.dtype))
    return flat.reshape(x.shape)
