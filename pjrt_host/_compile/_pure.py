"""``@assume_pure``: a torch function run as one jitted call, its backward
from ``jax.vjp``.

A :class:`PureFunction` traces its function once per argument signature
(:mod:`._trace`: shapes, dtypes, devices, which tensors require grad, the
values of the non-tensor arguments, the device configuration) and keeps,
per signature, the jitted forward (with the vjp's residuals as outputs when
a gradient is needed) and the jitted backward.  Everything a signature needs
lives in its own cache entry, so calls with shapes A, B, A use A's trace
each time.

Writes into arguments (``x.add_()``, BatchNorm's running statistics) come
back from the jitted call and are written into the arguments' storages, as
eager would leave them; a write into a tensor that requires grad is
refused.  Random ops draw a fresh key from the device's generator on every
call.  Called on fake tensors (inside an outer ``@assume_pure`` trace, or
while ``torch.compile`` traces), the function runs as it is, so it becomes
part of the outer graph.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import warnings
import weakref
from typing import Any, Callable, NamedTuple

import jax
import torch

from .._jax_settings import x64_api as _x64_api, x64_scope as _x64_scope
from .. import _program_cache
from . import _checks, _door
from ._trace import NotTraceable, call_with_leaves, fake_tensors, trace

__all__ = ["CacheInfo", "PureFunction", "PureModule", "PurityError", "assume_pure"]

logger = logging.getLogger(__name__)

#: A function traced this many times gets a warning (and again at 2x, 4x, ...).
RETRACE_WARNING = 8


class PurityError(RuntimeError):
    """The function does something a pure function cannot (see the message)."""


class CacheInfo(NamedTuple):
    """Counters of one pure function's trace cache."""

    hits: int  #: calls that found their signature's trace
    misses: int  #: calls that had to trace
    traces: int  #: traces made (== misses, less failed traces)
    size: int  #: signatures held now
    maxsize: int  #: least recently used signatures beyond this are dropped


class _Entry:
    """One argument signature of a jax-backed call: ``body(arrays, key) ->
    (outputs, [(argument number, new value)])`` (traceable; with ``sites``,
    also ``body(arrays, key, checks=list)`` collecting the index checks'
    rows) and its jitted forms."""

    __slots__ = ("body", "out_dtypes", "in_dtypes", "mutated", "needs_rng", "unflatten", "index", "diff", "other",
                 "float_outs", "other_outs", "name", "programs", "mesh", "sites", "checks")

    def __init__(self, body: Callable, out_dtypes: list, in_dtypes: list, mutated: list, needs_rng: bool,
                 unflatten: Callable, index: int, diff: tuple[int, ...], name: str, mesh: Any = None,
                 sites: list | None = None, checks: Any = None) -> None:
        self.body = body
        self.sites = sites or []  # the trace's index checks (_checks.Site)
        #: The checks mode (``config(checks=...)``) when the jitted forms also return the
        #: checks' verdicts (one array, see _checks.report), else None.
        self.checks = checks if self.sites else None
        self.mesh = mesh  # the mesh the body's sharding constraints name (None: none)
        self.out_dtypes = out_dtypes  # torch dtype of each tensor output
        self.in_dtypes = in_dtypes  # torch dtype of each tensor argument
        self.mutated = mutated  # the tensor arguments written, in the order body returns them
        self.needs_rng = needs_rng
        self.unflatten = unflatten  # tensor outputs -> the caller's result
        self.index = index
        self.diff = diff  # tensor arguments the gradient is taken for
        self.other = tuple(i for i in range(len(in_dtypes)) if i not in set(diff))
        self.float_outs = tuple(i for i, d in enumerate(out_dtypes) if d.is_floating_point or d.is_complex)
        self.other_outs = tuple(i for i in range(len(out_dtypes)) if i not in set(self.float_outs))
        self.name = name
        self.programs = _Programs()

    @staticmethod
    def _key(rng: Any) -> Any:
        if rng is None:
            return None
        kd, counter = rng
        return _door.draw_key(kd, counter)

    def plain(self) -> Any:
        """jit: (arrays, rng) -> (outputs, new values of the written
        arguments, index checks' verdicts or None)."""
        programs = self.programs
        if programs.plain is None:
            body, name, checking = self.body, self.name, self.checks is not None

            def fn(arrays: list, rng: Any) -> Any:
                rows: list | None = [] if checking else None
                with jax.named_scope(name):
                    outs, muts = body(arrays, _Entry._key(rng), checks=rows) if checking else \
                        body(arrays, _Entry._key(rng))
                return outs, [_like(v, arrays[i]) for i, v in muts], None if rows is None else _checks.stack(rows)

            programs.plain = _program_cache.jit(_named(fn, name))
        return programs.plain

    def forward(self) -> Any:
        """jit: (diff arrays, other arrays, rng) -> (float outputs, other
        outputs, written values, vjp residuals, index checks' verdicts or None)."""
        programs = self.programs
        if programs.forward is None:
            body, name, diff, other = self.body, self.name, self.diff, self.other
            checking = self.checks is not None
            float_outs, other_outs = self.float_outs, self.other_outs
            treedef = programs.res_treedef

            def fn(d_arrays: list, o_arrays: list, rng: Any) -> Any:
                key = _Entry._key(rng)

                def f(d: list) -> Any:
                    arrays = [None] * (len(diff) + len(other))
                    for i, a in zip(diff, d):
                        arrays[i] = a
                    for i, a in zip(other, o_arrays):
                        arrays[i] = a
                    rows: list | None = [] if checking else None
                    with jax.named_scope(name):
                        outs, muts = body(arrays, key, checks=rows) if checking else body(arrays, key)
                    return [outs[i] for i in float_outs], ([outs[i] for i in other_outs],
                                                          [_like(v, arrays[i]) for i, v in muts],
                                                          None if rows is None else _checks.stack(rows))

                fl, pullback, (rest, muts, flags) = jax.vjp(f, list(d_arrays), has_aux=True)
                res, treedef[0] = jax.tree_util.tree_flatten(pullback)
                return fl, rest, muts, res, flags

            programs.forward = _program_cache.jit(_named(fn, name + ".forward"))
        return programs.forward

    def backward(self) -> Any:
        """jit: (residuals, float output cotangents) -> gradients of the diff arrays."""
        programs = self.programs
        if programs.backward is None:
            name, treedef = self.name, programs.res_treedef

            def fn(res: list, cts: list) -> Any:
                with jax.named_scope(name + ".backward"):
                    return jax.tree_util.tree_unflatten(treedef[0], res)(cts)[0]

            programs.backward = _program_cache.jit(_named(fn, name + ".backward"))
        return programs.backward


