"""Every dtype keeps its values on the 'jax' device (int64 beyond 2**31 included)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("expr", [
    "torch.arange(4, device=D) * 3",
    "torch.arange(4, device=D) + 2.5",
    "torch.arange(4, device=D) / 2",
    "torch.arange(4, device=D) // 2",
    "torch.ones(2, dtype=torch.float64, device=D) * 2",
    "torch.ones(2, dtype=torch.float16, device=D) + torch.ones(2, device=D)",
    "torch.ones(2, device=D) + torch.tensor(1.0, dtype=torch.float64, device=D)",
    "torch.ones(2, dtype=torch.int32, device=D) + torch.tensor(1, device=D)",
    "torch.ones(2, dtype=torch.uint8, device=D) + torch.ones(2, dtype=torch.int8, device=D)",
    "torch.ones(2, dtype=torch.bool, device=D) + 1",
    "torch.ones(2, dtype=torch.int64, device=D).sum()",
    "torch.ones(2, dtype=torch.int32, device=D).sum()",
    "torch.ones(2, dtype=torch.bool, device=D).sum()",
    "torch.ones(3, dtype=torch.int64, device=D).mean(dtype=torch.float64)",
    "torch.ones(3, device=D) > 0",
    "torch.full((2,), 2**40, dtype=torch.int64, device=D) + 1",
    "torch.ones(2, dtype=torch.float64, device=D).sin()",
])
def test_dtype_fidelity(expr):
    got = eval(expr, {"torch": torch, "D": DEV})
    want = eval(expr, {"torch": torch, "D": "cpu"})
    assert got.dtype == want.dtype, expr
    torch.testing.assert_close(cpu(got), want)


def test_int64_values_survive():
    big = torch.tensor([2**62 + 1], dtype=torch.int64)
    assert big.to(DEV).cpu().item() == 2**62 + 1
    assert torch.tensor([1e300], dtype=torch.float64, device=DEV).cpu().item() == 1e300


@pytest.mark.parametrize("call", [
    lambda x, o: torch.sum(x, 1, out=o),
    lambda x, o: torch.prod(x + 1, 1, out=o),
    lambda x, o: torch.cumsum(x, 1, out=o),
    lambda x, o: torch.cumprod(x + 1, 1, out=o),
    lambda x, o: torch.sum(x, 1, dtype=torch.float64, out=o.double()),
], ids=["sum", "prod", "cumsum", "cumprod", "sum-dtype-given"])
def test_out_of_another_dtype_decides_what_a_reduction_computes_in(call):
    """Given no dtype, sum / prod / cumsum / cumprod with out= compute in
    out's dtype (torch casts the input first): sum([0.6, 0.6, 0.6, 1.5],
    out=int64) is 1, not the float sum 3.3 cast to 3."""
    x = torch.tensor([[0.6, 0.6, 0.6, 1.5], [2.7, -0.5, 1.9, 0.2]])
    results = []
    for dev in ("cpu", DEV):
        o = torch.empty(0, dtype=torch.int64, device=dev)
        out = call(x.to(dev), o)
        results.append(cpu(out))
    assert results[1].dtype == results[0].dtype
    assert torch.equal(results[1], results[0])
