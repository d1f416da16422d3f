"""Padded storages: the representation behind dynamic dimensions.

A storage whose ``padded`` is set holds an array of that (physical) shape
while torch sees its logical ``shape``: each dimension's first ``shape[d]``
entries are the values, the rest is padding whose contents mean nothing.
Physical sizes are *buckets* (:func:`bucket`), so every logical size in a
bucket runs the same programs; the logical sizes travel into them as
run-time scalars (:class:`PaddedSpec`).

Padding never shows: whatever reads a padded storage without knowing about
padding (``Storage.array``: copies to the host, views, checkpoints, every op
without a padded rule) gets it *cut* to its logical shape first (:func:`cut`,
a program per shape, as every op was before), and the storage keeps the cut
array.  The ops that know padding are listed with their rules in
``_dynamic_dims``; a padded input reaches their lowering with its padding
filled with a neutral value (:func:`fill`: zeros before a sum or a
contraction, ``-inf`` before a softmax), so the values inside the logical
box are the values of the exact computation.

This module is the storage side: buckets, the fill inside a trace, the
pad / cut programs and the counters ``torch.jax.dynamic_shape_stats()``
reports.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import sys
import threading
from typing import Any, Iterator, NamedTuple

from .. import _program_cache

__all__ = ["PaddedSpec", "bucket", "counts", "cut", "dynamic_ok", "fill", "note", "note_cut", "note_padded_call", "pad_as", "physical_shape",
           "reset"]


class PaddedSpec(NamedTuple):
    """What a compiled op is keyed on for a padded tensor argument: its jax
    dtype, its storage's physical shape, the physical view it is read
    through (``View.static`` or None), the masks of its dims (per dim, the
    ``(divisor, modulus)`` of each dynamic component: index ``i`` is inside
    when ``(i // divisor) % modulus < size``) and the fill its padding gets
    before the lowering reads it (None: left as it is; "min": the dtype's
    lowest value).  The program takes the array, the view's offset (when it
    has a view) and one int32 logical size per mask."""

    dtype: Any
    physical: tuple
    view: Any
    masks: tuple
    fill: Any
    #: per dim of the view, its components' ``(physical size, dynamic)``
    comps: tuple = ()
    #: whether the program takes the logical sizes (it fills the padding or
    #: draws per logical element)
    sized: bool = True


@functools.lru_cache(maxsize=4096)  # (a layout recurs at every call of a bucket: a cache's join every layer and token)
def physical_shape(padded: tuple) -> tuple:
    """The array shape of a storage padded as ``padded``: per dim, its
    components ``(physical size, logical size, dynamic)``, outermost first
    (a dim that merged a batch dim with a padded one has two)."""
    return tuple(math.prod(c[0] for c in dim) for dim in padded)


def bucket(n: int, odd: bool = False) -> int:
    """The physical size that logical size ``n`` is padded to: ``n`` itself
    for 0 and 1 (broadcasting reads size 1), a multiple of 16 up to 128,
    then steps about 1.25x apart (multiples of 16), so that padding never
    costs more than a quarter beyond 128.  ``odd`` (the oracle test mode):
    the next multiple of 7 above ``n``, so that padding is always there and
    never lines up with anything."""
    if n <= 1:
        return n
    if odd:
        return (n // 7 + 1) * 7
    if n <= 128:
        return -(-n // 16) * 16
    b = 128
    while b < n:
        b = -(-int(b * 1.25) // 16) * 16
    return b


#: The largest physical size a dynamic dim may have: its logical size and
#: the positions that mask it travel as int32 (:func:`device_scalar`, the
#: masks' iotas), so a longer dim stays exact.
MAX_SIZE = 2**31 - 1


def dynamic_ok(n: int, odd: bool = False) -> bool:
    """Whether a dim of logical size ``n`` can be dynamic: more than one
    element, and its bucket (:func:`room`) an int32."""
    return n > 1 and room(n, odd) <= MAX_SIZE


def room(n: int, odd: bool = False) -> int:
    """The bucket an eager storage's dynamic dim of logical size ``n`` is
    padded to: the smallest strictly above ``n``.  A storage whose size is
    its bucket's would hold no padding, and an unpadded storage is an exact
    one (``Storage.padded`` is None): a length landing on its bucket's end
    (32 of 32) would run exact and compile a program set of its own at the
    end of every bucket -- a cache growing by a token a step, a mask built
    from its length.  (Compiled graphs key their programs by :func:`bucket`
    of a symbolic size, where a full bucket is no other program.)"""
    return bucket(n + 1, odd) if n > 1 else n


def _library_dirs() -> tuple[str, ...]:
    import contextlib
    import functools
    import os

    import torch

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # pjrt_host/
    return (os.path.dirname(torch.__file__) + os.sep, package + os.sep, contextlib.__file__, functools.__file__)


_skipped: tuple[str, ...] = ()


def caller(instruction: bool = False) -> tuple:
    """Where the op was called from: the first frame outside torch,
    pjrt_host and the standard library's decorators (file, line; with
    ``instruction``, the bytecode offset too: one expression of a line),
    and the ``nn.Module`` that runs it (:func:`_module_of`).  A dynamic
    dim's *place* is made of it (``_dynamic_dims.on_miss``)."""
    global _skipped
    if not _skipped:
        _skipped = _library_dirs()
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_skipped) and not name.startswith("<frozen"):
            module = _module_of(frame)
            return (name, frame.f_lineno, frame.f_lasti, module) if instruction else (name, frame.f_lineno, module)
        frame = frame.f_back
    return ("", 0)


