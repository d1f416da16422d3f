"""A differential fuzzer of op programs: random programs of torch ops run on
torch CPU (the oracle) and on the 'jax' device in each eager mode and under
``torch.compile(backend="jax")``, their answers compared, a failing program
shrunk to a short reproducer saved as a standalone Python file.

A program is a list of statements (Python source lines) over a pool of
named tensors ``v0, v1, ...``: leaves made from a seed (small integers, or
normal draws; some with ``requires_grad``), then 5-30 ops -- elementwise,
reductions, matmuls, views (slices, transposes, expand, as_strided,
view/reshape), in-place and ``out=`` ops, casts, factories and random draws
-- over shapes from a small set (empty and 0-d included) and dtypes float32,
float64, int64, bool and bfloat16, and for float programs a backward through
the program.  The generator runs each op on CPU as it writes it, so it knows
every value's shape and dtype; a statement CPU refuses is kept now and then
(errors are compared too).

What is compared, per mode (``op``, ``fused``, ``sync``: ``pjrt_host.config
(eager=...)``; ``compile``: the program as one function under
``torch.compile(backend="jax")``, only for programs CPU runs without error):

- which statements raise, and the exception type (the device's is CPU's or a
  subclass of it);
- every tensor at the end (mutations through views included) and each leaf's
  gradient: dtype, shape, and values -- exactly where the value is exact
  (small integers and ops that keep them so: discontinuous ops such as
  floor, comparisons and argmax are only applied to those), within
  dtype-aware tolerances otherwise;
- eager modes only: which tensors share storage, which are views, strides
  of views, ``requires_grad`` and each tensor's ``_version``.

Random draws (and anything computed from them) differ from CPU's by design
(the device keys its draws its own way, docs/torch-device.md): against CPU
only their dtype and shape are compared; what is promised -- the same seed
gives every eager mode the same numbers -- is compared against op by op.

    python tests/fuzz_programs.py --seed 0 --count 200 --modes op,fused,sync,compile --save DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import re
import sys
import tempfile
import textwrap
import time
import warnings
from typing import Any, Callable

import torch

MODES = ("op", "fused", "sync", "replay", "compile", "padded", "padded-fused", "compile-dynamic")
#: ``compile-dynamic``: ``torch.compile(dynamic=True)`` with every dim of
#: every tensor dynamic in odd buckets: every size dynamo makes symbolic
#: runs through the padded graph (pjrt_host/_compile/_padded_graph.py)
COMPILED = ("compile", "compile-dynamic")
EAGER_MODES = ("op", "fused", "sync", "replay", "padded", "padded-fused")
#: ``replay``: fused eager, the program run twice before the run compared, so
#: that its segments replay their scripts (the replay lane takes their calls)
RUNS_BEFORE = {"replay": 2}
#: Modes compared with op by op's draws for the same seed (padded ones too:
#: a seed draws the same numbers with buckets and without).
SEEDED = ("fused", "sync", "replay", "padded", "padded-fused")
#: ``padded`` / ``padded-fused``: op by op / fused eager with every dim of
#: every tensor dynamic, in odd buckets (``dynamic_shapes="all"``, the
#: oracle mode of docs/dynamic-shapes.md)
PADDED = {"padded": "op", "padded-fused": "fused"}

#: Shapes of leaves and factories: few, so that programs reuse compiled ops.
SHAPES = [(), (0,), (4,), (2, 4), (3, 1, 4), (2, 0)]
#: Dtypes of leaves, with their weights.
DTYPES = [(torch.float32, 6), (torch.float64, 2), (torch.int64, 2), (torch.bool, 1), (torch.bfloat16, 1)]
FLOATS = (torch.float32, torch.float64, torch.bfloat16)

#: Tolerances for values that are not exact (bad_input_sweep's, and float64's).
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-7, atol=1e-7),
              torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}
#: The largest integer each float dtype holds exactly (its mantissa).
EXACT_LIMIT = {torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.bfloat16: 2 ** 8}


# ---------------------------------------------------------------------------
# Programs

@dataclasses.dataclass
class Stmt:
    text: str
    defines: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    random: bool = False      # draws random numbers (or reads uninitialised memory)
    exact: bool = True        # keeps exact inputs exact
    post: bool = False        # runs after the compiled function (the backward)
    empty_inputs: bool = False  # every tensor it reads was empty on CPU (set by the generator)


@dataclasses.dataclass
class Program:
    seed: int
    stmts: list[Stmt]
    #: name -> (random, exact) as the generator saw them on CPU.
    flags: dict[str, tuple[bool, bool]]
    #: leaves with requires_grad, whose .grad is compared.
    grads: tuple[str, ...] = ()
    #: name -> the least precise float dtype its value went through (a
    #: float32 result cast to float64 is compared with float32's tolerance).
    precision: dict = dataclasses.field(default_factory=dict)
    #: names an op CPU refused had written to (and what shares their
    #: storage): what a failed op leaves behind is unspecified (CPU's out=
    #: kernels resize before they check dtypes), so they are not compared.
    unspecified: frozenset[str] = frozenset()
    #: tensors sharing a storage that an out= resize grew: CPU grows the
    #: shared storage, a 'jax' storage cannot grow, so the out tensor gets a
    #: storage of its own (listed in docs/fuzzing.md); not compared.
    grown: frozenset[str] = frozenset()
    #: name -> the largest finite magnitude among the values it was
    #: computed from (itself included): a value left small by a
    #: cancellation (``a - b`` of two near values) carries the rounding
    #: error of its large operands, which a tolerance relative to the small
    #: result does not cover.
    magnitude: dict = dataclasses.field(default_factory=dict)

    @property
    def skipped(self) -> frozenset[str]:
        return self.unspecified | self.grown

    def without(self, drop: set[int]) -> "Program":
        """The program without statements ``drop`` and every statement that
        uses a name they define (transitively)."""
        gone: set[str] = set()
        kept = []
        for i, s in enumerate(self.stmts):
            if i in drop or gone.intersection(s.uses):
                gone.update(s.defines)
                continue
            kept.append(s)
        return Program(self.seed, kept, self.flags, tuple(g for g in self.grads if g not in gone), self.precision,
                       self.unspecified, self.grown, self.magnitude)

    def source(self) -> str:
        return "\n".join(s.text for s in self.stmts)


HELPERS = '''
def make(shape, dtype, seed, DEV, requires_grad=False, normal=False):
    """A leaf: small integers (exact arithmetic) or normal draws, made on CPU from a seed."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        t = torch.randint(0, 2, shape, generator=g).bool()
    elif normal:
        t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    else:
        t = torch.randint(-4, 5, shape, generator=g).to(dtype)
    return t.to(DEV).requires_grad_(requires_grad)


def backward(*ts):
    """Backward from the sum of every float tensor that needs a gradient."""
    ts = [t for t in ts if t.requires_grad and t.is_floating_point()]
    if ts:
        torch.stack([t.double().sum() for t in ts]).sum().backward()
