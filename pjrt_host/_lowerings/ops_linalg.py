"""Linear algebra lowerings (``torch.linalg`` and friends) on jnp.linalg.

torch's linalg ops return auxiliary outputs (``info`` codes, LU factors,
1-based int32 pivots) that its Python API then drops or checks; the
lowerings produce them with torch's shapes and dtypes.  ``info`` is LAPACK's
for the factorisations whose failure torch reports (Cholesky: the order of
the first leading minor that is not positive-definite; LU, solve, inverse:
the first zero pivot), so ``torch.linalg.cholesky`` / ``inv`` / ``solve``
of a bad matrix raise torch's ``LinAlgError`` with torch's text where they
returned NaN / inf: ``_linalg_check_errors`` reads ``info`` from the device
(as torch's cuda kernels do) and runs torch's own check on it.  Inside a
compiled graph nothing is read, and, as with ``check_errors=False``, a
singular matrix shows up as inf / NaN.

Where torch CPU's LAPACK leaves a free choice the lowerings take jaxlib's:
the sign of an eigenvector (``eig``, ``eigh``) or of a singular vector.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from . import lowering
from ._util import canonical_dim, cast, float_dtype, index_of_max, result_type


def _info(a):
    return jnp.zeros(a.shape[:-2], jnp.int32)


def _first(bad):
    """LAPACK's info from a per-column failure mask: the 1-based position of
    the first failure along the last axis, 0 where there is none."""
    if bad.shape[-1] == 0:  # an empty matrix cannot fail
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    return jnp.where(bad.any(-1), index_of_max(bad, -1) + 1, 0).astype(jnp.int32)


def _lu_info(lu):
    """getrf's info: the first zero on U's diagonal."""
    return _first(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _mT(a):
    return jnp.swapaxes(a, -1, -2)


@lowering("aten::linalg_inv_ex")
def inv_ex(a, *, check_errors=False):
    lu_, piv, _ = jax.lax.linalg.lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return jsl.lu_solve((lu_, piv), eye), _lu_info(lu_)


@lowering("aten::linalg_inv", "aten::inverse")
def inv(a):
    return jnp.linalg.inv(a)


@lowering("aten::linalg_cholesky_ex")
def cholesky_ex(a, *, upper=False, check_errors=False):
    lower = jnp.linalg.cholesky(a)
    info = jnp.zeros(a.shape[:-2], jnp.int32)
    if a.shape[-1]:
        failed = ~jnp.isfinite(lower).all()  # jax fills a failed factor with NaN
        info = jax.lax.cond(failed, _cholesky_info, lambda m: info, a)
    return (_mT(lower).conj() if upper else lower), info


def _cholesky_info(a):
    """potrf's info: the order of the first leading minor that is not
    positive-definite -- where elimination without pivoting (Cholesky's
    pivots, squared) meets a pivot that is not positive.  Only computed when
    the factorisation failed."""
    n = a.shape[-1]
    lower = jnp.tril(a)
    m = lower + _mT(jnp.tril(a, -1)).conj()  # the triangle torch reads, made whole
    ahead = jnp.arange(n)

    def step(k, m):
        pivot = m[..., k, k]
        below = jnp.where(ahead > k, m[..., :, k] / pivot[..., None], 0)
        right = jnp.where(ahead > k, m[..., k, :], 0)
        return m - below[..., :, None] * right[..., None, :]

    m = jax.lax.fori_loop(0, n, step, m)
    pivots = jnp.real(jnp.diagonal(m, axis1=-2, axis2=-1))
    return _first(~(pivots > 0))


@lowering("aten::cholesky")
def cholesky(a, upper=False):
    if a.size == 0:  # torch returns an empty input as it is, square or not (a (0, 5) input included)
        return a
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
    return lu, piv, _lu_info(lu)


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
    return x, lu_, piv, _lu_info(lu_)


@lowering("aten::linalg_solve_triangular")
def solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    # torch promotes A and B to one floating type (solve_triangular(A_float, B_int64) is float)
    dtype = float_dtype(result_type(a, b))
    a, b = cast(a, dtype), cast(b, dtype)
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


@lowering("aten::_linalg_check_errors", data_dependent=True)
def check_errors(info, api_name, *, is_matrix):
    """torch's own check (its ``LinAlgError`` and text) on the ``info`` the
    lowerings computed, read from the device; in a traced graph, none."""
    if isinstance(info, jax.core.Tracer):
        return None
    import numpy as np
    import torch

    torch.ops.aten._linalg_check_errors(torch.from_numpy(np.array(info)), api_name, is_matrix=is_matrix)
    return None


@lowering("aten::linalg_pinv.atol_rtol_tensor", "aten::linalg_pinv.atol_rtol_float")
def pinv(a, atol=None, rtol=None, hermitian=False):
    if a.size == 0:  # torch returns early here, a (..., n, m) result, square or not (hermitian)
        return jnp.zeros(a.shape[:-2] + (a.shape[-1], a.shape[-2]), a.dtype)
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


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@lowering("aten::linalg_lstsq")
def lstsq(a, b, rcond=None, *, driver=None):
    """torch's ``(solution, residuals, rank, singular_values)`` per LAPACK driver.

    ``gels`` is LAPACK's algorithm: a QR (an LQ when A is wide) that assumes
    full rank.  ``gelsy``, ``gelss`` and ``gelsd`` give the minimum-norm
    solution through the SVD, singular values at most ``rcond * s_max``
    taken as zero; for full-rank A that is the solution LAPACK computes, up
    to rounding.  ``gelsy``'s rank comes from LAPACK's pivoted QR and its
    condition estimate, the lowering's from the same singular value
    threshold; they can differ only for a matrix within rounding of that
    threshold.  (torch CPU hands gelsy an uninitialised ``jpvt``, which pins
    random columns first, so for a rank-deficient matrix its own rank and
    solution change from call to call; the lowering's are those with every
    column free.)  Residuals (``||A x - B||^2`` per column) exist, as in torch,
    when A is tall, for gels, and for gelss / gelsd only if every matrix has
    full column rank -- a shape that depends on the values, so that case
    runs eagerly (see ``_lstsq_core``)."""
    driver = "gelsy" if driver is None else driver  # torch CPU's default
    if a.ndim < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if not 0 <= a.ndim - b.ndim <= 1:
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    vector = a.ndim - b.ndim == 1
    b2 = b[..., None] if vector else b
    m, n = a.shape[-2:]
    if b2.shape[-2] != m:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    if a.dtype != b.dtype:
        raise RuntimeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                           f"input's dtype {a.dtype} and other's dtype {b.dtype}")
    eps = float(jnp.finfo(a.dtype).eps)
    rcond = eps * max(m, n) if rcond is None else (eps if rcond < 0 else float(rcond))
    solution, residuals, rank, sv = _lstsq_core(a, b2, rcond=rcond, driver=driver)
    if driver in ("gelss", "gelsd") and m > n and rank.size:
        # Residuals only if every matrix has full column rank: under jax.jit
        # this raises a concretization error and the op is rerun eagerly.
        if not bool(jnp.all(rank == n)):
            residuals = jnp.zeros((0,), residuals.dtype)
    return (solution[..., 0] if vector else solution), residuals, rank, sv


@functools.partial(jax.jit, static_argnames=("rcond", "driver"))
def _lstsq_core(a, b, *, rcond, driver):
    """lstsq's arrays, with gelss / gelsd residuals as if every matrix had
    full rank (:func:`lstsq` drops them where not).  Jitted on its own, so
    an eager rerun of lstsq still compiles the arithmetic."""
    m, n = a.shape[-2:]
    k = b.shape[-1]
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    real = jnp.finfo(a.dtype).dtype
    with_rank, with_sv = driver != "gels", driver in ("gelss", "gelsd")
    with_residuals = m > n and driver != "gelsy"
    if a.size == 0 or b.size == 0:  # LAPACK's quick return: x = 0, rank 0; gels also zeroes b
        solution = jnp.zeros(batch + (n, k), a.dtype)
        residuals = jnp.sum(jnp.abs(jnp.broadcast_to(b, batch + (m, k))) ** 2, axis=-2).astype(real)
        residuals = (residuals * (driver != "gels")) if with_residuals else jnp.zeros((0,), real)
        rank = jnp.zeros(a.shape[:-2] if with_rank else (0,), jnp.int64)
        sv = jnp.zeros(a.shape[:-2] + (min(m, n),) if with_sv else (0,), real)
        return solution, residuals, rank, sv
    if driver == "gels":
        if m >= n:  # A = Q R: x = R^-1 (Q^H b)[:n]
            h, tau = geqrf(jnp.broadcast_to(a, batch + (m, n)))
            c = jax.lax.linalg.ormqr(h, tau, jnp.broadcast_to(b, batch + (m, k)), left=True, transpose=True)
            solution = jax.lax.linalg.triangular_solve(jnp.triu(h[..., :n, :]), c[..., :n, :], left_side=True,
                                                       lower=False)
        else:  # A^H = Q R, A = R^H Q^H: x = Q [R^-H b; 0], the minimum-norm solution
            h, tau = geqrf(jnp.broadcast_to(_mT(a).conj(), batch + (n, m)))
            y = jax.lax.linalg.triangular_solve(jnp.triu(h[..., :m, :]), jnp.broadcast_to(b, batch + (m, k)),
                                                left_side=True, lower=False, transpose_a=True, conjugate_a=True)
            y = jnp.concatenate([y, jnp.zeros(batch + (n - m, k), a.dtype)], axis=-2)
            solution = jax.lax.linalg.ormqr(h, tau, y, left=True, transpose=False)
        rank, sv = jnp.zeros((0,), jnp.int64), jnp.zeros((0,), real)
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        keep = s > rcond * s[..., :1]
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
        s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
        solution = _mT(vh).conj() @ (s_inv[..., :, None] * (_mT(u).conj() @ b))
        sv = s if with_sv else jnp.zeros((0,), real)
        if not with_rank:
            rank = jnp.zeros((0,), jnp.int64)
        if with_residuals:
            h, tau = geqrf(jnp.broadcast_to(a, batch + (m, n)))
            c = jax.lax.linalg.ormqr(h, tau, jnp.broadcast_to(b, batch + (m, k)), left=True, transpose=True)
    if with_residuals:  # the part of b outside A's column space, as LAPACK leaves it in rows n: of Q^H b
        residuals = jnp.sum(jnp.abs(c[..., n:, :]) ** 2, axis=-2).astype(real)
    else:
        residuals = jnp.zeros((0,), real)
    return jnp.broadcast_to(solution, batch + (n, k)), residuals, rank, sv


# ---------------------------------------------------------------- LDL (Bunch-Kaufman)
#
# torch calls LAPACK's sytrf (hetrf for Hermitian complex input) with the lower
# triangle; for n below LAPACK's block size that is the unblocked sytf2 /
# hetf2, which _ldl_factor_one follows step by step: the same pivot choices,
# the same arithmetic, and so the same LD and pivots up to rounding.  Pivots
# are LAPACK's, 1-based: k > 0 a 1x1 block after swapping rows / columns with
# k, -k (twice) a 2x2 block after swapping the second with k.  Each step sees
# the trailing matrix whole (both triangles), permuted as LAPACK's swaps do.


def _cabs1(z):
    """LAPACK's CABS1 (|re| + |im|), what its complex pivot searches compare; abs for real."""
    return jnp.abs(z.real) + jnp.abs(z.imag) if jnp.iscomplexobj(z) else jnp.abs(z)


