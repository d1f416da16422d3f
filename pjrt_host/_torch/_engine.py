"""The compiled-op engine: one ATen op (or its in-place / out= form) run
through its lowering, compiled with ``jax.jit`` once per static signature.

A call, in the steps of :meth:`CompiledOp.__call__`:

1. *key*: the arguments become a hashable key and the dynamic values the
   program takes (``_signatures.encode``: dtypes, storage shapes, views,
   Python scalars; the device configuration and the place it runs);
2. *entry*: the key's program, built on its first call (:meth:`_build`:
   torch's meta kernel gives the result dtypes and shapes and raises
   torch's errors; a function that reads each input through its view,
   calls the lowering through :func:`pjrt_host._lowerings.invoke` and writes
   in-place / out= results back through the target's view, jitted); an op
   whose scalars change is tried with them traced (``_scalar_trials``);
3. *run*: fused eager records the op into its segment (``_fused``), else
   the program runs, donating what it overwrites when nothing else holds
   it (:meth:`_run`);
4. *results*: in-place and out= results are committed into their
   storages (``Storage.commit``), others wrapped as new tensors.

Later calls with the same key cost one dictionary lookup, one jitted call
and one wrapper tensor.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import _lowerings, _program_cache
from .._lowerings import Lowering, LoweringContext, op_name
from .._lowerings._dtypes import jax_dtype, torch_dtype
from . import _config, _dynamic_dims, _fused, _meta, _padding, _rng, _scalar_trials, _sharding, _strided
from ._devices import device_mismatch, jax_device, torch_device
from ._dtype_policy import device_dtype
from ._lowering_context import lowering_context
from ._padding import PaddedSpec
from ._signatures import (GENERATOR, ForeignFirst, HostScalar, SequenceArg, Traceable, decode, decoded_positions, encode,
                          encode_dynamic, encode_padded, first_jax_device, has_dynamic, note_miss, scalar_slots)
from ._sync import note_result, open_segments
from ._tensor import DONATE, JaxTensor, result_tensor, wrap_array

__all__ = ["CompiledOp", "missing_lowering", "op_name"]


class _OutResize(Exception):
    """An out= tensor whose shape is not the result's: taken by torch's
    resize path (``CompiledOp._into_resized_outputs``), never seen by users."""


# The lowering needs concrete values (a data-dependent shape): such an op
# runs op by op in jax eager mode instead.
_CONCRETE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                    jax.errors.TracerIntegerConversionError, jax.errors.NonConcreteBooleanIndexError,
                    jax.errors.TracerArrayConversionError)
_lock = threading.Lock()
#: What :meth:`CompiledOp._run` returns when the call must be made again (its
#: scalars turned static).
_AGAIN = object()
#: What :meth:`CompiledOp._padded` returns when the call runs exact (its
#: padded inputs cut to their logical sizes).
_EXACT = object()
_FELL_BACK = object()  #: the same, after it tried: its inputs are not padded again


class _Swapped(NamedTuple):
    """The call's arguments to run instead (``_dynamic_dims.exact_empties``)."""

    args: tuple
    kwargs: dict


#: functional op -> the engine op an in-place op runs on padded inputs
#: (``CompiledOp._padded_in_place``)
_functionals: dict = {}


class _Entry(NamedTuple):
    fn: Any  #: (*dyn) -> the op's result arrays
    plan: _meta.OutputPlan  #: how they come back (ignored for in-place / out=)
    raw: Any = None  #: the traceable function, for an in-place / out= op that may donate what it overwrites
    donating: dict | None = None  #: donated positions in dyn -> fn jitted with them donated (built on first use)
    fusable: Traceable | None = None  #: what fused eager records for the op (tensor results, or writes)
    used: list | None = None  #: [the op's hit count at this entry's last use]: which entries a full cache keeps


#: An in-place or out= op donates the storage array it overwrites when
#: nothing else holds it (``_tensor.DONATE``): XLA then writes the result
#: into the same buffer, so ``bucket[i:j].copy_(g)`` or ``x[k] += 1`` on a
#: large tensor updates it in place instead of copying all of it.
#: References to a storage's array when nothing else holds it: the
#: storage's attribute, the call's argument list, the local below and
#: getrefcount's own argument.
_SOLE_REFS = 4

