"""Linear algebra lowerings (``torch.linalg`` and friends) on jnp.linalg.

torch's linalg ops return auxiliary outputs (``info`` codes, LU factors,
1-based int32 pivots) that its Python API then drops or checks; the
lowerings produce them with torch's shapes and dtypes.  ``info`` is always 0:
a jitted function cannot raise on singular input, so, as with torch's
``check_errors=False``, a singular matrix shows up as inf / NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from . import lowering
from ._util import canonical_dim


def _info(a):
    return jnp.zeros(a.shape[:-2], jnp.int32)


def _mT(a):
    return jnp.swapaxes(a, -1, -2)


@lowering("aten::linalg_inv_ex")
def inv_ex(a, *, check_errors=False):
    return jnp.linalg.inv(a), _info(a)


@lowering("aten::linalg_inv", "aten::inverse")
def inv(a):
    return jnp.linalg.inv(a)


@lowering("aten::linalg_cholesky_ex")
def cholesky_ex(a, *, upper=False, check_errors=False):
    lower = jnp.linalg.cholesky(a)
    return (_mT(lower).conj() if upper else lower), _info(a)


@lowering("aten::cholesky")
def cholesky(a, upper=False):
    return cholesky_ex(a, upper=upper)[0]


@lowering("aten::_linalg_eigh")
def eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@lowering("aten::linalg_qr")
def qr(a, mode="reduced"):
    if mode == "r":
        r = jnp.linalg.qr(a, mode="r")
        return jnp.zeros((0,), a.dtype), r
    return jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")


@lowering("aten::_linalg_svd")
def svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        empty = jnp.zeros((0,), a.dtype)
        return empty, s, empty
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


def _lu_factor(a):
    """(LU, 1-based int32 pivots) as LAPACK's getrf gives them."""
    lu, piv, _ = jax.lax.linalg.lu(a)
    return lu, (piv + 1).astype(jnp.int32)


@lowering("aten::linalg_lu_factor_ex")
def lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, piv = _lu_factor(a)
    return lu, piv, _info(a)


@lowering("aten::linalg_lu")
def lu(a, *, pivot=True):
    m, n = a.shape[-2:]
    k = min(m, n)
    lu_, _, perm = jax.lax.linalg.lu(a)
    lower = jnp.tril(lu_[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
    upper = jnp.triu(lu_[..., :k, :])
    p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=a.dtype), -1, -2)
    return p, lower, upper


@lowering("aten::_linalg_det")
def det(a):
    lu_, piv = _lu_factor(a)
    return jnp.linalg.det(a), lu_, piv


@lowering("aten::_linalg_slogdet")
def slogdet(a):
    lu_, piv = _lu_factor(a)
    sign, logabsdet = jnp.linalg.slogdet(a)
    return sign, logabsdet, lu_, piv


@lowering("aten::_linalg_solve_ex")
def solve_ex(a, b, *, left=True, check_errors=False):
    lu_, piv = _lu_factor(a)
    vector = b.ndim == a.ndim - 1  # a batch of vectors, not of matrices
    if left:
        x = jnp.linalg.solve(a, b[..., None])[..., 0] if vector else jnp.linalg.solve(a, b)
    else:
        x = _mT(jnp.linalg.solve(_mT(a), _mT(b)))
    return x, lu_, piv, _info(a)


@lowering("aten::linalg_solve_triangular")
def solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if left:
        return jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, unit_diagonal=unitriangular)
    return jax.lax.linalg.triangular_solve(a, b, left_side=False, lower=not upper, unit_diagonal=unitriangular)


@lowering("aten::triangular_solve")
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    x = jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                        unit_diagonal=unitriangular)
    return x, a


@lowering("aten::cholesky_solve")
def cholesky_solve(b, factor, upper=False):
    return jsl.cho_solve((factor, not upper), b)


@lowering("aten::cholesky_inverse")
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return jsl.cho_solve((factor, not upper), eye)


@lowering("aten::linalg_cross")
def cross(a, b, *, dim=-1):
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    return jnp.cross(a, b, axis=canonical_dim(dim, len(shape)))


@lowering("aten::linalg_matrix_exp")
def matrix_exp(a):
    return jsl.expm(a)


@lowering("aten::linalg_eigvalsh")
def eigvalsh(a, UPLO="L"):
    return jnp.linalg.eigvalsh(a, UPLO=UPLO)


@lowering("aten::trace")
def trace(a):
    out = jnp.trace(a)
    return out.astype(jnp.int64) if not jnp.issubdtype(a.dtype, jnp.inexact) else out


