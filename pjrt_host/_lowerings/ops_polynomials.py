"""Classical orthogonal polynomials of a tensor degree ``n``
(``torch.special.*_polynomial_*``), with torch's special cases.

Each is its three-term recurrence run up to the largest degree present
(a ``lax.while_loop``, so it traces), every element picking its own degree's
value; the Chebyshev kinds switch to their trigonometric closed forms for
large degrees inside (-1, 1), as torch does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import lowering
from ._util import cast, float_dtype, result_type


def _operands(x, n):
    dtype = float_dtype(result_type(x, n))
    x = cast(x, dtype)
    n = cast(n, dtype)
    x, n = jnp.broadcast_arrays(x, n)
    # torch's CPU kernels take a degree as int64_t: a NaN or infinite one
    # converts to INT64_MIN on x86 (a negative degree: 0), where XLA would
    # saturate to INT64_MAX and the recurrence below would never end
    return x, jnp.where(jnp.isfinite(n), jnp.trunc(n), -1).astype(jnp.int64)


def _recurrence(x, n, p0, p1, step):
    """p_n for each element, from p_0, p_1 and p_k = step(k, p_{k-1}, p_{k-2})."""
    out = jnp.where(n == 0, p0, jnp.where(n == 1, p1, jnp.zeros_like(x)))
    top = jnp.max(n, initial=1)

    def body(state):
        k, p, q, out = state
        r = step(k, q, p)
        return k + 1, q, r, jnp.where(n == k, r, out)

    _, _, _, out = jax.lax.while_loop(lambda s: s[0] <= top, body, (jnp.asarray(2, jnp.int64), p0, p1, out))
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _ones(x):
    return jnp.ones_like(x)


def _chebyshev(kind, x, n):
    first = {"t": x, "u": 2 * x, "v": 2 * x - 1, "w": 2 * x + 1}[kind]
    out = _recurrence(x, n, _ones(x), first, lambda k, q, p: 2 * x * q - p)
    nf = n.astype(x.dtype)
    odd = (n % 2) == 1
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    inside = (jnp.abs(x) < 1) & (n > (6 if kind == "t" else 8))
    if kind == "t":
        closed = jnp.cos(nf * theta)
        at_one = jnp.where((x > 0) | ~odd, 1.0, -1.0)
    elif kind == "u":
        s = jnp.sin(theta)
        closed = jnp.where(s != 0, jnp.sin((nf + 1) * theta) / jnp.where(s != 0, s, 1),
                           (nf + 1) * jnp.cos((nf + 1) * theta) / x)
        at_one = jnp.where((x > 0) | ~odd, nf + 1, -(nf + 1))
    elif kind == "v":
        c = jnp.cos(theta / 2)
        closed = jnp.where(c != 0, jnp.cos((nf + 0.5) * theta) / jnp.where(c != 0, c, 1),
                           jnp.where(odd, -(nf + 1), nf + 1))
        at_one = jnp.where(x > 0, 1.0, jnp.where(odd, -(2 * nf + 1), 2 * nf + 1))
    else:
        s = jnp.sin(theta / 2)
        closed = jnp.where(s != 0, jnp.sin((nf + 0.5) * theta) / jnp.where(s != 0, s, 1), 2 * nf + 1)
        at_one = jnp.where(x > 0, 2 * nf + 1, jnp.where(odd, -1.0, 1.0))
    out = jnp.where(inside, closed, out)
    out = jnp.where((jnp.abs(x) == 1) & (n >= 0), at_one, out)
    return out.astype(x.dtype)


def _chebyshev_lowering(kind, shifted):
    def lower(x, n):
        x, n = _operands(x, n)
        return _chebyshev(kind, 2 * x - 1 if shifted else x, n)

    return lower


for _kind in "tuvw":
    lowering(f"aten::special_chebyshev_polynomial_{_kind}", f"aten::special_chebyshev_polynomial_{_kind}.x_scalar",
             f"aten::special_chebyshev_polynomial_{_kind}.n_scalar")(_chebyshev_lowering(_kind, False))
    lowering(f"aten::special_shifted_chebyshev_polynomial_{_kind}",
             f"aten::special_shifted_chebyshev_polynomial_{_kind}.x_scalar",
             f"aten::special_shifted_chebyshev_polynomial_{_kind}.n_scalar")(_chebyshev_lowering(_kind, True))


@lowering("aten::special_hermite_polynomial_h", "aten::special_hermite_polynomial_h.x_scalar",
          "aten::special_hermite_polynomial_h.n_scalar")
def hermite_h(x, n):
    x, n = _operands(x, n)
    return _recurrence(x, n, _ones(x), 2 * x, lambda k, q, p: 2 * x * q - 2 * (k - 1).astype(x.dtype) * p)


@lowering("aten::special_hermite_polynomial_he", "aten::special_hermite_polynomial_he.x_scalar",
          "aten::special_hermite_polynomial_he.n_scalar")
def hermite_he(x, n):
    x, n = _operands(x, n)
    return _recurrence(x, n, _ones(x), x, lambda k, q, p: x * q - (k - 1).astype(x.dtype) * p)


@lowering("aten::special_laguerre_polynomial_l", "aten::special_laguerre_polynomial_l.x_scalar",
          "aten::special_laguerre_polynomial_l.n_scalar")
def laguerre_l(x, n):
    x, n = _operands(x, n)

    def step(k, q, p):
        j = (k - 1).astype(x.dtype)
        return ((2 * j + 1 - x) * q - j * p) / (j + 1)

    out = _recurrence(x, n, _ones(x), 1 - x, step)
    return jnp.where((x == 0) & (n >= 0), 1.0, out).astype(x.dtype)


@lowering("aten::special_legendre_polynomial_p", "aten::special_legendre_polynomial_p.x_scalar",
          "aten::special_legendre_polynomial_p.n_scalar")
def legendre_p(x, n):
    x, n = _operands(x, n)

    def step(k, q, p):
        j = (k - 1).astype(x.dtype)
        return ((2 * j + 1) * x * q - j * p) / (j + 1)

    out = _recurrence(x, n, _ones(x), x, step)
    at_one = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)
    return jnp.where((jnp.abs(x) == 1) & (n >= 0), at_one, out).astype(x.dtype)
