"""Elementwise lowerings: arithmetic, math functions, comparisons, logical
and bitwise ops, where / clamp / lerp, activations and their gradients.

Every binary op promotes with torch's rules (:func:`_util.promote`), and
every int-to-float op (``sin``, ``sqrt``, true division) computes in torch's
default float dtype for integer inputs (:func:`_util.as_float`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch

from . import lowering
from ._util import as_float, as_stored, cast, float_dtype, optional_jax_dtype, promote, result_type, torch_dtype_of, to_jax

# ---------------------------------------------------------------- arithmetic


@lowering("aten::add.Tensor", "aten::add.Scalar")
def add(x, other, alpha=1):
    dtype, (x, other) = promote(x, other)
    if alpha != 1:  # torch rounds alpha to the tensors' dtype
        other = other * as_stored(cast(alpha, dtype))
    if dtype == torch.bool:
        return x | other
    return x + other


@lowering("aten::sub.Tensor", "aten::sub.Scalar")
def sub(x, other, alpha=1):
    dtype, (x, other) = promote(x, other)
    if alpha != 1:
        other = other * as_stored(cast(alpha, dtype))
    return x - other


@lowering("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(x, other, alpha=1):
    return sub(other, x, alpha)


@lowering("aten::mul.Tensor", "aten::mul.Scalar")
def mul(x, other):
    flags = [getattr(v, "dtype", None) == jnp.bool_ for v in (x, other)]
    dtype, (x, other) = promote(x, other, scalars_in_opmath=True)
    if dtype == torch.bool:
        return x & other
    if flags[0] != flags[1]:
        # XLA rewrites convert(mask) * y into select(mask, y, 0), which is
        # not IEEE's 0 * y (-0.0 for a negative y, NaN for inf and NaN), as
        # torch CPU computes it; y * 0 it leaves alone.
        mask, y = (x, other) if flags[0] else (other, x)
        return jnp.where(mask != 0, y, y * 0)
    return x * other


@lowering("aten::div.Tensor", "aten::div.Scalar", "aten::true_divide.Tensor", "aten::true_divide.Scalar")
def div(x, other):
    dtype = float_dtype(result_type(x, other))
    return cast(x, dtype) / cast(other, dtype)


@lowering("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode(x, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div(x, other)
    dtype, (x, other) = promote(x, other, scalars_in_opmath=True)
    if rounding_mode == "floor":
        return floor_divide(x, other)
    if dtype.is_floating_point:
        return jnp.trunc(x / other)
    return jax.lax.div(*jnp.broadcast_arrays(x, other))  # integer division truncates toward zero


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide(x, other):
    dtype, (x, other) = promote(x, other, scalars_in_opmath=True)
    if dtype.is_floating_point:
        # torch's div_floor: the floor of the exact quotient, via fmod, as Python does.
        mod = jnp.fmod(x, other)
        q = (x - mod) / other
        q = jnp.where((mod != 0) & ((other < 0) != (mod < 0)), q - 1, q)
        floor_q = jnp.floor(q)
        q = jnp.where(q - floor_q > 0.5, floor_q + 1, floor_q)
        return jnp.where(q == 0, jnp.copysign(jnp.zeros_like(q), x / other), jnp.where(other == 0, x / other, q))
    return jnp.floor_divide(x, other)


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor")
def remainder(x, other):
    _, (x, other) = promote(x, other)
    return jnp.remainder(x, other)


@lowering("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod(x, other):
    _, (x, other) = promote(x, other)
    return jnp.fmod(x, other)


@lowering("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar")
def pow(x, exponent):
    dtype, (xc, ec) = promote(x, exponent)
    if isinstance(exponent, int) and not isinstance(exponent, bool) and exponent >= 0:
        return jax.lax.integer_pow(xc, exponent) if dtype != torch.bool else xc | (exponent == 0)
    if isinstance(exponent, float) and exponent == 0.5 and dtype.is_floating_point:
        return jnp.sqrt(xc)
    if dtype.is_floating_point or dtype.is_complex:
        return jnp.power(xc, ec)
    if dtype == torch.bool:
        return xc | ~ec
    return _integer_power(xc, ec)


def _integer_power(base, exponent):
    """base ** exponent in integer arithmetic that wraps on overflow, as C
    does, by square-and-multiply over the exponent's bits; a negative
    exponent gives 0 except for bases 1 and -1."""
    base, exponent = jnp.broadcast_arrays(base, exponent)
    result = jnp.ones_like(base)
    square = base
    e = jnp.maximum(exponent, 0)
    for _ in range(jnp.iinfo(exponent.dtype).bits - 1):
        result = jnp.where((e & 1) == 1, result * square, result)
        square = square * square
        e = e >> 1
    minus_one = jnp.where((exponent & 1) == 0, 1, -1).astype(base.dtype)
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, minus_one, 0)).astype(base.dtype)
    return jnp.where(exponent < 0, negative, result)


@lowering("aten::float_power.Tensor_Tensor", "aten::float_power.Tensor_Scalar", "aten::float_power.Scalar")
def float_power(x, exponent):
    complex_ = any(torch_dtype_of(a).is_complex for a in (x, exponent))
    dtype = torch.complex128 if complex_ else torch.float64
    return jnp.power(cast(x, dtype), cast(exponent, dtype))


@lowering("aten::neg")
def neg(x):
    return -x


@lowering("aten::abs")
def abs_(x):
    return x if x.dtype == jnp.bool_ else jnp.abs(x)


@lowering("aten::sign")
def sign(x):
    if x.dtype == jnp.bool_:
        return x
    if jnp.issubdtype(x.dtype, jnp.floating):
        # torch's kernels compute (0 < x) - (x < 0): 0 for NaN and +0 for
        # -0, where jnp.sign keeps NaN and -0 (a division by the result
        # then gave -inf where CPU gives inf)
        return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)
    return jnp.sign(x)


@lowering("aten::sgn")
def sgn(x):
    if jnp.iscomplexobj(x):
        mag = jnp.abs(x)
        return jnp.where(mag == 0, 0, x / jnp.where(mag == 0, 1, mag)).astype(x.dtype)
    return sign(x)


@lowering("aten::signbit")
def signbit(x):
    return jnp.signbit(x) if jnp.issubdtype(x.dtype, jnp.floating) else x < 0


@lowering("aten::reciprocal")
def reciprocal(x):
    x = as_float(x)
    return 1 / x


@lowering("aten::square")
def square(x):
    return x * x if x.dtype != jnp.bool_ else x.astype(jnp.int64)


def _rounding(fn):
    def lower(x):
        return x if not jnp.issubdtype(x.dtype, jnp.inexact) else fn(x)

    return lower


for _name, _fn in (("ceil", jnp.ceil), ("floor", jnp.floor), ("trunc", jnp.trunc), ("fix", jnp.trunc)):
    lowering(f"aten::{_name}")(_rounding(_fn))


@lowering("aten::round", "aten::round.decimals")
def round_(x, *, decimals=0):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    if decimals == 0:
        return jnp.round(x)
    scale = cast(10.0 ** abs(decimals), torch_dtype_of(x))
    if decimals > 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


@lowering("aten::frac")
def frac(x):
    return x - jnp.trunc(x)


# --------------------------------------------------- int-to-float functions


def _float_unary(fn):
    def lower(x):
        return fn(as_float(x))

    lower.__name__ = getattr(fn, "__name__", "unary")
    return lower


_FLOAT_UNARY = {
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1,
    "log": jnp.log, "log2": jnp.log2, "log10": jnp.log10, "log1p": jnp.log1p,
    "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan,
    "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan,
    "arcsin": jnp.arcsin, "arccos": jnp.arccos, "arctan": jnp.arctan,
    "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "arcsinh": jnp.arcsinh, "arccosh": jnp.arccosh, "arctanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid, "special_expit": jax.nn.sigmoid,
    "erf": jsp.erf, "erfc": jsp.erfc, "erfinv": jsp.erfinv, "special_erfcx": jsp.erfcx if hasattr(jsp, "erfcx") else None,
    "lgamma": jsp.gammaln,
    "i0": jsp.i0, "special_i0e": jsp.i0e, "special_i1": jsp.i1, "special_i1e": jsp.i1e,
    "special_ndtr": jsp.ndtr, "special_ndtri": jsp.ndtri, "special_log_ndtr": jsp.log_ndtr,
    # torch's entr is 0 at 0 (jax's: -0 * log 0 = -0)
    "special_entr": lambda x: jnp.where(x == 0, jnp.zeros((), x.dtype), jsp.entr(x)),
    "sinc": jnp.sinc, "deg2rad": jnp.deg2rad, "rad2deg": jnp.rad2deg,
    "special_modified_bessel_i0": jsp.i0, "special_modified_bessel_i1": jsp.i1,
    # (torch's: 0 at +-inf, where sin(x) / x is NaN)
    "special_spherical_bessel_j0": lambda x: jnp.where(
        x == 0, jnp.ones((), x.dtype), jnp.where(jnp.isinf(x), jnp.zeros((), x.dtype), jnp.sin(x) / x)),
}
for _name, _fn in _FLOAT_UNARY.items():
    if _fn is not None:
        lowering(f"aten::{_name}")(_float_unary(_fn))


@lowering("aten::digamma", "aten::special_digamma", "aten::special_psi")
def digamma(x):
    """digamma with torch's values at the poles: -inf at 0 (+inf at -0),
    NaN at negative integers; negative arguments by reflection, which
    jax's does not do."""
    x = as_float(x)
    reflected = jsp.digamma(1 - x) - jnp.pi / jnp.tan(jnp.pi * x)
    out = jnp.where(x < 0, reflected, jsp.digamma(jnp.where(x < 0, 1.0, x).astype(x.dtype)))
    out = jnp.where((x < 0) & (x == jnp.floor(x)), jnp.nan, out)
    return jnp.where(x == 0, jnp.where(jnp.signbit(x), jnp.inf, -jnp.inf), out).astype(x.dtype)