@lowering("aten::linalg_householder_product")
def householder_product(a, tau):
    return jax.lax.linalg.householder_product(a, tau)


@lowering("aten::_linalg_check_errors")
def check_errors(info, api_name, *, is_matrix):
    """Nothing to check: the lowerings report info == 0 (see module doc)."""
    return None


@lowering("aten::linalg_pinv.atol_rtol_tensor", "aten::linalg_pinv.atol_rtol_float")
def pinv(a, atol=None, rtol=None, hermitian=False):
    if hermitian:  # from the lower triangle's eigendecomposition, as torch does
        w, v = jnp.linalg.eigh(a, symmetrize_input=False)
        s, u, vh = jnp.abs(w), v * jnp.sign(w)[..., None, :], _mT(v).conj()
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    smax = jnp.max(s, axis=-1, keepdims=True, initial=0.0)  # an empty matrix has no singular value
    atol = 0.0 if atol is None else jnp.asarray(atol)[..., None] if hasattr(atol, "shape") else atol
    if rtol is None:
        rtol = 0.0 if atol is not None and not (isinstance(atol, float) and atol == 0.0) else (
            max(a.shape[-2:]) * jnp.finfo(a.dtype).eps)
    rtol = jnp.asarray(rtol)[..., None] if hasattr(rtol, "shape") else rtol
    cutoff = jnp.maximum(atol, rtol * smax)
    s_inv = jnp.where(s > cutoff, 1 / jnp.where(s > cutoff, s, 1), 0)
    return jnp.matmul(_mT(vh).conj() * s_inv[..., None, :], _mT(u).conj())


@lowering("aten::lu_unpack")
def lu_unpack(lu_data, lu_pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu_data.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu_data[..., :, :k], -1) + jnp.eye(m, k, dtype=lu_data.dtype)
    upper = jnp.triu(lu_data[..., :k, :])
    perm = jax.lax.linalg.lu_pivots_to_permutation(lu_pivots.astype(jnp.int32) - 1, m)
    p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu_data.dtype), -1, -2)
    return p, lower, upper


@lowering("aten::linalg_lu_solve")
def lu_solve(lu_data, pivots, b, *, left=True, adjoint=False):
    p, lower, upper = lu_unpack(lu_data, pivots)
    solve = jax.lax.linalg.triangular_solve
    if left and not adjoint:  # A = P L U: x = U^-1 L^-1 P^T b
        y = solve(lower, _mT(p) @ b, left_side=True, lower=True, unit_diagonal=True)
        return solve(upper, y, left_side=True, lower=False)
    a = p @ lower @ upper
    a = _mT(a).conj() if adjoint else a
    return jnp.linalg.solve(a, b) if left else _mT(jnp.linalg.solve(_mT(a), _mT(b)))


@lowering("aten::geqrf")
def geqrf(a):
    """LAPACK's geqrf: R above the diagonal, the Householder vectors below it,
    and their scalar factors tau.  jnp's "raw" QR is geqrf, transposed."""
    h, tau = jnp.linalg.qr(a, mode="raw")
    return _mT(h), tau


@lowering("aten::ormqr")
def ormqr(a, tau, other, left=True, transpose=False):
    """``other`` times Q (or Q^H) of geqrf's Householder form, Q never formed."""
    if other.size == 0 or tau.shape[-1] == 0:  # no reflector: Q is the identity
        return jnp.broadcast_to(other, jnp.broadcast_shapes(a.shape[:-2], other.shape[:-2]) + other.shape[-2:])
    return jax.lax.linalg.ormqr(a[..., : tau.shape[-1]], tau, other, left=left, transpose=transpose)


@lowering("aten::linalg_eig")
def eig(a):
    """LAPACK's geev, as torch CPU calls it: complex eigenvalues in geev's
    order, eigenvectors of unit norm with their largest component real (which
    leaves each one's sign free: LAPACK builds differ there)."""
    if a.shape[-1] == 0:
        dtype = jnp.result_type(a.dtype, jnp.complex64)
        return jnp.zeros(a.shape[:-1], dtype), jnp.zeros(a.shape, dtype)
    w, v = jnp.linalg.eig(a)
    return w, v


@lowering("aten::linalg_eigvals", "aten::_linalg_eigvals")
def eigvals(a):
    if a.shape[-1] == 0:
        return jnp.zeros(a.shape[:-1], jnp.result_type(a.dtype, jnp.complex64))
    return jnp.linalg.eigvals(a)
