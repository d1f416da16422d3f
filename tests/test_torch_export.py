"""torch.export programs on the 'jax' device: a program exported from a
'jax' model, one exported on the CPU and moved (``ep.module().to('jax')``
or torch.export.passes.move_to_device_pass), and one through
torch.export.save / torch.export.load all run on 'jax' and give eager CPU's
results -- a tiny transformers GPT-2 and a small CNN.  The guard torch.export
puts before each ``.to()`` (``aten::_assert_tensor_metadata``) checks on
'jax' what it checks on CPU."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

import pjrt_host  # noqa: E402,F401

DEV = "jax"
nn = torch.nn


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), {"use_cache": False}


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


def _cnn():
    torch.manual_seed(0)
    model = _CNN()
    with torch.no_grad():  # running statistics that are not the defaults
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval(), (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),), {}


_MODELS = {"gpt2": _gpt2, "cnn": _cnn}


def _output(out):
    return out.logits if hasattr(out, "logits") else out


def _to(args, device):
    return tuple(a.to(device) for a in args)


def _check(out, expected):
    out = _output(out)
    assert out.device.type == DEV
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(params=sorted(_MODELS))
def case(request):
    model, args, kwargs = _MODELS[request.param]()
    with torch.no_grad():
        expected = _output(model(*args, **kwargs))
    return model, args, kwargs, expected


def test_exported_from_a_jax_model(case):
    model, args, kwargs, expected = case
    model.to(DEV)
    args = _to(args, DEV)
    ep = torch.export.export(model, args, kwargs=kwargs)
    assert any(p.device.type == DEV for p in ep.parameters())
    with torch.no_grad():
        _check(ep.module()(*args, **kwargs), expected)


def test_exported_on_cpu_then_module_moved(case):
    # The graph has the CPU burnt into its ops (arange(device=cpu), the
    # guards); they move with the weights, as move_to_device_pass moves them.
    model, args, kwargs, expected = case
    ep = torch.export.export(model, args, kwargs=kwargs)
    module = ep.module().to(DEV)
    with torch.no_grad():
        _check(module(*_to(args, DEV), **kwargs), expected)
        # ... and back: the CPU module is CPU's again.
        module.to("cpu")
        torch.testing.assert_close(_output(module(*args, **kwargs)), expected, rtol=1e-5, atol=1e-5)


def test_exported_on_cpu_then_move_to_device_pass(case):
    from torch.export.passes import move_to_device_pass

    model, args, kwargs, expected = case
    ep = move_to_device_pass(torch.export.export(model, args, kwargs=kwargs), DEV)
    with torch.no_grad():
        _check(ep.module()(*_to(args, DEV), **kwargs), expected)


def test_export_save_and_load(case):
    model, args, kwargs, expected = case
    model.to(DEV)
    args = _to(args, DEV)
    buf = io.BytesIO()
    torch.export.save(torch.export.export(model, args, kwargs=kwargs), buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    for name, p in loaded.named_parameters():
        assert isinstance(p, nn.Parameter) and p.device.type == DEV, name
    with torch.no_grad():
        _check(loaded.module()(*args, **kwargs), expected)


def test_exported_program_trains_a_step_like_cpu():
    model, (x,), _ = _cnn()
    model.train()
    target = torch.randint(0, 10, (2,), generator=torch.Generator().manual_seed(2))
    cpu_module = torch.export.export(model, (x,)).module()
    jax_module = torch.export.export(model, (x,)).module().to(DEV)
    for module, device in ((cpu_module, "cpu"), (jax_module, DEV)):
        nn.functional.cross_entropy(module(x.to(device)), target.to(device)).backward()
    cpu_grads = {n: p.grad for n, p in cpu_module.named_parameters()}
    for name, p in jax_module.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), cpu_grads[name], rtol=1e-4, atol=1e-5, msg=name)


_assert_metadata = torch.ops.aten._assert_tensor_metadata.default


def _cpu_error(t, *args, **kwargs):
    with pytest.raises(RuntimeError) as err:
        _assert_metadata(t, *args, **kwargs)
    return str(err.value)


@pytest.mark.parametrize("kwargs", [
    {"size": [3, 2]}, {"stride": [1, 1]}, {"dtype": torch.int64}, {"layout": torch.sparse_coo},
], ids=["size", "stride", "dtype", "layout"])
def test_assert_tensor_metadata_checks_as_cpu(kwargs):
    t = torch.zeros(2, 3)
    expected = _cpu_error(t, **kwargs)
    with pytest.raises(RuntimeError) as err:
        _assert_metadata(t.to(DEV), **kwargs)
    assert str(err.value) == expected  # torch's own words


def test_assert_tensor_metadata_passes_what_matches():
    t = torch.zeros(2, 3, device=DEV)
    for device in (t.device, torch.device(DEV)):  # 'jax' alone is the current device
        assert _assert_metadata(t, [2, 3], [3, 1], torch.float32, device=device, layout=torch.strided) is None
    view = t.t()
    assert _assert_metadata(view, [3, 2], [1, 3]) is None


def test_assert_tensor_metadata_device_mismatch_names_the_fix():
    t = torch.zeros(2, device=DEV)
    with pytest.raises(RuntimeError, match=r"Tensor device mismatch! Expected: cpu, Got: jax:0") as err:
        _assert_metadata(t, device=torch.device("cpu"))
    assert "aten::_assert_tensor_metadata" in str(err.value)
    assert "move_to_device_pass" in str(err.value)
    # CPU tensors are torch's own.
    assert _cpu_error(torch.zeros(2), device=torch.device("meta")) == \
        "Tensor device mismatch! Expected: meta, Got: cpu"


def test_module_moved_between_other_devices_is_torch_own():
    # A move with no 'jax' side leaves the graph as torch leaves it.
    model, args, kwargs = _gpt2()
    module = torch.export.export(model, args, kwargs=kwargs).module()
    code = module.code
    module.to("meta")
    assert module.code == code and "device(type='cpu')" in code