#: How many frames out from the caller's :func:`_module_of` looks for a module.
_MODULE_FRAMES = 4


def _module_of(frame: Any) -> int:
    """The identity of the ``nn.Module`` whose method runs ``frame`` or one
    of the few frames around it (0 for none).  One line of code runs for
    every instance of a module: Whisper's and T5's attention (transformers'
    shared ``sdpa_attention_forward``) for their encoder's 32 positions,
    their decoder's 12 and the cross-attention between them, so with the
    line alone a training step of fixed shapes found three sizes at one
    place and ran padded (Whisper: 40 % more elements, 18 programs
    compiled again in its second step).  Each instance sees its own."""
    import torch

    for _ in range(_MODULE_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            obj = frame.f_locals.get("self")
            if isinstance(obj, torch.nn.Module):
                return id(obj)
        frame = frame.f_back
    return 0


#: The distinct sizes a dim takes at one place before it is dynamic: three,
#: not dynamo's two, because an eager op's place (a line of code) is coarser
#: than dynamo's sources: one line that runs layers of two widths sees two
#: sizes of a dim that never changes, a sequence length keeps taking new ones.
SIZES = 3

#: The sizes each dim of a factory's result took at a place (see :func:`changing_dims`).
_place_sizes: dict = {}


def runs_padded(seen: dict, n: int) -> bool:
    """Note size ``n`` of one dim at one place (``seen``: each size noted
    there -> whether it ran exact) and say whether it runs dynamic: from the
    :data:`SIZES`-th distinct size on, a size runs padded in its bucket.  A
    size that ran exact at a place stays exact there, as dynamo keeps a
    frame's static graph beside the dynamic one: prompts of 12, then 17,
    then 12 tokens ran the third prompt padded into bucket 16, compiling
    the prefill's programs again beside the exact ones the first had left.
    So each size is decided once per place, and a length seen before runs
    the programs it ran then."""
    exact = seen.get(n)
    if exact is None:
        exact = len(seen) < SIZES - 1 or not dynamic_ok(n)
        if len(seen) < SIZES:  # (past that, every new size is padded: no need to keep it)
            seen[n] = exact
    return not exact


_lengths = threading.local()


def factory_lengths() -> dict | None:
    """Inside :func:`sized_after_padded`: logical length -> its bucket, of
    the tensors given to it; else None."""
    return getattr(_lengths, "padded", None)


@contextlib.contextmanager
def sized_after_padded(*tensors: Any) -> Iterator[None]:
    """Factories made here whose sizes are logical lengths of ``tensors``'
    padded dims are padded to those dims' buckets at once, as ``*_like`` of
    a padded tensor is (``_factories``).  torch's math attention (the composite, which
    attention with dropout over padded inputs runs) makes its causal mask
    as ``ones(L, S)`` of the query's and key's lengths: that factory's line
    first ran when the inputs became padded, so it was exact for two more
    lengths and then compiled its segments once more in each bucket."""
    lengths: dict[int, int] = {}
    for t in tensors:
        padded = getattr(getattr(t, "_storage", None), "padded", None)
        for comps in padded or ():
            for physical, logical, dynamic in comps:
                if dynamic and physical > logical:
                    lengths.setdefault(logical, physical)
    before = getattr(_lengths, "padded", None)
    _lengths.padded = lengths or before
    try:
        yield
    finally:
        _lengths.padded = before


def changing_dims(place: Any, shape: tuple) -> set:
    """The dims of ``shape`` that run padded at ``place`` (:func:`runs_padded`; a
    factory's name and the line that called it), as an op's inputs' dims
    become dynamic (``_dynamic_dims.on_miss``): a position ids' ``arange``
    or a mask's ``ones`` of a sequence's length."""
    sizes = _place_sizes.get((place, len(shape)))
    if sizes is None:
        if len(_place_sizes) > 4096:
            _place_sizes.clear()
        sizes = _place_sizes[(place, len(shape))] = [{} for _ in shape]
    return {d for d, n in enumerate(shape) if runs_padded(sizes[d], n)}


def fill(arr: Any, masks: tuple, sizes: Any, value: Any) -> Any:
    """Inside a trace: ``arr`` with every element outside the logical box
    (``masks`` per dim, with the run-time ``sizes`` in order) set to
    ``value`` (None: unchanged)."""
    if value is None:
        return arr
    import jax.numpy as jnp

    mask = inside(tuple(arr.shape), masks, sizes)
    if mask is None:
        return arr
    if value == "min" or value == "max":
        low = value == "min"
        if arr.dtype == jnp.bool_:
            value = not low
        elif jnp.issubdtype(arr.dtype, jnp.floating):
            value = -jnp.inf if low else jnp.inf
        else:
            value = jnp.iinfo(arr.dtype).min if low else jnp.iinfo(arr.dtype).max
    return jnp.where(mask, arr, jnp.asarray(value, dtype=arr.dtype))


def inside(shape: tuple, masks: tuple, sizes: Any) -> Any:
    """Inside a trace: True at every position of an array of ``shape``
    inside the logical box (``masks`` per dim, with the run-time ``sizes``
    in order); None when nothing is padded."""
    from jax import lax

    sizes = iter(sizes)
    mask = None
    for d, terms in enumerate(masks):
        for divisor, modulus in terms:
            i = lax.broadcasted_iota("int32", shape, d)
            if divisor != 1:
                i = i // divisor
            if modulus != shape[d] // divisor:
                i = i % modulus
            within = i < next(sizes)
            mask = within if mask is None else mask & within
    return mask


def positions(shape: tuple, comps: tuple, sizes: Any) -> Any:
    """Inside a trace: the logical row-major flat index of every position of
    an array of ``shape`` padded as ``comps`` (per dim, its components'
    ``(physical size, dynamic)``), the dynamic components' logical sizes
    being the run-time ``sizes`` in order."""
    import jax.numpy as jnp
    from jax import lax

    sizes = iter(sizes)
    coords = []  # (coordinate, logical size) per component, outermost first
    for d, dim in enumerate(comps):
        i = lax.broadcasted_iota("int32", shape, d)
        inner = math.prod(p for p, _ in dim)
        for p, dynamic in dim:
            inner //= p
            coords.append(((i // inner) % p if inner != 1 or p != shape[d] else i % p,
                           next(sizes) if dynamic else p))
    flat = jnp.zeros(shape, jnp.int32)
    for coordinate, n in coords:
        flat = flat * n + coordinate
    return flat


_scalars: dict[tuple, Any] = {}


def device_scalar(n: int, index: int) -> Any:
    """``n`` as an int32 array on device ``index``, made once per value: a
    host scalar costs a transfer on every call of the program."""
    found = _scalars.get((n, index))
    if found is None:
        import jax
        import numpy as np

        from ._devices import jax_device

        if len(_scalars) > 4096:
            _scalars.clear()
        found = _scalars[(n, index)] = jax.device_put(np.int32(n), jax_device(index))
    return found


_cut_programs: dict[tuple, Any] = {}


def cut(arr: Any, padded: tuple, shape: tuple) -> Any:
    """The logical values (of ``shape``) of ``arr``, padded as ``padded``
    (a program per pair of shapes: the cost every op had before buckets)."""
    comps = [c for dim in padded for c in dim]
    physical = tuple(c[0] for c in comps)
    logical = tuple(c[1] for c in comps)
    key = (tuple(arr.shape), physical, logical, shape)
    fn = _cut_programs.get(key)
    if fn is None:
        boxes = tuple(slice(0, n) for n in logical)
        fn = _cut_programs[key] = _program_cache.Kept("pjrt_host.cut",
                                                      lambda a: a.reshape(physical)[boxes].reshape(shape), key)
    return fn(arr)


def host_cut(values: Any, padded: tuple, shape: tuple) -> Any:
    """:func:`cut` of a numpy array (a padded storage copied to the host)."""
    comps = [c for dim in padded for c in dim]
    boxes = tuple(slice(0, c[1]) for c in comps)
    return values.reshape(tuple(c[0] for c in comps))[boxes].reshape(shape)


#: Arrays up to this size are padded through the host (a copy there and
#: back, no program), larger ones by a program per shape.
HOST_PAD_BYTES = 1 << 18
_pad_programs: dict[tuple, Any] = {}

#: Whether a storage was ever padded in this process: until then the
#: engine's hot path does not look for padded inputs.
live = False
#: The key in a tensor's ``__dict__`` of the dims an expand of an exact
#: storage is read wider along (``_dynamic_dims.mark_wider``).
WIDE = "_pjrt_wide"


def pad_layout(padded: tuple) -> tuple:
    """How an exact array is laid out as ``padded``: ``(split, widths,
    physical)``, reshaped to its components' logical sizes, zeros at their
    ends, reshaped to the physical shape."""
    comps = [c for dim in padded for c in dim]
    return tuple(c[1] for c in comps), tuple((0, c[0] - c[1]) for c in comps), physical_shape(padded)


def pad_as(arr: Any, padded: tuple) -> Any:
    """Exact ``arr`` laid out as ``padded`` (its padding zeros)."""
    return _padded_copy(arr, *pad_layout(padded))


def _padded_copy(arr: Any, split: tuple, widths: tuple, physical: tuple, on_device: bool = False) -> Any:
    """``arr`` reshaped to ``split``, given ``widths`` of zeros at the ends
    of those dims, reshaped to ``physical``: every padding the host lays out
    (a storage padded, widened along more dims, a bucket grown).  Up to
    :data:`HOST_PAD_BYTES` through the host (a copy there and back, no
    program); larger ones by a program per shapes and widths, kept on disk
    (``widen`` and ``grow_bucket`` split by physical sizes, so theirs do not
    depend on the padded dims' logical sizes; ``pad_as``'s do).
    ``on_device``: by the program whatever its size (the host's copy would
    wait for ``arr``'s value)."""
    if arr.nbytes <= HOST_PAD_BYTES and not on_device:
        import jax
        import numpy as np

        values = np.pad(np.asarray(arr).reshape(split), widths).reshape(physical)
        return jax.device_put(values, next(iter(arr.devices())))
    key = (tuple(arr.shape), split, widths, physical)
    fn = _pad_programs.get(key)
    if fn is None:
        def body(a):
            import jax.numpy as jnp

            return jnp.pad(a.reshape(split), widths).reshape(physical)

        if len(_pad_programs) > 512:
            _pad_programs.clear()
        fn = _pad_programs[key] = _program_cache.Kept("pjrt_host.pad", body, key)
    return fn(arr)


def grow_bucket(storage: Any, d: int, physical: int) -> bool:
    """Lay ``storage`` (computed, padded along ``d`` as one component) out
    with ``physical`` places along ``d``: the same values, more padding at
    the end (zeros).  A cache whose join crosses into the next bucket grows
    first, so that the join reads and writes one bucket, as every other
    join of that bucket does, instead of compiling its own program (and the
    segment around it) for the crossing.  False: nothing done."""
    padded = storage.padded
    if padded is None or len(padded[d]) != 1 or storage.pending:
        return False
    (have, n, dynamic), = padded[d]
    arr = storage._array
    if not dynamic or have >= physical or arr is None:
        return False
    axis = d  # (the array has one axis per dim, a merged dim's components in one: ``physical_shape``)
    widths = tuple((0, physical - have) if i == axis else (0, 0) for i in range(arr.ndim))
    # on the device: the host's copy would wait for the cache's value (the
    # step that made it), once per crossing per layer's key and value
    grown = _padded_copy(arr, tuple(arr.shape), widths,
                         tuple(physical if i == axis else size for i, size in enumerate(arr.shape)), on_device=True)
    storage._array = grown
    storage.padded = (*padded[:d], ((physical, n, True),), *padded[d + 1:])
    return True


def widen(arr: Any, padded: tuple, wider: tuple) -> Any:
    """``arr``, laid out as ``padded``, laid out as ``wider``: the same
    components, and dims exact in ``padded`` padded as ``wider`` has them
    (zeros).  Its program depends on the physical shapes and the new
    dims' components only, not on the padded dims' logical sizes."""
    split, widths = [], []
    for p, w in zip(padded, wider):
        for c in (w if p != w else p):
            split.append(c[1] if p != w else c[0])
            widths.append((0, c[0] - c[1]) if p != w else (0, 0))
    return _padded_copy(arr, tuple(split), tuple(widths), physical_shape(wider))


_relaid: set = set()  #: the keys of relayouts made once through the host


def relayout(arr: Any, padded: tuple, target: tuple) -> Any:
    """``arr``, laid out as ``padded``, laid out as ``target``: the same
    components but for the physical sizes of dynamic ones (eager pads a
    length to the bucket above it, where a compiled graph reads a full
    bucket: 32 of 48 places against 32 of 32).  Each component is cut or
    given zeros at its end; the padding's values are not kept (a reader
    fills it as its rule says).  Its program depends on the physical sizes
    only, never on the logical ones.  None when the layouts differ in more
    than that."""
    if len(padded) != len(target):
        return None
    split, cuts, widths = [], [], []
    for p, t in zip(padded, target):
        if len(p) != len(t):
            return None
        for a, b in zip(p, t):
            if a[1:] != b[1:] or (a[0] != b[0] and (not a[2] or b[0] < b[1])):
                return None
            split.append(a[0])
            cuts.append(min(a[0], b[0]))
            widths.append((0, max(b[0] - a[0], 0)))
    physical = physical_shape(target)
    split, cuts, widths = tuple(split), tuple(cuts), tuple(widths)
    key = ("relayout", tuple(arr.shape), split, cuts, widths)
    fn = _pad_programs.get(key)
    if fn is None and arr.nbytes <= HOST_PAD_BYTES and key not in _relaid:
        # a small array's first relayout of these shapes goes through the host
        # (no compile for a one-off: a length that fills its bucket); a second
        # one makes the program, since such a relayout recurs at every call (a
        # compiled decoding step's key/value cache, joined to the room of
        # ``s + 1`` and read back in its new length's bucket), and the host's
        # copy waits for the value each time
        import jax
        import numpy as np

        if len(_relaid) > 512:
            _relaid.clear()
        _relaid.add(key)
        values = np.asarray(arr).reshape(split)[tuple(slice(0, n) for n in cuts)]
        return jax.device_put(np.pad(values, widths).reshape(physical), next(iter(arr.devices())))
    if fn is None:
        def body(a):
            import jax.numpy as jnp

            return jnp.pad(a.reshape(split)[tuple(slice(0, n) for n in cuts)], widths).reshape(physical)

        if len(_pad_programs) > 512:
            _pad_programs.clear()
        fn = _pad_programs[key] = _program_cache.Kept("pjrt_host.relayout", body, key)
    return fn(arr)


def pad_storage(storage: Any, dims: set, odd: bool = False, padding: tuple | None = None) -> bool:
    """Pad ``storage`` (a ``_tensor.Storage``) along ``dims`` to their
    buckets (or as ``padding``, one dim's components): one on one device,
    computed, not padded yet; else nothing (False)."""
    if storage.padded is not None or type(storage.place) is not int or storage._array is None or storage.numel == 0:
        return False
    layout = bucket_layout(storage.shape, dims, odd, padding)
    return layout is not None and pad_storage_as(storage, layout)


def pad_more(storage: Any, dims: set) -> bool:
    """Lay ``storage`` (padded, on one device) out wider along ``dims`` of
    it that are exact, to their buckets; its padded dims as they are.
    False when none was exact."""
    padded = storage.padded
    if padded is None or type(storage.place) is not int or storage._array is None:
        return False
    wider = tuple(((room(n), n, True),) if d in dims and c == ((n, n, False),) and dynamic_ok(n) else c
                  for d, (n, c) in enumerate(zip(storage.shape, padded)))
    if wider == padded:
        return False
    storage._array = widen(storage.computed(), padded, wider)  # (a fused-eager result runs its segment)
    storage.padded = wider
    note("pads")
    return True


def pad_storage_as(storage: Any, padded: tuple) -> bool:
    """Lay ``storage`` (exact, computed, on one device) out as ``padded``
    (per dim its components); False when that is no padding at all."""
    if physical_shape(padded) == storage.shape:
        return False
    storage._array = pad_as(storage.computed(), padded)  # (a fused-eager result runs its segment)
    storage.padded = padded
    noted_padding()
    return True


def bucket_layout(shape: tuple, dims: set, odd: bool = False, padding: tuple | None = None) -> tuple | None:
    """``shape`` padded along ``dims`` to their buckets (or as ``padding``,
    one dim's components), per dim its components; None when that is no
    padding at all (every such dim at its bucket's size)."""
    padded = tuple((padding if padding is not None else ((room(n, odd), n, True),)) if d in dims
                   else ((n, n, False),) for d, n in enumerate(shape))
    return None if physical_shape(padded) == tuple(shape) else padded


def host_padded(values: Any, padded: tuple) -> Any:
    """Numpy array ``values`` (exact) laid out as ``padded`` on the host
    (its padding zeros): a host tensor padded on its way to the device,
    with no program and no copy back."""
    import numpy as np

    split, widths, physical = pad_layout(padded)
    return np.pad(values.reshape(split), widths).reshape(physical)


def noted_padding() -> None:
    """Count a storage laid out padded (``stats()['pads']``)."""
    note("pads")
    global live
    live = True


_counts: collections.Counter = collections.Counter()
#: op -> how many padded inputs it cut (an op without a padded rule)
_cut_by: collections.Counter = collections.Counter()
#: "op: reason" -> padded calls that ran exact instead
_fallbacks: collections.Counter = collections.Counter()
#: bucketed shape -> calls of padded programs on it
_buckets: collections.Counter = collections.Counter()


def note(event: str, amount: int = 1) -> None:
    _counts[event] += amount


def note_cut(who: str) -> None:
    _counts["cuts"] += 1
    _cut_by[who] += 1


def note_fallback(who: str, why: str) -> None:
    _counts["fallbacks"] += 1
    _fallbacks[f"{who}: {why}"] += 1


def note_padded_call(physical: tuple, logical: tuple) -> None:
    _counts["padded_calls"] += 1
    _counts["physical_elements"] += math.prod(physical)
    _counts["logical_elements"] += math.prod(logical)
    _buckets[physical] += 1


#: The padded shapes of the inputs padded calls read, by logical shape
#: (the latest): what a backward's expand of that shape is read wider to
#: (``_dynamic_dims.on_miss``).  Autograd's gradient of a sum or a mean is
#: the forward input's size expanded, and the forward input was padded
#: along its dynamic dims, or not at all.
_read_padded: dict[tuple, tuple] = {}


def note_padded_read(physical: tuple, logical: tuple) -> None:
    """A padded call read a tensor of ``logical`` shape as ``physical``."""
    if _read_padded.get(logical) != physical:
        if len(_read_padded) > 4096:
            _read_padded.clear()
        _read_padded[logical] = physical


def padded_read_of(logical: tuple) -> tuple | None:
    """The physical shape the latest padded call that read a tensor of
    ``logical`` shape read it as (:func:`note_padded_read`); None if none."""
    return _read_padded.get(logical)


def counts() -> dict[str, Any]:
    """What ``torch.jax.dynamic_shape_stats()`` returns."""
    result: dict[str, Any] = {k: _counts.get(k, 0) for k in
                              ("padded_calls", "pads", "padded_writes", "cuts", "fallbacks", "physical_elements",
                               "logical_elements", "graph_programs")}
    logical = result["logical_elements"]
    result["padding_overhead"] = (result["physical_elements"] / logical - 1.0) if logical else 0.0
    result["cuts_by_op"] = dict(_cut_by.most_common())
    result["fallbacks_by_reason"] = dict(_fallbacks.most_common())
    result["calls_by_bucket"] = {"x".join(map(str, k)): v for k, v in _buckets.most_common(32)}
    return result


def reset() -> None:
    _counts.clear()
    _relaid.clear()
    _read_padded.clear()
    _cut_by.clear()
    _fallbacks.clear()
    _buckets.clear()
