"""Argument values torch's CPU kernels refuse, refused on the device too.

A compiled program cannot raise, so without these checks a bad value gives
a result where CPU raises: ``torch.multinomial`` of a negative or NaN
probability draws anyway, ``one_hot`` of a negative class gives a zero row.
Per checked op, one small compiled program computes a verdict code on the
device; it is read at the next synchronisation point (``.item()``,
``.cpu()``, printing, ``torch.jax.synchronize()``), or at the op itself with
``pjrt_host.config(checks='sync')``; ``checks=False`` turns
these off with the index checks (the same switch: both are torch's
device-side asserts).  Errors are CPU's type and text, followed by the op
and when it was found.

The same checks run inside compiled graphs (``torch.compile(backend='jax')``,
``call_torch``): :func:`sites` reads an op's checks from the graph's fake
tensors, and the program computes each verdict code itself beside its
results (``_compile._checks``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import torch

from .. import _program_cache
from .._lowerings._util import index_of_max
from .._jax_settings import x64_scope
from ._sync import defer_check
from ._tensor import JaxTensor, read

__all__ = ["checker_for", "one_hot_classes", "sites"]

_local = threading.local()  # .collect: a list while :func:`sites` reads an op's checks (graph form)


class _Check:
    """``verdict(array, *static) -> int32 code`` (0: fine), and per code
    CPU's exception."""

    __slots__ = ("verdict", "errors", "_jitted")

    def __init__(self, verdict: Callable[..., Any], errors: dict[int, tuple[type, str]]) -> None:
        self.verdict = verdict
        self.errors = errors
        self._jitted: dict[tuple, Any] = {}

    def error(self, code: int) -> tuple[type, str]:
        """The exception type and text of a verdict code: a code past the
        listed ones takes the last listed; a text with ``{}`` has the code
        put in (Cholesky's order of the failing minor)."""
        exc, text = self.errors.get(code) or self.errors[max(self.errors)]
        return exc, text.format(code) if "{}" in text else text

    def code(self, array: Any, *static: Any) -> Any:
        fn = self._jitted.get(static)
        if fn is None:  # kept like the ops' programs: a warm process checks without tracing
            fn = self._jitted[static] = _program_cache.Kept(
                "pjrt_host.value_check", lambda a: self.verdict(a, *static).astype(jnp.int32),
                (repr(self.errors), static))
        return fn(array)


def _probabilities(p: Any) -> Any:
    bad = ~jnp.isfinite(p) | (p < 0)
    empty = jnp.sum(jnp.where(bad, 0, p), axis=-1) <= 0
    return jnp.where(bad.any(), 1, jnp.where(empty.any(), 2, 0))


_MULTINOMIAL = _Check(_probabilities, {
    1: (RuntimeError, "probability tensor contains either `inf`, `nan` or element < 0"),
    2: (RuntimeError, "invalid multinomial distribution (sum of probabilities <= 0)"),
})


def _classes(x: Any, num_classes: int) -> Any:
    negative = (x < 0).any()
    too_big = (x >= num_classes).any() if num_classes >= 0 else False
    return jnp.where(negative, 1, jnp.where(too_big, 2, 0))


_ONE_HOT = _Check(_classes, {
    1: (RuntimeError, "Class values must be non-negative."),
    2: (RuntimeError, "Class values must be smaller than num_classes."),
})


def _false(cond: Any) -> Any:
    return jnp.where(jnp.all(cond != 0), 0, 1)


_ASSERT = _Check(_false, {1: (RuntimeError, "Expected Tensor with single nonzero value, but got zero")})


def _outside(lo: float, hi: float) -> Callable[[Any], Any]:
    """A verdict: 1 where any element is outside [lo, hi] (NaN included)."""
    def verdict(a: Any) -> Any:
        return jnp.where(jnp.any(~((a >= lo) & (a <= hi))), 1, 0)

    return verdict


def _any_nan(a: Any) -> Any:
    return jnp.where(jnp.any(jnp.isnan(a)), 1, 0)


def _triangle_nan(a: Any, upper: bool) -> Any:
    """1 where the triangle an eigh reads holds a NaN."""
    half = jnp.triu(a) if upper else jnp.tril(a)
    return jnp.where(jnp.any(jnp.isnan(half)), 1, 0)


