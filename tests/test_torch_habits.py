"""What torch users rely on from torch.cuda, on the 'jax' device, written as
users write it: tied weights through module moves, memory statistics, out
of memory, device generators, index checks, profiling, dtype errors."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402

nn = torch.nn


# ---------------------------------------------------------------- 1. tied weights


class TinyLM(nn.Module):
    """GPT-2's layout in small: the output layer shares the embedding."""

    def __init__(self, vocab=17, dim=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.LayerNorm(dim))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(self.block(self.wte(idx)))


def test_to_jax_keeps_tied_weights_and_parameter_objects():
    model = TinyLM()
    weight = model.wte.weight
    weight.note = "set by a library"
    model.to("jax")
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight is weight  # the same object, as with cuda
    assert weight.device.type == "jax" and isinstance(weight, nn.Parameter) and weight.requires_grad
    assert weight.note == "set by a library"
    assert len(list(model.parameters())) == len(list(TinyLM().parameters()))


@pytest.mark.parametrize("convert", [
    lambda m: m.jax(),
    lambda m: m.to("jax").double(),
    lambda m: m.to("jax").half(),
    lambda m: m.to("jax").to(torch.bfloat16),
    lambda m: m.to("jax", torch.float64),
    lambda m: m.to("jax").cpu(),
    lambda m: m.to("jax").float().to("cpu").to("jax"),
])
def test_module_conversions_keep_ties(convert):
    model = TinyLM()
    weight = model.wte.weight
    convert(model)
    assert model.lm_head.weight is model.wte.weight is weight


def test_moving_keeps_gradients():
    model = TinyLM()
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    grad = model.wte.weight.grad.clone()
    model.to("jax")
    assert model.wte.weight.grad.device.type == "jax"
    torch.testing.assert_close(model.wte.weight.grad.cpu(), grad)


def test_cpu_conversions_are_torchs():
    model = TinyLM()
    weight = model.wte.weight
    model.double()
    assert model.lm_head.weight is model.wte.weight is weight and weight.dtype == torch.float64
    untied = nn.Linear(2, 2)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        w = untied.weight
        untied.double()
        assert untied.weight is not w  # torch's own choice on CPU, left alone
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_tied_model_trains_like_cpu():
    torch.manual_seed(0)
    cpu_model = TinyLM()
    jax_model = copy.deepcopy(cpu_model).to("jax")
    assert jax_model.lm_head.weight is jax_model.wte.weight
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 17, (4, 6), generator=g) for _ in range(3)]
    losses = {}
    for device, model in (("cpu", cpu_model), ("jax", jax_model)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[device] = []
        for step in range(6):
            idx = data[step % 3].to(device)
            logits = model(idx[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
    torch.testing.assert_close(torch.tensor(losses["jax"]), torch.tensor(losses["cpu"]), rtol=1e-4, atol=1e-5)
    for (name, p_cpu), (_, p_jax) in zip(cpu_model.state_dict().items(), jax_model.state_dict().items()):
        torch.testing.assert_close(p_jax.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=name)


def test_load_state_dict_keeps_ties():
    model = TinyLM().to("jax")
    state = {k: torch.full_like(v, 0.5, device="cpu") for k, v in TinyLM().state_dict().items()}
    model.load_state_dict(state)
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.device.type == "jax"
    torch.testing.assert_close(model.lm_head.weight.cpu(), torch.full((17, 8), 0.5))


# ---------------------------------------------------------------- 2. memory statistics


def test_memory_statistics_follow_tensors():
    torch.jax.empty_cache()
    base = torch.jax.memory_allocated()
    x = torch.ones(256, 1024, device="jax")  # 1 MiB
    y = x * 2
    assert torch.jax.memory_allocated() - base >= 2 * 2**20
    torch.jax.reset_peak_memory_stats()
    peak_before = torch.jax.max_memory_allocated()
    assert peak_before >= base + 2 * 2**20
    del x, y
    torch.jax.empty_cache()
    assert torch.jax.memory_allocated() <= base
    assert torch.jax.max_memory_allocated() == peak_before  # the peak stays until reset
    torch.jax.reset_peak_memory_stats("jax:0")
    assert torch.jax.max_memory_allocated(0) == torch.jax.memory_allocated(torch.device("jax:0"))
    stats = torch.jax.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.jax.memory_allocated()
    assert {"allocated_bytes.all.peak", "reserved_bytes.all.current", "num_ooms"} <= set(stats)
    assert torch.jax.memory_reserved() >= torch.jax.memory_allocated()
    free, total = torch.jax.mem_get_info()
    assert 0 < free <= total
    with pytest.raises(RuntimeError, match="Invalid device index 7"):
        torch.jax.memory_allocated(7)


# ---------------------------------------------------------------- 3. out of memory


@pytest.mark.parametrize("allocate", [
    lambda: torch.empty(2**42, device="jax"),
    lambda: torch.zeros(2**42, device="jax"),
    lambda: torch.ones(2**21, device="jax").expand(2**21, 2**21).contiguous().sum().item(),
    lambda: print(torch.ones(2**21, device="jax").expand(2**21, 2**21) * 2),
    lambda: torch.randn(2**42, device="jax").sum().item(),
], ids=["empty", "zeros", "contiguous", "mul", "randn"])
def test_out_of_memory_is_torchs_error_and_the_device_keeps_working(allocate):
    ooms = torch.jax.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as info:
        allocate()
    text = str(info.value)
    assert "out of memory on jax:0" in text and "plugin" in text
    assert "tried to allocate 16.00 TiB" in text, text
    assert "in use" in text and "empty_cache" in text
    assert torch.jax.memory_stats()["num_ooms"] == ooms + 1
    assert (torch.arange(3, device="jax") + 1).tolist() == [1, 2, 3]
