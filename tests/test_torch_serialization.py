"""Parameters on the 'jax' device keep their class through every way torch
copies one: torch.save / torch.load (each map_location, weights_only or
not), torch.save of a whole module, copy.deepcopy, and torch.export.save /
torch.export.load -- as CPU Parameters do."""

from __future__ import annotations

import copy
import io

import pytest
import torch

DEV = "jax"


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


class _Tied(torch.nn.Module):
    """An embedding tied to the output layer, as GPT-2's lm_head is."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(7, 4)
        self.out = torch.nn.Linear(4, 7, bias=False)
        self.out.weight = self.emb.weight
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.emb(ids)))


@pytest.mark.parametrize("map_location", [None, "cpu", DEV])
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_parameter_round_trip_keeps_class_and_requires_grad(map_location, weights_only, requires_grad):
    p = torch.nn.Parameter(torch.arange(6.0, device=DEV).reshape(2, 3), requires_grad=requires_grad)
    loaded = _round_trip(p, map_location=map_location, weights_only=weights_only)
    assert isinstance(loaded, torch.nn.Parameter)
    assert loaded.requires_grad is requires_grad
    assert loaded.device.type == ("cpu" if map_location == "cpu" else DEV)
    assert loaded.is_leaf and loaded.grad_fn is None
    assert loaded.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    if map_location == "cpu":
        # Exactly what a CPU Parameter is.
        assert type(loaded) is torch.nn.Parameter


def test_cpu_parameter_round_trip_is_torch_own():
    p = torch.nn.Parameter(torch.ones(3))
    for location in (None, "cpu"):
        loaded = _round_trip(p, map_location=location)
        assert type(loaded) is torch.nn.Parameter and loaded.requires_grad
    on_device = _round_trip(p, map_location=DEV)
    assert isinstance(on_device, torch.nn.Parameter) and on_device.device.type == DEV
    assert on_device.requires_grad and on_device.tolist() == [1.0, 1.0, 1.0]


def test_parameter_attributes_survive_save_and_deepcopy():
    # torch keeps a Parameter's Python attributes (its state) through
    # pickling and deepcopy; the device's own attributes are not state.
    p = torch.nn.Parameter(torch.zeros(2, device=DEV))
    p.sharded_dim = 1
    for loaded in (_round_trip(p, weights_only=False), copy.deepcopy(p)):
        assert isinstance(loaded, torch.nn.Parameter) and loaded.sharded_dim == 1
    on_cpu = _round_trip(p, map_location="cpu", weights_only=False)
    assert type(on_cpu) is torch.nn.Parameter and on_cpu.__dict__ == {"sharded_dim": 1}


def test_plain_tensor_stays_plain():
    t = torch.ones(3, device=DEV, requires_grad=True)
    loaded = _round_trip(t)
    assert not isinstance(loaded, torch.nn.Parameter)
    assert loaded.requires_grad and loaded.device.type == DEV


@pytest.mark.parametrize("map_location", [None, "cpu", DEV])
def test_whole_module_save_keeps_parameters_and_ties(map_location):
    torch.manual_seed(0)
    model = _Tied().to(DEV)
    model.norm.bias.requires_grad_(False)
    ids = torch.tensor([[1, 2, 3]], device=DEV)
    expected = model(ids).detach().cpu()
    loaded = _round_trip(model, map_location=map_location, weights_only=False)
    device = "cpu" if map_location == "cpu" else DEV
    names = dict(loaded.named_parameters())
    assert sorted(names) == ["emb.weight", "norm.bias", "norm.weight"]  # the tie is one parameter
    assert loaded.out.weight is loaded.emb.weight
    for name, p in names.items():
        assert isinstance(p, torch.nn.Parameter), name
        assert p.device.type == device, name
    assert not loaded.norm.bias.requires_grad and loaded.norm.weight.requires_grad
    torch.testing.assert_close(loaded(ids.to(device)).detach().cpu(), expected)
    # It trains as the model did: one step moves the tied weight once.
    opt = torch.optim.SGD(loaded.parameters(), lr=0.5)
    loaded(ids.to(device)).sum().backward()
    opt.step()
    assert loaded.out.weight is loaded.emb.weight
    assert not torch.equal(loaded.emb.weight.detach().cpu(), model.emb.weight.detach().cpu())


def test_deepcopy_module_keeps_parameters_ties_and_independence():
    torch.manual_seed(0)
    model = _Tied().to(DEV)
    model.norm.bias.requires_grad_(False)
    clone = copy.deepcopy(model)
    assert clone.out.weight is clone.emb.weight
    for (name, p), (_, q) in zip(model.named_parameters(), clone.named_parameters()):
        assert isinstance(q, torch.nn.Parameter), name
        assert q.device.type == DEV and q.requires_grad == p.requires_grad, name
        assert q is not p and q.data_ptr() != p.data_ptr(), name
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu())
    with torch.no_grad():
        clone.emb.weight.add_(1.0)
    torch.testing.assert_close(clone.emb.weight.detach().cpu(), model.emb.weight.detach().cpu() + 1.0)


def test_deepcopy_parameter():
    p = torch.nn.Parameter(torch.arange(3.0, device=DEV), requires_grad=False)
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and not q.requires_grad and q.device.type == DEV
    assert q.tolist() == [0.0, 1.0, 2.0]


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * self.scale


def test_export_save_load_with_parameters_on_device():
    torch.manual_seed(0)
    model = _Small().to(DEV)
    x = torch.randn(2, 4, device=DEV)
    exported = torch.export.export(model, (x,))
    buf = io.BytesIO()
    torch.export.save(exported, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)  # verifies parameters are nn.Parameter
    params = dict(loaded.named_parameters())
    assert sorted(params) == ["lin.bias", "lin.weight"]
    for name, p in params.items():
        assert isinstance(p, torch.nn.Parameter) and p.device.type == DEV, name
    assert not isinstance(loaded.state_dict["scale"], torch.nn.Parameter)
    torch.testing.assert_close(loaded.module()(x).cpu(), model(x).cpu())


def _held_dtypes() -> list[torch.dtype]:
    from pjrt_host._lowerings._dtypes import _TORCH_TO_JAX

    return sorted(_TORCH_TO_JAX, key=str)


def _random_bits(dtype: torch.dtype, n: int) -> torch.Tensor:
    """A CPU tensor of ``n`` elements of ``dtype`` with random bit patterns
    (NaN payloads, infinities and subnormals included), bools 0/1."""
    g = torch.Generator().manual_seed(n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("map_location", [None, "cpu", DEV])
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("dtype", _held_dtypes(), ids=str)
def test_every_held_dtype_round_trips_bit_exactly(dtype, weights_only, map_location):
    # The newer dtypes (float8s, uint16/32/64) go as torch saves them: the
    # untyped storage with the dtype beside it (_rebuild_tensor_v3); the
    # older ones through a TypedStorage (_rebuild_tensor_v2).
    host = _random_bits(dtype, 24)
    t = host.to(DEV)
    view = t[2:].reshape(2, 11)[:, ::2]  # an offset and a stride into the same storage
    loaded = _round_trip({"t": t, "view": view}, map_location=map_location, weights_only=weights_only)
    device = "cpu" if map_location == "cpu" else DEV
    for name, original in (("t", t), ("view", view)):
        got = loaded[name]
        assert got.dtype == dtype and got.device.type == device, name
        assert got.shape == original.shape and got.stride() == original.stride(), name
        assert got.storage_offset() == original.storage_offset(), name
        assert torch.equal(_bits(got), _bits(original)), name
    assert torch.equal(_bits(loaded["t"]), _bits(host))
    # Saved once, they come back sharing their storage, as on CPU.
    assert loaded["view"].untyped_storage().data_ptr() == loaded["t"].untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint16], ids=str)
def test_newer_dtype_parameter_round_trips(dtype):
    p = torch.nn.Parameter(torch.arange(4, device=DEV).to(dtype), requires_grad=False)
    for location in (None, "cpu", DEV):
        loaded = _round_trip(p, map_location=location)
        assert isinstance(loaded, torch.nn.Parameter) and loaded.dtype == dtype
        assert loaded.device.type == ("cpu" if location == "cpu" else DEV)
        assert loaded.float().tolist() == [0.0, 1.0, 2.0, 3.0]
