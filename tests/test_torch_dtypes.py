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


# ---------------------------------------------------------------- Python numbers meeting narrow dtypes

_U8 = "torch.tensor([0, 1, 100, 255], dtype=torch.uint8, device=D)"
_I8 = "torch.tensor([-128, -1, 3, 127], dtype=torch.int8, device=D)"


@pytest.mark.parametrize("expr", [
    f"{_U8} + (-1)", f"{_U8} + 300", f"{_U8} * (-1)", f"{_I8} * 1000", f"{_U8} == -1", f"{_U8} < 300",
    f"{_U8} // -1", f"{_U8} % -3", f"{_U8} & -2", f"{_U8}.clamp(min=-1)", f"{_U8}.clamp(max=-100)",
    f"{_U8}.fill_(-1)", f"{_U8}.masked_fill({_U8} > 50, -1)",
    f"{_U8}.index_fill(0, torch.tensor([0], device=D), -1)", f"{_U8}.scatter(0, torch.tensor([1], device=D), -2)",
    "torch.ones(2, dtype=torch.uint16, device=D).fill_(-1)", "torch.ones(2, dtype=torch.int32, device=D) + 2**40",
    "torch.where(torch.tensor([True, False], device=D), torch.ones(2, dtype=torch.uint8, device=D), -1)",
])
def test_a_python_integer_wraps_into_a_narrower_integer_dtype_as_on_cpu(expr):
    """torch casts an integer scalar into the tensors' integer dtype as C++
    casts (two's complement): ``uint8 + (-1)`` subtracts one, ``uint8 < 300``
    compares with 44.  jax refuses such a number, and the device raised
    "jax cannot compute this call"."""
    want = eval(expr, {"torch": torch, "D": "cpu"})
    got = eval(expr, {"torch": torch, "D": DEV})
    assert got.dtype == want.dtype
    assert torch.equal(cpu(got), want), expr


def test_a_compiled_graph_wraps_python_integers_as_eager_does():
    def f(x):
        return x + (-1), x < 300, x.clamp(min=-1), x.masked_fill(x > 50, -1)

    x = torch.tensor([0, 1, 100, 255], dtype=torch.uint8)
    want = f(x)
    got = torch.compile(f, backend="jax", fullgraph=True)(x.to(DEV))
    for g, w in zip(got, want):
        assert torch.equal(cpu(g), w)


@pytest.mark.parametrize("expr", [
    "torch.full((2,), 1e5, dtype=torch.float16, device=D)",
    "torch.ones(2, dtype=torch.float16, device=D).new_full((3,), 1e5)",
    "torch.full((2,), 300, dtype=torch.int8, device=D)",
    "torch.ones(2, dtype=torch.float16, device=D).fill_(1e5)",
    "torch.ones(2, dtype=torch.bfloat16, device=D).fill_(1e39)",
    "torch.ones(2, dtype=torch.float16, device=D).masked_fill(torch.tensor([True, False], device=D), 1e5)",
    "torch.ones(2, dtype=torch.float16, device=D).index_fill(0, torch.tensor([0], device=D), 1e5)",
    "torch.nn.functional.pad(torch.ones(2, dtype=torch.float16, device=D), (1, 1), value=1e5)",
    "torch.nn.functional.pad(torch.ones(2, dtype=torch.uint8, device=D), (1, 1), value=-300)",
    "torch.ones(2, dtype=torch.float16, device=D).clamp(max=1e5)",
    "torch.nn.functional.hardtanh(torch.ones(2, dtype=torch.float16, device=D), -1e5, 1e5)",
    "torch.ones(2, dtype=torch.float16, device=D).scatter(0, torch.tensor([0], device=D), 1e5)",
])
def test_a_number_the_dtype_cannot_hold_raises_cpus_overflow_error(expr):
    """A Scalar argument torch converts into the tensor's dtype with a
    check (fills, pads, clamps): a value beyond the dtype's range raises
    "value cannot be converted to type c10::Half without overflow" on CPU;
    the device gave inf (or a wrapped integer)."""
    with pytest.raises(RuntimeError, match="without overflow") as cpu_error:
        eval(expr, {"torch": torch, "D": "cpu"})
    with pytest.raises(RuntimeError, match="without overflow") as error:
        eval(expr, {"torch": torch, "D": DEV})
    assert str(error.value) == str(cpu_error.value)


def test_numbers_that_change_at_one_line_are_checked_against_the_dtype_each_time():
    """One line called with ever new numbers traces them as run-time values
    (one program for every value): a value of another range is still
    refused as CPU refuses it, a value CPU accepts still computes what CPU
    computes, and an integer that wraps to 0 still divides by zero."""
    def calls(dev):
        x = torch.tensor([0, 1, 3, 100], dtype=torch.uint8, device=dev)
        h = torch.ones(3, dtype=torch.float16, device=dev)
        for v in (1, 2, 5, 7, 200, 300, -1, -70000, 2**33, 3):
            for name, call in (("fill", lambda: x.clone().fill_(v)), ("masked_fill", lambda: x.masked_fill(x > 2, v)),
                               ("pow", lambda: x ** (v % 3)), ("floor_divide", lambda: x // v),
                               ("half fill", lambda: h.clone().fill_(v * 1000.5))):
                try:
                    yield name, v, call().cpu().tolist()
                except RuntimeError as err:
                    yield name, v, str(err)

    assert list(calls(DEV)) == list(calls("cpu"))