def _cholesky_order(a: Any, upper: bool) -> Any:
    """LAPACK potrf's info (0, or the order of the first leading minor that
    is not positive-definite) of any matrix of the batch."""
    from .._lowerings.ops_linalg import cholesky_ex

    info = cholesky_ex(a, upper=upper)[1]
    return jnp.max(info) if info.size else jnp.int32(0)


# torch CPU's kernels read these values (torch's cuda kernels assert on them
# on the device, or read them back and check as CPU does).
_LINALG_ERROR = torch.linalg.LinAlgError
_SVD = _Check(_any_nan, {1: (_LINALG_ERROR, "linalg.svd: The algorithm failed to converge because the input matrix "
                                            "contained non-finite values.")})
# NaN only: torch.linalg.eigvals of a tensor subclass reaches the device as
# linalg_eig, and CPU's eigvals takes an infinite entry (eig refuses it).
_EIGH = _Check(_triangle_nan, {1: (_LINALG_ERROR, "linalg.eigh: The algorithm failed to converge because the input "
                                                   "matrix is ill-conditioned or has too many repeated eigenvalues "
                                                   "(it holds NaN).")})
_EIG = _Check(_any_nan, {1: (RuntimeError, "torch.linalg.eig: input tensor should not contain infs or NaNs.")})
_CHOLESKY = _Check(_cholesky_order, {1: (_LINALG_ERROR, "cholesky: The factorization could not be completed because "
                                                        "the input is not positive-definite (the leading minor of "
                                                        "order {} is not positive-definite).")})
_BERNOULLI = _Check(_outside(0.0, 1.0), {1: (RuntimeError, "Expected p_in >= 0 && p_in <= 1 to be true, but got "
                                                           "false.  (Could this error message be improved?  If so, "
                                                           "please report an enhancement request to PyTorch.)")})
_STD = _Check(_outside(0.0, float("inf")), {1: (RuntimeError, "normal expects all elements of std >= 0.0")})
_BCE_INPUT = _Check(_outside(0.0, 1.0), {1: (RuntimeError, "all elements of input should be between 0 and 1")})
_BCE_TARGET = _Check(_outside(0.0, 1.0), {1: (RuntimeError, "all elements of target should be between 0 and 1")})
def _any_negative(a: Any) -> Any:
    return jnp.where(jnp.any(a < 0), 1, 0)


_NEGATIVE_REPEATS = _Check(_any_negative, {1: (RuntimeError, "repeats can not be negative")})
_FEW_SOURCES = _Check(lambda mask, shape, n: jnp.where(jnp.sum(jnp.broadcast_to(mask, shape) != 0) > n, 1, 0),
                      {1: (RuntimeError, "Number of elements of source < number of ones in mask")})
_ZERO = _Check(lambda a: jnp.where(jnp.any(a == 0), 1, 0), {1: (RuntimeError, "ZeroDivisionError")})
# a NaN rate fails CPU's ``rate >= 0`` too
_POISSON = _Check(lambda a: jnp.where(jnp.any(~(a >= 0)), 1, 0), {1: (RuntimeError, "invalid Poisson rate, expected rate to be non-negative")})
_BINCOUNT = _Check(_any_negative, {1: (RuntimeError, "bincount only supports 1-d non-negative integral inputs.")})


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex)


def _svd(mode: Any, args: tuple, kwargs: dict) -> None:
    a = _arg(args, kwargs, 0, "A")
    if _floating(a):
        _run("aten::_linalg_svd", _SVD, a, mode)


def _eigh(mode: Any, args: tuple, kwargs: dict) -> None:
    """``_linalg_eigh(A, UPLO)``: eigh, eigvalsh, and the hermitian pinv /
    matrix_rank, which read one triangle."""
    a = _arg(args, kwargs, 0, "A")
    if _floating(a):
        _run("aten::_linalg_eigh", _EIGH, a, mode, str(_arg(args, kwargs, 1, "UPLO") or "L").upper() == "U")


def _pinv(mode: Any, args: tuple, kwargs: dict) -> None:
    """``linalg.pinv``: through an SVD unless the input is hermitian."""
    a = _arg(args, kwargs, 0, "self")
    if _floating(a) and not kwargs.get("hermitian", False) and not any(v is True for v in args[1:]):
        _run("aten::linalg_pinv", _SVD, a, mode)