@lowering("aten::frexp.Tensor")
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


@lowering("aten::complex")
def complex_(real, imag):
    return jax.lax.complex(*jnp.broadcast_arrays(real, imag))


@lowering("aten::polar")
def polar(magnitude, angle):
    return jax.lax.complex(*jnp.broadcast_arrays(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle)))


@lowering("aten::type_as")
def type_as(x, other):
    return x.astype(other.dtype)


@lowering("aten::equal")
def equal(x, other):
    """A Python bool, as torch returns: concrete values only (the device
    runs it eagerly)."""
    return x.shape == other.shape and bool(jnp.all(x == other))


@lowering("aten::allclose")
def allclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(jnp.all(isclose(x, other, rtol, atol, equal_nan)))


@lowering("aten::isclose")
def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    _, (x, other) = promote(x, other)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.abs(x - other) <= atol + rtol * jnp.abs(other) if x.dtype != jnp.bool_ else x == other
    close = (x == other) | (jnp.abs(x - other) <= atol + rtol * jnp.abs(other))
    if equal_nan:
        close = close | (jnp.isnan(x) & jnp.isnan(other))
    return close


@lowering("aten::angle")
def angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = as_float(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


@lowering("aten::logit")
def logit(x, eps=None):
    x = as_float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lowering("aten::mvlgamma")
def mvlgamma(x, p):
    x = as_float(x)
    return jsp.multigammaln(x, p).astype(x.dtype)


@lowering("aten::nan_to_num", opmath=False)  # posinf/neginf default to the dtype's own limits
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


def _float_binary(fn):
    def lower(x, other):
        dtype, (x, other) = promote(x, other)
        dtype = float_dtype(dtype)
        return fn(cast(x, dtype), cast(other, dtype))

    return lower


def _atan2(y, x):
    """atan2 with C's answers at two zeros (±0 for +0, ±pi for -0, the sign
    of y's zero), which XLA:CPU gives or not depending on the program: NaN
    where the inputs are made inside it (``atan2(arange(2), arange(2))`` in
    a fused segment)."""
    zeros = (y == 0) & (x == 0)
    pi, zero = jnp.asarray(jnp.pi, y.dtype), jnp.zeros((), y.dtype)
    at_zeros = jnp.where(jnp.signbit(x), jnp.copysign(pi, y), jnp.copysign(zero, y))
    return jnp.where(zeros, at_zeros, jnp.arctan2(y, x))


for _names, _fn in (
    (("atan2.default", "arctan2.default"), _atan2),
    (("hypot.default",), jnp.hypot),
    (("logaddexp.default",), jnp.logaddexp),
    (("logaddexp2.default",), jnp.logaddexp2),
    (("copysign.Tensor", "copysign.Scalar"), jnp.copysign),
    (("xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other", "special_xlogy.default"), jsp.xlogy),
    (("special_xlog1py.default", "special_xlog1py.self_scalar", "special_xlog1py.other_scalar"), jsp.xlog1py),
    (("igamma.default", "special_gammainc.default"), jsp.gammainc),
    (("igammac.default", "special_gammaincc.default"), jsp.gammaincc),
):
    lowering(*(f"aten::{n}" for n in _names))(_float_binary(_fn))


@lowering("aten::nextafter", opmath=False)  # the next value of the dtype itself
def nextafter(x, other):
    _, (x, other) = promote(x, other)
    return jnp.nextafter(x, other)


@lowering("aten::ldexp.Tensor")
def ldexp(x, other):
    dtype = float_dtype(result_type(x, other))
    return cast(x, dtype) * jnp.exp2(cast(other, dtype))


@lowering("aten::heaviside")
def heaviside(x, values):
    _, (x, values) = promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lowering("aten::maximum", "aten::max.other")
def maximum(x, other):
    dtype, (x, other) = promote(x, other)
    return x | other if dtype == torch.bool else jnp.maximum(x, other)


@lowering("aten::minimum", "aten::min.other")
def minimum(x, other):
    dtype, (x, other) = promote(x, other)
    return x & other if dtype == torch.bool else jnp.minimum(x, other)


@lowering("aten::fmax")
def fmax(x, other):
    _, (x, other) = promote(x, other)
    return jnp.fmax(x, other)


@lowering("aten::fmin")
def fmin(x, other):
    _, (x, other) = promote(x, other)
    return jnp.fmin(x, other)


# --------------------------------------------------------------- comparisons


def _promoted_binary(fn):
    """``fn`` on both operands promoted to torch's common dtype (comparisons
    and bitwise ops: the result dtype is fn's own)."""
    def lower(x, other):
        _, (x, other) = promote(x, other)
        return fn(x, other)

    return lower


for _names, _fn in ((("eq",), jnp.equal), (("ne", "not_equal"), jnp.not_equal), (("lt", "less"), jnp.less),
                    (("le", "less_equal"), jnp.less_equal), (("gt", "greater"), jnp.greater),
                    (("ge", "greater_equal"), jnp.greater_equal)):
    lowering(*(f"aten::{n}.{o}" for n in _names for o in ("Tensor", "Scalar")))(_promoted_binary(_fn))


@lowering("aten::isnan")
def isnan(x):
    return jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, bool)


