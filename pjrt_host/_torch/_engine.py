"""The compiled-op engine: one ATen op (or its in-place / out= form) run
through its lowering, compiled with ``jax.jit`` once per static signature.

A call flattens the arguments into a hashable *key* (dtypes, storage shapes,
views, Python scalars, the device configuration) and the *dynamic* values
passed to the compiled function (storage arrays, gather offsets, random key
data).  The first call with a key asks torch's meta kernel for the result
dtypes and shapes (and torch's errors), builds a function that reads each
input through its view, calls the lowering through
:func:`pjrt_host._lowerings.invoke` and writes in-place / out= results back
through the target's view, and jits it.  Later calls with the same key cost
one dictionary lookup, one jitted call and one wrapper tensor.

The :class:`~pjrt_host._lowerings.LoweringContext` a lowering sees comes from
:func:`lowering_context`, which the compile backend uses too.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import _lowerings, _plugin, _program_cache, _runtime
from .._errors import PluginLoadError
from .._lowerings import Lowering, LoweringContext, op_name
from .._lowerings._dtypes import jax_dtype, torch_dtype
from . import _config, _fused, _meta, _rng, _sharding, _strided
from ._devices import device_mismatch, jax_device, torch_device
from ._dtype_policy import device_dtype
from ._tensor import DONATE, JaxTensor, Storage, TensorSpec, note_result, open_segments, read, wrap_array

__all__ = ["CompiledOp", "lowering_context", "missing_lowering", "op_name"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- context

_contexts: dict[Any, LoweringContext] = {}
_plugin_options: dict | None = None


def _lowering_options() -> dict:
    """The selected plugin's lowering options, refused with the plugin's name
    and the fix when one is not an int >= 0."""
    record = _runtime.runtime().record
    problems = _plugin.lowering_option_problems(record.plugin)
    if problems:
        raise PluginLoadError(record.name, record.distribution,
                              f"pjrt_host: plugin {record.name!r} ({type(record.plugin).__qualname__}) cannot lower "
                              f"ops: {'; '.join(problems)}. Fix the class attribute in the plugin.")
    return {name: getattr(record.plugin, name, 0) for name in _plugin.LOWERING_OPTIONS}


def lowering_context(cfg: _config.Config, one_device: bool = False) -> LoweringContext:
    """The context lowerings run with under device configuration ``cfg``
    (no random key: a caller that runs random ops adds its own);
    ``one_device``: the program runs on one device, not over a mesh
    (``LoweringContext.one_device``)."""
    ctx = _contexts.get((cfg, one_device))
    if ctx is None:
        global _plugin_options
        if _plugin_options is None:
            _plugin_options = _lowering_options()
        ctx = _contexts[cfg, one_device] = LoweringContext(matmul_precision=cfg.matmul_precision,
                                                           one_device=one_device, **_plugin_options)
    return ctx


# ---------------------------------------------------------------- argument encoding
#
# Each argument becomes a key entry; the values the compiled function takes
# at run time are appended to ``dyn`` in order.  'jax' tensors are keyed by
# their TensorSpec (precomputed on the storage / view); a Python scalar
# compiled in as a constant by a plain ``(type, value)`` tuple (1, 1.0 and
# True are distinct keys; a Python tuple argument is a SequenceArg, so a plain
# tuple can mean nothing else); everything else by one of these markers.


class DynamicScalar(NamedTuple):
    """A Python scalar passed at run time (ops whose scalars change every
    call, such as an optimizer's step size)."""

    type: type


class HostScalar(NamedTuple):
    """A 0-dim CPU tensor (torch lets it meet device tensors), passed as a value."""

    dtype: torch.dtype


class SequenceArg(tuple):
    """A list / tuple argument (TensorList, int[]): its items' keys."""

    __slots__ = ()


class _Generator:
    """A torch.Generator argument (random lowerings take the draw's key instead)."""

    def __repr__(self) -> str:  # a stable text: programs on disk are keyed by it
        return "GENERATOR"


GENERATOR = _Generator()


class _OutResize(Exception):
    """An out= tensor whose shape is not the result's: taken by torch's
    resize path (``CompiledOp._into_resized_outputs``), never seen by users."""


class _ForeignFirst(Exception):
    """A non-'jax' tensor came before any 'jax' tensor: the caller names both."""

    def __init__(self, device: torch.device) -> None:
        self.device = device


def _encode(v: Any, dyn: list, devs: list) -> Any:
    if isinstance(v, JaxTensor):
        storage = v._storage
        devs.append(storage.place)
        arr = storage._array  # a fused-eager result may be Pending: the caller resolves or records it
        dyn.append(arr if arr is not None else storage.get())
        view = v._view
        if view is None:
            return storage.spec
        dyn.append(view.run_offset)
        return view.spec
    t = type(v)
    if t is float or t is int or t is bool or t is complex:
        return (t, v)
    if t is list or t is tuple:
        return SequenceArg([_encode(x, dyn, devs) for x in v])
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            dyn.append(np.asarray(v.item(), dtype=jax_dtype(v.dtype)))
            return HostScalar(v.dtype)
        if devs:
            raise device_mismatch(torch_device(devs[0]), v.device)
        raise _ForeignFirst(v.device)
    if isinstance(v, torch.Generator):
        return GENERATOR
    return v


def _encode_dynamic(v: Any, dyn: list, devs: list) -> Any:
    t = type(v)
    if t is float or t is int:
        dyn.append(v)
        return DynamicScalar(t)
    if t is list or t is tuple:  # a Scalar[] (a foreach op's per-tensor step sizes)
        return SequenceArg([_encode_dynamic(x, dyn, devs) for x in v])
    return _encode(v, dyn, devs)


def _decode(x: Any, it: Any, inputs: list) -> Any:
    t = type(x)
    if t is TensorSpec:
        arr = next(it)
        offset = next(it) if x.view is not None else 0
        inputs.append((arr, offset))
        return _strided.read(arr, x.view, offset)
    if t is tuple:
        return x[1]
    if t is SequenceArg:
        return [_decode(y, it, inputs) for y in x]
    if t is DynamicScalar or t is HostScalar:
        inputs.append((None, 0))
        return next(it)
    if x is GENERATOR:
        return None
    return x


# Tensor positions too: torch passes a Python number there as it is (x / 2.0);
# and lists of numbers (torch.optim's foreach steps pass the bias corrections
# of every parameter as a Scalar[] that changes every step).
_SCALAR_TYPES = ("Scalar", "Scalar?", "float", "float?", "Tensor", "Tensor?", "List[number]", "List[float]")


def _scalar_slots(func: Any) -> frozenset:
    """Positions and names of the arguments that may hold a Python number."""
    slots: set = set()
    try:
        for i, a in enumerate(func._schema.arguments):
            if str(a.type) in _SCALAR_TYPES or str(a.type).startswith("number"):
                slots.add(a.name)
                if not a.kwarg_only:
                    slots.add(i)
    except Exception:
        pass
    return frozenset(slots)


def _has_dynamic(key: Any) -> bool:
    if type(key) is DynamicScalar:
        return True
    if isinstance(key, tuple) and type(key) is not TensorSpec:
        return any(_has_dynamic(k) for k in key)
    return False


def _first_jax_device(values: Any) -> Any:
    for v in values:
        if isinstance(v, JaxTensor):
            return v.device
        if isinstance(v, (list, tuple)):
            found = _first_jax_device(v)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- the engine

# The lowering needs concrete values (a data-dependent shape): such an op
# runs op by op in jax eager mode instead.
_CONCRETE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                    jax.errors.TracerIntegerConversionError, jax.errors.NonConcreteBooleanIndexError,
                    jax.errors.TracerArrayConversionError)
