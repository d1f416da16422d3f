"""What a compiled op is keyed on, and why it compiled again.

An op's call becomes a hashable *key* (:func:`encode`: a ``TensorSpec`` per
'jax' tensor, ``(type, value)`` per Python scalar compiled in as a constant,
the markers below for the rest) and the *dynamic* values its program takes
at run time; :func:`decode` turns those values back into the lowering's
arguments inside the traced function.  :func:`difference` says what sets two
keys of one op apart, in a user's terms: the ``pjrt_host.recompiles`` log
(:func:`note_miss` for op-by-op programs, ``_fused`` for segments) is made
of it.

:class:`Traceable` is what the engine hands fused eager for an op it may
record: the traced function with the op's name, key and disk signature.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import torch

from .._lowerings._dtypes import jax_dtype
from . import _padding, _strided
from ._padding import PaddedSpec
from ._devices import device_mismatch, torch_device
from ._tensor import JaxTensor, TensorSpec

__all__ = [
    "GENERATOR", "DynamicScalar", "ForeignFirst", "HostScalar", "SequenceArg", "Traceable", "decode", "describe",
    "difference", "encode", "encode_dynamic", "encode_padded", "first_jax_device", "has_dynamic", "matches", "note_miss",
    "recompiles", "scalar_key", "scalar_slots",
]

# ---------------------------------------------------------------- encoding
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
    #: The range the value falls in (:func:`scalar_span`): torch converts
    #: some Scalar arguments into the tensor's dtype with a check (``fill_``,
    #: ``masked_fill``, ``addcmul``'s value), so a value of another range is
    #: another signature, whose first call CPU's kernel is asked about.  A
    #: string, never a number: a key entry ``(int, 0)`` is the constant 0.
    span: str = ""


_INT_SPANS = ((7, "7"), (8, "8"), (15, "15"), (16, "16"), (31, "31"), (32, "32"))


def scalar_span(v: Any) -> str:
    """The range of a traced scalar: for an int, the bits of its magnitude
    in steps that match int8/uint8, int16/uint16, int32/uint32, and its
    sign; for a float, whether float16, bfloat16 or float32 holds it (inf
    and NaN convert to every float dtype)."""
    if type(v) is int:
        bits = abs(v).bit_length()
        span = next((name for limit, name in _INT_SPANS if bits <= limit), "64")
        return span if v >= 0 else "-" + span
    a = abs(v)
    if a <= 65504.0 or a != a or a == float("inf"):
        return ""
    return "bf16" if a <= 3.3895313892515355e38 else "f32" if a <= 3.4028234663852886e38 else "f64"


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


class ForeignFirst(Exception):
    """A non-'jax' tensor came before any 'jax' tensor: the caller names both."""

    def __init__(self, device: torch.device) -> None:
        self.device = device


def encode(v: Any, dyn: list, devs: list) -> Any:
    if isinstance(v, JaxTensor):
        storage = v._storage
        devs.append(storage.place)
        arr = storage._array  # a fused-eager result may be Pending: the caller resolves or records it
        if storage.padded is not None:  # an op without a padded rule reads the logical values
            arr = storage.unpad("an op without a padded rule")
        dyn.append(arr if arr is not None else storage.get())
        view = v._view
        if view is None:
            return storage.spec
        dyn.append(view.run_offset)
        return view.spec
    t = type(v)
    if t is float or t is int or t is bool or t is complex:
        return scalar_key(t, v)
    if t is list or t is tuple:
        return SequenceArg([encode(x, dyn, devs) for x in v])
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            dyn.append(np.asarray(v.item(), dtype=jax_dtype(v.dtype)))
            return HostScalar(v.dtype)
        if devs:
            raise device_mismatch(torch_device(devs[0]), v.device)
        raise ForeignFirst(v.device)
    if isinstance(v, torch.Generator):
        return GENERATOR
    return v


def scalar_key(t: type, v: Any) -> tuple:
    """The key entry of a Python scalar ``v`` of type ``t`` compiled in as a
    constant: ``(t, v)``; a value Python's equality cannot tell apart
    (-0.0 equals 0.0; a NaN equals nothing, not even another NaN) carries
    its text too, and a NaN is one canonical object.  Keyed by equality
    alone, ``x * -0.0`` ran the program compiled for ``x * 0.0`` (and gave
    +0), and every new NaN object compiled a new program."""
    if t is float:
        if v and v == v:  # the common case: finite, non-zero
            return (t, v)
        if v != v:
            return _NAN_KEY
        return (t, v) if str(v)[0] != "-" else _NEGATIVE_ZERO_KEY
    if t is complex and (v != v or not (v.real and v.imag)):  # a NaN, or a zero part (maybe -0.0)
        text = repr(v)
        if v == v:
            return (t, v, text)
        if len(_complex_nans) > 64:
            _complex_nans.clear()
        return (t, _complex_nans.setdefault(text, v), text)
    return (t, v)


_NAN_KEY = (float, float("nan"), "nan")
_NEGATIVE_ZERO_KEY = (float, -0.0, "-0.0")
_complex_nans: dict[str, complex] = {}  # one object per text


def encode_dynamic(v: Any, dyn: list, devs: list) -> Any:
    t = type(v)
    if t is float or t is int:
        dyn.append(v)
        return DynamicScalar(t, scalar_span(v))
    if t is list or t is tuple:  # a Scalar[] (a foreach op's per-tensor step sizes)
        return SequenceArg([encode_dynamic(x, dyn, devs) for x in v])
    return encode(v, dyn, devs)


#: Key entries of other values that :func:`matches` compares by equality:
#: immutable types whose equality is their identity or their value.
_PLAIN_ENTRIES = frozenset({type(None), str, torch.dtype, torch.layout, torch.memory_format, torch.device})


def matches(v: Any, k: Any, dyn: list, place: int) -> bool:
    """Whether argument ``v`` encodes to the key entry ``k`` (as
    :func:`encode` or, for a traced scalar, :func:`encode_dynamic` made
    it) with every tensor on device ``place``; if so, its run-time values
    are appended to ``dyn`` as encoding would.  Fused eager's replay lane
    checks a call against the one recorded before it this way instead of
    building the call's key: each entry kind is read as encode writes it.
    A value encoding would not give exactly ``k`` answers False, and so do
    the kinds a replayed call never holds (a padded read, a host scalar, a
    generator, a tensor still unwritten or on a mesh): the call then takes
    the engine's way, which builds its key."""
    tk = type(k)
    if tk is TensorSpec:
        if type(v) is not JaxTensor:
            return False
        storage = v._storage
        a = storage._array
        if storage.place != place or storage.padded is not None:
            return False
        if a is None:  # an empty tensor: one of no elements has its shared array (DynamicCache's, every layer)
            if 0 not in storage.shape or type(place) is not int:
                return False
            a = storage.get()
        view = v._view
        if view is None:
            if storage.spec != k:
                return False
            dyn.append(a)
            return True
        if view.spec != k or (_padding.live and _padding.WIDE in v.__dict__):
            return False
        dyn.append(a)
        dyn.append(view.run_offset)
        return True
    if tk is tuple:  # a scalar compiled in
        return scalar_key(type(v), v) == k
    if tk is SequenceArg:
        if (type(v) is not list and type(v) is not tuple) or len(v) != len(k):
            return False
        for x, kx in zip(v, k):
            if not matches(x, kx, dyn, place):
                return False
        return True
    if tk is DynamicScalar:
        if type(v) is not k.type or scalar_span(v) != k.span:
            return False
        dyn.append(v)
        return True
    return tk in _PLAIN_ENTRIES and type(v) is tk and v == k