@lowering("aten::isinf")
def isinf(x):
    return jnp.isinf(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros(x.shape, bool)


@lowering("aten::isfinite")
def isfinite(x):
    return jnp.isfinite(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.ones(x.shape, bool)


@lowering("aten::isposinf")
def isposinf(x):
    return x == jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros(x.shape, bool)


@lowering("aten::isneginf")
def isneginf(x):
    return x == -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros(x.shape, bool)


@lowering("aten::isreal")
def isreal(x):
    return jnp.imag(x) == 0 if jnp.iscomplexobj(x) else jnp.ones(x.shape, bool)


# ------------------------------------------------------------ logical, bitwise


def _truth(x):
    return to_jax(x) != 0


@lowering("aten::logical_not")
def logical_not(x):
    return ~_truth(x)


@lowering("aten::logical_and")
def logical_and(x, other):
    return _truth(x) & _truth(other)


@lowering("aten::logical_or")
def logical_or(x, other):
    return _truth(x) | _truth(other)


@lowering("aten::logical_xor")
def logical_xor(x, other):
    return _truth(x) ^ _truth(other)


for _name, _fn in (("bitwise_and", jnp.bitwise_and), ("bitwise_or", jnp.bitwise_or),
                   ("bitwise_xor", jnp.bitwise_xor), ("__and__", jnp.bitwise_and),
                   ("__or__", jnp.bitwise_or), ("__xor__", jnp.bitwise_xor)):
    lowering(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar", f"aten::{_name}.Scalar_Tensor")(_promoted_binary(_fn))


@lowering("aten::bitwise_not")
def bitwise_not(x):
    return ~x


def _shift(left: bool):
    def lower(x, other):
        dtype, (x, other) = promote(x, other)
        bits = jnp.iinfo(optional_jax_dtype(dtype)).bits
        too_far = (other < 0) | (other >= bits)
        if left:
            return jnp.where(too_far, 0, jnp.left_shift(x, jnp.clip(other, 0, bits - 1))).astype(x.dtype)
        # An arithmetic right shift by the width or more leaves only the sign.
        return jnp.where(too_far, jnp.where(x < 0, -1, 0), jnp.right_shift(x, jnp.clip(other, 0, bits - 1))).astype(x.dtype)

    return lower


lowering("aten::bitwise_left_shift.Tensor", "aten::bitwise_left_shift.Tensor_Scalar",
         "aten::bitwise_left_shift.Scalar_Tensor", "aten::__lshift__.Tensor", "aten::__lshift__.Scalar")(_shift(True))
lowering("aten::bitwise_right_shift.Tensor", "aten::bitwise_right_shift.Tensor_Scalar",
         "aten::bitwise_right_shift.Scalar_Tensor", "aten::__rshift__.Tensor", "aten::__rshift__.Scalar")(_shift(False))


@lowering("aten::gcd")
def gcd(x, other):
    _, (x, other) = promote(x, other)
    return jnp.gcd(x, other)


@lowering("aten::lcm")
def lcm(x, other):
    _, (x, other) = promote(x, other)
    return jnp.lcm(x, other)


# ---------------------------------------------------- where, clamp, lerp, ...


@lowering("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar")
def where(condition, x, other):
    _, (x, other) = promote(x, other)
    return jnp.where(condition, x, other)


def _bounded(x, lo, hi):
    """torch CPU's clamp by scalar bounds: ``x`` stays unless it is below
    ``lo`` (then ``lo``), then above ``hi`` (then ``hi``), so ``-0.0``
    clamped at 0 stays ``-0.0`` (XLA's max gives 0.0: ``relu(-0.0)`` then
    differed in sign, which ``atan2`` or a division turns into another
    value); NaN stays NaN, a NaN bound gives NaN, and ``lo > hi`` gives
    ``hi`` everywhere."""
    if lo is not None:
        x = jnp.where((x < lo) | jnp.isnan(lo), lo, x)
    if hi is not None:
        x = jnp.where((x > hi) | jnp.isnan(hi), hi, x)
    return x


def _promoted_bounds(x, min, max):
    """``x`` and its bounds (None where not given) in their promoted dtype."""
    _, (x, *bounds) = promote(x, *(b for b in (min, max) if b is not None))
    lo = bounds.pop(0) if min is not None else None
    hi = bounds.pop(0) if max is not None else None
    return x, lo, hi


@lowering("aten::clamp", "aten::clip")
def clamp(x, min=None, max=None):
    return _bounded(*_promoted_bounds(x, min, max))


@lowering("aten::clamp.Tensor", "aten::clip.Tensor")
def clamp_tensor(x, min=None, max=None):
    # torch's maximum then minimum (which of two equal zeros they give is
    # CPU's vector or scalar path's choice)
    x, lo, hi = _promoted_bounds(x, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowering("aten::clamp_min")
def clamp_min(x, min):
    return clamp(x, min=min)


@lowering("aten::clamp_min.Tensor")
def clamp_min_tensor(x, min):
    return clamp_tensor(x, min=min)


@lowering("aten::clamp_max")
def clamp_max(x, max):
    return clamp(x, max=max)


@lowering("aten::clamp_max.Tensor")
def clamp_max_tensor(x, max):
    return clamp_tensor(x, max=max)


@lowering("aten::lerp.Scalar", "aten::lerp.Tensor")
def lerp(start, end, weight):
    _, (start, end, weight) = promote(start, end, weight, scalars_in_opmath=True)
    # torch's two-sided form keeps lerp exact at weight 0 and 1.
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * (end - start), end - (end - start) * (1 - weight))


@lowering("aten::addcmul")
def addcmul(x, tensor1, tensor2, *, value=1):
    dtype, (x, t1, t2) = promote(x, tensor1, tensor2)
    return x + cast(value, dtype) * t1 * t2


@lowering("aten::addcdiv")
def addcdiv(x, tensor1, tensor2, *, value=1):
    dtype, (x, t1, t2) = promote(x, tensor1, tensor2)
    return x + cast(value, dtype) * (t1 / t2)


@lowering("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(x, mask, value):
    return jnp.where(mask, cast(value, torch_dtype_of(x)), x)


# alias / detach are views: ops_shape registers them with their _copy twins.
@lowering("aten::positive", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg")
def identity(x):
    return x


@lowering("aten::conj_physical", "aten::_conj_physical")
def conj_physical(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowering("aten::real")
def real(x):
    return jnp.real(x)


@lowering("aten::imag")
def imag(x):
    return jnp.imag(x)


# -------------------------------------------------------------- activations


@lowering("aten::relu")
def relu(x):
    return _bounded(x, jnp.zeros((), x.dtype), None)  # relu(-0.0) is -0.0, as on CPU


@lowering("aten::relu6")
def relu6(x):
    return hardtanh(x, 0, 6)


@lowering("aten::hardtanh")
def hardtanh(x, min_val=-1, max_val=1):
    dtype = torch_dtype_of(x)
    return _bounded(x, jnp.asarray(cast(min_val, dtype)), jnp.asarray(cast(max_val, dtype)))


@lowering("aten::leaky_relu")
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * cast(negative_slope, torch_dtype_of(x)))


@lowering("aten::gelu")
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + jsp.erf(x * (1 / math.sqrt(2))))


@lowering("aten::silu")
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowering("aten::mish")
def mish(x):
    return x * jnp.tanh(softplus(x))


@lowering("aten::softplus")
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lowering("aten::elu")
def elu(x, alpha=1, scale=1, input_scale=1):
    negative = alpha * jnp.expm1(jnp.minimum(x, 0) * input_scale)
    return jnp.where(x > 0, x, negative) * scale


@lowering("aten::celu")
def celu(x, alpha=1.0):
    return elu(x, alpha, 1, 1 / alpha)


@lowering("aten::selu")
def selu(x):
    return elu(x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946)


@lowering("aten::hardsigmoid")
def hardsigmoid(x):
    return jnp.clip(x / 6 + 0.5, 0, 1).astype(x.dtype)


@lowering("aten::hardswish")
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lowering("aten::hardshrink")
def hardshrink(x, lambd=0.5):
    lambd = as_stored(jnp.asarray(lambd, x.dtype))  # torch compares with lambd in the tensor's dtype
    # torch's test is "inside [-lambd, lambd]": NaN is outside, and stays NaN
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


@lowering("aten::softshrink")
def softshrink(x, lambd=0.5):
    # torch's x * 0 inside the band: NaN stays NaN, a negative x gives -0
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0)).astype(x.dtype)


@lowering("aten::threshold")
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, cast(value, torch_dtype_of(x)), x)


@lowering("aten::log_sigmoid_forward")
def log_sigmoid_forward(x):
    return jax.nn.log_sigmoid(x), jnp.zeros((0,), x.dtype)


@lowering("aten::log_sigmoid")
def log_sigmoid(x):
    return jax.nn.log_sigmoid(x)


@lowering("aten::glu")
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowering("aten::_prelu_kernel")
def prelu(x, weight):
    return jnp.where(x > 0, x, weight * x)


# ------------------------------------------------ gradients of activations
# Each is the vector-Jacobian product of the forward lowering above (or the
# closed form torch uses when it is simpler), so forward and backward agree.


def _vjp(forward, grad_output, x, *args, **kwargs):
    _, pullback = jax.vjp(lambda t: forward(t, *args, **kwargs), x)
    return pullback(grad_output.astype(x.dtype))[0]


@lowering("aten::threshold_backward")
def threshold_backward(grad_output, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad_output.dtype), grad_output)