_make_wrapper = torch.Tensor._make_wrapper_subclass
_lock = threading.Lock()


#: Why an op compiles again: ``logging.getLogger("pjrt_host.recompiles")``
#: at INFO logs every new signature of an op that had compiled before, with
#: what changed; a WARNING (once per op) says when an op keeps compiling new
#: signatures after it had run warm -- a shape that changes every step.
recompiles = logging.getLogger("pjrt_host.recompiles")
#: An op "runs warm" once it has reused its programs this many times; this
#: many new signatures after that warn.
_WARM_HITS = 64
_LATE_MISSES_WARN = 8


def _note_miss(op: CompiledOp, key: tuple) -> None:
    prev, op.last_key = op.last_key, key
    if prev is None:
        return
    if op.hits >= _WARM_HITS:
        if not op.late_misses:
            op.warm_hits = op.hits  # -1 once warned
        op.late_misses += 1
        # Often, against the reuses since: a shape changing every step, not
        # a few more models or layers among thousands of reuses.
        if op.late_misses >= _LATE_MISSES_WARN and op.late_misses * 32 >= op.hits - op.warm_hits \
                and op.warm_hits >= 0:
            op.warm_hits = -1  # warned: once per op
            recompiles.warning(
                "pjrt_host: %s keeps compiling new programs after running warm (%d new signatures after %d reuses; "
                "the last: %s). Each new shape compiles once: pad or bucket the sizes that change (sequence "
                "lengths to a multiple of 64, drop_last=True for the last batch). logging.getLogger("
                "'pjrt_host.recompiles').setLevel('INFO') logs every recompilation.",
                op.name, op.late_misses, op.hits, _difference(prev, key))
    if recompiles.isEnabledFor(logging.INFO):
        recompiles.info("%s compiles a new program: %s", op.name, _difference(prev, key))


def _difference(prev: tuple, key: tuple) -> str:
    """What differs between two keys of one op, in a user's terms."""
    changes = []
    (pa, pk, pt, pc, pp), (a, k, t, c, p) = prev, key
    for where, old, new in [(f"argument {i}", x, y) for i, (x, y) in enumerate(zip(pa, a))] + \
            [(f"argument {n!r}", x, y) for (n, x), (_, y) in zip(pk, k)]:
        if old == new:
            continue
        if type(old) is SequenceArg and type(new) is SequenceArg and len(old) == len(new):
            # A list (of tensors, of step sizes): which items changed, not the whole list twice.
            items = [i for i, (x, y) in enumerate(zip(old, new)) if x != y]
            first = items[0]
            changes.append(f"{where}, {len(items)} of its {len(new)} items (item {first}: "
                           f"{_describe(old[first])} -> {_describe(new[first])})")
        else:
            changes.append(f"{where} {_describe(old)} -> {_describe(new)}")
    if len(pa) != len(a) or [n for n, _ in pk] != [n for n, _ in k]:
        changes.append("other arguments")
    if pt != t:
        changes.append("the out= tensors")
    if pc != c:
        changes.append("pjrt_host.config settings")
    if pp != p:
        changes.append(f"the device ({pp} -> {p})")
    return "; ".join(changes) or "the same arguments (the earlier program was evicted)"