def _eig(mode: Any, args: tuple, kwargs: dict) -> None:
    a = _arg(args, kwargs, 0, "self")
    if _floating(a):
        _run("aten::linalg_eig", _EIG, a, mode)


def _cholesky(mode: Any, args: tuple, kwargs: dict) -> None:
    a = _arg(args, kwargs, 0, "self")
    if _floating(a) and a.dim() >= 2 and a.shape[-1] == a.shape[-2]:
        _run("aten::cholesky", _CHOLESKY, a, mode, bool(_arg(args, kwargs, 1, "upper")))


def _bernoulli(mode: Any, args: tuple, kwargs: dict) -> None:
    """``bernoulli(p)`` and ``bernoulli_(self, p: Tensor)``: the tensor of
    probabilities."""
    p = _arg(args, kwargs, 1, "p") if len(args) > 1 or "p" in kwargs else _arg(args, kwargs, 0, "self")
    if _floating(p) and not p.dtype.is_complex:
        _run("aten::bernoulli", _BERNOULLI, p, mode)


def _normal(mode: Any, args: tuple, kwargs: dict) -> None:
    std = _arg(args, kwargs, 1, "std")
    if _floating(std) and not std.dtype.is_complex:
        _run("aten::normal", _STD, std, mode)


def _binary_cross_entropy(mode: Any, args: tuple, kwargs: dict) -> None:
    x, target = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "target")
    if _floating(x) and not x.dtype.is_complex:
        _run("aten::binary_cross_entropy", _BCE_INPUT, x, mode)
    if _floating(target) and not target.dtype.is_complex:
        _run("aten::binary_cross_entropy", _BCE_TARGET, target, mode)


def _integer_division(op: str) -> Callable[[Any, tuple, dict], None]:
    """``floor_divide`` / ``remainder`` / ``fmod`` / ``div`` with a rounding
    mode, of integer operands: torch CPU's kernels refuse a zero divisor
    ("ZeroDivisionError"); jax divides and gives a value (-1, 0, the
    dividend).  A Python number that is 0 in the dtype is refused at the
    call, a tensor holding a zero at the next synchronisation."""
    def check(mode: Any, args: tuple, kwargs: dict) -> None:
        a, b = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "other")
        if op == "div" and _arg(args, kwargs, 2, "rounding_mode") is None:
            return  # true division: a float result (inf), as on CPU
        if not isinstance(a, torch.Tensor) or not isinstance(b, (torch.Tensor, int, float, bool)):
            return
        dtype = torch.result_type(a, b)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            return
        if a.numel() == 0 or isinstance(b, torch.Tensor) and b.numel() == 0:
            return  # no element is divided: CPU's kernel raises nothing (take_along_dim of empty tensors)
        if not isinstance(b, torch.Tensor):
            # (the number wraps into the dtype first: 256 divides a uint8 by 0)
            if int(b) % (1 << torch.iinfo(dtype).bits) == 0:
                _refuse(f"aten::{op}", RuntimeError("ZeroDivisionError"))
        elif type(b) is torch.Tensor and b.device.type == "cpu":  # a CPU scalar tensor (not a trace's fake)
            if b.numel() and bool((b == 0).any()):
                raise RuntimeError("ZeroDivisionError")
        else:
            _run(f"aten::{op}", _ZERO, b, mode)

    return check


def _repeat_interleave(mode: Any, args: tuple, kwargs: dict) -> None:
    """``repeat_interleave.Tensor(repeats)`` (what ``x.repeat_interleave(t)``
    reaches with a tensor of repeats): a negative count gave a shorter
    result."""
    repeats = _arg(args, kwargs, 0, "repeats")
    if isinstance(repeats, torch.Tensor) and not repeats.dtype.is_floating_point:
        _run("aten::repeat_interleave", _NEGATIVE_REPEATS, repeats, mode)


def _masked_scatter(mode: Any, args: tuple, kwargs: dict) -> None:
    """``masked_scatter(self, mask, source)``: a mask with more ones than
    ``source`` has elements took values from past its end."""
    x, mask, source = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "source")
    if all(isinstance(v, torch.Tensor) for v in (x, mask, source)):
        shape = tuple(torch.broadcast_shapes(x.shape, mask.shape))
        _run("aten::masked_scatter", _FEW_SOURCES, mask, mode, shape, source.numel())