def _named(fn: Any, name: str) -> Any:
    """``fn`` under ``name``: jax names a program after its function, so
    compile logs, profiles and ``jax.monitoring`` events say
    ``jit(Linear.forward)``, not ``jit(fn)``."""
    fn.__name__ = fn.__qualname__ = name
    return fn


class _Programs:
    """The jitted forms of one traced body, shared by every entry whose
    trace is the same program (:func:`_share`): each compiles once."""

    __slots__ = ("plain", "forward", "backward", "res_treedef", "__weakref__")

    def __init__(self) -> None:
        self.plain = self.forward = self.backward = None
        #: The vjp residuals' structure, set when the forward is traced.  A
        #: list the jitted functions close over: they hold neither this
        #: object nor an entry, so no reference cycle keeps them alive.
        self.res_treedef: list = [None]


#: Traced programs by what they compute (see :func:`_share`), held as long
#: as an entry of some pure function holds them: a model with many
#: identical layers, each under its own assume_pure, compiles one layer's
#: programs once, and ``cache_clear()`` of every such function frees them.
_shared: weakref.WeakValueDictionary[Any, _Programs] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def _share(entry: _Entry, program: Any, cfg: Any) -> None:
    """Give ``entry`` the jitted programs of an earlier entry that computes
    the same function -- the same program (:meth:`Program.fingerprint`:
    graph code, input layout, constant values; what it writes, returns and
    draws follows from them), gradient arguments and device configuration
    -- or offer its own.  The jitted
    functions close over the first entry's body, which computes the same
    values from the same arrays.  Graphs with opaque Python steps or a
    sharding mesh keep their own."""
    if entry.mesh is not None:
        return
    fp = program.fingerprint()
    if fp is None:
        return
    key = (fp, cfg, entry.diff)
    with _shared_lock:
        found = _shared.get(key)
        if found is not None:
            entry.programs = found
        else:
            _shared[key] = entry.programs