_fused.key_difference = _difference


def _describe(part: Any) -> str:
    if type(part) is DynamicScalar:
        return f"a traced {part.type.__name__}"
    if isinstance(part, TensorSpec):
        view = part.view
        if view is None:
            return f"{jnp.dtype(part[0]).name}{list(part[1])}"
        # View.static: (kind, size, ...)
        return f"{jnp.dtype(part[0]).name}{list(view[1])} ({view[0]} view of {list(part[1])})"
    if isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], type):
        return repr(part[1])
    if type(part) is SequenceArg:
        return f"a list of {len(part)}" if len(part) > 4 else f"[{', '.join(_describe(x) for x in part)}]"
    return repr(part)


class _Entry(NamedTuple):
    fn: Any  #: (*dyn) -> the op's result arrays
    plan: _meta.OutputPlan  #: how they come back (ignored for in-place / out=)
    raw: Any = None  #: the traceable function, for an in-place / out= op that may donate what it overwrites
    donating: dict | None = None  #: donated positions in dyn -> fn jitted with them donated (built on first use)
    fusable: Any = None  #: the traceable function of an op fused eager may record (one tensor result)


#: An in-place or out= op donates the storage array it overwrites when
#: nothing else holds it (``_tensor.DONATE``): XLA then writes the result
#: into the same buffer, so ``bucket[i:j].copy_(g)`` or ``x[k] += 1`` on a
#: large tensor updates it in place instead of copying all of it.
#: References to a storage's array when nothing else holds it: the
#: storage's attribute, the call's argument list, the local below and
#: getrefcount's own argument.
_SOLE_REFS = 4


def _sole_positions(dyn: list, storages: list) -> tuple[int, ...]:
    """Positions in ``dyn`` of the arrays of ``storages`` that nothing but
    their storage holds (a clone sharing the array, an array lent out
    through interop, the same array passed twice: not donated)."""
    positions = []
    for st in storages:
        arr = st.array
        if arr is None or sys.getrefcount(arr) > _SOLE_REFS:
            continue
        for i, x in enumerate(dyn):
            if x is arr:
                positions.append(i)
                break
    return tuple(positions)


#: Ops whose out= form, given no ``dtype``, computes in the out tensor's dtype
#: (torch's ``infer_dtype_from_optional``: ``sum(x_float, out=int64)`` sums
#: the input cast to int64, not the float sum cast).
_DTYPE_FROM_OUT = frozenset({"aten::sum", "aten::nansum", "aten::prod", "aten::cumsum", "aten::cumprod"})