def _poisson(mode: Any, args: tuple, kwargs: dict) -> None:
    rates = _arg(args, kwargs, 0, "self")
    if _floating(rates) and not rates.dtype.is_complex:
        _run("aten::poisson", _POISSON, rates, mode)


def _first_bad(bad: Any, x: Any) -> Any:
    """The first value of ``x`` where ``bad`` holds (the one CPU names),
    else 0."""
    flat = bad.reshape(-1)
    return jnp.where(jnp.any(flat), x.reshape(-1)[index_of_max(flat)], 0)


@functools.lru_cache(maxsize=256)  # one check (and its compiled programs) per bound and text; bounds follow shapes
def _bounded(text: str, low: int | None, high: int | None) -> _Check:
    """The check that every value lies in ``[low, high]`` (None: no bound);
    its code is the first value outside, put into ``text`` (a bad value is
    never 0: 0 lies within every bound used here)."""
    def verdict(x: Any) -> Any:
        bad = jnp.zeros(x.shape, bool)
        if low is not None:
            bad = bad | (x < low)
        if high is not None:
            bad = bad | (x > high)
        return _first_bad(bad, x)

    return _Check(verdict, {1: (RuntimeError, text)})


def _ctc_loss(mode: Any, args: tuple, kwargs: dict) -> None:
    """``_ctc_loss``'s lengths, as CPU checks them: each input length in
    ``[0, T]``, each target length at least 0 and (2-d targets) at most
    their width.  The device's lowering gave inf or a finite loss for
    them.  Lengths come as a list, a CPU tensor (checked here, at the
    call) or a device tensor (checked on the device)."""
    names = ("log_probs", "targets", "input_lengths", "target_lengths")
    log_probs, targets, inputs, labels = (_arg(args, kwargs, i, n) for i, n in enumerate(names))
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() not in (2, 3):
        return
    where = " (while checking arguments for ctc_loss_allocate_outputs)"
    checks = [(inputs, f"Expected input_lengths to have value at least 0, but got value {{}}{where}", 0, None),
              (inputs, f"Expected input_lengths to have value at most {log_probs.shape[0]}, but got value {{}}{where}",
               None, int(log_probs.shape[0])),
              (labels, f"Expected target_lengths to have value at least 0, but got value {{}}{where}", 0, None)]
    if isinstance(targets, torch.Tensor) and targets.dim() == 2:
        width = int(targets.shape[1])
        checks.append((labels, f"Expected tensor to have size at least {{}} at dimension 1, but got size {width} for "
                               f"argument #2 'targets'{where}", None, width))
    for lengths, text, low, high in checks:
        if isinstance(lengths, (list, tuple)) or (type(lengths) is torch.Tensor and lengths.device.type == "cpu"):
            values = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
            for v in values:
                if (low is not None and v < low) or (high is not None and v > high):
                    _refuse("aten::_ctc_loss", RuntimeError(text.format(v)))
                    return
        elif isinstance(lengths, torch.Tensor) and not lengths.dtype.is_floating_point:
            _run("aten::_ctc_loss", _bounded(text, low, high), lengths, mode)


def _segment_lengths(lengths: Any, width: int) -> Any:
    """1: a negative length; 2: a row of lengths that does not sum to the
    data's width along the axis."""
    rows = lengths.reshape(-1, lengths.shape[-1]) if lengths.ndim else lengths.reshape(1, 1)
    return jnp.where(jnp.any(lengths < 0), 1, jnp.where(jnp.any(rows.sum(-1) != width), 2, 0))


_SEGMENT_LENGTHS = _Check(_segment_lengths, {
    1: (RuntimeError, "lengths contains negative value!"),
    2: (RuntimeError, "segment_reduce(): Expected all rows of lengths along axis to sum to "
                      "data.size(lengths.dim()-1) when !unsafe.")})


_SEGMENT_OFFSETS = _Check(lambda o: jnp.where(jnp.any(o[..., 1:] < o[..., :-1]), 1, 0), {1: (
    RuntimeError, "Expected segment_length >= 0 to be true, but got false.  (Could this error message be improved?  "
                  "If so, please report an enhancement request to PyTorch.)")})


