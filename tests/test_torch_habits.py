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
    import gc

    gc.collect()  # earlier tests' garbage: freed between the readings, it made the difference smaller (CI, once)
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


def test_memory_stats_are_numbers_and_keep_a_training_runs_peak():
    """As torch.cuda.memory_stats: an OrderedDict of str -> int (loggers
    such as Lightning's DeviceStatsMonitor take numbers only; a 'source'
    string there tripped them), and the peak of a training run is still
    there after the model is gone, until reset."""
    import collections
    import gc

    torch.jax.empty_cache()
    torch.jax.reset_peak_memory_stats()
    model = torch.nn.Linear(64, 64).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(32, 64, device="jax")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss.item()
    del model, opt, loss
    gc.collect()
    torch.jax.empty_cache()
    stats = torch.jax.memory_stats()
    assert type(stats) is collections.OrderedDict and list(stats) == sorted(stats)
    assert all(type(k) is str and type(v) is int for k, v in stats.items()), stats
    # weight, bias and a batch of activations were alive at once
    assert stats["allocated_bytes.all.peak"] >= (64 * 64 + 64 + 32 * 64) * 4 > stats["allocated_bytes.all.current"]
    assert torch.jax.max_memory_allocated() == stats["allocated_bytes.all.peak"]
    assert torch.jax.memory_stats_source() in ("device", "host accounting of live arrays")
    torch.jax.reset_peak_memory_stats()
    assert torch.jax.memory_stats()["allocated_bytes.all.peak"] < stats["allocated_bytes.all.peak"]
    assert f"({torch.jax.memory_stats_source()})" in torch.jax.memory_summary().splitlines()[0]


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


def test_an_op_deciding_to_trace_its_scalars_does_not_run_a_huge_result_twice():
    """After a few scalar values an op tries tracing them, running the call
    twice and comparing: on a result too large to hold, that comparison
    once aborted the process instead of the out-of-memory error."""
    small = torch.ones(3, device="jax")
    for value in (3.0, 5.0, 7.0):  # one compile per value, until the trial
        torch.fmod(small, value)
    big = torch.ones(2**21, device="jax").expand(2**21, 2**21)
    with pytest.raises(torch.OutOfMemoryError):
        print(torch.fmod(big, 11.0))
    assert torch.fmod(small * 9, 4.0).tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------- 4. device generators


def test_device_generator_drives_the_devices_random_ops():
    g = torch.Generator(device="jax")
    assert isinstance(g, torch.Generator) and g.device == torch.device("jax:0")
    assert torch.Generator(torch.device("jax:0")).device.type == "jax"
    assert g.manual_seed(123) is g and g.initial_seed() == 123

    def draws():
        x = torch.empty(4, device="jax")
        return [torch.randn(3, device="jax", generator=g), torch.rand(2, 3, device="jax", generator=g),
                torch.randint(0, 100, (5,), device="jax", generator=g), torch.randint(7, (2,), device="jax", generator=g),
                torch.randperm(6, device="jax", generator=g), x.normal_(generator=g).clone(),
                x.uniform_(generator=g).clone(), x.bernoulli_(0.5, generator=g).clone(),
                torch.multinomial(torch.ones(5, device="jax"), 3, generator=g)]

    first = draws()
    assert all(t.device.type == "jax" for t in first)
    g.manual_seed(123)
    again = draws()
    for a, b in zip(first, again):
        assert torch.equal(a.cpu(), b.cpu())
    state = g.get_state()
    after = draws()
    g.set_state(state)
    for a, b in zip(after, draws()):
        assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(first[0].cpu(), after[0].cpu())
    assert copy.deepcopy(g).device.type == "jax"


def test_cpu_generators_are_torchs():
    g = torch.Generator()
    assert type(g) is torch._C.Generator and g.device.type == "cpu"
    assert torch.equal(torch.randn(3, generator=torch.Generator().manual_seed(0)),
                       torch.randn(3, generator=torch.Generator("cpu").manual_seed(0)))


# ---------------------------------------------------------------- 5. out-of-range indices


def _setitem(x, index):
    x[index] = 0.0
    return x