class CompiledOp:
    """One op (or its in-place / out= form) compiled per static signature.

    ``inplace``: the position of the tensor an in-place op writes (its
    lowering returns the new value); ``out_names``: the ``out=`` arguments,
    written with the results of the functional lowering; ``meta_op``: the
    op whose meta kernel gives the results (the functional one)."""

    __slots__ = ("func", "lowering", "inplace", "out_names", "meta_op", "cache", "eager", "name", "scalar_slots",
                 "dynamic", "misses", "in_trial", "simple", "hits", "last_key", "late_misses", "warm_hits",
                 "dtype_from_out", "checked_scalars")

    def __init__(self, func: Any, lowering: Lowering, inplace: int | None = None,
                 out_names: tuple[str, ...] = (), meta_op: Any = None) -> None:
        self.func = func
        self.lowering = lowering
        self.inplace = inplace
        self.out_names = out_names
        self.meta_op = meta_op if meta_op is not None else func
        self.cache: dict[Any, _Entry] = {}
        self.eager = lowering.data_dependent
        self.name = op_name(func)
        # Arguments typed Scalar / float: an optimizer passes a new value every
        # step (Adam's step size), which must not mean a new compile every step.
        self.scalar_slots = _scalar_slots(func)
        # scalars traced (True), static (False), undecided (None)
        self.dynamic: bool | None = True if lowering.traced_scalars and self.scalar_slots else None
        self.misses = 0
        self.hits = 0
        self.late_misses = 0  # new signatures after the op had run warm (see _note_miss)
        self.warm_hits = 0  # its reuses at the first of those
        self.last_key: Any = None
        self.in_trial = False
        # No out= targets, no random key, scalars static: the common case.
        self.simple = not out_names and not lowering.needs_rng
        self.dtype_from_out = bool(out_names) and self.name.split(".")[0] in _DTYPE_FROM_OUT
        self.checked_scalars: set = set()  # scalar values of a traced random op already checked

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        dyn: list[Any] = []
        devs: list[int] = []
        out_targets: list[JaxTensor] = []
        generator = None
        given = kwargs
        if not self.simple or self.dynamic:
            kwargs, out_targets, generator = self._split_kwargs(kwargs)
        try:
            if self.dynamic:
                slots = self.scalar_slots
                key_args = tuple([_encode_dynamic(v, dyn, devs) if i in slots else _encode(v, dyn, devs)
                                  for i, v in enumerate(args)])
                key_kwargs = tuple([(k, _encode_dynamic(v, dyn, devs) if k in slots else _encode(v, dyn, devs))
                                    for k, v in kwargs.items()])
            else:
                key_args = tuple([_encode(v, dyn, devs) for v in args])
                key_kwargs = tuple([(k, _encode(v, dyn, devs)) for k, v in kwargs.items()]) if kwargs else ()
        except _ForeignFirst as err:
            raise device_mismatch(_first_jax_device(list(args) + list(kwargs.values())), err.device) from None
        if not devs:
            raise RuntimeError(f"pjrt_host: {self.name} reached the 'jax' device without a 'jax' tensor")
        place = devs[0]
        targets_key = ()
        if out_targets:
            targets_key = self._encode_targets(out_targets, dyn, devs, place)
        for d in devs:
            if d != place:
                # Operands on several places: a mesh among them takes the others.
                place = _sharding.unify(devs, dyn)
                if place is None:
                    raise device_mismatch(torch_device(devs[0]), torch_device(d))
                break
        # ``index``: the torch device; ``place`` is ``index`` itself unless the
        # op runs on a mesh (an operand is sharded).
        index = place if type(place) is int else place.index
        cfg = _config.current()
        # ``place`` too: a program is compiled for its device
        key = (key_args, key_kwargs, targets_key, cfg, place)
        entry = self.cache.get(key)
        if entry is not None:
            self.hits += 1
            if self.dynamic and self.lowering.needs_rng:
                self._check_scalars(args, kwargs)
        else:
            self.misses += 1
            if not self.in_trial:
                _note_miss(self, key)
            # A random op's scalars (bounds, mean, std, p) are tried traced
            # from its second signature: nn.init passes new ones per layer.
            if self.misses > (1 if self.lowering.needs_rng else 3) and self.dynamic is None and self.scalar_slots \
                    and not self.out_names \
                    and not self.in_trial and not self.eager:
                # The trial takes the call as given: its generator= decides
                # what both runs draw (the split kwargs have lost it, and a
                # seeded generator's draw then depended on earlier calls).
                return self._trial_dynamic(args, given)
            try:
                entry = self._build(key, args, kwargs, out_targets, cfg, given)
            except _OutResize:
                return self._into_resized_outputs(args, kwargs, out_targets, always=True)
        rewind = None
        if self.lowering.needs_rng:  # drawn once the call runs (a trial above draws for itself)
            if self.dynamic and _has_dynamic(key):  # may run again with static scalars, drawing the same
                rewind = self._same_draw_again(args, given)
            dyn.extend(_rng.next_key_args(index, generator))
        if cfg.eager == "fused":
            if entry.fusable is not None and not self.in_trial and type(place) is int:
                fused = self._record(entry, dyn, args, out_targets, index, place)
                if fused is not None:
                    return fused
            dyn = _fused.resolve(dyn)
        elif open_segments:
            dyn = _fused.resolve(dyn)
        try:
            try:
                if entry.raw is not None and type(place) is int and not self.in_trial:
                    written = [args[self.inplace]._storage] if self.inplace is not None else \
                        [t._storage for t in out_targets]
                    donated = _sole_positions(dyn, written)
                    if donated:
                        fn = entry.donating.get(donated)
                        if fn is None:
                            fn = entry.donating[donated] = self._program(
                                key, jax.jit(entry.raw, donate_argnums=donated, keep_unused=True), donated)
                            with warnings.catch_warnings():  # an unusable donated buffer is freed all the same
                                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                                result = fn(*dyn)
                        else:
                            result = fn(*dyn)
                    else:
                        result = entry.fn(*dyn)
                else:
                    result = entry.fn(*dyn)
            except _CONCRETE_ERRORS:
                if self.dynamic and _has_dynamic(key):
                    # The lowering branches on a traced scalar's value: its
                    # scalars compile as constants from now on (a trial then
                    # compares two static runs).  Not eager: that would run
                    # every later call op by op.
                    self.dynamic = False
                    for k in [k for k in self.cache if _has_dynamic(k)]:
                        del self.cache[k]
                    if rewind is not None:
                        rewind()
                    return self(args, given)
                self.eager = True
                self.cache.clear()
                entry = self._build(key, args, kwargs, out_targets, cfg, given)
                result = entry.fn(*dyn)
        except Exception:
            if not out_targets:
                raise
            resized = self._into_resized_outputs(args, kwargs, out_targets)
            if resized is None:
                raise
            return resized
        if self.inplace is not None:
            target = args[self.inplace]
            storage = target._storage
            if storage.read_only is not None:
                raise RuntimeError(storage.read_only)
            if place is not index:
                result = _sharding.settle(result, storage.get())
            storage.array = result
            storage.version += 1
            note_result(index, result)
            return target
        if out_targets:
            for t, arr in zip(out_targets, result):
                if t._storage.read_only is not None:
                    raise RuntimeError(t._storage.read_only)
                if place is not index:
                    arr = _sharding.settle(arr, t._storage.get())
                t._storage.array = arr
                t._storage.version += 1
            note_result(index, result[0])
            return out_targets[0] if len(out_targets) == 1 else tuple(out_targets)
        plan = entry.plan
        outputs = plan.outputs
        if outputs is not None and plan.container == "single" and outputs[0].kind == "tensor":
            # The hot path: one tensor result.
            note_result(index, result)
            spec = outputs[0]
            t = _make_wrapper(JaxTensor, spec.shape, dtype=spec.dtype, device=torch_device(index))
            t._storage = Storage(result, spec.shape, result.dtype, index, place)
            t._view = None
            return t
        return _wrap_results(result, plan, index, place)

    def _record(self, entry: _Entry, dyn: list, args: tuple, out_targets: list, index: int, place: Any) -> Any:
        """Fused eager: the op recorded into this thread's segment (its
        results pending), or None to run it now."""
        if self.inplace is not None:
            target = args[self.inplace]
            storage = target._storage
            if storage.read_only is not None or type(storage.place) is not int:
                return None
            return target if _fused.record(entry.fusable, dyn, None, index, place, into=[storage]) else None
        if out_targets:
            storages = [t._storage for t in out_targets]
            if any(s.read_only is not None or type(s.place) is not int for s in storages):
                return None
            if not _fused.record(entry.fusable, dyn, None, index, place, into=storages, returns_one=False):
                return None
            return out_targets[0] if len(out_targets) == 1 else tuple(out_targets)
        return _fused.record(entry.fusable, dyn, entry.plan, index, place)

    def _split_kwargs(self, kwargs: dict) -> tuple[dict, list, Any]:
        out_targets = []
        generator = None
        if self.out_names or (self.lowering.needs_rng and "generator" in kwargs):
            kwargs = dict(kwargs)
            for n in self.out_names:
                out_targets.append(kwargs.pop(n))
            if self.dtype_from_out and kwargs.get("dtype") is None and isinstance(out_targets[0], torch.Tensor):
                kwargs["dtype"] = out_targets[0].dtype  # computed in out's dtype, as torch does
            if self.lowering.needs_rng:
                generator = kwargs.pop("generator", None)
        return kwargs, out_targets, generator

    def _into_resized_outputs(self, args: tuple, kwargs: dict, out_targets: list, always: bool = False) -> Any:
        """torch's out= contract when a result's shape differs from its out
        tensor's (``nonzero(out=torch.empty(0))``, an out of another
        shape): the out tensor is resized to the result, with torch's
        warning when it held elements.  None when every shape already
        matched (the failure was something else), unless ``always`` (the
        meta kernel's shapes differ from the out tensors', the lowering's
        results do not: log_sigmoid_forward's buffer): then they are copied."""
        values = self.meta_op(*args, **kwargs)
        values = list(values) if isinstance(values, (tuple, list)) else [values]
        if self.lowering.data_dependent:
            _meta.check_out_dtypes(self.name, [v.dtype for v in values], out_targets)
        if not always and all(tuple(t.shape) == tuple(v.shape) for t, v in zip(out_targets, values)):
            return None
        for t, v in zip(out_targets, values):
            if tuple(t.shape) != tuple(v.shape):
                if t.numel() != 0:
                    import warnings

                    warnings.warn(
                        f"An output with one or more elements was resized since it had shape {list(t.shape)}, which "
                        f"does not match the required output shape {list(v.shape)}. This behavior is deprecated, "
                        "and in a future PyTorch release outputs will not be resized unless they have zero "
                        "elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                        "elements with t.resize_(0).", UserWarning, stacklevel=4)
                with torch.no_grad():
                    t.set_(v.to(t.dtype))
            else:
                with torch.no_grad():
                    t.copy_(v)
        return out_targets[0] if len(out_targets) == 1 else tuple(out_targets)

    @staticmethod
    def _encode_targets(out_targets: list, dyn: list, devs: list, place: Any) -> tuple:
        keys = []
        for t in out_targets:
            if not isinstance(t, JaxTensor):
                raise device_mismatch(torch_device(place if type(place) is int else place.index), t.device)
            storage = t._storage
            devs.append(storage.place)
            dyn.append(storage.get())
            view = t._view
            dyn.append(view.run_offset if view is not None else 0)
            keys.append((t.dtype, tuple(t.shape), storage.spec if view is None else view.spec))
        return tuple(keys)

    def _trial_dynamic(self, args: tuple, kwargs: dict) -> Any:
        """Try tracing this op's scalars instead of compiling per value: keep
        it if the lowering traces and gives the same result (a lowering that
        branches on a scalar's value cannot).  The verdict is kept beside the
        programs on disk: a later process of the same setting takes it
        without running the op twice (op by op)."""
        signature = (self.name, op_name(self.meta_op), self.inplace, self.lowering.where)
        # Not in fused eager: there the trial ends the open segment, and a
        # process that skips it records other segments than the one that
        # made the programs on disk (new programs to compile, not fewer).
        verdict = _program_cache.remembered("traced-scalars", signature) \
            if _config.current().eager != "fused" else None
        if verdict in (b"traced", b"static"):
            self.dynamic = verdict == b"traced"
            return self(args, kwargs)
        target = args[self.inplace] if self.inplace is not None else None
        saved = target._storage.get() if target is not None else None
        redraw = self._same_draw_again(args, kwargs)  # a random op: both runs draw the same numbers
        self.in_trial = True
        try:
            static_out = self(args, kwargs)
        finally:
            self.in_trial = False
        if redraw is not None:
            redraw()
        if target is not None:
            static_value = target._storage.array
            if _nbytes(static_value) > _TRIAL_BYTES:
                return target  # too large to run twice: judged at a later, smaller call
            target._storage.array = saved
        elif _nbytes(static_out) > _TRIAL_BYTES:
            return static_out
        self.dynamic = True
        self.in_trial = True  # the second run too: run now, never recorded by fused eager
        try:
            try:
                dyn_out = self(args, kwargs)
            finally:
                self.in_trial = False
            if target is not None:
                same = _same(static_value, target._storage.array)
            else:
                same = _same_outputs(static_out, dyn_out)
        except Exception as err:
            logger.debug("%s keeps static scalars: %s", self.name, err)
            same = False
        _program_cache.remember("traced-scalars", signature, b"traced" if same else b"static")
        if same:
            return dyn_out
        self.dynamic = False
        for k in [k for k in self.cache if _has_dynamic(k)]:
            del self.cache[k]
        if target is not None:
            target._storage.array = static_value
        return static_out

    def _check_scalars(self, args: tuple, kwargs: dict) -> None:
        """A random op whose scalars are traced reuses one program for every
        bound, mean, std or p, so the checks torch makes on their values
        (``normal_(std=-1)``: its meta kernel; ``uniform_(3, -1)``,
        ``bernoulli_(1.5)``: its CPU kernel) would run only for the first:
        they run for each new set of values (a model's dropout repeats its p,
        so once per layer, not per call)."""
        values = tuple(v for i, v in enumerate(args) if i in self.scalar_slots and type(v) in (int, float)) + \
            tuple((k, v) for k, v in kwargs.items() if k in self.scalar_slots and type(v) in (int, float))
        seen = self.checked_scalars
        if values in seen:
            return
        _meta.run_meta(self.meta_op, args, kwargs)
        _meta.check_cpu_kernel(self.func, args, kwargs)
        if len(seen) > 256:
            seen.clear()
        seen.add(values)

    def _same_draw_again(self, args: tuple, kwargs: dict) -> Any:
        """For a random op: a function that rewinds the random state the
        next call draws from (the device's counter, or a generator passed
        to the op), so a second run draws what the first did."""
        if not self.lowering.needs_rng:
            return None
        generator = kwargs.get("generator")
        if generator is not None:
            snapshot = generator.get_state()
            return lambda: generator.set_state(snapshot)
        device = _first_jax_device(list(args) + list(kwargs.values()))
        st = _rng.state(device.index or 0 if device is not None else 0)
        counter = st.counter
        return lambda: setattr(st, "counter", counter)

    def _build(self, key: Any, args: tuple, kwargs: dict, out_targets: list, cfg: _config.Config,
               given: dict | None = None) -> _Entry:
        # CPU's probe takes the call as it was made (``given``: before a dtype
        # taken from out= was added, which CPU's kernel would accept)
        every_kwarg = given if given is not None else dict(kwargs, **dict(zip(self.out_names, out_targets)))
        # what the program is keyed by on disk: what a process of the same
        # setting found out about this call before is kept under it too
        disk_signature = (self._disk_signature(key, ()) if type(key[4]) is int
                          and _program_cache.directory() is not None else None)
        try:
            known, meta = self._meta_result(disk_signature, args, kwargs)
        except Exception:
            # torch CPU's own refusal where its kernel refuses first (a meta
            # kernel's assertion is not what CPU users see)
            _meta.check_cpu_kernel(self.func, args, every_kwarg)
            raise
        # CPU ran the call's own layouts: its kernel's answer on overlapping
        # writes stands instead of the rule by tags below
        cpu_accepts = self._cpu_kernel_verdict(disk_signature, args, every_kwarg)
        lowering = self.lowering
        needs_rng = lowering.needs_rng
        base_ctx = lowering_context(cfg, type(key[4]) is int)
        key_args, key_kwargs = key[0], key[1]
        n_targets = len(out_targets)

        def decode(dyn: tuple) -> tuple[list, dict, list, LoweringContext]:
            it = iter(dyn)
            inputs: list[tuple[Any, Any]] = []
            call_args = [_decode(x, it, inputs) for x in key_args]
            call_kwargs = {k: _decode(x, it, inputs) for k, x in key_kwargs}
            targets = [(next(it), next(it)) for _ in range(n_targets)]
            ctx = base_ctx
            if needs_rng:
                key_data, counter = next(it), next(it)
                rng_key = jax.random.fold_in(
                    jax.random.wrap_key_data(key_data.astype(jnp.uint32), impl="threefry2x32"), counter)
                ctx = dataclasses.replace(base_ctx, rng_key=rng_key)
            return call_args, call_kwargs, inputs, targets, ctx

        if self.inplace is not None:
            target = args[self.inplace]
            target_view = None if target._view is None else target._view.static
            target_dtype = jax_dtype(target.dtype)
            target_shape = tuple(target.shape)
            if not cpu_accepts:
                _meta.check_out_overlap([target], self.func, self.meta_op)
            if known and self.meta_op is not self.func and isinstance(meta, torch.Tensor):
                _meta.check_inplace(meta, target)
            position = self.inplace
            plan = _meta.OutputPlan("single", None)

            def fn(*dyn):
                call_args, call_kwargs, inputs, _, ctx = decode(dyn)
                value = _lowerings.invoke(lowering, call_args, call_kwargs, ctx)
                if isinstance(value, (tuple, list)):
                    value = value[0]
                value = jnp.broadcast_to(jnp.asarray(value).astype(target_dtype), target_shape)
                arr, offset = inputs[position]
                return _strided.write(arr, target_view, offset, value)
        elif out_targets:
            if self.meta_op is not self.func and not cpu_accepts:  # CPU's kernel took these out= dtypes
                _meta.check_out(self.func, args, kwargs, self.out_names, out_targets)
            if not cpu_accepts:
                _meta.check_out_overlap(out_targets, self.func, self.meta_op)
            if known and _meta.out_needs_resize(meta, out_targets):
                # torch resizes an out= tensor of another shape to the result's; the
                # program below would broadcast the result into it instead.
                raise _OutResize(self.name)
            views = [None if t._view is None else t._view.static for t in out_targets]
            shapes = [(jax_dtype(t.dtype), tuple(t.shape)) for t in out_targets]
            plan = _meta.OutputPlan("tuple", None)

            exact = lowering.data_dependent  # its result dtypes are the op's own: out= must match them
            name = self.name

            def fn(*dyn):
                call_args, call_kwargs, _, targets, ctx = decode(dyn)
                value = _lowerings.invoke(lowering, call_args, call_kwargs, ctx)
                values = value if isinstance(value, (tuple, list)) else (value,)
                if exact:
                    _meta.check_out_dtypes(name, [torch_dtype(jnp.asarray(v).dtype) for v in values], out_targets)
                return tuple(_strided.write(arr, view, offset, jnp.broadcast_to(jnp.asarray(v).astype(d), s))
                             for (arr, offset), view, (d, s), v in zip(targets, views, shapes, values))
        else:
            plan = _meta.output_plan(known, meta)
            if plan.outputs is not None:
                plan = dataclasses.replace(plan, outputs=tuple(
                    dataclasses.replace(o, dtype=device_dtype(o.dtype)) if o.kind == "tensor" else o
                    for o in plan.outputs))
                dtypes = [jax_dtype(o.dtype) if o.kind == "tensor" else None for o in plan.outputs]
                result_dtypes = dtypes[0] if plan.container == "single" else dtypes
                if result_dtypes is None:  # a single scalar result
                    result_dtypes = None
            else:
                result_dtypes = None

            def fn(*dyn):
                call_args, call_kwargs, _, _, ctx = decode(dyn)
                return _lowerings.invoke(lowering, call_args, call_kwargs, ctx, result_dtypes)
        jitted = not (self.eager or not cfg.jit)
        writes = self.inplace is not None or bool(out_targets)
        # jax names the program after the function: compile logs, profiles
        # and jax.monitoring events then say which torch op compiled.
        fn.__name__ = fn.__qualname__ = self.name.replace("::", ".")
        # the op and its key: fused eager says which op's arguments changed
        # when a segment compiles a new program (_fused._why_new)
        fn.pjrt_host_key = (self.name, key)
        # Fused eager records ops whose results are tensors torch described in advance.
        tensors = plan.outputs is not None and all(o.kind == "tensor" for o in plan.outputs) and bool(plan.outputs)
        if jitted and (tensors or writes) and disk_signature is not None:
            # what fused eager keys a segment's program by on disk (_fused._run)
            fn.pjrt_host_signature = disk_signature
        # keep_unused: an input the op only overwrites (uniform_, fill_ of a
        # tensor) places the program on its device; jax would drop it and run
        # on its default device, leaving a tensor of jax:1 on device 0
        entry = _Entry(self._program(key, jax.jit(fn, keep_unused=True), signature=disk_signature) if jitted else fn,
                       plan,
                       fn if (jitted and writes and DONATE) else None,
                       {} if (jitted and writes and DONATE) else None,
                       fn if (jitted and (tensors or writes)) else None)
        with _lock:
            if len(self.cache) > 512:  # shapes that never repeat: bound the memory
                self.cache.clear()
            self.cache[key] = entry
        return entry


    def _program(self, key: tuple, jitted: Any, donated: tuple = (), signature: Any = None) -> Any:
        """What runs ``jitted``: itself on a mesh or with the program cache
        off, else a :class:`_FirstCall` that gets its compiled program from
        the program cache (from disk, untraced, when it was made before)."""
        place = key[4]
        if type(place) is not int or _program_cache.directory() is None:
            return jitted
        if signature is None or donated:
            signature = self._disk_signature(key, donated)
        return _FirstCall(self, key, jitted, signature, place, donated)

    def _meta_result(self, disk_signature: _program_cache.Spelt | None, args: tuple,
                     kwargs: dict) -> tuple[bool, Any]:
        """``_meta.run_meta`` for the call (the program's ``disk_signature``
        with the program cache on): torch's meta kernels give a call's result
        shapes and dtypes once per signature, and a foreach op's run torch's
        reference code for every tensor, so what they answered is kept
        beside the programs on disk, as the in-memory entry keeps it for
        this process.  A refusal is never kept: it is raised again."""
        if disk_signature is not None:
            data = _program_cache.remembered("meta", disk_signature)
            kept = None if data is None else _meta.decode_result(data)
            if kept is not None:
                return kept
        known, meta = _meta.run_meta(self.meta_op, args, kwargs)
        data = _meta.encode_result(known, meta) if disk_signature is not None else None
        if data is not None:
            _program_cache.remember("meta", disk_signature, data)
        return known, meta

    def _cpu_kernel_verdict(self, disk_signature: _program_cache.Spelt | None, args: tuple, kwargs: dict) -> bool:
        """``_meta.check_cpu_kernel`` for the call (the program's
        ``disk_signature`` with the program cache on): raises CPU's
        refusal, else whether CPU ran the call's own layouts.  An accepted
        call's verdict is kept beside the programs on disk, so that a warm
        process does not probe CPU again for each signature (a foreach
        step's probe runs the op on every parameter).  It is keyed as the
        program and the in-memory entry are: a signature whose scalars are
        traced is probed once, for the first value met, here by the first
        process that met it as in memory by this one."""
        signature = None if disk_signature is None else (disk_signature, _meta.inside_backward())
        return _program_cache.learnt("cpu-kernel", signature, lambda: _meta.check_cpu_kernel(self.func, args, kwargs))

    def _disk_signature(self, key: tuple, donated: tuple) -> _program_cache.Spelt:
        """Everything the program of ``key`` is traced from, as the program
        cache keys it on disk (its ``repr``)."""
        cfg = key[3]
        return _program_cache.Spelt((self.name, op_name(self.meta_op), self.inplace, self.out_names,
                                     self.lowering.where, lowering_context(cfg, True), key[0], key[1], key[2], cfg,
                                     donated))


class _FirstCall:
    """A program until its first call: then compiled for the call's argument
    types (``_program_cache.compiled``: loaded from disk without tracing
    when this process's setting made it before), and put in its entry's
    place so that later calls run the compiled program directly."""

    __slots__ = ("op", "key", "jitted", "signature", "index", "donated")

    def __init__(self, op: CompiledOp, key: tuple, jitted: Any, signature: tuple, index: int,
                 donated: tuple) -> None:
        self.op, self.key, self.jitted, self.signature, self.index, self.donated = \
            op, key, jitted, signature, index, donated

    def __call__(self, *dyn: Any) -> Any:
        # the argument types too: one key can meet a Python int and a numpy
        # int (weak and strong types) at one position
        signature = (self.signature, tuple(str(jax.typeof(x)) for x in dyn))
        compiled = _program_cache.compiled(self.op.name, signature, self.jitted, dyn, jax_device(self.index))
        program = _program_cache.with_retrace(compiled, self.jitted)

        op = self.op
        with _lock:
            entry = op.cache.get(self.key)
            if entry is not None:
                if not self.donated and entry.fn is self:
                    op.cache[self.key] = entry._replace(fn=program)
                elif self.donated and entry.donating is not None and entry.donating.get(self.donated) is self:
                    entry.donating[self.donated] = program
        return program(*dyn)


def _wrap_results(result: Any, plan: _meta.OutputPlan, index: int, place: Any = None) -> Any:
    outputs = plan.outputs
    if outputs is None:
        return _wrap_dynamic(result, index, place)
    if plan.container == "single":
        return _to_python(result)  # a Python scalar result
    wrapped = []
    for spec, arr in zip(outputs, result):
        if spec.kind == "tensor":
            note_result(index, arr)
            wrapped.append(wrap_array(arr, index, spec.dtype, place))
        elif spec.kind == "none":
            wrapped.append(None)
        else:
            wrapped.append(_to_python(arr))
    return tuple(wrapped) if plan.container == "tuple" else wrapped


def _wrap_dynamic(result: Any, index: int, place: Any = None) -> Any:
    """Results of an op torch cannot describe in advance, wrapped as they come."""
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap_dynamic(r, index, place) for r in result)
    if result is None or isinstance(result, (bool, int, float, complex)):
        return result
    if getattr(result, "ndim", None) is None:
        return result
    arr = result
    dtype = torch_dtype(arr.dtype)
    mapped = device_dtype(dtype)
    if mapped is not dtype:
        arr = arr.astype(jax_dtype(mapped))
    return wrap_array(arr, index, mapped, place)