def _segment_reduce(mode: Any, args: tuple, kwargs: dict) -> None:
    """``segment_reduce(data, reduce, lengths=...)``: lengths that are
    negative or do not cover the data gave a result; ``offsets=...`` that
    decrease (a negative segment length, which CPU refuses even when
    ``unsafe``) gave one too."""
    data, lengths, offsets = _arg(args, kwargs, 0, "data"), kwargs.get("lengths"), kwargs.get("offsets")
    if isinstance(lengths, torch.Tensor) and isinstance(data, torch.Tensor) and not kwargs.get("unsafe", False) \
            and lengths.dim() >= 1 and data.dim() >= lengths.dim():
        _run("aten::segment_reduce", _SEGMENT_LENGTHS, lengths, mode, int(data.shape[lengths.dim() - 1]))
    if lengths is None and isinstance(offsets, torch.Tensor) and offsets.dim() >= 1 and offsets.shape[-1] > 1 \
            and not offsets.dtype.is_floating_point:
        _run("aten::segment_reduce", _SEGMENT_OFFSETS, offsets, mode)


_BAG_FIRST = _Check(lambda o: o[0], {1: (RuntimeError, "offsets[0] has to be 0, i.e., the first sequence in the "
                                         "mini-batch has to start from position 0. However, got {}")})
_BAG_ORDER = _Check(lambda o: jnp.where(jnp.any(o[1:] < o[:-1]), 1, 0), {1: (
    RuntimeError, "Expected i < index_size to be true, but got false.  (Could this error message be improved?  If "
                  "so, please report an enhancement request to PyTorch.)")})