#: The most signatures an op keeps built at once (:meth:`CompiledOp._forget_least_used`).
CACHE_ENTRIES = 512


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
                 "dtype_from_out", "checked_scalars", "rule", "seen_shapes", "logical", "physical", "seen_scalars",
                 "replayable", "padded_replayable")

    def __init__(self, func: Any, lowering: Lowering, inplace: int | None = None,
                 out_names: tuple[str, ...] = (), meta_op: Any = None) -> None:
        self.func = func
        self.lowering = lowering
        self.inplace = inplace
        self.out_names = out_names
        self.cache: dict[Any, _Entry] = {}
        self.eager = lowering.data_dependent
        self.name = op_name(func)
        self.meta_op = meta_op if meta_op is not None else _meta.META_STAND_INS.get(self.name, func)
        # Arguments typed Scalar / float: an optimizer passes a new value every
        # step (Adam's step size), which must not mean a new compile every step.
        self.scalar_slots = scalar_slots(func)
        # scalars traced (True), static (False), undecided (None)
        self.dynamic: bool | None = True if lowering.traced_scalars and self.scalar_slots else None
        self.misses = 0
        self.hits = 0
        self.late_misses: dict | None = None  # per form, new signatures after the op had run warm (see _signatures.note_miss)
        self.warm_hits = 0  # its reuses at the first of those
        self.last_key: Any = None
        self.in_trial = False
        # No out= targets, no random key, scalars static: the common case.
        self.simple = not out_names and not lowering.needs_rng
        self.dtype_from_out = bool(out_names) and self.name.split(".")[0] in _DTYPE_FROM_OUT
        self.checked_scalars: set = set()  # scalar values of a traced random op already checked
        self.seen_scalars: set = set()  # its signatures with scalar values left out (_scalars_vary)
        # Dynamic dimensions (_dynamic_dims): how the op reads padded inputs
        # (None: it cuts them), its inputs' first shapes, its padded calls'
        # logical result shapes.
        self.rule = _dynamic_dims.rule_for(func, self.name, lowering, inplace, out_names)
        self.seen_shapes: dict = {}
        self.logical: dict = {}
        self.physical: dict = {}  # fused eager: a padded key's result shapes
        #: Whether the op's whole handler is this object's call (no checks or
        #: rewrites around it: ``_dispatch.handler_for``), so that fused
        #: eager may replay its calls without it (``_fused.replay``).
        self.replayable = False
        #: Whether its handler is this object's call for padded inputs too
        #: (no wrapper that handles them itself: a join, a mean): fused
        #: eager may replay its padded calls (``_dynamic_dims.PaddedLane``).
        self.padded_replayable = False

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        given = kwargs
        fell_back = False
        if _padding.live:
            if self.rule is None:
                if self.inplace is not None and (self.meta_op is not self.func or self.lowering.per_element):
                    written = self._padded_in_place(args, kwargs)
                    if written is not None:
                        return written
                _dynamic_dims.unpad_all(args, kwargs, self.name)  # named in the statistics
            else:
                result = self._padded(args, kwargs)
                if type(result) is _Swapped:  # empty tensors of padded storages: exact ones in their place
                    args, kwargs = result.args, result.kwargs
                    given = kwargs
                    result = self._padded(args, kwargs)
                if result is _FELL_BACK:
                    fell_back = True
                elif result is not _EXACT:
                    return result
        out_targets: list[JaxTensor] = []
        generator = None
        if not self.simple or self.dynamic:
            kwargs, out_targets, generator = self._split_kwargs(kwargs)
        key, dyn = self._key(args, kwargs, out_targets)
        cfg, place = key[3], key[4]
        # ``index``: the torch device; ``place`` is ``index`` itself unless the
        # op runs on a mesh (an operand is sharded).
        index = place if type(place) is int else place.index
        entry = self.cache.get(key)
        if entry is not None:
            self.hits += 1
            entry.used[0] = self.hits
            if self.dynamic and self.lowering.needs_rng:
                _scalar_trials.check_scalars(self, args, kwargs)
        else:
            if (self.rule is not None and cfg.dynamic_shapes and type(place) is int
                    and not self.in_trial and not fell_back and _dynamic_dims.on_miss(self, args, kwargs, cfg.dynamic_shapes)):
                return self(args, given)  # inputs padded: their dims are dynamic from now on
            self.misses += 1
            if not self.in_trial:
                note_miss(self, key)
            if self._tries_traced_scalars(key):
                # The trial takes the call as given: its generator= decides
                # what both runs draw (the split kwargs have lost it, and a
                # seeded generator's draw then depended on earlier calls).
                return _scalar_trials.trial(self, args, given)
            try:
                entry = self._build(key, args, kwargs, out_targets, cfg, given)
            except _OutResize:
                return self._into_resized_outputs(args, kwargs, out_targets, always=True)
        rewind = None
        if self.lowering.needs_rng:  # drawn once the call runs (a trial above draws for itself)
            if self.dynamic and has_dynamic(key):  # may run again with static scalars, drawing the same
                rewind = _scalar_trials.same_draw_again(self, args, given)
            dyn.extend(_rng.next_key_args(index, generator))
        written = self._written(args, out_targets) if self.inplace is not None or out_targets else ()
        if cfg.eager == "fused":
            if entry.fusable is not None and not self.in_trial and type(place) is int:
                fused = self._record(entry, dyn, args, out_targets, index, place)
                if fused is not None:
                    return fused
            dyn = self._resolved(dyn, place)
        elif open_segments:
            dyn = self._resolved(dyn, place)
        try:
            result = self._run(entry, key, dyn, written, args, kwargs, out_targets, given, rewind)
        except Exception:
            if not out_targets:
                raise
            resized = self._into_resized_outputs(args, kwargs, out_targets)
            if resized is None:
                raise
            return resized
        if result is _AGAIN:
            return self(args, given)
        if self.inplace is not None:
            written[0].commit(result, place is not index)
            return args[self.inplace]
        if out_targets:
            for storage, arr in zip(written, result):
                storage.commit(arr, place is not index)
            return out_targets[0] if len(out_targets) == 1 else tuple(out_targets)
        plan = entry.plan
        outputs = plan.outputs
        if outputs is not None and plan.container == "single" and outputs[0].kind == "tensor":
            # The hot path: one tensor result.
            note_result(index, result)
            return result_tensor(result, outputs[0].shape, outputs[0].dtype, index, place)
        return _wrap_results(result, plan, index, place)

    def _padded_in_place(self, args: tuple, kwargs: dict) -> Any:
        """An in-place op run as its functional op (``x.sub_(y)`` as
        ``sub(x, y)``) over padded inputs: the functional op's padded route,
        and the target's storage takes its result, padded (an exact target
        beside a padded operand becomes padded, as an input does when its
        dim becomes dynamic).  None where it cannot be: the target is a view
        (its storage holds more than it), the functional op has no rule or
        its call runs exact, or the result is not the target's shape and
        dtype (the in-place route then raises torch's error).  torch's
        SiLU backward computes ``1 - sigmoid`` as ``empty_like``, ``fill_``
        and ``sub_``: its ``sub_`` cut every MLP activation of a Llama
        training step, which then compiled per length.  A target that is a
        view of a padded storage (``shifted[..., 0] = start``) is written
        through its view in the storage's bucket (``_dynamic_dims.write``)."""
        target = args[self.inplace] if self.inplace < len(args) else None
        if type(target) is not JaxTensor or type(target._storage.place) is not int \
                or not _config.current().dynamic_shapes or not _dynamic_dims.padded_inputs(args, kwargs):
            return None
        if target._view is not None and (target._storage.padded is None or _dynamic_dims.read_of(target) is None):
            return None
        functional = _functionals.get(self.meta_op)
        if functional is None:
            functional = _functionals[self.meta_op] = CompiledOp(self.meta_op, self.lowering)
        if functional.rule is None:
            return None
        # a draw this route makes and then drops (the exact route draws instead)
        # must not use up the seed's numbers: the same seed draws the same
        # numbers with buckets and without
        rewind = _scalar_trials.same_draw_again(functional, args, kwargs)
        result = functional._padded(args, kwargs)
        if type(result) is not JaxTensor or result._view is not None or result.shape != target.shape \
                or result.dtype != target.dtype or (target._view is not None and not _dynamic_dims.write(target, result)):
            if rewind is not None:
                rewind()
            return None
        if target._view is None:
            target._storage.take(result._storage)
        return target

    def _padded(self, args: tuple, kwargs: dict) -> Any:
        """The call run on its padded inputs, through the program of their
        buckets (``_dynamic_dims``), or :data:`_EXACT`: it runs exact, its
        padded inputs cut (dynamic shapes off, inputs that do not line up,
        anything the padded run cannot describe).  Under fused eager the
        padded call is recorded into the segment (its results pending)."""
        cfg = _config.current()
        if not cfg.dynamic_shapes:
            return _EXACT  # encode() cuts what is padded
        padded = _dynamic_dims.padded_inputs(args, kwargs)
        if not padded:
            return _EXACT
        swapped = _dynamic_dims.exact_empties(args, kwargs, padded)
        if swapped is not None:
            return _Swapped(*swapped)
        given = (args, kwargs)
        made = self.padded_key(args, kwargs, cfg)
        if len(made) == 3:
            return self._exact(made[1], made[2], made[0])
        key, dyn, reads, dims, args, kwargs = made
        place = key[4]
        entry = self.cache.get(key)
        if entry is None and _dynamic_dims.pad_marked(*given):
            return self._padded(*given)  # an input marked dynamic along more dims: padded along them too
        if self.lowering.needs_rng:
            if self.dynamic:  # traced scalars of a random op: the exact route's trials
                return self._exact(args, kwargs, "a random op with traced scalars")
            dyn.extend(_rng.next_key_args(place, None))  # the key an exact call would take
        if entry is None:
            # An undecided op's scalars are static here, until one takes
            # another value at the same place, as on the exact route (a
            # mean's gradient divides by the length: a new scalar per length)
            if self._tries_traced_scalars(key, padded=True) and not self.lowering.needs_rng:
                self.misses += 1
                return _scalar_trials.trial(self, *given)
            self.misses += 1
            note_miss(self, key, bucketed=True)
            try:
                entry = self._build(key, args, kwargs, [], cfg, kwargs)
            except Exception:
                return self._exact(args, kwargs, "its program could not be built")  # the exact call raises torch's error, if there is one
        else:
            self.hits += 1
            entry.used[0] = self.hits
        shapes = _dynamic_dims.logical_shapes(self, key, args, kwargs)
        plan = entry.plan
        if shapes is None or plan.outputs is None or any(o.kind not in ("tensor", "none") for o in plan.outputs):
            return self._exact(args, kwargs, "results torch cannot describe")
        if cfg.eager == "fused" and entry.fusable is not None and not self.in_trial:
            recorded = self._record_padded(entry, key, dyn, dims, shapes, place)
            if recorded is _EXACT:
                return self._exact(args, kwargs, "a result whose padding is unknown")
            if recorded is not None:
                self.note_padded_call(args, kwargs, reads)
                if entry.fusable.lane is None:  # its later calls may take fused eager's replay lane
                    entry.fusable.lane = _dynamic_dims.padded_lane(self, key, entry, reads, given, (args, kwargs))
                return recorded
        if open_segments:
            dyn = self._resolved(dyn, place)
        try:
            result = entry.fn(*dyn)
        except Exception as e:
            return self._exact(args, kwargs, f"its program failed ({type(e).__name__})")
        single = plan.container == "single"
        results = (result,) if single else result
        made = []
        for spec, arr, shape in zip(plan.outputs, results, shapes):
            if spec.kind == "none":
                made.append(None)
                continue
            layout = _dynamic_dims.result_layout(dims, tuple(arr.shape), shape)
            if layout is None:
                return self._exact(args, kwargs, "a result whose padding is unknown")
            made.append((arr, layout[0], spec.dtype, layout[1]))
        self.note_padded_call(args, kwargs, reads)
        wrapped = []
        for m in made:
            if m is None:
                wrapped.append(None)
                continue
            arr, shape, dtype, padded = m
            note_result(place, arr)
            wrapped.append(result_tensor(arr, shape, dtype, place, None, padded))
        if single:
            return wrapped[0]
        return tuple(wrapped) if plan.container == "tuple" else wrapped

    def padded_key(self, args: tuple, kwargs: dict, cfg: Any) -> tuple:
        """A padded call's key and what it reads: ``(key, dyn, reads, dims,
        args, kwargs)``, the arguments as ``_dynamic_dims.prepare`` lined
        them up (the same objects where it padded none of them); or
        ``(why, args, kwargs)`` where the call runs exact."""
        rule = self.rule
        prepared = _dynamic_dims.prepare(rule, args, kwargs)
        if prepared is None:
            return "inputs that do not line up", args, kwargs
        reads, dims, args, kwargs = prepared
        dyn: list[Any] = []
        devs: list[Any] = []
        slots = self.scalar_slots if self.dynamic else ()
        fill_of = _dynamic_dims.fill_of
        draws = self.lowering.needs_rng
        try:
            key_args = tuple([encode_dynamic(v, dyn, devs) if i in slots and id(v) not in reads
                              else encode_padded(v, dyn, devs, fill_of(rule, i, args, kwargs), reads, draws)
                              for i, v in enumerate(args)])
            key_kwargs = tuple([(k, encode_dynamic(v, dyn, devs) if k in slots and id(v) not in reads
                                 else encode_padded(v, dyn, devs, fill_of(rule, k, args, kwargs), reads, draws))
                                for k, v in kwargs.items()]) if kwargs else ()
        except ForeignFirst:
            return "a tensor on another device", args, kwargs
        place = devs[0] if devs else None
        if type(place) is not int or any(d != place for d in devs):
            return "a mesh or several devices", args, kwargs
        return (key_args, key_kwargs, (), cfg, place), dyn, reads, dims, args, kwargs

    @staticmethod
    def note_padded_call(args: tuple, kwargs: dict, reads: dict) -> None:
        """Count a padded call in the statistics, by its first padded input,
        and note the padded shape each padded input was read as."""
        counted = False
        for t in (*args, *kwargs.values()):
            read = reads.get(id(t)) if type(t) is JaxTensor else None
            if read is not None:
                shape = tuple(t.shape)
                if not counted:
                    _padding.note_padded_call(read.psize, shape)
                    counted = True
                _padding.note_padded_read(read.psize, shape)

    def _record_padded(self, entry: _Entry, key: tuple, dyn: list, dims: dict, shapes: list, place: int) -> Any:
        """Fused eager: a padded call recorded into this thread's segment,
        its results pending and padded as the call's inputs are; None to
        run it now, :data:`_EXACT` when a result's padding is unknown."""
        physical = self.physical.get(key)
        if physical is None:
            try:  # the program's result shapes, once per key (the bucket's)
                out = jax.eval_shape(entry.fusable.fn, *[_fused.abstract(v) for v in dyn])
            except Exception:
                return None  # it needs concrete values: it runs now
            outs = (out,) if entry.plan.container == "single" else tuple(out)
            physical = tuple(tuple(o.shape) for o in outs)
            if len(self.physical) > 512:
                self.physical.clear()
            self.physical[key] = physical
        results = _dynamic_dims.result_layouts(dims, physical, shapes)
        if results is None:
            return _EXACT
        return _fused.record(entry.fusable, dyn, entry.plan, place, place, padded=results)

    @staticmethod
    def _resolved(dyn: list, place: Any) -> list:
        """``dyn`` with its pending values computed, on ``place``: a value
        that was pending when a mesh took the call's operands comes out of
        its segment on one device, and moves onto the mesh now."""
        resolved = _fused.resolve(dyn)
        if resolved is not dyn and type(place) is not int:
            resolved = _sharding.onto_mesh(list(resolved), place)
        return resolved

    def _exact(self, args: tuple, kwargs: dict, why: str) -> Any:
        """The padded route gives up (``why``, counted): the call's padded
        inputs are cut, and it runs exact."""
        _padding.note_fallback(self.name, why)
        _dynamic_dims.unpad_all(args, kwargs, self.name)
        return _FELL_BACK

    def _key(self, args: tuple, kwargs: dict, out_targets: list) -> tuple[tuple, list]:
        """The call's key ``(args, kwargs, out= targets, configuration,
        place)`` and the dynamic values its program takes."""
        dyn: list[Any] = []
        devs: list[Any] = []
        try:
            if self.dynamic:
                slots = self.scalar_slots
                key_args = tuple([encode_dynamic(v, dyn, devs) if i in slots else encode(v, dyn, devs)
                                  for i, v in enumerate(args)])
                key_kwargs = tuple([(k, encode_dynamic(v, dyn, devs) if k in slots else encode(v, dyn, devs))
                                    for k, v in kwargs.items()])
            else:
                key_args = tuple([encode(v, dyn, devs) for v in args])
                key_kwargs = tuple([(k, encode(v, dyn, devs)) for k, v in kwargs.items()]) if kwargs else ()
        except ForeignFirst as err:
            raise device_mismatch(first_jax_device(list(args) + list(kwargs.values())), err.device) from None
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
        # ``place`` too: a program is compiled for its device
        return (key_args, key_kwargs, targets_key, _config.current(), place), dyn

    def _tries_traced_scalars(self, key: tuple, padded: bool = False) -> bool:
        """Whether this new signature starts a trial of traced scalars: a
        random op's scalars (bounds, mean, std, p) when they take values
        not seen before (nn.init passes new bounds per layer, with new
        shapes; a model's dropouts of one p do not start one); another op's when a scalar took
        a second value where everything else was seen before (an
        optimizer's step size, a scheduled learning rate), as a dimension
        becomes dynamic at its second size.  Signatures that differ in
        shapes do not start one: a constant such as attention's scale,
        the same in every call, stays compiled in, and fused eager's
        segments around it keep their programs (a trial ends a segment)."""
        if not (self.dynamic is None and self.scalar_slots and not self.out_names and not self.in_trial
                and not self.eager):
            return False
        if self.lowering.needs_rng:
            return _new_scalar_values(self, key)
        # Inside a backward, whose calls have no place of their own, only
        # on the padded route (a mean's gradient divides by each new length
        # of a bucket): on the exact route autograd's formulas multiply by
        # each forward constant at "one place", and a trial halfway through
        # a first step turned the op traced for the next forward's segments
        # too.  The padded route runs from a dim's third size on.
        if _meta.inside_backward():
            return padded and _scalars_vary(self, key, "a backward")
        return _scalars_vary(self, key, _dynamic_dims._caller(instruction=True))

    def _written(self, args: tuple, out_targets: list) -> list:
        """The storages the call writes (an in-place op's target, the out=
        tensors'), refused before anything runs when one is read-only."""
        written = [args[self.inplace]._storage] if self.inplace is not None else [t._storage for t in out_targets]
        for storage in written:
            if storage.read_only is not None:
                storage.check_writable()
        return written

    def _run(self, entry: _Entry, key: tuple, dyn: list, written: list, args: tuple, kwargs: dict,
             out_targets: list, given: dict, rewind: Any) -> Any:
        """The entry's program run on ``dyn`` (given up the arrays of
        ``written`` that nothing else holds); :data:`_AGAIN` when the call
        must be made again, with its scalars static."""
        place = key[4]
        try:
            if entry.raw is not None and type(place) is int and not self.in_trial:
                donated = _sole_positions(dyn, written)
                if donated:
                    fn = entry.donating.get(donated)
                    if fn is None:
                        fn = entry.donating[donated] = self._program(
                            key, _program_cache.jit(entry.raw, donate_argnums=donated, keep_unused=True), donated)
                        with warnings.catch_warnings():  # an unusable donated buffer is freed all the same
                            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                            return fn(*dyn)
                    return fn(*dyn)
            return entry.fn(*dyn)
        except _CONCRETE_ERRORS:
            if self.dynamic and has_dynamic(key):
                # The lowering branches on a traced scalar's value: its
                # scalars compile as constants from now on (a trial then
                # compares two static runs).  Not eager: that would run
                # every later call op by op.
                _scalar_trials.drop_traced(self)
                if rewind is not None:
                    rewind()
                return _AGAIN
            self.eager = True
            self.cache.clear()
            entry = self._build(key, args, kwargs, out_targets, key[3], given)
            return entry.fn(*dyn)

    def _record(self, entry: _Entry, dyn: list, args: tuple, out_targets: list, index: int, place: Any) -> Any:
        """Fused eager: the op recorded into this thread's segment (its
        results pending), or None to run it now."""
        if self.inplace is not None:
            target = args[self.inplace]
            storage = target._storage
            if type(storage.place) is not int:
                return None
            return target if _fused.record(entry.fusable, dyn, None, index, place, into=[storage]) else None
        if out_targets:
            storages = [t._storage for t in out_targets]
            if any(type(s.place) is not int for s in storages):
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
                    _meta.resize_warning(t.shape, v.shape)
                _meta.resize_out(t, v)
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
        fn, plan = self._traced(key, args, kwargs, out_targets, cfg, known, meta, cpu_accepts)
        jitted = not (self.eager or not cfg.jit)
        writes = self.inplace is not None or bool(out_targets)
        # jax names the program after the function: compile logs, profiles
        # and jax.monitoring events then say which torch op compiled.
        fn.__name__ = fn.__qualname__ = self.name.replace("::", ".")
        # Fused eager records ops whose results are tensors torch described in
        # advance, with the op's key (the recompile log compares them) and its
        # disk signature (a segment's program is kept on disk by its ops').
        tensors = plan.outputs is not None and all(o.kind == "tensor" for o in plan.outputs) and bool(plan.outputs)
        # keep_unused: an input the op only overwrites (uniform_, fill_ of a
        # tensor) places the program on its device; jax would drop it and run
        # on its default device, leaving a tensor of jax:1 on device 0
        program = self._program(key, _program_cache.jit(fn, keep_unused=True), signature=disk_signature) if jitted else fn
        fusable = Traceable(fn, self.name, key, disk_signature, program) if jitted and (tensors or writes) else None
        entry = _Entry(program,
                       plan,
                       fn if (jitted and writes and DONATE) else None,
                       {} if (jitted and writes and DONATE) else None,
                       fusable,
                       [self.hits])
        if (fusable is not None and self.replayable and self.simple and not writes and type(key[4]) is int
                and all(_replayable(k) for k in key[0]) and all(_replayable(k) for _, k in key[1])):
            fusable.lane = _fused.Lane(self.func, key, self, entry.used, plan)
        with _lock:
            if len(self.cache) >= CACHE_ENTRIES:
                self._forget_least_used()
            self.cache[key] = entry
        return entry


    def _forget_least_used(self) -> None:
        """Bound the memory of an op of ever new shapes: keep the half of
        its entries used last.  Clearing them all dropped the hot ones too
        (a model's steady shapes, after a few hundred others), which then
        traced again, and fused eager's recorded segments, which know the
        ops by identity, no longer matched: each replayed segment was
        recorded and keyed again."""
        kept = sorted(self.cache.items(), key=lambda item: item[1].used[0])[len(self.cache) // 2:]
        self.cache = dict(kept)

    def _traced(self, key: tuple, args: tuple, kwargs: dict, out_targets: list, cfg: _config.Config, known: bool,
                meta: Any, cpu_accepts: bool) -> tuple[Any, _meta.OutputPlan]:
        """The traceable function of the call (``fn(*dyn)``: its result
        arrays; for an in-place / out= op the written storages' new arrays)
        and how its results come back; the out= and in-place rules torch
        checks on the call's tensors are checked here, once per key."""
        lowering = self.lowering
        needs_rng = lowering.needs_rng
        base_ctx = lowering_context(cfg, type(key[4]) is int)
        key_args, key_kwargs = key[0], key[1]
        n_targets = len(out_targets)

        def arguments(dyn: tuple) -> tuple[list, dict, list, list, LoweringContext]:
            it = iter(dyn)
            inputs: list[tuple[Any, Any]] = []
            positions = decoded_positions()
            positions.clear()
            logical = []  # (argument position, the mask of its logical elements) of each padded one
            call_args = []
            for i, x in enumerate(key_args):
                call_args.append(decode(x, it, inputs))
                if type(x) is PaddedSpec and x.sized:
                    logical.append((i, positions[-1][2]))
            call_kwargs = {k: decode(x, it, inputs) for k, x in key_kwargs}
            targets = [(next(it), next(it)) for _ in range(n_targets)]
            ctx = base_ctx
            if logical:
                ctx = dataclasses.replace(ctx, logical=tuple(logical))
            if needs_rng:
                key_data, counter = next(it), next(it)
                ctx = dataclasses.replace(ctx, rng_key=_rng.draw_key(key_data, counter),
                                          draw_positions=tuple((shape, at) for shape, at, _ in positions))
            positions.clear()
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
                call_args, call_kwargs, inputs, _, ctx = arguments(dyn)
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
                call_args, call_kwargs, _, targets, ctx = arguments(dyn)
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
                result_dtypes = dtypes[0] if plan.container == "single" else dtypes  # None: a scalar result
            else:
                result_dtypes = None

            def fn(*dyn):
                call_args, call_kwargs, _, _, ctx = arguments(dyn)
                return _lowerings.invoke(lowering, call_args, call_kwargs, ctx, result_dtypes)
        return fn, plan

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


def _scalars_vary(op: CompiledOp, key: tuple, place: Any) -> bool:
    """Whether ``key`` (a new signature of ``op``) differs from one seen
    before at the same place only in the values of its Python scalars;
    notes it.  The place is the expression (line and bytecode offset) of
    the first caller outside torch and pjrt_host (the model's code, or the
    line that called an optimizer's step), as a dimension's is its line:
    ``pow(x, 3.0)`` in an activation and autograd's ``pow(x, 2.0)`` in its
    backward, or ``0.5 * x`` and ``0.044715 * x`` in one line, are
    constants, not one scalar that changes."""
    slots = op.scalar_slots
    masked = (tuple([_value_free(k) if i in slots else k for i, k in enumerate(key[0])]),
              tuple([(name, _value_free(k)) if name in slots else (name, k) for name, k in key[1]]), *key[2:],
              place)
    seen = op.seen_scalars
    if masked in seen:
        return True
    if len(seen) > 512:  # an op of ever new shapes: bound the memory
        seen.clear()
    seen.add(masked)
    return False


def _new_scalar_values(op: CompiledOp, key: tuple) -> bool:
    """Whether the Python scalars of ``key`` (a new signature of a random
    ``op``) are values the op has not met before, after it met others; notes them."""
    slots = op.scalar_slots  # (a slot typed Tensor may hold a tensor: only the Python scalars count)
    values = (tuple([k for i, k in enumerate(key[0]) if i in slots and _value_free(k) is not k]),
              tuple([(name, k) for name, k in key[1] if name in slots and _value_free(k) is not k]))
    seen = op.seen_scalars
    if values in seen:
        return False
    if len(seen) > 512:
        seen.clear()
    seen.add(values)
    return len(seen) > 1


def _replayable(k: Any) -> bool:
    """Whether a key entry is of a kind fused eager's replay lane reads
    (``_signatures.matches``): not a padded read, a host scalar or a
    generator."""
    t = type(k)
    if t is SequenceArg:
        return all(_replayable(x) for x in k)
    return t is not PaddedSpec and t is not HostScalar and k is not GENERATOR


def _value_free(k: Any) -> Any:
    """A key entry with its Python scalars' values left out (their types kept)."""
    if type(k) is tuple and k and k[0] in (int, float, bool, complex):  # (scalar_key's entries)
        return k[0]
    if type(k) is SequenceArg:
        return SequenceArg([_value_free(x) for x in k])
    return k


class _FirstCall:
    """A program until its first call: then compiled for the call's argument
    types (``_program_cache.compiled``: loaded from disk without tracing
    when this process's setting made it before), and put in its entry's
    place so that later calls run the compiled program directly."""

    __slots__ = ("op", "key", "jitted", "signature", "index", "donated", "made")

    def __init__(self, op: CompiledOp, key: tuple, jitted: Any, signature: tuple, index: int,
                 donated: tuple) -> None:
        self.op, self.key, self.jitted, self.signature, self.index, self.donated = \
            op, key, jitted, signature, index, donated
        self.made: Any = None  # the program, for a caller that kept this object (fused eager's Traceable.run)

    def __call__(self, *dyn: Any) -> Any:
        if self.made is not None:
            return self.made(*dyn)
        # the argument types too: one key can meet a Python int and a numpy
        # int (weak and strong types) at one position
        signature = (self.signature, tuple(str(jax.typeof(x)) for x in dyn))
        compiled = _program_cache.compiled(self.op.name, signature, self.jitted, dyn, jax_device(self.index))
        program = self.made = _program_cache.with_retrace(compiled, self.jitted)

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