def _index_programs(device):
    x = torch.arange(6.0, device=device).reshape(2, 3)
    five = torch.tensor([5], device=device)
    return {
        "index": lambda: torch.arange(3, device=device)[five],
        "negative": lambda: x[torch.tensor([-3], device=device)],
        "index_put_": lambda: x.clone().index_put_((five,), torch.tensor(1.0, device=device)),
        "setitem": lambda: _setitem(x.clone(), five),
        "index_select": lambda: x.index_select(1, five),
        "gather": lambda: x.gather(1, five.reshape(1, 1)),
        "scatter": lambda: x.scatter(1, five.reshape(1, 1), 1.0),
        "scatter_add_": lambda: x.clone().scatter_add_(1, five.reshape(1, 1), x),
        "index_add": lambda: x.index_add(1, five, torch.ones(2, 1, device=device)),
        # CPU's kernel paths word it differently: IndexError for a self of at most
        # one dimension, alpha != 1 or an int32 index; RuntimeError along dim 1 of
        # index_select, and through scatter_add_ for index_add along dim 0
        "index_select_dim0": lambda: x.index_select(0, five),
        "index_select_0d": lambda: torch.tensor(1.0, device=device).index_select(0, five),
        "index_add_dim0": lambda: x.index_add(0, five, torch.ones(1, 3, device=device)),
        "index_add_alpha": lambda: x.index_add(0, five, torch.ones(1, 3, device=device), alpha=2),
        "index_add_int32": lambda: x.index_add(0, five.int(), torch.ones(1, 3, device=device)),
        "index_add_0d": lambda: torch.tensor(1.0, device=device).index_add(0, five, torch.tensor(2.0, device=device)),
        "index_fill": lambda: x.index_fill(1, five, 0.0),
        "embedding": lambda: nn.functional.embedding(five, x),
        "take": lambda: x.take(torch.tensor([6], device=device)),
        "put_": lambda: x.clone().put_(torch.tensor([6], device=device), torch.ones(1, device=device)),
    }


def _outcome(fn):
    try:
        return "ok", fn().cpu().tolist()
    except (IndexError, RuntimeError) as err:
        return type(err).__name__, str(err).split(" (raised by ")[0]


@pytest.mark.parametrize("mode", [True, "sync"])
@pytest.mark.parametrize("program", sorted(_index_programs("cpu")))
def test_out_of_range_indices_raise_cpus_error(program, mode):
    expected = _outcome(_index_programs("cpu")[program])
    assert expected[0] != "ok"
    with pjrt_host.config(checks=mode):
        got = _outcome(_index_programs("jax")[program])
    assert got[0] == expected[0]
    if program != "index":  # CPU's text counts the dimension of x[:, i] oddly
        assert got[1] == expected[1]
    assert (torch.arange(3, device="jax")[torch.tensor([-1, 2], device="jax")]).tolist() == [2, 2]


def test_index_errors_by_default_at_the_next_synchronisation():
    bad = torch.arange(3, device="jax")[torch.tensor([5], device="jax")]  # queued, not yet checked
    with pytest.raises(IndexError, match=r"index 5 is out of bounds .* \(raised by aten::index.Tensor on jax:0"):
        print(bad)
    with pjrt_host.config(checks="sync"), pytest.raises(IndexError, match="out of bounds"):
        torch.arange(3, device="jax")[torch.tensor([5], device="jax")]
    torch.arange(3, device="jax")[torch.tensor([5], device="jax")]
    with pytest.raises(IndexError):
        torch.jax.synchronize()
    with pjrt_host.config(checks=False):
        assert torch.arange(3, device="jax")[torch.tensor([5], device="jax")].tolist() == [2]  # clipped
    with pytest.raises(ValueError, match="check_indices"):
        with pjrt_host.config(check_indices="always"):
            pass


# ---------------------------------------------------------------- 6. profiling


def test_profile_records_a_trace_with_torch_names(tmp_path):
    import glob
    import gzip
    import json

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to("jax")
    with pjrt_host.profile(tmp_path) as logdir:
        model(torch.randn(4, 8, device="jax")).sum().backward()
    assert logdir == str(tmp_path)
    traces = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.trace.json.gz"))
    assert traces and glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
    names = {e.get("name") for e in json.load(gzip.open(traces[0]))["traceEvents"]}
    assert {"aten::addmm", "aten::relu", "aten::threshold_backward", "nn.Linear", "nn.Sequential"} <= names
    assert (torch.ones(2, device="jax") * 2).tolist() == [2.0, 2.0]  # no profiling cost left behind


# ---------------------------------------------------------------- 7. dtypes the device cannot hold


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(2, dtype=torch.complex32, device="jax"),
    lambda: torch.empty(2, dtype=torch.complex32, device="jax"),
    lambda: torch.zeros(2, dtype=torch.complex32).to("jax"),
    lambda: torch.ones(2, device="jax").to(torch.complex32),
])
def test_a_dtype_the_device_cannot_hold_names_what_to_use(make):
    with pytest.raises(TypeError, match=r"torch.complex32 .* 'jax' device cannot hold it; use torch.complex64"):
        make()