def encode_padded(v: Any, dyn: list, devs: list, fill: Any, reads: dict, draws: bool = False) -> Any:
    """:func:`encode` for an op with a padded rule: a tensor in ``reads``
    (``id`` -> its ``_dynamic_dims.PaddedRead``) becomes a ``PaddedSpec``
    (its storage array, view offset and logical sizes passed at run time),
    its padding given ``fill`` before the lowering reads it."""
    if type(v) is list or type(v) is tuple:
        return SequenceArg([encode_padded(x, dyn, devs, fill, reads, draws) for x in v])
    read = reads.get(id(v)) if type(v) is JaxTensor else None
    if read is None:
        return encode(v, dyn, devs)
    storage = v._storage
    devs.append(storage.place)
    dyn.append(storage._array)
    if read.view is not None:
        dyn.append(read.offset)
    # the logical sizes, where the program reads them: to fill the padding,
    # or to draw per logical element (an elementwise op reads none)
    sized = fill is not None or draws
    if sized:
        index = storage.place
        for sizes in read.sizes:
            dyn.extend([_padding.device_scalar(n, index) for n in sizes])
    return PaddedSpec(storage.jax_dtype, read.physical, read.view, read.masks, fill,
                      tuple(tuple((c[0], c[2]) for c in dim) for dim in read.comps), sized)