@functools.lru_cache(maxsize=256)  # one per indices count: bounded, as batch sizes vary
def _bag_end(n: int) -> _Check:
    """The check that the last offset is at most ``n``, the indices' count."""
    return _Check(lambda o: jnp.where(o[-1] > n, o[-1], 0), {1: (
        RuntimeError, f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {{}}")})


@functools.lru_cache(maxsize=256)  # one per table size: bounded
def _bag_rows(n: int) -> _Check:
    """The check that every index is a row of a table of ``n``: the code
    is the first one outside (never 0, a row of every table)."""
    return _Check(lambda i: _first_bad((i < 0) | (i >= n), i).astype(jnp.int64).clip(-2**31, 2**31 - 1), {1: (
        RuntimeError, f"Index of input takes value {{}} which is not in the valid range [0, {n})")})


def _embedding_bag(mode: Any, args: tuple, kwargs: dict) -> None:
    """``_embedding_bag(weight, indices, offsets, ...)`` with 1-d indices:
    an index that is not a row of the table gave a row of whatever the
    lowering read (CPU says "Index 1 of input takes value 12 which is not
    in the valid range [0, 10)", or on its path for 1-d indices with
    offsets "Expected i < index_size"; the verdict carries the value, not
    the position); offsets that do not start at 0, decrease, or pass the
    indices' end made bags of whatever the lowering read."""
    weight, indices, offsets = (_arg(args, kwargs, i, n) for i, n in enumerate(("weight", "indices", "offsets")))
    if isinstance(weight, torch.Tensor) and isinstance(indices, torch.Tensor) and weight.dim() == 2 \
            and not indices.dtype.is_floating_point and indices.dtype != torch.bool:
        _run("aten::_embedding_bag", _bag_rows(int(weight.shape[0])), indices, mode)
    if not (isinstance(indices, torch.Tensor) and isinstance(offsets, torch.Tensor)) or indices.dim() != 1 \
            or offsets.dim() != 1 or offsets.numel() == 0 or offsets.dtype.is_floating_point:
        return
    n = int(indices.shape[0])
    _run("aten::_embedding_bag", _BAG_FIRST, offsets, mode)
    _run("aten::_embedding_bag", _bag_end(n), offsets, mode)
    if offsets.numel() > 1:
        _run("aten::_embedding_bag", _BAG_ORDER, offsets, mode)


@functools.lru_cache(maxsize=256)  # one per sequence length: bounded, as shapes vary
def _sorter_within(n: int) -> _Check:
    """The check that every sorter index lies in ``[0, n)``."""
    return _Check(lambda s: jnp.where(jnp.any((s < 0) | (s >= n)), 1, 0),
                  {1: (RuntimeError, "torch.searchsorted(): sorter index out of range")})


def _searchsorted(mode: Any, args: tuple, kwargs: dict) -> None:
    """``searchsorted(sorted_sequence, values, sorter=...)``: a sorter index
    outside the sequence read a clipped element and gave a position."""
    sequence, sorter = _arg(args, kwargs, 0, "sorted_sequence"), kwargs.get("sorter")
    if isinstance(sequence, torch.Tensor) and isinstance(sorter, torch.Tensor) and sequence.dim() >= 1 \
            and not sorter.dtype.is_floating_point:
        _run("aten::searchsorted", _sorter_within(int(sequence.shape[-1])), sorter, mode)


def _number(v: float) -> str:
    """A float as torch's C++ messages print it (``0``, ``0.5``, ``inf``)."""
    return f"{v:g}"


def _finite_values(a: Any) -> Any:
    return jnp.where(jnp.all(jnp.isfinite(a)), 0, 1)


# With no range of their own, histc and histogram take the input's least and
# greatest values as theirs; CPU then names them (which a verdict code cannot
# carry: the text says where they come from instead).
_HISTC_DATA = _Check(_finite_values, {1: (RuntimeError, "torch.histc: range of [min, max] of the input is not "
                                                        "finite (it holds inf or NaN)")})
_HISTOGRAM_DATA = _Check(_finite_values, {1: (RuntimeError, "torch.histogramdd: dimension 0's range [min, max] of "
                                                            "the input is not finite (it holds inf or NaN)")})


def _histc(mode: Any, args: tuple, kwargs: dict) -> None:
    """``histc(input, bins, min, max)``: a range that is not finite, given
    or taken from the input (``min == max``), gave counts where CPU
    raises.  (torch's meta kernel refuses ``min > max`` itself.)"""
    x = _arg(args, kwargs, 0, "self")
    low, high = _arg(args, kwargs, 2, "min"), _arg(args, kwargs, 3, "max")
    low, high = 0.0 if low is None else float(low), 0.0 if high is None else float(high)
    if not _floating(x) or x.dtype.is_complex:
        return
    if low != high:
        if not (np.isfinite(low) and np.isfinite(high)):
            _refuse("aten::histc", RuntimeError(f"torch.histc: range of [{_number(low)}, {_number(high)}] is not "
                                                "finite"))
    else:
        _run("aten::histc", _HISTC_DATA, x, mode)


def _histogram(mode: Any, args: tuple, kwargs: dict) -> None:
    """``histogram(input, bins: int, range=None, ...)``: a range whose
    least end passes its greatest, or that is not finite (given, or the
    input's own), gave counts where CPU raises."""
    x, bins = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "bins")
    if isinstance(bins, torch.Tensor) or not _floating(x) or x.dtype.is_complex:
        return  # bin edges given as a tensor: CPU reads no range
    bounds = _arg(args, kwargs, 2, "range")
    if bounds is None:
        _run("aten::histogram", _HISTOGRAM_DATA, x, mode)
        return
    low, high = (float(v) for v in bounds)
    if low > high:
        _refuse("aten::histogram", RuntimeError(f"torch.histogramdd: min should not exceed max, but got min "
                                                f"{_number(low)} max {_number(high)} for dimension 0"))
    elif not (np.isfinite(low) and np.isfinite(high)):
        _refuse("aten::histogram", RuntimeError(f"torch.histogramdd: dimension 0's range [{_number(low)}, "
                                                f"{_number(high)}] is not finite"))


def _first_infinite_column(a: Any, dims: int) -> Any:
    """1 + the first of ``dims`` columns (the last dim) holding inf or NaN; 0 if none."""
    bad = ~jnp.all(jnp.isfinite(a.reshape(-1, dims)), axis=0)
    return jnp.where(jnp.any(bad), jnp.argmax(bad) + 1, 0)


_HISTOGRAMDD_DATA: dict[int, _Check] = {}


def _histogramdd_data(dims: int) -> _Check:
    check = _HISTOGRAMDD_DATA.get(dims)
    if check is None:
        check = _HISTOGRAMDD_DATA[dims] = _Check(_first_infinite_column, {
            d + 1: (RuntimeError, f"torch.histogramdd: dimension {d}'s range [min, max] of the input is not finite "
                                  "(it holds inf or NaN)") for d in range(dims)})
    return check


def _histogramdd(mode: Any, args: tuple, kwargs: dict) -> None:
    """``_histogramdd_bin_edges(input, bins, range=None, ...)`` (histogramdd
    with bin counts): each dimension's range, given or its column's least
    and greatest values, must be finite and not upside down; CPU raises
    where the device counted."""
    x = _arg(args, kwargs, 0, "self")
    if not _floating(x) or x.dtype.is_complex or x.dim() < 1:
        return
    dims = int(x.shape[-1])
    bounds = _arg(args, kwargs, 2, "range")
    if bounds is None:
        if dims:
            _run("aten::_histogramdd_bin_edges", _histogramdd_data(dims), x, mode, dims)
        return
    for d in range(min(dims, len(bounds) // 2)):
        low, high = float(bounds[2 * d]), float(bounds[2 * d + 1])
        if low > high:
            _refuse("aten::_histogramdd_bin_edges", RuntimeError(
                f"torch.histogramdd: min should not exceed max, but got min {_number(low)} max {_number(high)} "
                f"for dimension {d}"))
        if not (np.isfinite(low) and np.isfinite(high)):
            _refuse("aten::_histogramdd_bin_edges", RuntimeError(
                f"torch.histogramdd: dimension {d}'s range [{_number(low)}, {_number(high)}] is not finite"))


_LSTSQ_A = _Check(_any_nan, {1: (RuntimeError, "torch.linalg.lstsq: A has illegal value: it holds NaN, which "
                                               "CPU's LAPACK refuses (\"Argument 4 has illegal value\")")})
_LSTSQ_B = _Check(_any_nan, {1: (RuntimeError, "torch.linalg.lstsq: B has illegal value: it holds NaN, which "
                                               "CPU's LAPACK refuses (\"Argument 6 has illegal value\")")})


def _lstsq(mode: Any, args: tuple, kwargs: dict) -> None:
    """``linalg_lstsq(A, B)``: CPU's LAPACK (MKL's ?gelsy, the default
    driver: A is its argument 4, B its 6) refuses a NaN in either as an
    illegal argument, a RuntimeError; the device solved and gave NaN.  (An
    inf is not refused on CPU: it solves to zeros there, NaN here.)"""
    a, b = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "b")
    if _floating(a):
        _run("aten::linalg_lstsq", _LSTSQ_A, a, mode)
    if _floating(b):
        _run("aten::linalg_lstsq", _LSTSQ_B, b, mode)


def _bincount(mode: Any, args: tuple, kwargs: dict) -> None:
    x = _arg(args, kwargs, 0, "self")
    if isinstance(x, torch.Tensor) and not x.dtype.is_floating_point and x.dtype != torch.bool:
        _run("aten::bincount", _BINCOUNT, x, mode)


def _run(op: str, spec: _Check, tensor: Any, mode: Any, *static: Any, text: str | None = None) -> None:
    collect = getattr(_local, "collect", None)
    if collect is not None:  # graph form: the program computes the verdict itself
        if isinstance(tensor, torch.Tensor):
            collect.append((tensor, lambda a: spec.verdict(a, *static).astype(jnp.int32),
                            lambda code: (spec.error(code)[0], text or spec.error(code)[1])))
        return
    if not isinstance(tensor, JaxTensor) or tensor.numel() == 0:
        return
    code = spec.code(read(tensor), *static)
    device = tensor.device

    def verdict(wait: bool) -> bool:
        if not wait and not code.is_ready():
            return False
        value = int(np.asarray(code))
        if value:
            exc, message = spec.error(value)
            raise exc(f"{text or message} (raised by {op} on {device}, found at the next synchronisation "
                      "point; pjrt_host.config(checks='sync'), or the debugging mode PJRT_HOST_EAGER=sync, "
                      "raises at the op itself)")
        return True

    if mode == "sync":  # at the op itself: wait for the verdict (a program still running is no pass)
        value = int(np.asarray(code))
        if value:
            exc, message = spec.error(value)
            raise exc(text or message)
    else:
        defer_check(verdict)


def _refuse(op: str, err: Exception) -> None:
    """A call refused whatever its tensors hold (a Python 0 divisor):
    raised at the call; in graph form, by every call of the program."""
    collect = getattr(_local, "collect", None)
    if collect is None:
        raise err
    collect.append((None, lambda a: jnp.ones((), jnp.int32), lambda code: (type(err), str(err))))


def sites(name: str, args: tuple, kwargs: dict) -> list[tuple]:
    """Graph form: the value checks ATen op ``name`` makes on ``args``
    (fake tensors, as a traced graph records them), without reading values:
    ``[(tensor, verdict, error)]``, ``verdict(array)`` the traceable int32
    code of the tensor's values (0: fine; ``tensor`` None: a call refused
    whatever it holds, ``array`` unused) and ``error(code)`` CPU's
    exception type and text for a code."""
    check = checker_for(name)
    if check is None:
        return []
    found: list[tuple] = []
    _local.collect = found
    try:
        check(True, args, kwargs)
    finally:
        _local.collect = None
    return found


def _multinomial(mode: Any, args: tuple, kwargs: dict) -> None:
    probs = args[0] if args else kwargs.get("self")
    if isinstance(probs, torch.Tensor) and probs.dtype.is_floating_point:
        _run("aten::multinomial", _MULTINOMIAL, probs, mode)


def _assert_async(mode: Any, args: tuple, kwargs: dict) -> None:
    """torch's device-side assert (its decompositions' checks: ``one_hot``,
    ``nll_loss`` ...), with its message."""
    cond = args[0] if args else kwargs.get("self")
    msg = args[1] if len(args) > 1 else kwargs.get("assert_msg")
    _run("aten::_assert_async", _ASSERT, cond, mode, text=msg or None)


_CHECKS: dict[str, Callable[[Any, tuple, dict], None]] = {
    "multinomial": _multinomial,
    "_assert_async": _assert_async,
    "_linalg_svd": _svd,
    "linalg_eig": _eig,
    "linalg_pinv": _pinv,
    "_linalg_eigh": _eigh,
    "cholesky": _cholesky,
    "bernoulli": _bernoulli,
    # a Python number p (bernoulli_(p=0.5), bernoulli(self, p)): self's values
    # are not probabilities, and torch leaves p's default out of args
    "bernoulli.float": lambda mode, args, kwargs: None,
    "bernoulli.p": lambda mode, args, kwargs: None,
    "normal": _normal,
    "binary_cross_entropy": _binary_cross_entropy,
    "bincount": _bincount,
    "poisson": _poisson,
    "_ctc_loss": _ctc_loss,
    "segment_reduce": _segment_reduce,
    "_embedding_bag": _embedding_bag,
    "_embedding_bag_forward_only": _embedding_bag,
    "repeat_interleave": _repeat_interleave,
    "masked_scatter": _masked_scatter,
    "searchsorted": _searchsorted,
    "histc": _histc,
    "histogram.bin_ct": _histogram,
    "histogram.bin_ct_out": _histogram,
    "_histogramdd_bin_edges": _histogramdd,
    "linalg_lstsq": _lstsq,
    **{op: _integer_division(op) for op in ("floor_divide", "remainder", "fmod")},
    # div only with a rounding mode (true division is never refused, and is hot)
    **{f"div.{overload}": _integer_division("div") for overload in ("Tensor_mode", "Scalar_mode", "out_mode")},
}


def checker_for(name: str) -> Callable[[Any, tuple, dict], None] | None:
    """The value check of ATen op ``name`` ("aten::multinomial.out"), or None."""
    namespace, _, rest = name.rpartition("::")
    if namespace not in ("aten", ""):
        return None
    base, _, overload = rest.partition(".")
    base = base if base.startswith("_") else base.rstrip("_")
    return _CHECKS.get(f"{base}.{overload}") or _CHECKS.get(base)


@x64_scope
def one_hot_classes(x: Any, num_classes: int, mode: Any) -> None:
    """CPU's errors for ``one_hot`` classes out of ``[0, num_classes)``
    (torch leaves them to a device assert on accelerators).  With
    ``num_classes=-1`` torch reads the largest class itself."""
    if mode and not x.dtype.is_floating_point and x.dtype != torch.bool:
        _run("aten::one_hot", _ONE_HOT, x, mode, int(num_classes))
