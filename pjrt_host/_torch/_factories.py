"""Tensors made from nothing on the 'jax' device: ``torch.zeros(...,
device='jax')``, ``torch.randn``, ``torch.arange`` ...: the storage side of
the factory lowerings (``_lowerings.ops_factories``, which compiled graphs
run too).

torch's meta kernel of the factory gives the result's shape and dtype (and
its errors for bad arguments); the values are the factory's lowering, one
compiled function per factory and static arguments, placed directly on the
target device.  Random factories draw from the device's random state;
small ones (``Lowering.per_element``) in power-of-two buckets.  ``empty``
is made lazily.  A factory without a lowering is computed on torch CPU and
moved (one copy), which is exact for every factory torch has.

``_kernels.FACTORY_OPS`` names the overloads that get a device kernel (it
cannot read the lowering table: registration runs inside ``import torch``
and must not import jax); tests/test_torch_factories.py keeps the two equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading
from typing import Any, Iterator

import jax
import numpy as np
import torch

from .. import _lowerings, _program_cache
from .._lowerings._dtypes import dtype_name, jax_dtype
from . import _config, _fused, _memory, _meta, _padding, _rng
from ._conversion import to_jax_array
from ._devices import DEVICE_NAME, device_index, jax_device, sharding
from ._dtype_policy import device_dtype
from ._signatures import HostLane, Traceable, scalar_key
from ._lowering_context import lowering_context
from ._sync import note_result
from ._tensor import Storage, contiguous_strides, make, new_tensor, result_tensor, view_for, wrap_array

__all__ = ["bucket", "factory_lowering", "run", "run_factory"]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- running them

_compiled: dict[Any, Any] = {}


def _target_index(kwargs: dict) -> int:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != DEVICE_NAME:
        raise RuntimeError(f"pjrt_host: factory reached the '{DEVICE_NAME}' device with device={device}")
    return device_index(device)


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, (bool, int, float, complex)):
        return scalar_key(type(v), v)  # (-0.0 apart from 0.0, one NaN: the engine's rule)
    return v


#: (op, its arguments, torch's default dtype) -> the meta kernel's result:
#: torch's meta ``arange`` is Python (its reference and out= wrapper), 54 us
#: of a 97 us ``torch.arange(5, 17, device='jax')``, called per token by
#: transformers' ``generate()``.  The tensors are only read (shape, dtype,
#: strides, size).
_metas: dict = {}


def _meta_result(op: Any, args: tuple, meta_kwargs: dict) -> torch.Tensor:
    """``op(*args, **meta_kwargs)`` on the meta device, made once per call
    of the same (typed) arguments; calls with a tensor argument are not
    kept (their values are not in the key)."""
    if any(isinstance(v, torch.Tensor) for v in (*args, *meta_kwargs.values())):
        return op(*args, **meta_kwargs)
    try:
        key = (op, _freeze(args), _freeze(tuple(sorted(meta_kwargs.items()))), torch.get_default_dtype())
        found = _metas.get(key)
    except TypeError:  # an unhashable argument
        return op(*args, **meta_kwargs)
    if found is None:
        found = op(*args, **meta_kwargs)
        if len(_metas) > 4096:  # sizes that never repeat: bound the memory
            _metas.clear()
        _metas[key] = found
    return found


def run_factory(op: Any, name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The device kernel of the factory overload ``op``, named ``name``
    ("arange.start")."""
    try:
        return _run_factory(op, name, args, kwargs)
    except (MemoryError, RuntimeError) as err:
        oom = _memory.as_out_of_memory(err, f"aten::{name}", (), kwargs)
        if oom is None:
            raise
        raise oom from err