#: The padded arrays :func:`decode` read in the trace being made: ``(shape,
#: the logical flat index of each position, the mask of the logical
#: positions)``, each a function (a random lowering's draws use the first:
#: ``LoweringContext.draw_positions``; a lowering that reads padding itself,
#: the second: ``LoweringContext.logical``); the engine empties it per trace.
_decoding = threading.local()


def decoded_positions() -> list:
    """This thread's list (two threads may trace at once)."""
    found = getattr(_decoding, "positions", None)
    if found is None:
        found = _decoding.positions = []
    return found


def decode(x: Any, it: Any, inputs: list) -> Any:
    t = type(x)
    if t is TensorSpec:
        arr = next(it)
        offset = next(it) if x.view is not None else 0
        inputs.append((arr, offset))
        return _strided.read(arr, x.view, offset)
    if t is PaddedSpec:
        arr = next(it)
        offset = next(it) if x.view is not None else 0
        inputs.append((arr, offset))
        arr = _strided.read(arr, x.view, offset)
        if not x.sized:
            return arr
        sizes = [next(it) for terms in x.masks for _ in terms]
        shape, comps, masks = tuple(arr.shape), x.comps, x.masks
        decoded_positions().append((shape, lambda: _padding.positions(shape, comps, sizes),
                                    lambda: _padding.inside(shape, masks, sizes)))
        return _padding.fill(arr, x.masks, sizes, x.fill)
    if t is tuple:
        return x[1]
    if t is SequenceArg:
        return [decode(y, it, inputs) for y in x]
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


def scalar_slots(func: Any) -> frozenset:
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


def has_dynamic(key: Any) -> bool:
    if type(key) is DynamicScalar:
        return True
    if isinstance(key, tuple) and type(key) is not TensorSpec:
        return any(has_dynamic(k) for k in key)
    return False


def first_jax_device(values: Any) -> Any:
    for v in values:
        if isinstance(v, JaxTensor):
            return v.device
        if isinstance(v, (list, tuple)):
            found = first_jax_device(v)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- diagnostics

#: Why an op compiles again: ``logging.getLogger("pjrt_host.recompiles")``
#: at INFO logs every new signature of an op that had compiled before, with
#: what changed; a WARNING (once per op) says when an op keeps compiling new
#: signatures after it had run warm -- a shape that changes every step.
recompiles = logging.getLogger("pjrt_host.recompiles")
#: An op "runs warm" once it has reused its programs this many times; this
#: many new signatures of one form after that warn.
_WARM_HITS = 64
_LATE_MISSES_WARN = 8