def _ldl_full(lower, herm):
    """The symmetric (Hermitian) matrix whose lower triangle is ``lower``."""
    strict = jnp.tril(lower, -1)
    diag = jnp.diagonal(lower)
    diag = diag.real.astype(lower.dtype) if herm else diag
    return strict + (strict.conj() if herm else strict).T + jnp.diag(diag)


def _ldl_factor_one(a, herm):
    n = a.shape[-1]
    real = jnp.finfo(a.dtype).dtype
    alpha = ((1 + jnp.sqrt(jnp.asarray(17, real))) / 8).astype(real)  # as LAPACK computes it
    idx = jnp.arange(n)
    rows, cols = idx[:, None], idx[None, :]
    conj = (lambda z: z.conj()) if herm else (lambda z: z)
    diag_abs = (lambda z: jnp.abs(z.real)) if herm else _cabs1

    def step(state):
        lower, ipiv, info, k = state
        full = _ldl_full(lower, herm)
        col = full[:, k]
        absakk = diag_abs(col[k])
        below = jnp.where(idx > k, _cabs1(col), -1)
        imax = index_of_max(below)  # the first largest, as LAPACK's i*amax
        colmax = jnp.maximum(below[imax], 0)
        rowmax = jnp.max(jnp.where((idx >= k) & (idx != imax), _cabs1(full[imax]), 0))
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = zero | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        one = keep | (diag_abs(full[imax, imax]) >= alpha * rowmax)
        kp = jnp.where(keep, k, imax)
        kk = jnp.where(one, k, k + 1)  # the row / column that kp replaces
        perm = idx.at[kk].set(kp).at[kp].set(kk)
        s = full[perm][:, perm]  # the trailing matrix after LAPACK's interchange
        d = s[k, k]
        # 1x1 block: x = column k below the diagonal; A -= x x^T / d, column k /= d.
        x = jnp.where(idx > k, s[:, k], 0)
        r1 = (1 / d.real).astype(a.dtype) if herm else 1 / d
        upd1 = s + x[:, None] * (-r1 * conj(x))[None, :]
        col1 = r1 * x
        # 2x2 block [[d, e*], [e, f]]: LAPACK's w_k, w_k+1 per row j > k+1.
        c0 = jnp.where(idx > k + 1, s[:, k], 0)
        c1 = jnp.where(idx > k + 1, s[:, jnp.minimum(k + 1, n - 1)], 0)
        e = s[jnp.minimum(k + 1, n - 1), k]
        f = s[jnp.minimum(k + 1, n - 1), jnp.minimum(k + 1, n - 1)]
        if herm:
            absd = jnp.abs(e)
            d11, d22 = f.real / absd, d.real / absd
            tt = 1 / (d11 * d22 - 1)
            d21 = e / absd
            dd = tt / absd
            wk = dd * (d11 * c0 - d21 * c1)
            wkp1 = dd * (d22 * c1 - d21.conj() * c0)
        else:
            d11, d22 = f / e, d / e
            t = 1 / (d11 * d22 - 1)
            d21 = t / e
            wk = d21 * (d11 * c0 - c1)
            wkp1 = d21 * (d22 * c1 - c0)
        upd2 = s - c0[:, None] * conj(wk)[None, :] - c1[:, None] * conj(wkp1)[None, :]
        # Write back the lower triangle of the trailing matrix.
        trailing = (rows >= cols) & (cols >= k)
        new1 = jnp.where(cols > k, upd1, jnp.where((cols == k) & (rows > k), col1[:, None], s))
        new2 = jnp.where(cols > k + 1, upd2,
                         jnp.where((cols == k) & (rows > k + 1), wk[:, None],
                                   jnp.where((cols == k + 1) & (rows > k + 1), wkp1[:, None], s)))
        new = jnp.where(zero, full, jnp.where(one, new1, new2))
        if herm:
            new = jnp.where(rows == cols, new.real.astype(a.dtype), new)
        lower = jnp.where(trailing, new, lower)
        piv = (kp + 1).astype(jnp.int32)
        ipiv = jnp.where(one, ipiv.at[k].set(piv), ipiv.at[k].set(-piv).at[jnp.minimum(k + 1, n - 1)].set(-piv))
        info = jnp.where(zero & (info == 0), k + 1, info)
        return lower, ipiv, info, k + jnp.where(one, 1, 2)

    state = (jnp.tril(a), jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    lower, ipiv, info, _ = jax.lax.while_loop(lambda st: st[3] < n, step, state)
    return lower, ipiv, info


@lowering("aten::linalg_ldl_factor_ex")
def ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    """LAPACK's sytrf / hetrf, lower triangle, as torch CPU calls it (see
    above); info is LAPACK's too: k > 0 where D(k, k) is exactly zero."""
    if a.size == 0:
        return jnp.zeros(a.shape, a.dtype), jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    herm = bool(hermitian) and jnp.iscomplexobj(a)
    fn = jnp.vectorize(functools.partial(_ldl_factor_one, herm=herm), signature="(n,n)->(n,n),(n),()")
    return fn(a)


@lowering("aten::linalg_ldl_factor")
def ldl_factor(a, *, hermitian=False):
    return ldl_factor_ex(a, hermitian=hermitian)[:2]


def _ldl_solve_one(ld, ipiv, b, herm):
    """LAPACK's sytrs / hetrs: B := A^-1 B for A = L D L^T (L D L^H) as
    sytrf / hetrf leave it, one block of D at a time."""
    n = ld.shape[-1]
    idx = jnp.arange(n)
    conj = (lambda z: z.conj()) if herm else (lambda z: z)

    def swap(b, i, j):
        return b[idx.at[i].set(j).at[j].set(i)]

    def forward(state):  # L D y = b
        b, k = state
        p = ipiv[k]
        one = p > 0
        k1 = jnp.minimum(k + 1, n - 1)
        # 1x1 block
        b1 = swap(b, k, p - 1)
        b1 = b1 - jnp.where(idx > k, ld[:, k], 0)[:, None] * b1[k][None, :]
        akk = ld[k, k]
        b1 = b1.at[k].multiply((1 / akk.real).astype(b.dtype) if herm else 1 / akk)
        # 2x2 block
        b2 = swap(b, k1, -p - 1)
        b2 = b2 - jnp.where(idx > k1, ld[:, k], 0)[:, None] * b2[k][None, :]
        b2 = b2 - jnp.where(idx > k1, ld[:, k1], 0)[:, None] * b2[k1][None, :]
        e = ld[k1, k]
        akm1 = ld[k, k] / conj(e)
        ak = ld[k1, k1] / e
        denom = akm1 * ak - 1
        bkm1, bk = b2[k] / conj(e), b2[k1] / e
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(one, b1, b2), k + jnp.where(one, 1, 2)

    def backward(state):  # L^T x = y (L^H for Hermitian)
        b, k = state
        p = ipiv[k]
        one = p > 0
        km1 = jnp.maximum(k - 1, 0)
        below = jnp.where((idx > k)[:, None], b, 0)
        b1 = b.at[k].add(-(conj(ld[:, k]) @ below))
        b1 = swap(b1, k, p - 1)
        b2 = b.at[k].add(-(conj(ld[:, k]) @ below)).at[km1].add(-(conj(ld[:, km1]) @ below))
        b2 = swap(b2, k, -p - 1)
        return jnp.where(one, b1, b2), k - jnp.where(one, 1, 2)

    b, _ = jax.lax.while_loop(lambda st: st[1] < n, forward, (b, jnp.zeros((), jnp.int32)))
    b, _ = jax.lax.while_loop(lambda st: st[1] >= 0, backward, (b, jnp.asarray(n - 1, jnp.int32)))
    return b


@lowering("aten::linalg_ldl_solve")
def ldl_solve(ld, pivots, b, *, hermitian=False):
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    out = jnp.broadcast_to(b, batch + b.shape[-2:])
    if out.size == 0:
        return out
    herm = bool(hermitian) and jnp.iscomplexobj(ld)
    fn = jnp.vectorize(functools.partial(_ldl_solve_one, herm=herm), signature="(n,n),(n),(n,k)->(n,k)")
    return fn(ld, pivots.astype(jnp.int32), out)