def run(entry: _Entry, read: Arguments) -> Any:
    """One call: the jitted forward on the tensors' arrays (as one autograd
    node when a gradient is needed), the written arguments updated, the
    outputs wrapped and put in the caller's structure.  With a sharded
    tensor among the arguments the call runs on its mesh (the others are
    replicated onto it) and the outputs keep the shardings XLA gives them."""
    tensors, arrays = read.tensors, read.arrays
    place = entry.mesh if entry.mesh is not None else read.sharded
    if place is not None:
        place = _door.onto_mesh(arrays, [_door.storage(t) for t in tensors], place)
    rng = _door.next_key_args(entry.index) if entry.needs_rng else None
    if entry.diff:
        box: list = []
        outs = _Call.apply(entry, arrays, rng, box, place, *tensors)
        muts, flags = box
    else:
        arrs, muts, flags = entry.plain()(arrays, rng)
        outs = [_door.wrap(a, entry.index, dt, place) for a, dt in zip(arrs, entry.out_dtypes)]
    for i, value in zip(entry.mutated, muts):
        t = tensors[i]
        _door.write(t, value)
        torch.autograd.graph.increment_version(t)
    if outs:  # torch.jax.synchronize() waits for it (a result is its storage's own array)
        _door.note_result(entry.index, _door.read(outs[-1]))
    if flags is not None:
        _checks.report(flags, entry.sites, entry.checks,
                       f"in pjrt_host.assume_pure({entry.name}) on {_door.DEVICE_NAME}:{entry.index}")
    return entry.unflatten(list(outs))


def _like(value: Any, base: Any) -> Any:
    return value.astype(base.dtype).reshape(base.shape)


class _Call(torch.autograd.Function):
    """One call of a pure function as one autograd node."""

    @staticmethod
    def forward(ctx: Any, entry: _Entry, arrays: list, rng: Any, box: list, place: Any,
                *tensors: torch.Tensor) -> Any:
        d = [arrays[i] for i in entry.diff]
        o = [arrays[i] for i in entry.other]
        fl, rest, muts, res, flags = entry.forward()(d, o, rng)
        ctx.entry = entry
        ctx.res = res
        ctx.place = place
        box.extend((muts, flags))
        outs: list[Any] = [None] * len(entry.out_dtypes)
        for i, a in zip(entry.float_outs, fl):
            outs[i] = a
        for i, a in zip(entry.other_outs, rest):
            outs[i] = a
        results = tuple(_door.wrap(a, entry.index, dt, place) for a, dt in zip(outs, entry.out_dtypes))
        ctx.mark_non_differentiable(*(results[i] for i in entry.other_outs))
        return results

    @staticmethod
    @torch.autograd.function.once_differentiable
    @_x64_scope  # called by the autograd engine
    def backward(ctx: Any, *grads: Any) -> Any:
        entry: _Entry = ctx.entry
        # torch materialises the gradient of an unused output as zeros.
        cts = [_cotangent(_as_array(grads[i], entry.index), _door.jax_dtype_of(entry.out_dtypes[i]))
               for i in entry.float_outs]
        if ctx.place is not None:  # a sharded call: the cotangents join its mesh
            _door.onto_mesh(cts, [], ctx.place)
        grads_in = entry.backward()(ctx.res, cts)
        ctx.res = None  # free the residuals (a second backward is an error, as in eager)
        out: list[Any] = [None] * len(entry.in_dtypes)
        for i, g in zip(entry.diff, grads_in):
            out[i] = _door.wrap(g, entry.index, entry.in_dtypes[i], ctx.place)
        return (None, None, None, None, None, *out)


def _cotangent(array: Any, dtype: Any) -> Any:
    """An output's gradient in the output's dtype (jax's ``astype`` costs
    ~3.5 us even when the dtype already matches, once per output per backward)."""
    return array if array.dtype == dtype else array.astype(dtype)


def _as_array(t: torch.Tensor, index: int) -> Any:
    if isinstance(t, _door.JaxTensor):
        return _door.read(t)
    return _door.to_device_array(t, index)


# ---------------------------------------------------------------- the cache


class _Signature(NamedTuple):
    treedef: Any
    leaves: tuple
    grad: bool
    cfg: Any