def note_miss(op: Any, key: tuple, bucketed: bool = False) -> None:
    """Log a new signature of ``op`` (at INFO), and warn once when the op
    keeps compiling after running warm.  ``bucketed``: a padded call's,
    whose dynamic dims are in buckets already -- bounded, and no advice to
    pad applies (a length entering a new bucket is not a shape changing
    every step).

    A shape that changes every step gives new signatures of one *form*
    (:func:`form`: the key without its sizes and scalar values) in which
    one size (or scalar) takes value after value; a program that turns
    to other work (training, then ``generate()`` at batch 1) gives a
    burst of new signatures at its new call sites, each size among a few
    values (the batch, the prompt's length and 1, the widths), which its
    later calls then reuse.  Only the former warns: after running warm,
    each size of each form collects the values it takes (and the form its
    last key, so that the warning names what changed at that call site)."""
    prev, op.last_key = op.last_key, key
    if prev is None:
        return
    if op.hits >= _WARM_HITS and not bucketed:
        late = op.late_misses
        if late is None:
            late = op.late_misses = {}
            op.warm_hits = op.hits  # -1 once warned
        sizes: list = []
        shape = form(key, sizes)
        seen, before = late.get(shape, (None, prev))
        if seen is None:
            if len(late) >= 256:  # (forms that never come back: bound the memory)
                late.clear()
            seen = [set() for _ in sizes]
        late[shape] = (seen, key)
        count = 0
        for taken, v in zip(seen, sizes):
            if len(taken) < _LATE_MISSES_WARN:
                taken.add(v)
            count = max(count, len(taken))
        # Often, against the reuses since: a shape changing every step, not
        # a few more models or layers among thousands of reuses.
        if count >= _LATE_MISSES_WARN and count * 32 >= op.hits - op.warm_hits and op.warm_hits >= 0:
            op.warm_hits = -1  # warned: once per op
            recompiles.warning(
                "pjrt_host: %s keeps compiling new programs after running warm (a size took %d values in its new "
                "signatures after %d reuses; the last: %s). Each new shape compiles once: pad or bucket the sizes "
                "that change (sequence lengths to a multiple of 64, drop_last=True for the last batch); "
                "torch.jax.dynamic_shape_stats() names the ops that cut padded dims (docs/dynamic-shapes.md). "
                "logging.getLogger('pjrt_host.recompiles').setLevel('INFO') logs every recompilation.",
                op.name, count, op.hits, difference(before, key))
    if recompiles.isEnabledFor(logging.INFO):
        recompiles.info("%s compiles a new program: %s", op.name, difference(prev, key))


def form(key: Any, sizes: list) -> Any:
    """``key`` without its sizes and scalar values: per tensor its dtype,
    rank and view kind, per compiled-in scalar its type; what it leaves out
    is appended to ``sizes`` in order (tensors' sizes, their views', the
    scalars' values).  The signatures of one call site whose lengths (or a
    scalar) change share a form."""
    t = type(key)
    if t is TensorSpec:
        view = key.view
        sizes.extend(key[1])
        if view is None:
            return (key[0], len(key[1]), None)
        sizes.extend(view[1])
        return (key[0], len(key[1]), (view[0], len(view[1])))
    if t is PaddedSpec:
        sizes.extend(key.physical)
        return ("padded", key.dtype, len(key.physical))
    if t is tuple and len(key) >= 2 and isinstance(key[0], type):  # a scalar compiled in
        sizes.append(key[1])
        return key[0]
    if isinstance(key, tuple):
        return tuple(form(k, sizes) for k in key)
    return key


def difference(prev: tuple, key: tuple) -> str:
    """What differs between two keys of one op, in a user's terms (keys
    the engine did not build, as a join's: both, shortened)."""
    if not (_engine_key(prev) and _engine_key(key)):
        return f"{_shortened(prev)} -> {_shortened(key)}"
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
                           f"{describe(old[first])} -> {describe(new[first])})")
        else:
            changes.append(f"{where} {describe(old)} -> {describe(new)}")
    if len(pa) != len(a) or [n for n, _ in pk] != [n for n, _ in k]:
        changes.append("other arguments")
    if pt != t:
        changes.append("the out= tensors")
    if pc != c:
        changes.append("pjrt_host.config settings")
    if pp != p:
        changes.append(f"the device ({pp} -> {p})")
    return "; ".join(changes) or "the same arguments (the earlier program was evicted)"