'''
_helpers: dict[str, Any] = {"torch": torch}
exec(HELPERS, _helpers)


def namespace(device: str) -> dict[str, Any]:
    return {"torch": torch, "F": torch.nn.functional, "DEV": device, "make": _helpers["make"],
            "backward": _helpers["backward"]}


# ---------------------------------------------------------------------------
# The generator

class Skip(Exception):
    """No value in the pool fits the op."""


def _fmt(shape: tuple) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"


def _dt(dtype: torch.dtype) -> str:
    return "torch." + str(dtype).split(".")[1]


class Gen:
    """Writes a program while running it on CPU, so every op is chosen for
    the values the pool really holds."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.ns = namespace("cpu")
        self.flags: dict[str, tuple[bool, bool]] = {}
        self.stmts: list[Stmt] = []
        self.n = 0
        self.grads: list[str] = []
        self.unspecified: set[str] = set()
        self.grown: set[str] = set()
        self.precision: dict[str, torch.dtype] = {}
        self.magnitude: dict[str, float] = {}
        #: storages a computing op laid out other than row-major on CPU
        #: (their tensors may look contiguous later, after t_())
        self.odd_layout: set[int] = set()

    def layout_ok(self, t: torch.Tensor) -> bool:
        return _row_major_owner(t) and t.untyped_storage()._cdata not in self.odd_layout

    # --- helpers for op writers
    def new(self) -> str:
        self.n += 1
        return f"v{self.n - 1}"

    def names(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exact: bool = False) -> list[str]:
        out = []
        for name, (rnd, ex) in self.flags.items():
            t = self.ns.get(name)
            if isinstance(t, torch.Tensor) and (ex or not exact) and pred(t):
                out.append(name)
        return out

    def usable(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exact: bool = False) -> list[str]:
        """The names :meth:`names` gives, without those whose values are not
        compared (a refused statement wrote them, an out= resize grew their
        storage): what follows from them is not defined either (a ``*_like``
        of a tensor a refused ``matmul(out=)`` resized on CPU only)."""
        return [n for n in self.names(pred, exact) if n not in self.unspecified and n not in self.grown]

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exact: bool = False) -> str:
        names = self.usable(pred, exact)
        if not names:
            raise Skip
        # favour recent values: programs are chains, not bags
        return names[min(len(names) - 1, int(len(names) * (1 - self.rng.random() ** 2)))]

    def t(self, name: str) -> torch.Tensor:
        return self.ns[name]

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def dim(self, t: torch.Tensor) -> int:
        if t.dim() == 0:
            raise Skip
        return self.rng.randrange(-t.dim(), t.dim())

    def shape(self) -> tuple:
        return self.choice(SHAPES)

    def dtype(self) -> torch.dtype:
        return self.rng.choices([d for d, _ in DTYPES], [w for _, w in DTYPES])[0]

    # --- building
    def leaf(self) -> None:
        name = self.new()
        shape, dtype = self.shape(), self.dtype()
        grad = dtype in (torch.float32, torch.float64) and self.rng.random() < 0.5
        normal = dtype in FLOATS and self.rng.random() < 0.3
        extra = (", requires_grad=True" if grad else "") + (", normal=True" if normal else "")
        seed = self.rng.randrange(1 << 16)
        self.add(Stmt(f"{name} = make({_fmt(shape)}, {_dt(dtype)}, {seed}, DEV{extra})", (name,), exact=not normal))
        if grad:
            self.grads.append(name)

    def add(self, stmt: Stmt, keep_errors: float = 0.3) -> bool:
        """Run ``stmt`` on CPU; keep it (and note its values' flags) if CPU
        runs it, or now and then if CPU raises."""
        before = {n: self.ns[n] for n in self.flags if isinstance(self.ns.get(n), torch.Tensor)}
        versions = {n: t._version for n, t in before.items()}
        sizes = {n: t.untyped_storage().nbytes() for n, t in before.items()}
        used = [before[u] for u in stmt.uses if u in before]
        stmt.empty_inputs = bool(used) and all(t.numel() == 0 for t in used)
        shapes = {n: tuple(t.shape) for n, t in before.items()}
        row_major = {n: self.layout_ok(t) for n, t in before.items()}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(stmt.text, self.ns)
        except Exception as err:  # noqa: BLE001 - CPU's refusals are part of the program
            for n in stmt.defines:
                self.ns.pop(n, None)
            # an index out of range is found on the device and raised at the
            # next synchronisation point in op and fused modes (by design,
            # docs/torch-device.md): such refusals are not kept
            value_dependent = isinstance(err, IndexError) or "out of range" in str(err) \
                or "out of bounds" in str(err)
            if not value_dependent and self.rng.random() < keep_errors:
                self.stmts.append(stmt)
                keys = {_storage(before[u]) for u in stmt.uses if u in before} - {None}
                self.unspecified.update(u for u in stmt.uses if u in before)
                self.unspecified.update(n for n, t in before.items() if _storage(t) in keys)
                return True
            return False
        self.stmts.append(stmt)
        rnd = stmt.random or any(self.flags[u][0] for u in stmt.uses if u in self.flags)
        ex = stmt.exact and all(self.flags[u][1] for u in stmt.uses if u in self.flags)
        for n in stmt.defines:
            t = self.ns[n]
            if isinstance(t, torch.Tensor) and t._base is None and not t.is_contiguous():
                self.odd_layout.add(t.untyped_storage()._cdata)
        inputs = [self.precision[u] for u in stmt.uses if u in self.precision]
        largest = max([self.magnitude.get(u, 0.0) for u in stmt.uses], default=0.0)
        for n in stmt.defines:
            self.flags[n] = (rnd, ex and _looks_exact(self.ns[n]))
            if isinstance(self.ns[n], torch.Tensor):
                self.precision[n] = _loosest(inputs + [self.ns[n].dtype])
                self.magnitude[n] = max(largest, _largest(self.ns[n]))
        for n, t in before.items():
            resized = tuple(t.shape) != shapes[n] and not stmt.text.startswith(f"{n}.")  # an out= resize
            key = t.untyped_storage()._cdata
            group = {m for m, u in before.items() if u.untyped_storage()._cdata == key}
            # (a resize that laid the out tensor out as its input, not row-major
            # -- a transpose's layout -- rewrote what its other views read)
            if t.untyped_storage().nbytes() > sizes[n] or (resized and not all(row_major[m] for m in group)) \
                    or (resized and t._base is None and not t.is_contiguous()):
                if len(group) > 1:
                    self.grown.update(group)
                if resized and t._base is None and not t.is_contiguous():
                    self.odd_layout.add(key)
        # a write reaches every tensor that shares the written storage
        written = [n for n, t in before.items() if t._version != versions[n]]
        for w in written:
            key = _storage(before[w])
            for n, t in before.items():
                if n == w or (key is not None and _storage(t) == key):
                    r0, e0 = self.flags[n]
                    self.flags[n] = (r0 or rnd, e0 and ex and _looks_exact(t))
                    self.precision[n] = _loosest(inputs + [self.precision.get(n, t.dtype)])
                    self.magnitude[n] = max(largest, self.magnitude.get(n, 0.0), _largest(t))
        return True

    def finish_backward(self) -> None:
        live = [n for n in self.names(lambda t: t.requires_grad and t.is_floating_point())]
        if live and self.grads:
            self.add(Stmt(f"backward({', '.join(live)})", (), tuple(live), post=True), keep_errors=1.0)


def _storage(t: torch.Tensor):
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else None


def _largest(t: torch.Tensor) -> float:
    """The largest finite magnitude in ``t`` (0 for a non-float or empty one)."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0
    with torch.no_grad():
        a = t.detach().abs()
        a = a[torch.isfinite(a)]
        return float(a.max()) if a.numel() else 0.0


def _loosest(dtypes: list) -> torch.dtype:
    """The float dtype of widest tolerance among ``dtypes`` (float64 if none)."""
    order = [torch.bfloat16, torch.float32, torch.float64]
    floats = [d for d in dtypes if d in order]
    return min(floats, key=order.index) if floats else torch.float64


def _row_major_owner(t: torch.Tensor) -> bool:
    """Whether the tensor owning ``t``'s storage is row-major on CPU.  A
    computing op's result is row-major on the device where CPU may keep an
    input's layout (a documented limit, docs/torch-device.md), so ops that
    read a storage's layout (as_strided, view / reshape / flatten deciding
    between a view and a copy, out= resizes) are only written where the
    layouts agree."""
    owner = t._base if t._base is not None else t
    return owner.is_contiguous()


def _looks_exact(t: Any) -> bool:
    if not isinstance(t, torch.Tensor):
        return True
    if not t.is_floating_point():
        return True
    v = t.detach().double()
    if not bool(torch.isfinite(v).all()):
        return False
    return bool((v == v.round()).all()) and (v.numel() == 0 or float(v.abs().max()) < EXACT_LIMIT[t.dtype])


# --- op writers: each adds statements through g.add, or raises Skip

def _is_float(t):
    return t.is_floating_point()


def op_unary_exact(g: Gen) -> None:
    a = g.pick()
    t = g.t(a)
    if t.dtype is torch.bool:
        fn = g.choice(["torch.logical_not({})", "~{}"])
    else:
        fn = g.choice(["torch.neg({})", "torch.abs({})", "F.relu({})", "({} * 2)", "({} - 3)", "({} ** 2)",
                       "torch.square({})", "{}.clamp(-2, 3)"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,)))


def op_unary_inexact(g: Gen) -> None:
    a = g.pick(_is_float)
    fn = g.choice(["torch.exp({}.clamp(-8, 8))", "torch.tanh({})", "torch.sigmoid({})", "torch.sin({})",
                   "torch.sqrt({}.abs())", "torch.log1p({}.abs())", "torch.rsqrt({}.abs() + 1)", "torch.erf({})",
                   "F.gelu({})", "F.softplus({})", "F.silu({})", "({} / 3)", "torch.reciprocal({}.abs() + 1)",
                   "torch.atan2({0}, {0} + 1)", "({} * 0.1)"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,), exact=False))


def op_discontinuous(g: Gen) -> None:
    """Only on exact values: a rounding difference would jump here."""
    a = g.pick(exact=True)
    fn = g.choice(["torch.floor({} / 2)", "torch.round({} / 4)", "torch.sign({})", "({} > 0)", "({} == 1)",
                   "torch.trunc({} / 3)", "{}.long()", "{}.bool()", "torch.argmax({})", "({} <= -1)",
                   "torch.div({}, 3, rounding_mode='floor')", "torch.remainder({}, 3)", "torch.ceil({} / 2)"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,)))


def _broadcastable(g: Gen, a: str, exact: bool = False) -> str:
    sa = g.t(a).shape

    def fits(t):
        try:
            torch.broadcast_shapes(sa, t.shape)
            return True
        except RuntimeError:
            return False

    # now and then any value: the op may refuse it, as CPU does
    return g.pick(fits if g.rng.random() < 0.9 else (lambda t: True), exact=exact)


def op_binary(g: Gen) -> None:
    exact = g.rng.random() < 0.5
    a = g.pick(exact=exact)
    b = _broadcastable(g, a, exact=exact)
    if exact:
        fn = g.choice(["torch.add({}, {})", "torch.sub({}, {}, alpha=2)", "torch.mul({}, {})",
                       "torch.maximum({}, {})", "torch.minimum({}, {})", "torch.eq({}, {})", "torch.lt({}, {})",
                       "torch.ge({}, {})", "torch.logical_and({}, {})", "torch.bitwise_and({}, {})",
                       "torch.where({0} > 0, {0}, {1})", "({} + {})", "({} * {})"])
        stmt_exact = True
    else:
        fn = g.choice(["torch.add({}, {})", "torch.mul({}, {})", "torch.div({}, {})", "torch.sub({}, {})",
                       "torch.atan2({}, {})", "torch.hypot({}, {})", "torch.lerp({}, {}, 0.3)",
                       "torch.addcmul({0}, {1}, {1}, value=0.5)"])
        stmt_exact = False
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a, b), (o,), (a, b), exact=stmt_exact))


def op_where(g: Gen) -> None:
    c = g.pick(lambda t: t.dtype is torch.bool)
    a = _broadcastable(g, c)
    b = _broadcastable(g, a)
    o = g.new()
    g.add(Stmt(f"{o} = torch.where({c}, {a}, {b})", (o,), (c, a, b)))


def op_reduce(g: Gen) -> None:
    exact = g.rng.random() < 0.5
    a = g.pick(exact=exact)
    t = g.t(a)
    d = g.rng.randrange(-t.dim(), t.dim()) if t.dim() else None
    kd = g.choice(["", ", keepdim=True"])
    ds = "" if d is None or g.rng.random() < 0.25 else f"{d}"
    if exact:
        fn = g.choice([f"torch.sum({{}}{', ' + ds if ds else ''}{kd if ds else ''})",
                       f"torch.amax({{}}{', ' + ds if ds else ''}{kd if ds else ''})",
                       f"torch.cumsum({{}}, {d if d is not None else 0})",
                       f"torch.argmax({{}}{', ' + ds if ds else ''}{kd if ds else ''})",
                       f"torch.prod({{}}{', ' + ds if ds else ''}{kd if ds else ''})",
                       f"torch.any({{}}{', ' + ds if ds else ''})", f"torch.all({{}})",
                       f"torch.max({{}}, {d if d is not None else 0}).values",
                       f"torch.min({{}}, {d if d is not None else 0}).indices",
                       f"torch.sort({{}}, {d if d is not None else 0}, stable=True).indices",
                       f"torch.count_nonzero({{}})"])
    else:
        fn = g.choice([f"torch.mean({{}}{', ' + ds if ds else ''}{kd if ds else ''})",
                       f"torch.softmax({{}}, {d if d is not None else 0})",
                       f"torch.log_softmax({{}}, {d if d is not None else 0})",
                       f"torch.logsumexp({{}}, {d if d is not None else 0})",
                       f"torch.var({{}}{', ' + ds if ds else ''})", f"torch.std({{}}{', ' + ds if ds else ''})",
                       f"torch.norm({{}})", f"torch.sum({{}}{', ' + ds if ds else ''})",
                       f"torch.cumprod({{}}, {d if d is not None else 0})"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,), exact=exact))


def op_matmul(g: Gen) -> None:
    exact = g.rng.random() < 0.6
    a = g.pick(lambda t: t.dim() >= 1, exact=exact)
    k = g.t(a).shape[-1]
    b = g.pick(lambda t: t.dim() >= 1 and (t.shape[-2] if t.dim() >= 2 else t.shape[0]) == k
               if g.rng.random() < 0.9 else True, exact=exact)
    ta, tb = g.t(a), g.t(b)
    if ta.dtype != tb.dtype and (ta.numel() == 0 or tb.numel() == 0):
        # CPU multiplies empty operands of mixed dtypes (no dtype check when
        # there is nothing to sum); the device refuses them as CPU refuses
        # any other pair (listed in docs/fuzzing.md)
        raise Skip
    fn = g.choice(["torch.matmul({}, {})", "({} @ {})"])
    if g.t(a).dim() == 2 and g.t(b).dim() == 2:
        fn = g.choice([fn, "torch.mm({}, {})"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a, b), (o,), (a, b), exact=exact))


def op_view(g: Gen) -> None:
    a = g.pick()
    t = g.t(a)
    n, r = t.dim(), g.rng
    opts = ["{}.detach()", "{}.view(-1)", "{}.reshape(-1)", "{}.unsqueeze(0)", "{}[None]", "{}.flatten()"]
    if n >= 1:
        d = g.dim(t)
        size = t.shape[d]
        s = r.randrange(0, size + 1)
        e = r.randrange(s, size + 1)
        step = r.choice([1, 1, 2])
        sl = ", ".join([":"] * (d % n) + [f"{s}:{e}:{step}" if step > 1 else f"{s}:{e}"])
        opts += ["{}[" + sl + "]", f"{{}}.narrow({d}, {s}, {e - s})", f"{{}}.transpose(0, {n - 1})",
                 f"{{}}.movedim(0, -1)", f"{{}}.unsqueeze({d})", f"{{}}.chunk(2, {d})[0]",
                 f"{{}}.split(1, {d})[-1]" if size else "{}.view(-1)", "{}.mT" if n >= 2 else "{}.t()"]
        if size:
            opts += [f"{{}}.select({d}, {r.randrange(size)})", f"{{}}[{r.randrange(-size, size)}]",
                     f"{{}}.unbind({d})[{r.randrange(size)}]"]
        if size == 1:
            opts.append(f"{{}}.squeeze({d})")
        if n >= 2:
            opts += ["{}.t()" if n == 2 else "{}.permute(" + ", ".join(map(str, r.sample(range(n), n))) + ")",
                     "{}.diagonal()", f"{{}}.unfold({d}, 1, 1)", "{}.squeeze()"]
        # expand: size-1 dims to 3, and a new leading dim
        opts.append("{}.expand(" + ", ".join(["2"] + [str(3 if x == 1 else x) for x in t.shape]) + ")")
        if t.numel() and t.is_contiguous():
            opts.append("{}.view(" + ", ".join(map(str, t.shape[::-1])) + ")")
    else:
        opts += ["{}.expand(3)", "{}.view(1, 1)"]
    if t.untyped_storage().nbytes() and t.dtype.itemsize:
        nel = t.untyped_storage().nbytes() // t.element_size()
        if nel >= 2:
            off = r.randrange(0, nel // 2)
            rows, cols = r.choice([(2, 1), (1, 2), ((nel - off) // 2, 2), (2, (nel - off) // 2)])
            stride = r.choice([(cols, 1), (1, rows), (0, 1)])
            opts.append(f"{{}}.as_strided(({rows}, {cols}), {stride}, {off})")
    fn = g.choice(opts)
    if fn.startswith(LAYOUT_READERS) and not g.layout_ok(t):
        raise Skip
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,)))


#: Ops whose answer depends on the storage's layout (see _row_major_owner).
LAYOUT_READERS = ("{}.view(", "{}.reshape(", "{}.flatten(", "{}.as_strided(", "{}.contiguous(")


def op_shape(g: Gen) -> None:
    """Ops that copy: cat, stack, flip, roll, repeat, index_select, gather,
    advanced indexing, masks, pad, tril, contiguous, clone."""
    a = g.pick()
    t = g.t(a)
    n, r = t.dim(), g.rng
    opts = ["{}.clone()", "{}.contiguous()", "torch.stack([{0}, {0}])", "{}.repeat(2" + ", 1" * n + ")"
            if n else "{}.repeat(2)"]
    if n:
        d = g.dim(t)
        size = t.shape[d]
        b = g.pick(lambda u: u.dim() == n and all(u.shape[i] == t.shape[i] for i in range(n) if i != d % n)
                   if r.random() < 0.9 else True)
        opts += [f"torch.cat([{{}}, {b}], {d})", f"{{}}.flip({d})", f"{{}}.roll(1, {d})",
                 f"F.pad({{}}, (1, 0))" if t.is_floating_point() else "{}.flip(0)"]
        if size:
            idx = [r.randrange(size) for _ in range(r.randrange(1, 4))]
            # (indexing along dim d, every other index counted from the end)
            ends = [i - size if k % 2 else i for k, i in enumerate(idx)]
            opts += [f"{{}}.index_select({d}, torch.tensor({idx}, device=DEV))",
                     f"{{}}[{':, ' * (d % n)}torch.tensor({ends}, device=DEV)]"]
            gshape = list(t.shape)
            gshape[d] = 2
            gi = torch.randint(0, size, gshape, generator=torch.Generator().manual_seed(r.randrange(99)))
            opts.append(f"torch.gather({{}}, {d}, torch.tensor({gi.tolist()}, dtype=torch.long, device=DEV))")
        if n == 2:
            opts += ["torch.tril({})", "torch.triu({}, 1)"]
        if not g.flags[a][0]:  # a random value's mask has another shape on the device (its draws differ)
            opts += ["{0}[{0} > 0]" if t.dtype is not torch.bool else "{0}[{0}]", "torch.nonzero({})",
                     "torch.masked_select({0}, {0} != 0)"]
    fn = g.choice(opts)
    if fn.startswith(LAYOUT_READERS) and not g.layout_ok(t):
        raise Skip
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), tuple(sorted(set(re.findall(r"\bv\d+\b", fn.format(a)))))))


def op_cast(g: Gen) -> None:
    a = g.pick()
    t = g.t(a)
    target = g.choice([torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16])
    if (t.is_floating_point() and not target.is_floating_point) and not g.flags[a][1]:
        raise Skip  # truncation of an inexact value jumps
    fn = g.choice([f"{{}}.to({_dt(target)})", f"{{}}.to({_dt(target)}, copy=True)", "{}.float()", "{}.double()"])
    o = g.new()
    g.add(Stmt(f"{o} = " + fn.format(a), (o,), (a,), exact=not (t.is_floating_point() and target is torch.bfloat16)))


def op_factory(g: Gen) -> None:
    s, r = g.shape(), g.rng
    dt = g.choice([torch.float32, torch.int64, torch.float64, torch.bool])
    opts = [f"torch.zeros({_fmt(s)}, dtype={_dt(dt)}, device=DEV)", f"torch.ones({_fmt(s)}, device=DEV)",
            f"torch.full({_fmt(s)}, 3, dtype={_dt(dt)}, device=DEV)", f"torch.arange({r.randrange(6)}, device=DEV)",
            f"torch.arange(0.0, {r.randrange(1, 4)}, 0.5, device=DEV)", f"torch.eye({r.randrange(4)}, device=DEV)"]
    names = g.usable()
    if names:
        a = g.choice(names)
        opts += [f"torch.zeros_like({a})", f"torch.ones_like({a}, dtype={_dt(dt)})", f"{a}.new_full((2,), 2)",
                 f"torch.full_like({a}, 7)"]
    fn = g.choice(opts)
    o = g.new()
    g.add(Stmt(f"{o} = {fn}", (o,), tuple(re.findall(r"\bv\d+\b", fn))))


def op_random(g: Gen) -> None:
    s, r = g.shape(), g.rng
    opts = [f"torch.randn({_fmt(s)}, device=DEV)", f"torch.rand({_fmt(s)}, device=DEV)",
            f"torch.randint(0, 5, {_fmt(s)}, device=DEV)", f"torch.randperm({r.randrange(6)}, device=DEV)",
            f"torch.bernoulli(torch.full({_fmt(s)}, 0.5, device=DEV))", f"torch.empty({_fmt(s)}, device=DEV)"]
    floats = g.usable(_is_float)
    if floats:
        a = g.choice(floats)
        opts += [f"torch.rand_like({a})", f"F.dropout({a}, 0.5, training=True)", f"torch.randn_like({a})",
                 f"torch.empty_like({a})"]
    fn = g.choice(opts)
    o = g.new()
    g.add(Stmt(f"{o} = {fn}", (o,), tuple(re.findall(r"\bv\d+\b", fn)), random=True))


def op_inplace(g: Gen) -> None:
    a = g.pick()
    t = g.t(a)
    r = g.rng
    b = _broadcastable(g, a)
    if b != a and _storage(g.t(b)) is not None and _storage(g.t(b)) == _storage(t):
        # an in-place op reading memory it writes (x.mul_(x[1:2])): the
        # result depends on the order of the writes, which torch leaves
        # undefined (CPU goes element by element, the device reads first)
        b = a
    exact = True
    rnd = False
    opts = [f"{a}.add_({b})", f"{a}.mul_({b})", f"{a}.copy_({b})", f"{a}.zero_()", f"{a}.fill_(2)",
            f"{a}.neg_()", f"{a}.clamp_(-1, 2)", f"{a}.sub_({b}, alpha=2)", f"{a}.relu_()",
            f"{a}.masked_fill_({a} > 0, 5)" if t.dtype is not torch.bool else f"{a}.masked_fill_({a}, False)",
            f"{a} += {b}", f"{a} *= 3", f"{a}.abs_()"]
    casts = {f"{a}.copy_({b})"}  # the writes that convert b's values to a's dtype
    if t.dim():
        d = g.dim(t)
        size = t.shape[d]
        s = r.randrange(0, size + 1)
        sl = ", ".join([":"] * (d % t.dim()) + [f"{s}:"])
        opts += [f"{a}[{sl}] = {b}", f"{a}[{sl}] += 1", f"{a}[{sl}] = 3", f"{a}.t_()" if t.dim() <= 2 else
                 f"{a}.transpose_(0, 1)", f"{a}.unsqueeze_(0)", f"{a}.squeeze_()"]
        casts.add(f"{a}[{sl}] = {b}")
        if size:
            idx = sorted(set(r.randrange(size) for _ in range(2)))
            opts += [f"{a}.index_fill_({d}, torch.tensor({idx}, device=DEV), -1)",
                     f"{a}[{':, ' * (d % t.dim())}torch.tensor({idx}, device=DEV)] = 0",
                     f"{a}.index_add_({d}, torch.tensor({idx}, device=DEV), {a}.index_select({d}, "
                     f"torch.tensor({idx}, device=DEV)))"]
    if t.is_floating_point():
        opts += [f"{a}.div_(2)", f"{a}.mul_(0.5)"]
    else:
        opts += [f"{a}.div_(2)"]  # CPU refuses: an integer cannot hold the quotient
    fn = r.choice(opts)
    if fn in casts and not t.is_floating_point() and g.t(b).is_floating_point() and not g.flags[b][1]:
        # an integer or bool destination truncates an inexact value: a
        # rounding difference would jump, and a NaN's or an inf's conversion
        # is undefined in C++ (x86 gives INT64_MIN, XLA 0), as op_cast and
        # op_out keep them out
        raise Skip
    if fn.startswith((f"{a}.div_", f"{a}.mul_(0.5)")):
        exact = False
    if r.random() < 0.12 and t.is_floating_point():
        fn = r.choice([f"{a}.uniform_()", f"{a}.normal_()", f"{a}.bernoulli_(0.5)", f"{a}.exponential_()",
                       f"{a}.random_(0, 5)"])
        rnd = True
    g.add(Stmt(fn, (), tuple(sorted(set(re.findall(r"\bv\d+\b", fn)))), random=rnd, exact=exact))


def op_out(g: Gen) -> None:
    r = g.rng
    a = g.pick()
    b = _broadcastable(g, a)
    if r.random() < 0.5:
        c = g.new()
        dt = g.t(a).dtype if r.random() < 0.8 else g.choice([torch.float32, torch.int64, torch.bool])
        g.add(Stmt(f"{c} = torch.empty(0, dtype={_dt(dt)}, device=DEV)", (c,)))
        if c not in g.flags:
            raise Skip
    else:
        c = g.pick()
    if not g.t(c).is_floating_point() and not (g.flags[a][1] and g.flags[b][1]):
        raise Skip  # an integer out= truncates: a rounding difference would jump
    fn = r.choice([f"torch.add({a}, {b}, out={c})", f"torch.mul({a}, {b}, out={c})", f"torch.neg({a}, out={c})",
                   f"torch.sum({a}, 0, out={c})" if g.t(a).dim() else f"torch.sum({a}, out={c})",
                   f"torch.cat([{a}, {a}], out={c})" if g.t(a).dim() else f"torch.abs({a}, out={c})",
                   f"torch.maximum({a}, {b}, out={c})", f"torch.clamp({a}, 0, 2, out={c})",
                   f"torch.matmul({a}, {b}, out={c})", f"torch.where({a} > 0, {a}, {b}, out={c})"])
    key = g.t(c).untyped_storage()._cdata
    if key in (g.t(a).untyped_storage()._cdata, g.t(b).untyped_storage()._cdata):
        # out= sharing memory with an input: torch refuses partial overlap
        # in elementwise ops, and leaves a resized or reduced one undefined
        # (CPU resizes out, its input, before it reads it)
        elementwise = fn.startswith(("torch.add", "torch.mul", "torch.neg", "torch.maximum", "torch.clamp"))
        try:
            same = tuple(torch.broadcast_shapes(g.t(a).shape, g.t(b).shape)) == tuple(g.t(c).shape)
        except RuntimeError:
            same = False
        if not (elementwise and same and c in (a, b)):
            raise Skip
    g.add(Stmt(fn, (), tuple(sorted(set(re.findall(r"\bv\d+\b", fn))))))


#: Op writers with their weights.
OPS: list[tuple[Callable[[Gen], None], int]] = [
    (op_unary_exact, 5), (op_unary_inexact, 5), (op_discontinuous, 4), (op_binary, 8), (op_where, 2),
    (op_reduce, 6), (op_matmul, 3), (op_view, 10), (op_shape, 5), (op_cast, 3), (op_factory, 2),
    (op_random, 2), (op_inplace, 10), (op_out, 4)]


def generate(seed: int, min_ops: int = 5, max_ops: int = 30) -> Program:
    """The program of ``seed``: 1-4 leaves, then ``min_ops``-``max_ops`` ops."""
    g = Gen(seed)
    with torch.random.fork_rng(devices=[]):  # the generator's own CPU draws leave torch's seed alone
        torch.manual_seed(seed)
        for _ in range(g.rng.randint(1, 4)):
            g.leaf()
        target = g.rng.randint(min_ops, max_ops)
        tries = 0
        ops = len(g.stmts)
        while len(g.stmts) - ops < target and tries < target * 20:
            tries += 1
            writer = g.rng.choices([w for w, _ in OPS], [k for _, k in OPS])[0]
            try:
                writer(g)
            except Skip:
                pass
        if g.grads and g.rng.random() < 0.8:
            g.finish_backward()
    return Program(seed, g.stmts, g.flags, tuple(g.grads), g.precision, frozenset(g.unspecified),
                   frozenset(g.grown), g.magnitude)


# ---------------------------------------------------------------------------
# Running

@dataclasses.dataclass
class Snap:
    dtype: torch.dtype
    shape: tuple
    stride: tuple
    is_view: bool
    version: int
    requires_grad: bool
    storage: Any
    values: torch.Tensor
    base_stride: tuple | None = None
    #: the tensor a view is of (itself if none), by identity: views of an
    #: empty tensor share no storage address
    root: int | None = None


@dataclasses.dataclass
class Outcome:
    errors: dict[int, type]       # statement index -> exception type
    tensors: dict[str, Snap]
    final_error: str | None = None  # an error after the statements (at synchronisation, reading values)


def _mode_scope(mode: str):
    import pjrt_host
    if mode in PADDED:
        return pjrt_host.config(eager=PADDED[mode], dynamic_shapes="all")
    if mode in EAGER_MODES:
        return pjrt_host.config(eager="fused" if mode == "replay" else mode)
    return contextlib.nullcontext()


def _snapshot(ns: dict, program: Program, names: list[str]) -> dict[str, Snap]:
    out = {}
    for n in names:
        t = ns.get(n)
        if isinstance(t, torch.Tensor):
            out[n] = _snap(t)
    for n in program.grads:
        t = ns.get(n)
        if isinstance(t, torch.Tensor) and t.grad is not None:
            out[n + ".grad"] = _snap(t.grad)
    return out


def _snap(t: torch.Tensor) -> Snap:
    base = t._base
    return Snap(t.dtype, tuple(t.shape), tuple(t.stride()), t._is_view(), t._version, t.requires_grad,
                _storage(t), t.detach().cpu().clone(), None if base is None else tuple(base.stride()),
                id(t if base is None else base))


def _defined(program: Program) -> list[str]:
    return [n for s in program.stmts for n in s.defines]


def run(program: Program, device: str, mode: str = "op") -> Outcome:
    """Run ``program`` statement by statement on ``device`` (CPU ignores the mode)."""
    if mode in COMPILED and device != "cpu":
        return run_compiled(program, device, dynamic=mode == "compile-dynamic")
    if device != "cpu":
        for _ in range(RUNS_BEFORE.get(mode, 0)):
            run(program, device, "fused")
    ns = namespace(device)
    errors: dict[int, type] = {}
    torch.manual_seed(program.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _mode_scope(mode) if device != "cpu" else contextlib.nullcontext():
            for i, s in enumerate(program.stmts):
                try:
                    exec(s.text, ns)
                except Exception as err:  # noqa: BLE001 - the type is compared
                    errors[i] = type(err)
            try:
                if device != "cpu":
                    torch.jax.synchronize()
                tensors = _snapshot(ns, program, _defined(program))
            except Exception as err:  # noqa: BLE001
                return Outcome(errors, {}, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return Outcome(errors, tensors)


def _is_leaf(s: Stmt) -> bool:
    return len(s.defines) == 1 and s.text.startswith(f"{s.defines[0]} = make(")


def compile_source(program: Program) -> str:
    """The program as ``program(DEV, *leaves)``: its leaves are made
    eagerly and passed in, as a model's inputs are; the rest is the body."""
    leaves = [s.defines[0] for s in program.stmts if _is_leaf(s)]
    body = [s.text for s in program.stmts if not s.post and not _is_leaf(s)]
    names = _defined(Program(program.seed, [s for s in program.stmts if not s.post], program.flags))
    ret = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
    return (f"def program({', '.join(['DEV'] + leaves)}):\n"
            + textwrap.indent("\n".join(body + [f"return {ret}"]), "    ") + "\n")


def run_compiled(program: Program, device: str, backend: str = "jax", dynamic: bool = False) -> Outcome:
    """The program as one function under torch.compile(backend=backend) (its
    leaves made before, eagerly); the backward runs after it, through the
    compiled graph.  ``dynamic``: every size symbolic (``dynamic=True``),
    the device's buckets odd."""
    import torch._dynamo
    ns = namespace(device)
    exec(compile_source(program), ns)
    torch._dynamo.reset()
    fn = torch.compile(ns["program"], backend=backend, dynamic=True if dynamic else None)
    if dynamic and device != "cpu":
        import pjrt_host
        with pjrt_host.config(dynamic_shapes="all"):
            return _run_compiled(program, device, ns, fn)
    return _run_compiled(program, device, ns, fn)


def _run_compiled(program: Program, device: str, ns: dict, fn: Any) -> Outcome:
    torch.manual_seed(program.seed)
    errors: dict[int, type] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        leaves = []
        for s in program.stmts:
            if _is_leaf(s):
                exec(s.text, ns)
                leaves.append(ns[s.defines[0]])
        try:
            values = fn(device, *leaves)
        except Exception as err:  # noqa: BLE001
            text = " ".join(line.strip() for line in str(err).splitlines()[:3])
            # a backend's failure is named by its cause too: dynamo wraps every
            # backend error alike, and two failures agree only if their causes do
            inner = getattr(err, "inner_exception", None)
            name = type(err).__name__ + (f"({type(inner).__name__})" if inner is not None else "")
            return Outcome({-1: type(err)}, {}, f"{name}: {text}")
        ns.update(values)
        for i, s in enumerate(program.stmts):
            if s.post:
                try:
                    exec(s.text, ns)
                except Exception as err:  # noqa: BLE001
                    errors[i] = type(err)
        try:
            if device != "cpu":
                torch.jax.synchronize()
            tensors = _snapshot(ns, program, _defined(program))
        except Exception as err:  # noqa: BLE001
            return Outcome(errors, {}, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return Outcome(errors, tensors)


def torch_compiles_so(program: Program, dev: Outcome, cpu: Outcome | None = None,
                      diffs: list[str] | None = None, dynamic: bool = False) -> bool:
    """Whether torch.compile itself, with aot_eager on CPU (torch's own
    functionalization and AOTAutograd, no device), gives what the device
    gave in compile mode: then a difference from eager CPU is torch's.
    Given eager CPU's outcome and the device's ``diffs`` from it, also
    where aot_eager differs from eager CPU in the same tensors the same way
    (a wrong value made of random draws, which differ between backends)."""
    try:
        ref = run_compiled(program, "cpu", backend="aot_eager", dynamic=dynamic)
    except Exception:  # noqa: BLE001 - no answer: not torch's
        return False
    if dev.final_error or ref.final_error:
        return bool(dev.final_error and ref.final_error) and \
            dev.final_error.split(":")[0] == ref.final_error.split(":")[0]
    if not [d for d in compare(program, ref, dev, "compile") if _kind(d) != "known"]:
        return True
    if cpu is None or not diffs:
        return False
    theirs = {_subject(d) for d in compare(program, cpu, ref, "compile") if _kind(d) != "known"}
    return {_subject(d) for d in diffs if _kind(d) != "known"} <= theirs


def _subject(diff: str) -> tuple[str, str]:
    """A difference's kind and the tensor (or statement) it is about."""
    kind, _, rest = diff.partition(": ")
    words = rest.split()
    return kind, " ".join(words[:2]) if words[:1] == ["statement"] else (words[0] if words else "")


# ---------------------------------------------------------------------------
# Comparing

def _groups(tensors: dict[str, Snap], skip: frozenset[str] = frozenset()) -> set[frozenset[str]]:
    by: dict[Any, set[str]] = {}
    for n, s in tensors.items():
        if s.storage is not None and not n.endswith(".grad") and n not in skip:
            by.setdefault(s.storage, set()).add(n)
    return {frozenset(v) for v in by.values() if len(v) > 1}


def _values_differ(got: torch.Tensor, want: torch.Tensor, exact: bool, loose: bool = False,
                   precision: torch.dtype | None = None, magnitude: float = 0.0) -> str:
    if want.is_floating_point() and not exact:
        # the tolerance of the least precise float the value went through,
        # absolute to the largest value it was computed from (a cancellation
        # keeps its operands' rounding error)
        tol = dict(TOLERANCES.get(_loosest([want.dtype, precision or want.dtype]), {}))
        if tol:
            tol["atol"] = max(tol["atol"], tol["rtol"] * magnitude)
        if loose:
            tol = {k: v * 10 for k, v in tol.items()}
    else:
        tol = dict(rtol=0, atol=0)
    try:
        torch.testing.assert_close(got, want, equal_nan=True, check_stride=False, **tol)
    except AssertionError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return " ".join(lines[:4])[:300]
    return ""


def compare(program: Program, cpu: Outcome, dev: Outcome, mode: str, reference: Outcome | None = None) -> list[str]:
    """What differs between the device's outcome and CPU's, one line each
    (each starting with its kind: error, final, missing, dtype, shape,
    values, random, alias, view, stride, version, grad)."""
    out = []
    if dev.final_error and mode in COMPILED and not cpu.final_error:
        if dev.final_error.startswith("TorchRuntimeError") and "fake tensor" in dev.final_error and any(
                st.empty_inputs for st in program.stmts):
            return [f"known: torch.compile's tracing refused the program ({dev.final_error[:120]}) "
                    f"({KNOWN['empty-inputs']})"]
        if dev.final_error.startswith("BackendCompilerFailed") and "modified by an inplace operation" in \
                dev.final_error:
            return [f"known: {KNOWN['compile-saved-mutation']}"]
        if dev.final_error.startswith("AssertionError") and "after application of ViewMeta sequence" in \
                dev.final_error:
            return [f"known: {KNOWN['compile-view-replay']}"]
    if dev.final_error:
        return [f"final: the device raised {dev.final_error} after the statements (CPU: "
                f"{cpu.final_error or 'nothing'})"]
    #: names a known difference reaches (what a statement the device
    #: refused would have defined or written, and what follows from them)
    after_known: set[str] = set()
    if mode not in COMPILED:
        for i in sorted(set(range(len(program.stmts))) | set(dev.errors)):
            want, got = cpu.errors.get(i), dev.errors.get(i)
            stmt = program.stmts[i] if i >= 0 else None
            if stmt is not None and after_known.intersection(stmt.uses):
                after_known.update(stmt.uses + stmt.defines)
                continue
            if want is None and got is not None and stmt is not None and stmt.empty_inputs:
                out.append(f"known: statement {i} `{stmt.text}`: the device raised {got.__name__}, "
                           f"CPU ran it on empty inputs ({KNOWN['empty-inputs']})")
                after_known.update(stmt.uses + stmt.defines)
            elif want is None and got is not None:
                out.append(f"error: statement {i} `{program.stmts[i].text}`: the device raised {got.__name__}, "
                           f"CPU ran it")
            elif want is NotImplementedError and got is RuntimeError and stmt is not None and \
                    re.search(r"torch\.matmul\(| @ ", stmt.text):
                out.append(f"known: statement {i} `{stmt.text}`: the device raised RuntimeError, CPU "
                           f"NotImplementedError ({KNOWN['matmul-fold']})")
                after_known.update(stmt.uses + stmt.defines)
            elif want is not None and (got is None or not issubclass(got, want)):
                out.append(f"error: statement {i} `{program.stmts[i].text}`: CPU raised {want.__name__}, the "
                           f"device {'ran it' if got is None else 'raised ' + got.__name__}")
        # ... and what shares storage with them (a view written through its base)
        roots: dict[Any, set[str]] = {}
        for n, snap in cpu.tensors.items():
            roots.setdefault(snap.root, set()).add(n.split(".")[0])
        for group in [*_groups(cpu.tensors), *roots.values()]:
            if after_known.intersection(group):
                after_known.update(group)
    else:
        for i in sorted(set(cpu.errors) | set(dev.errors)):
            if cpu.errors.get(i) is not dev.errors.get(i) and not (
                    cpu.errors.get(i) and dev.errors.get(i) and issubclass(dev.errors[i], cpu.errors[i])):
                what = program.stmts[i].text if i >= 0 else "the compiled program"
                out.append(f"error: {what}: CPU {_raised(cpu.errors.get(i))}, the device {_raised(dev.errors.get(i))}")
    for name, want in cpu.tensors.items():
        base = name.split(".")[0]
        if base in after_known:
            continue
        got = dev.tensors.get(name)
        if got is None:
            out.append(f"missing: {name} is a tensor on CPU only")
            continue
        if base in program.skipped:
            continue
        rnd, exact = program.flags.get(base, (False, False))
        if name.endswith(".grad"):
            rnd = rnd or any(s.random for s in program.stmts)
            exact = False
        if got.dtype != want.dtype:
            out.append(f"dtype: {name} is {got.dtype}, CPU {want.dtype}")
            continue
        # a random value's shape may depend on its values (nonzero of a draw)
        if got.shape != want.shape and not (rnd and len(got.shape) == len(want.shape)):
            out.append(f"shape: {name} is {got.shape}, CPU {want.shape}")
            continue
        if got.shape != want.shape:
            continue
        if not rnd:
            why = _values_differ(got.values, want.values, exact, precision=program.precision.get(base),
                                 magnitude=program.magnitude.get(base, 0.0))
            if why:
                out.append(f"values: {name} ({'exact' if exact else 'inexact'} {want.dtype}): {why}")
        elif reference is not None and name in reference.tensors:
            # the promise: one seed, the same numbers in every eager mode
            ref = reference.tensors[name]
            if ref.shape == got.shape and ref.dtype == got.dtype and not torch.equal(ref.values, got.values):
                why = _values_differ(got.values, ref.values, exact and mode == "sync",
                                     loose=mode in ("fused", "replay"))
                if why:
                    out.append(f"random: {name} differs from op by op's draw with the same seed: {why}")
        if mode in EAGER_MODES:
            if got.requires_grad != want.requires_grad and not name.endswith(".grad"):
                out.append(f"grad: {name}.requires_grad is {got.requires_grad}, CPU {want.requires_grad}")
            if got.is_view != want.is_view:
                out.append(f"view: {name} is{'' if got.is_view else ' not'} a view, CPU's is{'' if want.is_view else ' not'}")
            # a view's strides follow its base's: only where the bases agree
            # (results of computing ops are row-major where CPU keeps an
            # input's layout: a documented limit, docs/torch-device.md)
            elif (want.is_view and got.stride != want.stride and 0 not in want.shape
                  and got.base_stride == want.base_stride):
                out.append(f"stride: view {name} has strides {got.stride}, CPU {want.stride}")
            # a gradient's _version counts autograd's own in-place steps (how
            # AccumulateGrad and the backward formulas reuse buffers): not the user's
            if got.version != want.version and not name.endswith(".grad"):
                out.append(f"version: {name}._version is {got.version}, CPU {want.version}")
    for name in dev.tensors:
        if name not in cpu.tensors and name.split(".")[0] not in after_known:
            out.append(f"missing: {name} is a tensor on the device only")
    if mode in EAGER_MODES:
        want_g = {frozenset(g & dev.tensors.keys()) for g in _groups(cpu.tensors, program.skipped | after_known)}
        got_g = {frozenset(g & cpu.tensors.keys()) for g in _groups(dev.tensors, program.skipped | after_known)}
        for grp in sorted(want_g - got_g, key=sorted):
            out.append(f"alias: {', '.join(sorted(grp))} share storage on CPU, not on the device")
        for grp in sorted(got_g - want_g, key=sorted):
            out.append(f"alias: {', '.join(sorted(grp))} share storage on the device, not on CPU")
    return out


#: Differences that are known and listed (docs/fuzzing.md), by name: a diff
#: line of kind ``known`` names one; it is counted, never a mismatch.
KNOWN = {
    "empty-inputs": "CPU's kernels run no code for empty tensors, so CPU accepts dtypes there that it refuses "
                    "for any other size; the device refuses them at every size (docs/fuzzing.md)",
    "compile-saved-mutation": "torch.compile refuses, when it compiles, an in-place write to a value the "
                              "backward needs, which eager refuses only in a backward (aot_eager on CPU too; "
                              "docs/fuzzing.md)",
    "matmul-fold": "torch's composite matmul folds a batched product into one mm for a tensor subclass (as on "
                   "CPU when the folded operand needs a gradient), so a dtype CPU's bmm has no code for is refused "
                   "with mm's RuntimeError, CPU's own on that path (docs/fuzzing.md)",
    "compile-torch": "torch.compile with aot_eager on CPU gives the device's answer (or differs from eager CPU "
                     "in the same tensors), not eager CPU's: torch's functionalization or AOTAutograd "
                     "(docs/fuzzing.md)",
    "compile-view-replay": "AOTAutograd's replay of a compiled function's outputs that alias its inputs fails "
                           "its own shape assertion where the inputs alias each other (aot_eager on CPU too; "
                           "docs/fuzzing.md)",
}


def _raised(t: type | None) -> str:
    return "ran it" if t is None else f"raised {t.__name__}"


def check(program: Program, modes: tuple[str, ...], cpu: Outcome | None = None,
          known_seen: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Mismatches of ``program`` per mode (modes without any are left out)."""
    cpu = cpu or run(program, "cpu")
    found = {}
    reference = None
    for mode in modes:
        if mode in COMPILED and cpu.errors:
            continue  # one error ends a compiled program: only programs CPU runs whole
        try:
            dev = run(program, "jax", mode)
        except Exception as err:  # noqa: BLE001 - the harness itself must not stop the run
            found[mode] = [f"harness: {type(err).__name__}: {err}"]
            continue
        if mode == "op":
            reference = dev
        diffs = compare(program, cpu, dev, mode, reference if mode in SEEDED else None)
        if mode in COMPILED and any(_kind(d) != "known" for d in diffs) and torch_compiles_so(
                program, dev, cpu, diffs, dynamic=mode == "compile-dynamic"):
            diffs = [f"known: {KNOWN['compile-torch']} ({'; '.join(diffs)[:200]})"]
        known = [d for d in diffs if _kind(d) == "known"]
        if known and known_seen is not None:
            known_seen.setdefault(mode, []).extend(known)
        diffs = [d for d in diffs if _kind(d) != "known"]
        if diffs:
            found[mode] = diffs
    return found


def _kind(diff: str) -> str:
    return diff.split(":", 1)[0]


# ---------------------------------------------------------------------------
# Shrinking

def shrink(program: Program, mode: str, kinds: set[str], budget: int = 120) -> Program:
    """Delta debugging: drop chunks of statements (and what uses them) while
    a mismatch of one of ``kinds`` remains in ``mode``; then replace values
    by leaves of their shape and dtype (which cuts what they depend on) and
    drop again."""
    calls = 0

    def fails(p: Program) -> bool:
        nonlocal calls
        calls += 1
        try:
            diffs = check(p, ("op", mode) if mode in SEEDED else (mode,)).get(mode, [])
        except Exception:  # noqa: BLE001
            return False
        return any(_kind(d) in kinds for d in diffs)

    def drop_chunks(current: Program) -> Program:
        chunk = max(1, len(current.stmts) // 2)
        while chunk >= 1 and calls < budget:
            changed = False
            start = len(current.stmts) - chunk
            while start > -chunk and calls < budget:
                candidate = current.without(set(range(max(0, start), start + chunk)))
                if len(candidate.stmts) < len(current.stmts) and fails(candidate):
                    current = candidate
                    changed = True
                start -= chunk
            if not changed:
                if chunk == 1:
                    break
                chunk //= 2
            else:
                chunk = min(chunk, max(1, len(current.stmts) // 2))
        return current

    current = drop_chunks(program)
    while calls < budget:
        cpu = run(current, "cpu").tensors
        for i in range(len(current.stmts) - 1, -1, -1):
            s = current.stmts[i]
            if len(s.defines) != 1 or s.text.startswith(f"{s.defines[0]} = make(") or s.defines[0] not in cpu:
                continue
            snap = cpu[s.defines[0]]
            leaf = Stmt(f"{s.defines[0]} = make({_fmt(snap.shape)}, {_dt(snap.dtype)}, {i}, DEV"
                        f"{', requires_grad=True' if snap.requires_grad and snap.dtype.is_floating_point else ''})",
                        s.defines)
            candidate = dataclasses.replace(current, stmts=current.stmts[:i] + [leaf] + current.stmts[i + 1:])
            if calls < budget and fails(candidate):
                current = drop_chunks(candidate)
                break
        else:
            break
    return current


def reproducer(program: Program, mode: str, diffs: list[str], cpu: Outcome, dev: Outcome | None = None) -> str:
    """A standalone script: the program run on CPU and on 'jax' in ``mode``."""
    raising = set(cpu.errors) | set(dev.errors if dev else ())
    lines = []
    for i, s in enumerate(program.stmts):
        if s.post and mode in COMPILED:
            continue
        if i in raising:
            lines += ["try:", f"    {s.text}", "except Exception as err:",
                      f"    print(DEV, 'statement {i} raised', type(err).__name__, err)"]
        else:
            lines.append(s.text)
    names = _defined(program)
    body = textwrap.indent("\n".join(["torch.manual_seed(%d)" % program.seed] + lines
                                     + ["return {" + ", ".join(f"{n!r}: {n}" for n in names) + "}"]), "    ")
    if mode in COMPILED:
        leaves = [st for st in program.stmts if _is_leaf(st)]
        names_l = [st.defines[0] for st in leaves]
        lines = [ln for ln in lines if not any(ln == st.text for st in leaves)]
        body = textwrap.indent("\n".join(lines + ["return {" + ", ".join(f"{n!r}: {n}" for n in names) + "}"]),
                               "    ")
        head = "def program(DEV, " + ", ".join(names_l) + "):\n" if names_l else "def program(DEV):\n"
        make_leaves = "".join(f"{st.text}\n" for st in leaves)
        args_l = "".join(", " + n for n in names_l)
        run_cpu = f"DEV = 'cpu'\ntorch.manual_seed({program.seed})\n{make_leaves}cpu = program(DEV{args_l})\n"
        if mode == "compile-dynamic":
            run_dev = (f"DEV = 'jax'\ntorch.manual_seed({program.seed})\n"
                       f"with pjrt_host.config(dynamic_shapes='all'):\n"
                       + textwrap.indent(f"{make_leaves}dev = torch.compile(program, backend='jax', dynamic=True)"
                                         f"(DEV{args_l})\n", "    "))
        else:
            run_dev = (f"DEV = 'jax'\ntorch.manual_seed({program.seed})\n{make_leaves}"
                       f"dev = torch.compile(program, backend='jax')(DEV{args_l})\n")
        for p in program.stmts:
            if p.post:
                args = ", ".join(p.uses)
                run_dev += (f"backward(*[cpu[n] for n in {args.split(', ')!r}])\n"
                            f"backward(*[dev[n] for n in {args.split(', ')!r}])\n")
    else:
        head = "def program(DEV):\n"
        run_cpu = 'cpu = program("cpu")\n'
        runs = RUNS_BEFORE.get(mode, 0) + 1  # (replay: the last of three fused runs)
        setting = (f"eager={PADDED[mode]!r}, dynamic_shapes='all'" if mode in PADDED
                   else f"eager={'fused' if mode == 'replay' else mode!r}")
        run_dev = (f"with pjrt_host.config({setting}):\n"
                   f"    for _ in range({runs}):\n        dev = program('jax')\n    torch.jax.synchronize()\n")
    grads = ", ".join(repr(g) for g in program.grads)
    return f'''"""Fuzz reproducer (tests/fuzz_programs.py): seed {program.seed}, mode {mode!r}.

What differed from torch CPU:
{textwrap.indent(chr(10).join(diffs), "    ")}
"""
import warnings

