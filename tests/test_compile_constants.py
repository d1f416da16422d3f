"""Tensor constants of a compiled graph (what ``torch.tensor(data)`` in the
compiled code leaves: AOTAutograd's ``_tensor_constantN``) reach the device
bit for bit, whatever their dtype: a float64 constant is not narrowed to
float32, bfloat16 / float16 / int64 / complex values and NaN payloads are
the constant's own.  Each compiled result equals eager's, bit for bit."""

from __future__ import annotations

import struct

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import torch._dynamo  # noqa: E402

import pjrt_host  # noqa: E402,F401

DEV = "jax"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    return t.reshape(-1).view(torch.uint8)


def _same(compiled: torch.Tensor, eager: torch.Tensor) -> None:
    assert compiled.device.type == DEV
    assert compiled.dtype == eager.dtype and compiled.shape == eager.shape
    assert torch.equal(_bits(compiled), _bits(eager)), (compiled.cpu(), eager.cpu())


def _nan_with_payload() -> float:
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_1234_5679))[0]


# (name, dtype of x, function using a constant made in the compiled code):
# 0-d constants made on the CPU (which torch lets meet 'jax' tensors), and
# constants made on the device.
_CASES = [
    ("float64", torch.float64, lambda x: x + torch.tensor(0.1, dtype=torch.float64)),
    ("float64_third", torch.float64, lambda x: x * torch.tensor(1 / 3, dtype=torch.float64)),
    ("float64_tiny", torch.float64, lambda x: x * torch.tensor(1e-300, dtype=torch.float64)),
    ("float64_on_device", torch.float64,
     lambda x: x * torch.tensor([1 / 3, 1e-300, 2.0 ** 60 + 1.0], dtype=torch.float64, device=DEV)),
    ("bfloat16", torch.bfloat16, lambda x: x + torch.tensor(1.0078125, dtype=torch.bfloat16)),
    ("bfloat16_on_device", torch.bfloat16,
     lambda x: x + torch.tensor([1.0078125, -3.140625, 1e-30], dtype=torch.bfloat16, device=DEV)),
    ("float16", torch.float16, lambda x: x + torch.tensor(0.0999755859375, dtype=torch.float16)),
    ("float16_subnormal", torch.float16, lambda x: x * torch.tensor(6.0e-8, dtype=torch.float16)),
    ("float16_on_device", torch.float16,
     lambda x: x + torch.tensor([0.0999755859375, 6.0e-8, 65504.0], dtype=torch.float16, device=DEV)),
    ("int64_large", torch.int64, lambda x: x + torch.tensor(2 ** 53 + 1, dtype=torch.int64)),
    ("int64_largest", torch.int64, lambda x: x * 0 + torch.tensor(2 ** 63 - 1, dtype=torch.int64)),
    ("int64_on_device", torch.int64,
     lambda x: x + torch.tensor([2 ** 53 + 1, -(2 ** 62) - 3, 2 ** 62 + 7], dtype=torch.int64, device=DEV)),
    ("complex64", torch.complex64, lambda x: x * torch.tensor(0.1 + 0.7j, dtype=torch.complex64)),
    ("complex64_on_device", torch.complex64,
     lambda x: x * torch.tensor([0.1 + 0.7j, -1e-20j, 3.0], dtype=torch.complex64, device=DEV)),
    ("complex128", torch.complex128, lambda x: x + torch.tensor(0.1 + 1e-300j, dtype=torch.complex128)),
    ("complex128_on_device", torch.complex128,
     lambda x: x + torch.tensor([0.1 + 0.2j, 1e-300 - 1e300j, 1.0], dtype=torch.complex128, device=DEV)),
    ("float64_nan_payload", torch.float64,
     lambda x: torch.where(x > 100, x, torch.tensor(_nan_with_payload(), dtype=torch.float64))),
]


@pytest.mark.parametrize("name,dtype,fn", _CASES, ids=[c[0] for c in _CASES])
def test_constants_keep_their_values(name, dtype, fn):
    x = (torch.tensor([1.0, 2.0, 3.0]).to(dtype) if dtype != torch.int64 else torch.tensor([1, -2, 0])).to(DEV)
    compiled = torch.compile(fn, backend="jax", fullgraph=True)(x)
    _same(compiled, fn(x))


def test_float64_constant_is_not_narrowed():
    x = torch.zeros((), dtype=torch.float64, device=DEV)
    got = torch.compile(lambda x: x + torch.tensor(0.1, dtype=torch.float64), backend="jax")(x)
    assert got.item() == 0.1  # not 0.10000000149011612, the float32 nearest


def test_nan_payload_of_a_constant_survives():
    payload = struct.unpack("<Q", struct.pack("<d", _nan_with_payload()))[0]
    x = torch.zeros(3, dtype=torch.float64, device=DEV)
    got = torch.compile(lambda x: torch.where(x > 1, x, torch.tensor(_nan_with_payload(), dtype=torch.float64)),
                        backend="jax", fullgraph=True)(x)
    assert [struct.unpack("<Q", struct.pack("<d", v))[0] for v in got.tolist()] == [payload] * 3


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.float8_e4m3fn, torch.bool, torch.int8],
                         ids=str)
def test_constants_of_other_dtypes(dtype):
    values = {torch.bool: [0, 1, 1, 0, 1], torch.int8: [0, 1, -128, 127, 7]}.get(dtype, [0, 1, 3, 255, 7])

    def fn(x):
        if dtype == torch.float8_e4m3fn:
            constant = torch.tensor([0.0, 1.0, 3.0, 240.0, 7.0], device=DEV).to(dtype)
        else:
            constant = torch.tensor(values, dtype=dtype, device=DEV)
        return torch.where(x, constant, torch.zeros((), dtype=dtype))

    x = torch.tensor([True, True, False, True, True], device=DEV)
    _same(torch.compile(fn, backend="jax", fullgraph=True)(x), fn(x))