def _run_factory(op: Any, name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    if _fused.replaying:
        # fused eager replays a script: the factory it recorded here, if this is it
        replayed = _fused.replay(op, args, kwargs)
        if replayed is not None:
            return replayed
    index = _target_index(kwargs)
    meta_kwargs = dict(kwargs, device="meta")
    meta_kwargs.pop("pin_memory", None)
    if "generator" in meta_kwargs:
        meta_kwargs["generator"] = None  # the meta kernel needs no random state
    try:
        meta = _meta_result(op, args, meta_kwargs)
    except Exception as err:
        _meta.check_cpu_factory(op, args, kwargs)  # CPU's own refusal first, where its kernel refuses
        known = _meta.kernel_error(err)
        if known is not None:
            raise known from None
        raise
    dtype = device_dtype(meta.dtype)
    shape = tuple(meta.shape)
    if name.startswith("empty"):
        # Made lazily (zeros on first use): a size the device can never hold
        # fails here, as it would on cuda, not at some later op.
        _memory.check_fits(math.prod(shape) * meta.element_size(), index, f"aten::{name}")
        stride = tuple(meta.stride())
        asked = args[1] if name == "empty_strided" and len(args) > 1 else kwargs.get("stride", ())
        if any(s < 0 for s in asked):  # the meta kernel makes other strides; CPU's refuses (its storage overflows)
            op(*args, **dict({k: v for k, v in kwargs.items() if k != "pin_memory"}, device="cpu"))
        if math.prod(shape) > 1 and stride != contiguous_strides(shape):
            return _strided_empty(meta, dtype, index)
        return new_tensor(shape, dtype, index)
    lowering = factory_lowering(op)
    if lowering is None or any(isinstance(a, torch.Tensor) for a in args):
        return _on_cpu(op, args, kwargs, index)
    numel = math.prod(shape)
    drawn = shape
    padded = None
    if lowering.per_element and 0 < numel <= _BUCKETED:
        drawn = (bucket(numel),)
    elif name in _SIZED and shape and _config.current().dynamic_shapes is True:
        padded = _padded_layout(name, shape)
        if padded is not None:
            drawn = _padding.physical_shape(padded)
    try:  # a bucketed or padded result is keyed without its size
        key = (name, _freeze(args if drawn == shape else _unsized(name, args)), dtype, drawn, index)
        fn = _compiled.get(key)
    except TypeError:
        key, fn = None, None
    if name == "full" and key is not None:
        base = (name, _freeze(args[:1]) if drawn == shape else (), dtype, drawn, index)  # (the key but the value)
        fill = _varying_fill(args, dtype, base)
        if fill is not None:
            torch.full((2,), fill, dtype=dtype)  # CPU's check of the value (see _of_a_varying_value)
            return _of_a_varying_value(op, base, lowering, args, 1, kwargs, dtype, shape, drawn, padded, index)
    if name in ("arange.start", "arange.start_step") and key is not None and drawn == shape:
        step = args[2] if len(args) > 2 else 1
        base = (name, ("run-time start", step, len(args)), dtype, drawn, index)  # (n, in drawn: the key but the start)
        if _varying_start(args, kwargs, step, dtype, base):
            return _of_a_varying_value(op, base, lowering, args, 0, kwargs, dtype, shape, drawn, None, index)
    if name == "zeros" and padded is None and fn is None and key is not None and len(shape) == 1 \
            and _once_in_a_backward(key, numel, meta):
        # a backward's flat zeros of a size with no program yet (autograd's
        # ``as_strided`` backward makes one of its gradient's size, which the
        # padded gradient then takes all of, at every new batch): zeros on
        # first use, from the host, as ``empty``'s; a second call of the size
        # makes the program (as ``_padding.relayout`` does)
        return new_tensor(shape, dtype, index)
    if (key is not None and not lowering.needs_rng and (drawn == shape or padded is not None)
            and _config.current().eager == "fused"):
        recorded = _recorded(op, key, name, lowering, args, kwargs, dtype, shape, drawn, padded, index)
        if recorded is not None:
            return recorded
    draw = _rng.next_key_args(index, kwargs.get("generator")) if lowering.needs_rng else ()
    if fn is None:
        _meta.check_cpu_factory(op, args, kwargs)  # once per signature: CPU's kernel refusals
        fn = _compile(name, lowering, args, kwargs, jax_dtype(dtype), drawn, index)
        if key is not None:
            # compiled for this call (from disk, untraced, when made before)
            fn = _compiled[key] = _program_cache.compiled(f"aten::{name}", _disk_signature(key, kwargs, lowering), fn,
                                                          draw, jax_device(index))
    arr = fn(*draw)
    if padded is None and drawn != shape and _config.current().dynamic_shapes is True:
        # a bucketed draw of a changing size: its elements placed padded
        # (each at its logical flat index, the numbers an exact draw gives),
        # one program per bucket instead of a cut per shape
        padded = _padded_layout(name, shape)
        if padded is not None:
            arr = _placed(arr, padded, index)
    if padded is not None:
        note_result(index, arr)
        return result_tensor(arr, shape, dtype, index, None, padded)
    if drawn != shape:
        arr = _cut(arr, shape, index)
    return wrap_array(arr, index, dtype)


#: ``full``'s fill values (``arange``'s starts) seen per key without them
#: and place (the line that called it: generate() makes ``full((1,),
#: False)`` at one line and ``full((1,), True)`` at another, each a constant
#: there; keyed by the shape alone, both became run-time arguments at the
#: second call, and every segment holding one compiled again) (at most two):
#: one that took a second takes it at run time from then on.
_fills: dict[tuple, set] = {}
#: The dtypes a run-time fill is made in (converted on the host, by numpy,
#: as torch converts it; half and bfloat16 keep their value static).
_TRACED_FILL_DTYPES = (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                       torch.uint8, torch.bool)


def _varying_fill(args: tuple, dtype: torch.dtype, base: tuple) -> Any:
    """``full``'s fill value when it is to be a run-time argument: a bool,
    int or float, of a call whose other arguments took another fill value
    before (a sampling loop's ``torch.full((b,), t)`` per step: a program
    per value, and under fused eager the segment of every op after it,
    compiled again at each step).  None: it stays static."""
    fill = args[1] if len(args) > 1 else None
    if type(fill) not in (bool, int, float) or dtype not in _TRACED_FILL_DTYPES:
        return None
    if type(fill) is int and not -(1 << 63) <= fill < (1 << 63):
        return None
    if type(fill) is float and not dtype.is_floating_point:
        return None  # (a float made an integer: torch's conversion of NaN or of what overflows is its own)
    if type(fill) is bool and dtype == torch.bool:
        # a flag has two values, and a line that makes one usually makes
        # both in time (generate()'s max-length criterion: False at every
        # token, True at the last): at run time from the first call, so that
        # the segments holding it do not compile again at the first True
        return fill
    return fill if _took_another((*base, type(fill), _padding.caller()), scalar_key(type(fill), fill)) else None


def _varying_start(args: tuple, kwargs: dict, step: Any, dtype: torch.dtype, base: tuple) -> bool:
    """Whether ``arange(start, end[, step])``'s start is to be a run-time
    argument: integers, an int64 result, and a call of the same length
    and step that took another start before (a decoding loop's position
    ids, ``arange(past, past + 1)``: a program per token).  The lowering
    computes ``start + i * step`` in the program either way."""
    start = args[0]
    if type(start) is not int or type(args[1]) is not int or type(step) is not int or "step" in kwargs \
            or dtype != torch.int64 or not -(1 << 62) < start < (1 << 62):
        return False
    return _took_another((*base, _padding.caller()), start)


def _took_another(key: tuple, value: Any) -> bool:
    """Note ``value`` for the call ``key`` (a factory's key without it):
    whether the call has taken two values (:data:`_fills`)."""
    seen = _fills.get(key)
    if seen is None:
        if len(_fills) > 4096:
            _fills.clear()
        seen = _fills[key] = set()
    if len(seen) < 2:
        seen.add(value)
    return len(seen) >= 2


def _of_a_varying_value(op: Any, base: tuple, lowering: Any, args: tuple, at: int, kwargs: dict,
                        dtype: torch.dtype, shape: tuple, drawn: tuple, padded: tuple | None,
                        index: int) -> torch.Tensor:
    """A factory with its argument at ``at`` (``full``'s value,
    ``arange``'s start) a run-time argument of its program: one program
    per shape and dtype, recorded into the segment under fused eager (the
    value an input of its program), else run on its own.  (A program made
    once no longer makes CPU's checks of the value: ``full``'s caller runs
    it, ``full((2,), 1e300, dtype=float32)`` does not fit.)"""
    name = base[0]
    given = args[at]
    key = (*base, ("run-time argument", at, type(given).__name__))
    # made in the dtype here, as torch converts it (a program's conversion
    # flushed a float32 subnormal, 1e-45, to zero): the program broadcasts it
    if type(given) is bool:  # (made once on the device: a flag is passed at every call)
        value = _device_flag(given, index)
    else:
        value = np.asarray(given, dtype=jax_dtype(dtype) if name == "full" else np.int64)
    jdtype = jax_dtype(dtype)
    ctx = lowering_context(_config.current(), True)

    def body(v):
        return _lowerings.invoke(lowering, (*args[:at], v, *args[at + 1:]), kwargs, ctx, jdtype, drawn)

    body.__name__ = body.__qualname__ = f"aten.{name}"
    if _config.current().eager == "fused":
        _memory.check_fits(math.prod(drawn) * dtype.itemsize, index, f"aten::{name}")

        def make() -> tuple:
            _meta.check_cpu_factory(op, args, kwargs)
            return body, _program_cache.jit(body, out_shardings=sharding(index))

        traceable = _fused.host_op(_traceables, f"aten::{name}", key, make,
                                   _disk_signature(key, kwargs, lowering) if _program_cache.directory() else None)
        plan = _meta.OutputPlan("single", (_meta.OutputSpec("tensor", shape, dtype),))
        recorded = _fused.record(traceable, [value], plan, index, index,
                                 padded=None if padded is None else [(shape, drawn, padded)])
        if recorded is not None:
            if padded is None and type(given) is bool and dtype == torch.bool:
                # (a flag: no value check to make at a later call)
                FactoryLane.of(traceable, op, key, shape, dtype, index, at).accept(args, kwargs)
            return recorded
    fn = _compiled.get(key)
    if fn is None:
        _meta.check_cpu_factory(op, args, kwargs)
        fn = _compiled[key] = _program_cache.compiled(f"aten::{name}", _disk_signature(key, kwargs, lowering),
                                                      _program_cache.jit(body, out_shardings=sharding(index)), (value,),
                                                      jax_device(index))
    arr = fn(value)
    if padded is not None:
        note_result(index, arr)
        return result_tensor(arr, shape, dtype, index, None, padded)
    return wrap_array(arr, index, dtype)


_flags: dict = {}


def _device_flag(value: bool, index: int) -> Any:
    """``value`` as a bool array on device ``index``, made once."""
    found = _flags.get((value, index))
    if found is None:
        found = _flags[(value, index)] = jax.device_put(np.bool_(value), jax_device(index))
        _fused.unshared.add(id(found))  # (kept for the process: its id stays its own)
    return found


#: Factories whose value at a position does not depend on the result's
#: size (the lowering reads only the shape it is given), and the position
#: of the argument that sets the size where it is not the size list.
_SIZED = {"zeros": None, "ones": None, "full": None, "arange": 0, "arange.start": 1, "arange.start_step": 1}


_local = threading.local()


@contextlib.contextmanager
def shaped_after_a_tensor() -> Iterator[None]:
    """Factories made here take their sizes from a tensor (``zeros_like``:
    an optimizer's state, one line making every parameter's): their
    sizes changing at a line says nothing of a length, so they are never
    padded by :func:`_padded_layout`."""
    before = getattr(_local, "after_a_tensor", False)
    _local.after_a_tensor = True
    try:
        yield
    finally:
        _local.after_a_tensor = before


@contextlib.contextmanager
def at_physical_shape() -> Iterator[None]:
    """Factories made here make the physical values of a padded tensor
    (``_storage_ops._padded_like``: a ``zeros_like`` of one, its bucket's
    shape given): exact at the sizes given, never padded again -- not even
    inside a backward, where a padded read of that shape noted earlier
    would pad them (a ``zeros_like`` of a padded gradient then held an
    array of twice its bucket, and the next op that cut it failed)."""
    before = getattr(_local, "physical", False)
    _local.physical = True
    try:
        yield
    finally:
        _local.physical = before


def _padded_layout(name: str, shape: tuple) -> tuple | None:
    """A factory whose result's dims took a third size at its place (the
    line that called it: position ids' ``arange(t)``, a mask's ``ones(t,
    t)``) makes its result padded along them, to their buckets, as an op's
    dynamic inputs are (``_dynamic_dims.on_miss``): one program per bucket
    instead of one per length, and the ops after it read it padded.  None:
    none did."""
    if getattr(_local, "physical", False):
        return None
    lengths = _padding.factory_lengths()
    if not lengths and _meta.inside_backward():
        # autograd's thread has no user frame, so sizes counted at a place
        # would pool every backward's; a backward's zeros of its forward
        # input's shape (``new_zeros``: index's gradient is put into them)
        # are padded as a padded call last read a tensor of that shape, as
        # its expands are (``_dynamic_dims.on_miss``), else exact
        # (only in the buckets this setting pads to: a read noted under another
        # setting -- the test mode's odd buckets -- gave a zeros that the
        # tensors it met could not line up with, and a program failed)
        physical = _padding.padded_read_of(tuple(shape))
        odd = _config.current().dynamic_shapes == "all"
        if physical is None or len(physical) != len(shape) or all(p == n for p, n in zip(physical, shape)) \
                or any(p != n and p != _padding.room(n, odd) for p, n in zip(physical, shape)):
            return None
        _padding.live = True
        return tuple(((p, n, True),) if p != n else ((n, n, False),) for p, n in zip(physical, shape))
    if getattr(_local, "after_a_tensor", False):
        return None
    if lengths and any(n in lengths for n in shape):
        _padding.live = True
        return tuple(((lengths[n], n, True),) if n in lengths else ((n, n, False),) for n in shape)
    dims = _padding.changing_dims(("factory", name, _padding.caller()), shape)
    if not dims:
        return None
    _padding.live = True  # (the ops' padded route is looked at from now on)
    return tuple(((_padding.room(n), n, True),) if d in dims else ((n, n, False),) for d, n in enumerate(shape))


#: Keys of backward zeros made lazily once (:func:`_once_in_a_backward`).
_lazy_zeros: set = set()


def _once_in_a_backward(key: tuple, numel: int, meta: Any) -> bool:
    """Whether a flat zeros of ``key`` (no program yet) is made lazily:
    inside a backward, with dynamic shapes on, small, and its key's first
    time."""
    if not _config.current().dynamic_shapes or not _meta.inside_backward() \
            or numel * meta.element_size() > _padding.HOST_PAD_BYTES or key in _lazy_zeros:
        return False
    if len(_lazy_zeros) > 4096:
        _lazy_zeros.clear()
    _lazy_zeros.add(key)
    return True


def _unsized(name: str, args: tuple) -> tuple:
    """``args`` without what sets the result's size (its size list, or
    ``arange``'s end), which a bucketed or padded result is not keyed by."""
    at = _SIZED.get(name)
    return tuple(a for i, a in enumerate(args) if i != at and not isinstance(a, (list, tuple)))


def factory_lowering(op: Any) -> Any:
    """The factory lowering of ``op`` (an overload), or None."""
    found = _lowerings.lookup(op)
    return found if found is not None and found.factory else None


def _disk_signature(key: tuple, kwargs: dict, lowering: Any) -> tuple:
    """What the program cache keeps a factory's program (and what it found
    out about it) under on disk."""
    return (key, sorted((k, "GENERATOR" if k == "generator" else v) for k, v in kwargs.items()), lowering.where,
            lowering_context(_config.current(), True))


_traceables: dict[Any, Traceable] = {}


def _recorded(op: Any, key: tuple, name: str, lowering: Any, args: tuple, kwargs: dict, dtype: torch.dtype,
              shape: tuple, drawn: tuple, padded: tuple | None, index: int) -> torch.Tensor | None:
    """Fused eager: a factory that draws nothing recorded into the thread's
    segment as an op without inputs (its result pending), so that a mask's
    ``ones`` or the position ids' ``arange`` is made inside the program of
    the ops that read it instead of by a program call of its own (a GPT-2
    ``generate()`` made 238 such calls per call).  None: it runs now."""
    # a size the device can never hold fails at the call, as the factory's
    # own program (and cuda) fails there, not at the read that runs the segment
    _memory.check_fits(math.prod(drawn) * dtype.itemsize, index, f"aten::{name}")
    def make() -> tuple:
        _meta.check_cpu_factory(op, args, kwargs)  # once per signature: CPU's kernel refusals
        body = _body(name, lowering, args, kwargs, jax_dtype(dtype), drawn)
        return body, _program_cache.jit(body, out_shardings=sharding(index))

    op_traceable = _traceables.get(key)
    if op_traceable is None:
        op_traceable = _fused.host_op(_traceables, f"aten::{name}", key, make,
                                      _disk_signature(key, kwargs, lowering) if _program_cache.directory() else None)
    plan = _meta.OutputPlan("single", (_meta.OutputSpec("tensor", shape, dtype),))
    recorded = _fused.record(op_traceable, [], plan, index, index,
                             padded=None if padded is None else [(shape, drawn, padded)])
    if recorded is not None and padded is None:
        FactoryLane.of(op_traceable, op, key, shape, dtype, index).accept(args, kwargs)
    return recorded


class FactoryLane(HostLane):
    """Fused eager's replay lane of a factory recorded into a script (the
    ``arange``, ``full`` and scalar tensors ``generate()`` makes every
    token): a later call at that place in the script with the same typed
    arguments, under the same default dtype, is recorded again without the
    meta kernel, the key or the padding bookkeeping (one program for the
    same arguments: their key is the recorded op's).  Exact results only;
    inside :func:`_padding.sized_after_padded` (where a factory may be
    padded at once) and for any other arguments the call takes the
    factory's own way.  ``at``: the position of a bool flag ``full`` takes
    at run time (:func:`_of_a_varying_value`), any bool there."""

    __slots__ = ("forms", "shape", "at")

    def __init__(self, func: Any, key: tuple, shape: tuple, dtype: torch.dtype, place: int,
                 at: int | None = None) -> None:
        super().__init__(func, key, place, shape, dtype)
        self.shape, self.at = shape, at
        #: the typed arguments of the calls recorded with this op: each
        #: spelling of one call (``device='jax'`` or ``x.device``, a dtype
        #: given or not) that the factory's way keyed alike (bounded)
        self.forms: set = set()

    def accept(self, args: tuple, kwargs: dict) -> None:
        """Note a call the factory's way recorded as this lane's op: its
        later calls of the same typed arguments take the lane."""
        typed = self._typed(self._fixed(args), kwargs)
        if typed is not None and len(self.forms) < 16:
            self.forms.add(typed)

    @staticmethod
    def _typed(args: tuple, kwargs: dict) -> tuple | None:
        """The call's arguments with their types (1, True and 1.0 apart),
        and torch's default dtype; None for an argument that is no plain
        value."""
        try:
            typed = (_freeze(args), _freeze(tuple(sorted(kwargs.items()))) if kwargs else (),
                     torch.get_default_dtype())
            hash(typed)
        except TypeError:
            return None
        if any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
            return None
        return typed

    def _fixed(self, args: tuple) -> tuple:
        """``args`` with the run-time flag's place marked, not its value."""
        at = self.at
        if at is None or len(args) <= at:
            return args
        return (*args[:at], ("run-time flag", type(args[at]) is bool), *args[at + 1:])

    def match(self, args: tuple, kwargs: dict, dyn: list, place: int) -> tuple | None:
        """``(((shape, shape, None),), None)`` when the call is the one
        recorded (its flag, if any, appended to ``dyn`` as the factory's
        way passes it), None when not."""
        if _padding.factory_lengths() is not None or self._typed(self._fixed(args), kwargs) not in self.forms:
            return None
        if self.at is not None:
            dyn.append(_device_flag(args[self.at], place))
        return ((self.shape, self.shape, None),), None

    def engine_key(self, args: tuple, kwargs: dict, cfg: Any, results: tuple) -> tuple:
        """The recorded key after checking the factory's meta kernel gives
        the call the lane's shape and dtype (``PJRT_HOST_CHECK_REPLAY``)."""
        meta_kwargs = dict(kwargs, device="meta")
        meta_kwargs.pop("pin_memory", None)
        meta = _meta_result(self.func, args, meta_kwargs)
        if tuple(meta.shape) != self.shape or device_dtype(meta.dtype) != self.outputs[0][1]:
            raise AssertionError(f"pjrt_host: fused eager's replay lane took a call of {self.func} as the one "
                                 f"recorded, but its result is {tuple(meta.shape)} {meta.dtype}")
        if tuple(results) != ((self.shape, self.shape, None),):
            raise AssertionError(f"pjrt_host: fused eager's replay lane gave a factory the layout {results}")
        return self.key, [] if self.at is None else [_device_flag(args[self.at], self.place)]


def _body(name: str, lowering: Any, args: tuple, kwargs: dict, dtype: Any, shape: tuple) -> Any:
    """The factory's traceable function of nothing (its arguments static)."""
    ctx = lowering_context(_config.current(), True)  # a factory makes its tensor on one device

    def body():
        return _lowerings.invoke(lowering, args, kwargs, ctx, dtype, shape)

    body.__name__ = body.__qualname__ = f"aten.{name}"  # what jax's compile logs and events name
    return body


def _compile(name: str, lowering: Any, args: tuple, kwargs: dict, dtype: Any, shape: tuple, index: int) -> Any:
    """The factory's lowering jitted on the target device, its arguments
    static (what the key in ``_compiled`` holds)."""
    if not lowering.needs_rng:
        return _program_cache.jit(_body(name, lowering, args, kwargs, dtype, shape), out_shardings=sharding(index))
    ctx = lowering_context(_config.current(), True)  # a factory makes its tensor on one device

    def body(key_data, counter):
        key = _rng.draw_key(key_data, counter)
        return _lowerings.invoke(lowering, args, kwargs, dataclasses.replace(ctx, rng_key=key), dtype, shape)

    body.__name__ = body.__qualname__ = f"aten.{name}"  # what jax's compile logs and events name
    return _program_cache.jit(body, out_shardings=sharding(index))


#: Random factories and in-place draws made element by element
#: (``Lowering.per_element``: ``rand``, ``uniform_``, ``normal_`` ...) of at
#: most this many elements are drawn in power-of-two buckets, so a program
#: compiles per bucket, not per shape (a random program takes XLA about
#: 0.5 s to compile on a CPU).
_BUCKETED = 1 << 16


def bucket(numel: int) -> int | None:
    """The power-of-two bucket a draw of ``numel`` elements is made in
    (None: drawn at its own size)."""
    return max(16, 1 << (numel - 1).bit_length()) if 0 < numel <= _BUCKETED else None


_cuts: dict[tuple, Any] = {}


def _cut(flat: Any, shape: tuple[int, ...], index: int) -> Any:
    """The first elements of a bucketed draw ``flat`` in ``shape``: one
    small program per bucket and shape, kept like the ops' (a warm process
    cuts without tracing)."""
    fn = _cuts.get(shape)
    if fn is None:
        if len(_cuts) > 1024:  # shapes that never repeat: bound the memory
            _cuts.clear()
        fn = _cuts[shape] = _program_cache.Kept("pjrt_host.cut", functools.partial(_first_elements, shape=shape),
                                                shape)
    return fn(flat)


_placings: dict[tuple, Any] = {}


def _placed(flat: Any, padded: tuple, index: int) -> Any:
    """A bucketed draw ``flat`` laid out as ``padded`` (per dim its
    components): each logical element is the one of its logical flat index,
    the padding any of them.  One program per bucket and layout, the
    logical sizes passed at run time."""
    physical = _padding.physical_shape(padded)
    comps = tuple(tuple((c[0], c[2]) for c in dim) for dim in padded)
    key = (tuple(flat.shape), dtype_name(flat.dtype), physical, comps)
    fn = _placings.get(key)
    if fn is None:
        if len(_placings) > 256:
            _placings.clear()

        def body(flat: Any, *sizes: Any) -> Any:
            import jax.numpy as jnp

            at = _padding.positions(physical, comps, sizes)
            return flat[jnp.minimum(at, flat.shape[0] - 1)]

        fn = _placings[key] = _program_cache.Kept("pjrt_host.placed_draw", body, key[1:])
    sizes = [_padding.device_scalar(c[1], index) for dim in padded for c in dim if c[2]]
    return fn(flat, *sizes)


def _strided_empty(meta: torch.Tensor, dtype: torch.dtype, index: int) -> torch.Tensor:
    """An uninitialised tensor with the strides torch gives it (``meta``'s:
    ``empty_strided``, ``empty(memory_format=torch.channels_last)``), as a
    view of a storage that holds it in that order: an ``as_strided`` of it,
    or of a copy into it, reads the elements it reads on CPU."""
    size, stride = tuple(meta.shape), tuple(meta.stride())
    dims = sorted(range(len(size)), key=lambda d: (-stride[d], d))
    held = tuple(size[d] for d in dims)
    if tuple(stride[d] for d in dims) != contiguous_strides(held):
        held = (meta.untyped_storage().nbytes() // meta.element_size(),)  # gaps or overlaps: the storage flat
    storage = Storage(None, held, jax_dtype(dtype), index)
    return make(storage, size, dtype, stride, 0, view_for(storage, size, stride, 0))


def _first_elements(flat: Any, shape: tuple[int, ...]) -> Any:
    return flat[:math.prod(shape)].reshape(shape)


def _on_cpu(op: Any, args: tuple, kwargs: dict, index: int) -> torch.Tensor:
    cpu_kwargs = dict(kwargs, device="cpu")
    cpu_kwargs.pop("pin_memory", None)
    out = op(*args, **cpu_kwargs)
    if isinstance(out, torch.Tensor):
        dtype = device_dtype(out.dtype)
        return wrap_array(to_jax_array(out, index, dtype), index, dtype)
    return out


def run(op: Any, args: tuple, kwargs: dict) -> Any:
    """The device-key fallback: any factory without a kernel of its own."""
    name = op.name().split("::", 1)[1] if hasattr(op, "name") else str(op)
    if name in ("empty.memory_format", "empty_strided"):
        return run_factory(op, name, args, kwargs)
    index = _target_index(kwargs)
    logger.debug("factory %s computed on torch CPU and moved to the device", name)
    try:
        return _on_cpu(op, args, kwargs, index)
    except (MemoryError, RuntimeError) as err:
        oom = _memory.as_out_of_memory(err, f"aten::{name}", (), kwargs, index)
        if oom is None:
            raise
        raise oom from err