@lowering("aten::gelu_backward")
def gelu_backward(grad_output, x, *, approximate="none"):
    return _vjp(gelu, grad_output, x, approximate=approximate)


@lowering("aten::silu_backward")
def silu_backward(grad_output, x):
    s = jax.nn.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


@lowering("aten::mish_backward")
def mish_backward(grad_output, x):
    return _vjp(mish, grad_output, x)


@lowering("aten::tanh_backward")
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


@lowering("aten::sigmoid_backward")
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@lowering("aten::logit_backward")
def logit_backward(grad_output, x, eps=None):
    inside = jnp.ones(x.shape, bool) if eps is None else (x >= eps) & (x <= 1 - eps)
    return jnp.where(inside, grad_output / (x * (1 - x)), jnp.zeros((), x.dtype))


@lowering("aten::hardtanh_backward")
def hardtanh_backward(grad_output, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad_output.dtype), grad_output)


@lowering("aten::leaky_relu_backward")
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad_output, grad_output * negative_slope)


@lowering("aten::elu_backward")
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    y = self_or_result
    if is_result:
        negative = grad_output * input_scale * (y + alpha * scale)
    else:
        negative = grad_output * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return jnp.where(y > 0, grad_output * scale, negative)


@lowering("aten::softplus_backward")
def softplus_backward(grad_output, x, beta, threshold):
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad_output, grad_output * z / (z + 1))