class PureFunction:
    """``fn`` traced once per argument signature, each call one jitted call."""

    def __init__(self, fn: Callable, *, name: str | None = None, maxsize: int = 128) -> None:
        if not callable(fn):
            raise TypeError(f"pjrt_host.assume_pure: expected a function or an nn.Module, got {type(fn).__name__}")
        if maxsize < 1:
            raise ValueError(f"pjrt_host.assume_pure: maxsize must be at least 1, got {maxsize}")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.maxsize = maxsize
        self._what = f"pjrt_host.assume_pure({self.name})"
        self._cache: collections.OrderedDict[_Signature, _Entry] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._traces = 0
        self._warn_at = RETRACE_WARNING
        self._last: _Signature | None = None
        functools.update_wrapper(self, fn)

    # -------------------------------------------------------- public

    def cache_info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, self._traces, len(self._cache), self.maxsize)

    def cache_clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._hits = self._misses = self._traces = 0
            self._warn_at = RETRACE_WARNING

    def __repr__(self) -> str:
        return f"<pjrt_host.assume_pure {self.name}>"

    def __get__(self, obj: Any, owner: Any = None) -> Any:  # decorating a method
        return self if obj is None else functools.partial(self, obj)

    @_x64_api
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _door.dynamo_compiling():
            # torch.compile traces through: the function becomes part of
            # the compiled graph (itself one jitted call).
            return self.fn(*args, **kwargs)
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        grad = torch.is_grad_enabled()
        what = self._what
        read = read_arguments(leaves, treedef, what, grad)
        if read is None:  # fake or functional 'jax' tensors: an outer trace is running; be part of it
            return self.fn(*args, **kwargs)
        tensors, index = read.tensors, read.index
        sig = _Signature(treedef, read.parts, grad, _door.config())
        try:
            entry = self._cache.get(sig)
        except TypeError:
            raise _unhashable(what, leaves, treedef) from None
        if entry is None:
            entry = self._trace(sig, leaves, tensors, index)
        else:
            with self._lock:
                self._hits += 1
                try:
                    self._cache.move_to_end(sig)
                except KeyError:
                    pass
        return run(entry, read)

    # -------------------------------------------------------- tracing

    def _trace(self, sig: _Signature, leaves: list, tensors: list, index: int) -> _Entry:
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        fakes = fake_tensors([(tuple(t.shape), t.dtype, index) for t in tensors])
        fn = self.fn
        flat_fn = call_with_leaves(fn, leaves, sig.treedef, positions)

        with self._lock:
            self._misses += 1
        try:
            traced = trace(flat_fn, fakes, f"pjrt_host.assume_pure({self.name})")
        except NotTraceable as err:
            raise PurityError(f"{err}. A pure function must be one graph of torch ops for each argument "
                              f"signature (see docs/interop.md).{captured_hint(fn)}{_object_hint(leaves)}") \
                from err.__cause__
        diff = tuple(n for n, t in enumerate(tensors) if sig.grad and t.requires_grad)
        for n in traced.mutated:
            t = tensors[n]
            if sig.grad and t.requires_grad:
                raise PurityError(
                    f"pjrt_host.assume_pure({self.name}) writes in place into its argument "
                    f"{_describe(leaves, sig.treedef, positions[n])} (shape {tuple(t.shape)}, {t.dtype}), which "
                    f"requires grad; torch's autograd cannot differentiate that write. Write into a copy "
                    f"(x = x.clone()) or call it under torch.no_grad().")
        ctx = _door.lowering_context(sig.cfg)
        entry = _Entry(functools.partial(traced.run, ctx=ctx), [d for d in traced.out_dtypes if d is not None],
                       [t.dtype for t in tensors], traced.mutated, traced.needs_rng, traced.unflatten, index, diff,
                       self.name, traced.mesh, traced.program.sites, sig.cfg.check_mode or None)
        _share(entry, traced.program, sig.cfg)
        with self._lock:
            self._traces += 1
            self._cache[sig] = entry
            while len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
            warn = self._traces >= self._warn_at
            if warn:
                self._warn_at *= 2
            last, self._last = self._last, sig
        if warn:
            warnings.warn(f"pjrt_host.assume_pure({self.name}) has been traced {self._traces} times, once per new "
                          f"argument signature{_what_changed(last, sig, leaves)}. Each trace costs a compilation; "
                          f"keep shapes and Python arguments fixed (pass varying numbers as tensors).",
                          RuntimeWarning, stacklevel=3)
        return entry


def captured_hint(fn: Callable) -> str:
    """A hint naming the modules and 'jax' tensors ``fn`` reads from its
    closure or globals: a pure function's tensors must be its arguments."""
    names = []
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    cells = {n: c.cell_contents for n, c in zip(code.co_freevars, fn.__closure__ or ()) if _filled(c)}
    glob = getattr(fn, "__globals__", {})
    for name in code.co_freevars + code.co_names:
        obj = cells.get(name, glob.get(name))
        if isinstance(obj, torch.nn.Module) or (isinstance(obj, torch.Tensor) and obj.device.type == _door.DEVICE_NAME):
            names.append(name)
    if not names:
        return ""
    return (f" It reads {', '.join(sorted(set(names)))} from outside its arguments: the tensors of a pure function "
            f"must be arguments. Pass them in, or wrap the module itself: pjrt_host.assume_pure(module) makes its "
            f"parameters and buffers arguments.")


