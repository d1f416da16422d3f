"""Moving tensors to and from the 'jax' device: copies never alias, numpy / item / tolist, bfloat16, Module.to, printing, torch.save / load."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- moves


def test_to_and_back():
    c = torch.randn(4, 3)
    j = c.to(DEV)
    assert j.device == torch.device("jax", 0)
    assert torch.equal(j.cpu(), c)
    assert torch.equal(c.jax().cpu(), c)
    assert j.is_jax
    assert j.to(torch.float64).dtype == torch.float64
    assert torch.equal(j.to("cpu", torch.float64), c.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_empty_tensors_come_to_the_device_as_cpu_has_them(dtype):
    """An empty tensor has no values to move (transformers' DynamicCache
    makes two a layer a forward: ``torch.tensor([], device=...)``, then
    cats the keys onto it); it is made on the device, in the dtype and
    shape asked for, and grows and reads as CPU's does."""
    for shape in [(0,), (2, 0), (0, 3, 1)]:
        c = torch.empty(shape, dtype=dtype)
        j = c.to(DEV)
        assert j.shape == c.shape and j.dtype == dtype and j.device.type == DEV
        assert j.cpu().shape == c.shape and j.cpu().dtype == dtype
    data = torch.ones(1, 2, 3, 4).to(dtype)
    grown = torch.cat([torch.tensor([], dtype=dtype, device=DEV), data.to(DEV)], dim=-2)
    assert torch.equal(grown.cpu(), torch.cat([torch.tensor([], dtype=dtype), data], dim=-2))
    assert torch.tensor([], dtype=torch.float64, device=DEV).to(torch.float16).dtype == torch.float16


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_tensors_of_no_elements_stay_apart(mode):
    """Tensors of no elements share one device array per shape and dtype;
    in-place ops on one (given its array), or growing one, leave the others
    as they were."""
    with pjrt_host.config(eager=mode):
        a, b = torch.empty(0, 3, device=DEV), torch.zeros(0, 3, device=DEV)
        c = torch.tensor([], device=DEV).reshape(0, 3)
        a.add_(1)
        b.mul_(2)
        grown = torch.tensor([], device=DEV)
        grown.resize_(3).fill_(1.0)
        torch.jax.synchronize()
        assert torch.cat([a, b, c]).cpu().shape == (0, 3)
        assert torch.tensor([], device=DEV).add(1).cpu().shape == (0,)
        assert grown.cpu().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("make_view", [
    lambda t: t, lambda t: t.t(), lambda t: t[1:, ::2], lambda t: t.view(torch.int32), lambda t: t[0].expand(3, 4),
    lambda t: t.reshape(12)[3:9],
], ids=["whole", "transpose", "strided", "dtype-view", "expand", "range"])
def test_detach_and_alias_share_the_view(make_view):
    """detach() (what autograd's AccumulateGrad calls on every gradient) and
    alias() read and write exactly what their source does."""
    base = torch.arange(12.0).reshape(3, 4).to(DEV)
    src = make_view(base)
    ref = make_view(torch.arange(12.0).reshape(3, 4))
    for out in (src.detach(), torch.ops.aten.alias(src)):
        assert (out.shape, out.stride(), out.storage_offset(), out.dtype) == \
            (ref.shape, ref.stride(), ref.storage_offset(), ref.dtype)
        assert out.data_ptr() == src.data_ptr() and not out.requires_grad
        assert torch.equal(out.cpu(), ref)
    if not src.stride() or min(src.stride()) > 0:  # an expanded view cannot be written
        src.detach().fill_(7)
        assert torch.equal(src.cpu(), torch.full_like(ref, 7))
    with torch.inference_mode():
        d = base.detach()
    assert not d.is_inference() and d.data_ptr() == base.data_ptr()


def test_move_does_not_alias_either_way():
    c = torch.zeros(3)
    j = c.to(DEV)
    c.add_(1)  # the device copy must not see it
    assert cpu(j).tolist() == [0.0, 0.0, 0.0]
    back = j.cpu()
    back.add_(5)
    assert cpu(j).tolist() == [0.0, 0.0, 0.0]


def test_numpy_item_tolist():
    j = torch.tensor([[1.5, 2.5]], device=DEV)
    assert isinstance(j.numpy(), np.ndarray) and j.numpy().tolist() == [[1.5, 2.5]]
    assert j.tolist() == [[1.5, 2.5]]
    assert j.sum().item() == 4.0
    assert isinstance(torch.tensor(3, device=DEV).item(), int)
    assert torch.tensor(True, device=DEV).item() is True
    with pytest.raises(RuntimeError, match="requires grad"):
        torch.ones(2, device=DEV, requires_grad=True).numpy()


def test_bfloat16_round_trip():
    c = torch.randn(5).to(torch.bfloat16)
    assert torch.equal(c.to(DEV).cpu(), c)


def test_module_to():
    m = torch.nn.Linear(3, 2)
    m.to(DEV)
    assert all(p.device.type == DEV for p in m.parameters())
    assert all(isinstance(p, torch.nn.Parameter) for p in m.parameters())
    y = m(torch.ones(1, 3, device=DEV))
    assert y.device.type == DEV and y.requires_grad


def test_printing():
    text = repr(torch.tensor([1.0, 2.0], device=DEV))
    assert text == "tensor([1., 2.], device='jax:0')"
    assert "dtype=torch.int32" in repr(torch.ones(2, dtype=torch.int32, device=DEV))
    g = torch.ones(2, device=DEV, requires_grad=True)
    assert "requires_grad=True" in repr(g)
    assert "grad_fn=<MulBackward0>" in repr(g * 2)
    assert "size=(0, 3)" in repr(torch.zeros(0, 3, device=DEV))
    assert str(torch.tensor([1.0, 2.0], device=DEV)) == text


def test_save_load(tmp_path):
    m = torch.nn.Linear(3, 2).to(DEV)
    t = torch.arange(6, device=DEV).view(2, 3)
    path = tmp_path / "ckpt.pt"
    torch.save({"state": m.state_dict(), "t": t}, path)
    loaded = torch.load(path)  # weights_only=True by default
    assert loaded["t"].device.type == DEV and torch.equal(loaded["t"].cpu(), t.cpu())
    for k, v in m.state_dict().items():
        assert loaded["state"][k].device.type == DEV
        assert torch.equal(loaded["state"][k].cpu(), v.cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu"