def _to_python(x: Any) -> Any:
    if isinstance(x, (bool, int, float, complex)) or x is None:
        return x
    return np.asarray(x).item()


#: The trial of traced scalars runs an op twice and compares the results;
#: an op whose results are larger than this is not tried (a later call is).
_TRIAL_BYTES = 1 << 24


def _nbytes(x: Any) -> int:
    if isinstance(x, JaxTensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return getattr(x, "nbytes", 0)


def _same(a: Any, b: Any) -> bool:
    """Equal values (float: within 1e-6 relative, NaN equal to NaN),
    compared on the host: a trial's results are at most _TRIAL_BYTES, and
    copying them costs less than compiling a comparison for each new shape
    (about 0.1 s each on XLA:CPU: 12 of them were 1.2 s of a GPT-2 training
    step's 16 s cold start)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return bool(np.array_equal(a, b))
    wide = np.complex128 if jnp.issubdtype(a.dtype, jnp.complexfloating) else np.float64
    a, b = a.astype(wide), b.astype(wide)
    with np.errstate(all="ignore"):
        close = np.abs(a - b) <= 1e-6 * np.abs(b)
        return bool(np.all((a == b) | close | (np.isnan(a) & np.isnan(b))))


def _same_outputs(x: Any, y: Any) -> bool:
    if isinstance(x, JaxTensor) and isinstance(y, JaxTensor):
        return x.dtype == y.dtype and x.shape == y.shape and _same(read(x), read(y))
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and all(_same_outputs(a, b) for a, b in zip(x, y))
    return x == y


def missing_lowering(func: Any) -> NotImplementedError:
    """The error for an op the device cannot run: what, why, and the two ways on.
    An op outside aten is named by its own namespace (``torchvision::nms``
    is torchvision's, not an ATen op)."""
    name = op_name(func)
    namespace = name.split("::", 1)[0] if "::" in name else "aten"
    if namespace == "aten":
        what = f"the ATen op {name} has no lowering to JAX and no decomposition in torch {torch.__version__}"
    else:
        what = (f"the op {name} (of the {namespace} library, outside ATen) has no lowering to JAX and no "
                "implementation for every device")
    return NotImplementedError(
        f"pjrt_host: {what}, so it cannot run on the 'jax' device. To run such ops on torch CPU meanwhile "
        "(slow: two transfers per call), wrap the code in `with pjrt_host.config(cpu_fallback=True):`. "
        "How to report the gap, and how to add a lowering: docs/op-coverage.md in the pjrt_host sources.")