_PLAIN = (int, float, bool, complex, str, bytes, type(None), type(Ellipsis), slice, torch.dtype, torch.device,
          torch.memory_format, torch.layout)


def _object_hint(leaves: list) -> str:
    """A hint naming the objects among the non-tensor arguments (a cache
    object, a config): constants of the trace, their tensors not arguments."""
    kinds = sorted({type(x).__name__ for x in leaves if not isinstance(x, (torch.Tensor,) + _PLAIN)})
    if not kinds:
        return ""
    return (f" Its arguments include {', '.join(kinds)} objects: a non-tensor argument is a constant of the trace, "
            f"and tensors inside it are not arguments. Pass the tensors themselves (a transformers model: call it "
            f"with use_cache=False).")


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def _describe(leaves: list, treedef: Any, pos: int) -> str:
    """'argument 0' / 'keyword argument w' / 'argument 1[2]' for a flat leaf position."""
    try:
        paths = jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(treedef, list(range(len(leaves)))))
        path = paths[0][pos][0]
    except Exception:
        return f"leaf {pos}"
    if not path:
        return f"leaf {pos}"
    head = path[0]
    rest = "".join(str(k) for k in path[2:])
    if getattr(head, "idx", None) == 0:
        return f"argument {path[1].idx}{rest}"
    key = getattr(path[1], "key", path[1])
    return f"keyword argument {key!s}{rest}"


#: Marks a tensor's part of a call's cache key (a static's part starts with its type).
_TENSOR = object()


class Arguments(NamedTuple):
    """The flat arguments of one call, read for its cache key."""

    tensors: list  #: the 'jax' tensors, in order
    arrays: list  #: their values, one jax array each
    sharded: Any  #: the placement of the first sharded tensor, None if none is
    parts: tuple  #: per leaf: (_TENSOR, storage spec or (dtype, shape), needs grad) for a tensor, (type, value) otherwise
    statics: tuple  #: (position, value) of each non-tensor leaf
    index: int  #: the tensors' device index


def read_arguments(leaves: list, treedef: Any, what: str, grad: bool) -> Arguments | None:
    """Split a call's flat arguments into 'jax' tensors and static values.
    None when a tensor is a fake or functional 'jax' tensor (a trace is
    running); a tensor of another device, or two devices, is an error."""
    tensors: list[torch.Tensor] = []
    arrays: list[Any] = []
    sharded = None
    parts: list[Any] = []
    statics: list[tuple[int, Any]] = []
    index = None
    JaxTensor = _door.JaxTensor
    for pos, leaf in enumerate(leaves):
        if type(leaf) is JaxTensor:
            i, arr, place, spec = _door.argument(leaf)
            if index is None:
                index = i
            elif i != index:
                raise RuntimeError(f"{what}: the tensor arguments are on two devices, {_door.DEVICE_NAME}:{index} "
                                   f"and {_door.DEVICE_NAME}:{i}; move them to one device")
            tensors.append(leaf)
            arrays.append(arr)
            if sharded is None and type(place) is not int:
                sharded = place
            # A whole storage is keyed by its spec (dtype and shape, made
            # once per storage); torch's own attributes cost ~0.15 us each
            # on a tensor subclass.
            parts.append((_TENSOR, spec if spec is not None else (leaf.dtype, leaf.shape),
                          grad and leaf.requires_grad))
        elif isinstance(leaf, torch.Tensor):
            if leaf.device.type == _door.DEVICE_NAME:
                return None
            where = _describe([None] * len(leaves), treedef, pos)
            raise RuntimeError(
                f"{what}: {where} is a tensor on {leaf.device} (shape {tuple(leaf.shape)}, {leaf.dtype}); it "
                f"runs on the '{_door.DEVICE_NAME}' device: move it there first "
                f"(t.to('{_door.DEVICE_NAME}')).")
        else:
            statics.append((pos, leaf))
            parts.append((type(leaf), leaf))
    return Arguments(tensors, arrays, sharded, tuple(parts), tuple(statics),
                     _door.current_index() if index is None else index)