@lowering("aten::hardsigmoid_backward")
def hardsigmoid_backward(grad_output, x):
    return jnp.where((x > -3) & (x < 3), grad_output / 6, jnp.zeros((), grad_output.dtype))


@lowering("aten::hardswish_backward")
def hardswish_backward(grad_output, x):
    inner = grad_output * ((x / 3) + 0.5)
    return jnp.where(x < -3, 0, jnp.where(x <= 3, inner, grad_output)).astype(grad_output.dtype)


@lowering("aten::hardshrink_backward")
def hardshrink_backward(grad_out, x, lambd):
    return jnp.where(jnp.abs(x) <= lambd, jnp.zeros((), grad_out.dtype), grad_out)


@lowering("aten::softshrink_backward")
def softshrink_backward(grad_output, x, lambd):
    return jnp.where(jnp.abs(x) <= lambd, jnp.zeros((), grad_output.dtype), grad_output)


@lowering("aten::log_sigmoid_backward")
def log_sigmoid_backward(grad_output, x, buffer):
    return grad_output * jax.nn.sigmoid(-x)


@lowering("aten::glu_backward")
def glu_backward(grad_output, x, dim):
    return _vjp(glu, grad_output, x, dim)


@lowering("aten::_prelu_kernel_backward")
def prelu_backward(grad_output, x, weight):
    grad_x = jnp.where(x > 0, grad_output, weight * grad_output)
    grad_w = jnp.where(x > 0, jnp.zeros((), x.dtype), x * grad_output)
    return grad_x, grad_w
