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