def _unhashable(what: str, leaves: list, treedef: Any) -> TypeError:
    for pos, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            continue
        try:
            hash(leaf)
        except TypeError:
            return TypeError(
                f"{what}: {_describe(leaves, treedef, pos)} is a {type(leaf).__name__}, which "
                f"is not hashable; non-tensor arguments are part of the trace's cache key, so they must be hashable "
                f"(a tuple instead of a list, a frozen dataclass), or be passed as tensors.")
    return TypeError(f"{what}: the arguments' structure is not hashable")


def _what_changed(last: _Signature | None, sig: _Signature, leaves: list) -> str:
    if last is None:
        return ""
    if last.treedef != sig.treedef:
        return f"; the last one changed the arguments' structure ({last.treedef} -> {sig.treedef})"
    for pos, (a, b) in enumerate(zip(last.leaves, sig.leaves)):
        if a != b:
            where = _describe(leaves, sig.treedef, pos)
            return f"; the last one changed {where}: {_show(a)} -> {_show(b)}"
    if last.grad != sig.grad:
        return "; the last one changed torch.is_grad_enabled()"
    return "; the last one changed the device configuration (pjrt_host.config)"


def _show(part: tuple) -> str:
    if part[0] is _TENSOR:
        desc = part[1]
        if isinstance(desc, _door.TensorSpec):  # a whole storage: (jax dtype, shape, None)
            desc = (_door.torch_dtype(desc[0]), desc[1])
        return f"tensor {tuple(desc[1])} {desc[0]}" + (" requiring grad" if part[2] else "")
    return repr(part[1])


# ---------------------------------------------------------------- modules


class PureModule(torch.nn.Module):
    """An ``nn.Module`` whose forward runs as one pure function: its
    parameters and buffers (the module's own tensors, tied ones once) are
    arguments of the trace, so torch.optim trains them and buffer writes
    (BatchNorm's running statistics) land in the module's buffers."""

    def __init__(self, module: torch.nn.Module, *, maxsize: int = 128) -> None:
        super().__init__()
        self.module = module
        name = type(module).__qualname__
        self._pure = PureFunction(self._functional, name=name, maxsize=maxsize)

    def _functional(self, state: dict, training: int, *args: Any, **kwargs: Any) -> Any:
        from torch.nn.utils.stateless import _reparametrize_module

        with _reparametrize_module(self.module, state, tie_weights=True):
            return self.module(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if _door.dynamo_compiling():
            return self.module(*args, **kwargs)
        state, training = self._state()
        return self._pure(state, training, *args, **kwargs)

    def _state(self) -> tuple[dict, int]:
        """The module's parameters and buffers (tied ones once) by name, and
        every submodule's training flag.  Where they live is read once (a
        module walk costs tens of microseconds); the tensors themselves are
        read on every call, so a replaced parameter or buffer is seen."""
        where = self.__dict__.get("_where")
        if where is None:
            module = self.module
            where = []
            seen: set[int] = set()
            for prefix, m in module.named_modules(remove_duplicate=False):
                for table in ("_parameters", "_buffers"):
                    for attr, t in getattr(m, table).items():
                        if t is None or id(t) in seen:
                            continue
                        seen.add(id(t))
                        where.append((f"{prefix}.{attr}" if prefix else attr, m, table, attr))
            self.__dict__["_where"] = where
            self.__dict__["_submodules"] = list(module.modules())
        try:
            state = {name: getattr(m, table)[attr] for name, m, table, attr in where}
        except KeyError:  # a parameter or buffer was removed: read the module again
            del self.__dict__["_where"]
            return self._state()
        # The training flags as one int (bit per submodule): one leaf of the
        # cache key instead of one per submodule.
        modes = 0
        for m in self.__dict__["_submodules"]:
            modes = modes + modes + m.training
        return state, modes

    def cache_info(self) -> CacheInfo:
        return self._pure.cache_info()

    def cache_clear(self) -> None:
        self._pure.cache_clear()

    # The wrapped module's state, under its own names.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)


def assume_pure(fn: Any = None, *, maxsize: int = 128) -> Any:
    """Run ``fn`` (a function, or an ``nn.Module``) as one jitted call per
    argument signature, its backward from ``jax.vjp``.  Usable as
    ``@assume_pure`` or ``@assume_pure(maxsize=...)``."""
    if fn is None:
        return functools.partial(assume_pure, maxsize=maxsize)
    if isinstance(fn, torch.nn.Module):
        return PureModule(fn, maxsize=maxsize)
    return PureFunction(fn, maxsize=maxsize)
