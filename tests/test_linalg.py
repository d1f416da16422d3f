"""Linear algebra on the 'jax' device against torch CPU where torch's OpInfo
samples do not reach: LDL of indefinite matrices (2x2 pivot blocks; OpInfo's
samples are positive definite), lstsq's per-driver outputs for rank-deficient
matrices, broadcast batches and vector right-hand sides, and eig's one free
choice (a sign per eigenvector)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402,F401  (registers the device if autoload is off)

DEV = "jax"


def _close(actual, expected, **tol):
    assert actual.device.type == DEV
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype, hermitian", [(torch.float32, False), (torch.float64, False),
                                              (torch.complex64, True), (torch.complex64, False)])
def test_ldl_of_indefinite_matrices_pivots_as_lapack(dtype: torch.dtype, hermitian: bool) -> None:
    torch.manual_seed(0)
    a = torch.randn(3, 8, 8, dtype=dtype)
    a = a + (a.mH if hermitian else a.mT)
    ld, pivots, info = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    assert (pivots < 0).any(), "the sample should need 2x2 blocks"
    got = torch.linalg.ldl_factor_ex(a.to(DEV), hermitian=hermitian)
    assert torch.equal(got[1].cpu(), pivots) and torch.equal(got[2].cpu(), info)
    _close(got[0], ld, rtol=1e-4, atol=1e-4)
    b = torch.randn(8, 2, dtype=dtype)
    x = torch.linalg.ldl_solve(got[0], got[1], b.to(DEV), hermitian=hermitian)
    _close(x, torch.linalg.ldl_solve(ld, pivots, b, hermitian=hermitian), rtol=1e-3, atol=1e-4)


def test_ldl_reports_lapacks_info_for_a_zero_pivot() -> None:
    a = torch.diag(torch.tensor([2.0, 0.0, 1.0]))
    _, pivots, info = torch.linalg.ldl_factor_ex(a.to(DEV))
    assert pivots.cpu().tolist() == [1, 2, 3] and info.item() == 2


# One matrix of rank 2 (a zero column: no singular value near the rcond threshold), one of full rank.
_LOW_RANK = torch.stack([torch.eye(6, 3) * torch.tensor([1.0, 2.0, 0.0]) + torch.tensor([0.1, 0.2, 0.0]),
                         torch.eye(6, 3) + 0.1])


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("case", ["tall", "wide", "broadcast", "vector", "rank-deficient"])
def test_lstsq_gives_torchs_outputs_per_driver(driver: str | None, case: str) -> None:
    if case == "rank-deficient" and driver == "gels":
        pytest.skip("LAPACK's gels assumes full rank")
    if case == "rank-deficient" and driver in (None, "gelsy"):
        pytest.skip("torch CPU passes gelsy an uninitialised jpvt, which pins random columns first: its rank of "
                    "a rank-deficient matrix changes from call to call (the device's is the rank)")
    torch.manual_seed(0)
    a, b = {
        "tall": (torch.randn(2, 6, 4), torch.randn(2, 6, 3)),
        "wide": (torch.randn(4, 6), torch.randn(4, 2)),
        "broadcast": (torch.randn(1, 6, 3), torch.randn(3, 6, 2)),
        "vector": (torch.randn(2, 5, 3), torch.randn(2, 5)),
        "rank-deficient": (_LOW_RANK, torch.randn(2, 6, 2)),
    }[case]
    expected = torch.linalg.lstsq(a, b, driver=driver)
    actual = torch.linalg.lstsq(a.to(DEV), b.to(DEV), driver=driver)
    for name in ("solution", "residuals", "rank", "singular_values"):
        _close(getattr(actual, name), getattr(expected, name), rtol=1e-4, atol=1e-4)


def test_eig_matches_up_to_each_eigenvectors_sign() -> None:
    torch.manual_seed(0)
    a = torch.randn(4, 6, 6)
    w, v = torch.linalg.eig(a)
    jw, jv = torch.linalg.eig(a.to(DEV))
    _close(jw, w, rtol=1e-4, atol=1e-5)
    phase = (jv.cpu().conj() * v).sum(-2, keepdim=True)
    phase = phase / phase.abs()
    torch.testing.assert_close(phase.abs(), torch.ones_like(phase.abs()))
    torch.testing.assert_close(phase.real.abs(), torch.ones_like(phase.real), atol=1e-4, rtol=0)  # +1 or -1
    _close(jv, v * phase.conj(), rtol=1e-4, atol=1e-5)
    _close(torch.linalg.eigvals(a.to(DEV)), w, rtol=1e-4, atol=1e-5)
