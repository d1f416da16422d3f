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
import sys
import threading
import warnings
from typing import Any, NamedTuple

import jax
import torch

from .._jax_settings import x64_scope as _x64_scope
from . import _checks, _door
from ._interpreter import GraphLoweringError, Program

__all__ = ["CompiledGraph", "EagerGraph", "REPORT"]

logger = logging.getLogger("pjrt_host")

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

    return jax.jit(split, donate_argnums=(0,))


class EagerGraph:
    """Runs the graph's ops one by one (each on the device, eagerly)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        # AOTAutograd passes the argument list as it is (an instance
        # attribute: wrappers copy __dict__, not class attributes).
        self._boxed_call = True

    @_x64_scope
    def __call__(self, args: list) -> Any:
        args = list(args)
        return self.gm(*args)


class CompiledGraph:
    """One ATen graph as one jitted jax function."""

    def __init__(self, gm: torch.fx.GraphModule, program: Program, what: str) -> None:
        self.gm = gm
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

    @_x64_scope
    def __call__(self, args: list) -> Any:
        if self.eager is not None:
            return self.eager(args)
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
        return results

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
            outs, mutations = program.run(inputs, rng_key, ctx, rows)
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
        entry = _Entry(jax.jit(fn), tuple(mutated_slots), static_outputs, foreign, fn, {}, checking)
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
        self.eager = EagerGraph(self.gm)
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