def _engine_key(key: Any) -> bool:
    """Whether ``key`` has the engine's form: (args, ((name, value), ...),
    out= targets, configuration, place)."""
    return type(key) is tuple and len(key) == 5 and type(key[0]) is tuple and type(key[1]) is tuple and all(
        type(item) is tuple and len(item) == 2 for item in key[1])


def _shortened(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 160 else text[:157] + "..."


def describe(part: Any) -> str:
    if type(part) is PaddedSpec:
        dims = [d for d, terms in enumerate(part.masks) if terms]
        return f"{jnp.dtype(part.dtype).name}{list(part.physical)} (padded to buckets along dims {dims})"
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
        return f"a list of {len(part)}" if len(part) > 4 else f"[{', '.join(describe(x) for x in part)}]"
    return repr(part)


class Traceable:
    """An op's traceable function, as fused eager records it: ``fn(*dyn)``
    gives the op's result arrays; ``name`` and ``key`` are the op's and its
    engine key (the recompile log compares them), ``signature`` what the
    program cache keys it by on disk (None while the cache is off).
    Hashed by identity, as the function it carries: one per engine entry.
    ``run`` is the op's own program (``fn`` jitted), which runs a segment
    op by op while the segment's program compiles in the background.
    ``lane``: how a later call of the op is replayed without the engine
    (``_fused.Lane``), for the ops that can be."""

    __slots__ = ("fn", "name", "key", "signature", "run", "lane")

    def __init__(self, fn: Any, name: str, key: tuple, signature: Any, run: Any = None) -> None:
        self.fn, self.name, self.key, self.signature, self.run = fn, name, key, signature, run
        self.lane: Any = None

    def __repr__(self) -> str:
        return f"Traceable({self.name})"


#: The torch ops that have a replay lane (``_fused.Lane``, :class:`HostLane`):
#: a call of any other cannot take another script's lane either
#: (``_fused._lane_others``), and looks no further.
LANED: set = set()


class HostLane:
    """The replay lane of one of the host's own recorded computations (a
    cache's join, a factory): ``_fused.replay`` reads it as it reads a
    padded call's lane, and it is its own op and its own rule --
    ``match(args, kwargs, dyn, place)`` gives ``(((shape, physical,
    padding),), noted)`` for a call it takes (its run-time values appended
    to ``dyn``), and ``engine_key`` what the host's own way would key the
    call by (``PJRT_HOST_CHECK_REPLAY``).  One result; ``noted``, when not
    None, is counted as a padded call (:meth:`note_padded_call`)."""

    __slots__ = ("func", "cfg", "place", "key", "outputs", "used", "hits")
    container = "single"
    traced = False
    in_trial = False
    dynamic = None
    noted = None  # (an exact cat's note: _fused.Lane.noted)

    def __init__(self, func: Any, key: tuple, place: int, shape: Any, dtype: Any) -> None:
        from . import _config

        self.func, self.key, self.place = func, key, place
        LANED.add(func)
        self.cfg = _config.current()
        self.outputs = ((shape, dtype, jax_dtype(dtype)),)
        self.used = [0]
        self.hits = 0

    @classmethod
    def of(cls, op: Any, *args: Any) -> HostLane:
        """The lane of ``op`` (the host computation's recorded op) under
        the settings in force, made at its first recording under them: a
        lane made under other settings (an earlier ``with
        pjrt_host.config(...)``, another module's) is replaced, since the
        replay takes a lane under its own settings only."""
        from . import _config

        lane = op.lane
        if lane is None or lane.cfg is not _config.current():
            lane = op.lane = cls(*args)
        return lane

    @property
    def op(self) -> HostLane:
        return self

    @property
    def padded(self) -> HostLane:
        return self

    def note_padded_call(self, args: tuple, kwargs: dict, noted: Any) -> None:
        pass