import torch

import pjrt_host

warnings.simplefilter("ignore")
F = torch.nn.functional
{HELPERS}

{head}{body}


{run_cpu}{run_dev}for name, want in cpu.items():
    got = dev[name]
    if isinstance(want, torch.Tensor):
        print(name, "cpu:", want.detach(), "_version", want._version)
        print(name, "jax:", got.detach().cpu(), "_version", got._version)
for name in [{grads}]:
    print(name, ".grad cpu:", cpu[name].grad, "jax:", None if dev[name].grad is None else dev[name].grad.cpu())
'''


# ---------------------------------------------------------------------------
# The driver

@dataclasses.dataclass
class Found:
    seed: int
    mode: str
    diffs: list[str]
    shrunk: Program | None = None
    path: str | None = None


def fuzz(seed: int, count: int, modes: tuple[str, ...], save: str | None = None, compile_every: int = 1,
         shrink_budget: int = 120, time_limit: float | None = None, log: Callable[[str], None] = print,
         do_shrink: bool = True, min_ops: int = 5, max_ops: int = 30, progress: int = 0,
         schedule: tuple[str, ...] = (), trace: bool = False) -> dict:
    """Run ``count`` programs (seeds seed..seed+count-1); mismatches are
    shrunk and saved under ``save``.  ``schedule``: program k runs in mode
    ``schedule[k % len(schedule)]`` only (a cheap sample across the modes),
    instead of every mode of ``modes``."""
    torch.ones(1, device="jax").cpu()  # the device loaded before any compile (its first load inside one: docs/fuzzing.md)
    started = time.monotonic()
    modes = tuple(dict.fromkeys(modes + tuple(schedule)))
    stats = {"programs": 0, "statements": 0, "cpu_errors": 0, "runs": {m: 0 for m in modes},
             "mismatches": {m: 0 for m in modes}, "known": {}, "found": []}
    for k in range(count):
        if time_limit is not None and time.monotonic() - started > time_limit:
            break
        s = seed + k
        if trace:
            print(f"start seed {s}", file=sys.stderr, flush=True)
        program = generate(s, min_ops, max_ops)
        cpu = run(program, "cpu")
        if schedule:
            these = (schedule[k % len(schedule)],)
        else:
            these = tuple(m for m in modes if m not in COMPILED or k % compile_every == 0)
        known: dict[str, list[str]] = {}
        found = check(program, these, cpu, known)
        for mode, lines in known.items():
            stats["known"].setdefault(mode, 0)
            stats["known"][mode] += 1
        stats["programs"] += 1
        stats["statements"] += len(program.stmts)
        stats["cpu_errors"] += bool(cpu.errors)
        for m in these:
            if m not in COMPILED or not cpu.errors:
                stats["runs"][m] += 1
        for mode, diffs in found.items():
            stats["mismatches"][mode] += 1
            f = Found(s, mode, diffs)
            if do_shrink:
                try:
                    f.shrunk = shrink(program, mode, {_kind(d) for d in diffs}, shrink_budget)
                except Exception:  # noqa: BLE001
                    f.shrunk = program
            else:
                f.shrunk = program
            if save:
                os.makedirs(save, exist_ok=True)
                p = f.shrunk
                cpu_p = run(p, "cpu")
                diffs_p = check(p, ("op", mode) if mode in SEEDED else (mode,), cpu_p).get(mode, diffs)
                f.path = os.path.join(save, f"repro_seed{s}_{mode}.py")
                with open(f.path, "w") as fh:
                    fh.write(reproducer(p, mode, diffs_p, cpu_p))
            stats["found"].append(f)
            log(f"seed {s} mode {mode}: {len(diffs)} difference(s), first: {diffs[0]}"
                + (f" -> {len(f.shrunk.stmts)} statements" if f.shrunk else "") + (f", {f.path}" if f.path else ""))
        if progress and stats["programs"] % progress == 0:
            log(f"[{time.monotonic() - started:.0f} s] {stats['programs']} programs, runs {stats['runs']}, "
                f"mismatches {stats['mismatches']}")
    stats["seconds"] = time.monotonic() - started
    return stats


def summary(stats: dict) -> str:
    lines = [f"programs run: {stats['programs']} ({stats['statements']} statements, {stats['cpu_errors']} with a "
             f"statement CPU refuses), {stats['seconds']:.1f} s"]
    for m in stats["runs"]:
        lines.append(f"  {m:8s} runs {stats['runs'][m]:6d}  mismatches {stats['mismatches'][m]}  known differences "
                     f"{stats['known'].get(m, 0)}")
    for f in stats["found"]:
        lines.append(f"  seed {f.seed} {f.mode}: {f.diffs[0][:160]}"
                     + (f" [{len(f.shrunk.stmts)} stmts]" if f.shrunk else "") + (f" {f.path}" if f.path else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--modes", default="op,fused,sync,compile")
    ap.add_argument("--save", default=None, help="directory for reproducers (default: a new temporary one)")
    ap.add_argument("--compile-every", type=int, default=1, help="run compile mode on every Nth program only")
    ap.add_argument("--time-limit", type=float, default=None, help="stop starting programs after this many seconds")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-budget", type=int, default=120)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--progress", type=int, default=0, help="print a progress line every N programs")
    ap.add_argument("--trace", action="store_true", help="print each program's seed to stderr before it runs "
                    "(a crash names its program)")
    ap.add_argument("--json", default=None, help="write the counts (and each mismatch) to this file")
    args = ap.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown modes {bad}; modes are {', '.join(MODES)}")
    save = args.save or tempfile.mkdtemp(prefix="pjrt_host_fuzz_")
    import pjrt_host  # noqa: F401 - the device
    stats = fuzz(args.seed, args.count, modes, save, args.compile_every, args.shrink_budget, args.time_limit,
                 log=(lambda s: None) if args.quiet else (lambda s: print(s, flush=True)),
                 do_shrink=not args.no_shrink, progress=args.progress, trace=args.trace)
    if args.json:
        import json
        with open(args.json, "w") as fh:
            json.dump({k: v for k, v in stats.items() if k != "found"}
                      | {"found": [{"seed": f.seed, "mode": f.mode, "diffs": f.diffs, "path": f.path,
                                    "statements": len(f.shrunk.stmts) if f.shrunk else None}
                                   for f in stats["found"]]}, fh, indent=1)
    print(summary(stats))
    print(f"reproducers: {save}")
    return 1 if stats["found"] else 0


if __name__ == "__main__":
    sys.exit(main())
