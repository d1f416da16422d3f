"""Checkpoints and storages on the 'jax' device as training scripts use
them: torch.save / torch.load with every form of map_location, storages,
safetensors, memory that frees, torch.accelerator, streams and events,
activation checkpointing's RNG."""

from __future__ import annotations

import io

import pytest
import torch

DEV = "jax"


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


MAP_LOCATIONS = {
    "str": "jax",
    "str-index": "jax:0",
    "device": torch.device("jax"),
    "dict": {"cpu": "jax", "jax:0": "jax:0"},
    "callable": lambda storage, loc: storage.to(device="jax"),
    "none": None,
}


@pytest.mark.parametrize("saved_on", ["cpu", DEV])
@pytest.mark.parametrize("form", sorted(MAP_LOCATIONS))
def test_torch_load_map_location_keeps_views_shared(saved_on, form):
    base = torch.arange(12.0).reshape(3, 4).to(saved_on)
    ints = torch.arange(5, dtype=torch.int64).to(saved_on)
    buf = _saved({"base": base, "row": base[1], "col": base[:, 2], "ints": ints, "flag": ints > 2})
    expected_device = "cpu" if (form == "none" and saved_on == "cpu") else DEV
    loaded = torch.load(buf, map_location=MAP_LOCATIONS[form])  # weights_only=True, torch's default
    for name, t in loaded.items():
        assert t.device.type == expected_device, name
    assert loaded["row"].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert loaded["col"].tolist() == [2.0, 6.0, 10.0]
    assert loaded["flag"].tolist() == [False, False, False, True, True]
    assert loaded["col"].stride() == (4,) and loaded["col"].storage_offset() == 2
    # Views come back over one storage: a write through the base shows in both.
    assert loaded["row"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    loaded["base"][1, 2] = 100.0
    assert loaded["row"][2].item() == 100.0 and loaded["col"][1].item() == 100.0


def test_jax_checkpoint_loads_onto_the_cpu():
    t = torch.arange(6.0, device=DEV).reshape(2, 3)
    loaded = torch.load(_saved({"t": t, "v": t[1]}), map_location="cpu")
    assert loaded["t"].device.type == "cpu" and loaded["v"].tolist() == [3.0, 4.0, 5.0]
    assert loaded["v"].untyped_storage().data_ptr() == loaded["t"].untyped_storage().data_ptr()


def test_torch_load_to_a_missing_device_index_is_an_error():
    buf = _saved({"t": torch.ones(2)})
    with pytest.raises(RuntimeError, match="device_count"):
        torch.load(buf, map_location="jax:7")


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(DEV)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_training_checkpoint_resumes_to_exactly_the_next_step(tmp_path, mode):
    """Op by op, the resumed step is the uninterrupted one bit for bit.  In
    fused eager, to rounding: torch.load puts the optimizer's step counts on
    the device (they stayed on the CPU in the first run), so the resumed
    optimizer step is a segment of other ops, and XLA rounds a program's
    arithmetic by what else it holds (``x / sqrt(y)`` becomes ``x *
    rsqrt(y)`` inside one program)."""
    import pjrt_host

    with pjrt_host.config(eager=mode):
        _resume_and_compare(tmp_path, exact=mode == "op")


def _resume_and_compare(tmp_path, exact):
    x = torch.randn(5, 8).to(DEV)

    def step(model, opt):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    model, opt = _model_and_optimizer()
    for _ in range(3):
        step(model, opt)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    step(model, opt)
    expected = [p.detach().cpu() for p in model.parameters()]

    resumed, resumed_opt = _model_and_optimizer()
    ckpt = torch.load(tmp_path / "ckpt.pt", map_location=DEV)
    assert all(v.device.type == DEV for v in ckpt["opt"]["state"][0].values())
    resumed.load_state_dict(ckpt["model"])
    resumed_opt.load_state_dict(ckpt["opt"])
    step(resumed, resumed_opt)
    for want, got in zip(expected, resumed.parameters()):
        if exact:
            assert torch.equal(want, got.detach().cpu())
        else:
            torch.testing.assert_close(got.detach().cpu(), want, rtol=1e-6, atol=1e-7)


def test_untyped_storage_of_jax_tensors():
    x = torch.arange(12.0, device=DEV).reshape(3, 4)
    s = x.untyped_storage()
    assert s.device == torch.device("jax:0") and s.nbytes() == 48
    assert x[1].untyped_storage() is s and x.t().untyped_storage() is s
    assert x[1].data_ptr() == s.data_ptr() + 16
    other = torch.arange(12.0, device=DEV).untyped_storage()
    assert other.data_ptr() >= s.data_ptr() + 48 or other.data_ptr() + 48 <= s.data_ptr()  # never overlap
    assert bytes(s.cpu()) == bytes(x.cpu().untyped_storage())
    assert torch.empty(0, device=DEV).set_(s, 4, (2, 2), (1, 4)).tolist() == [[4.0, 8.0], [5.0, 9.0]]
    # A tensor set on the storage shares the data: writes show in x.
    alias = torch.empty(0, device=DEV).set_(s)
    alias[0] = -1.0
    assert x[0, 0].item() == -1.0
    # Another dtype reads the same bytes, but cannot write them.
    as_bytes = torch.empty(0, dtype=torch.uint8, device=DEV).set_(s)
    assert as_bytes.shape == (48,) and bytes(as_bytes.cpu().numpy()) == bytes(x.cpu().untyped_storage())
    with pytest.raises(RuntimeError, match="write the tensor itself"):
        as_bytes.zero_()


@pytest.mark.parametrize("how", ["eager", "out=", "compiled"])
def test_a_read_only_snapshot_refuses_writes_and_keeps_its_values(how):
    # A storage read as another dtype is a snapshot: a write would not reach
    # the tensor.  It is refused before anything runs, so the snapshot (and
    # the buffer a write would have given up) stays readable; a compiled
    # graph that writes its input refuses as eager does, not silently.
    x = torch.arange(4.0, device=DEV)
    snapshot = torch.empty(0, dtype=torch.int32, device=DEV).set_(x.untyped_storage())
    before = snapshot.cpu().clone()
    write = {"eager": lambda t: t.add_(1),
             "out=": lambda t: torch.add(t, 1, out=t),
             "compiled": torch.compile(lambda t: t.add_(1), backend="jax")}[how]
    with pytest.raises(RuntimeError, match="write the tensor itself"):
        write(snapshot)
    assert torch.equal(snapshot.cpu(), before)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_storages_made_for_the_device():
    st = torch.UntypedStorage(16, device=DEV)
    assert st.device.type == DEV and st.nbytes() == 16
    src = torch.arange(4, dtype=torch.float32).untyped_storage()
    for moved in (src.to(device=DEV), src.jax(), torch.UntypedStorage(bytes(src), device=DEV)):
        assert moved.device.type == DEV
        assert torch.empty(0, device=DEV).set_(moved).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert bytes(moved.cpu()) == bytes(src)
    typed = torch.arange(3.0).storage().to(device=DEV)  # the TypedStorage API
    assert typed.device.type == DEV and typed.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match="set_"):
        torch.empty(0, device=DEV).set_(torch.UntypedStorage(8))  # a CPU storage
    with pytest.raises(RuntimeError, match="setStorage"):
        torch.empty(0, device=DEV).set_(torch.UntypedStorage(8, device=DEV), 0, (4,), (1,))


def test_dtype_views_of_another_element_size_read_the_same_bytes():
    x = torch.tensor([[1.5, -2.0, 3.25], [0.0, 7.0, -1e30]], device=DEV)
    for dtype in (torch.uint8, torch.int16, torch.float32, torch.bfloat16):
        got = x.view(dtype)
        assert got.shape == x.cpu().view(dtype).shape
        assert torch.equal(got.cpu(), x.cpu().view(dtype))
    b = torch.arange(8, dtype=torch.uint8, device=DEV).reshape(2, 4)
    assert torch.equal(b.view(torch.int32).cpu(), b.cpu().view(torch.int32))
    with pytest.raises(RuntimeError, match="divisible"):
        x.view(torch.float64)


def test_safetensors_save_and_load(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    model = torch.nn.Linear(4, 3).to(DEV)
    tensors = {"w": model.weight.detach(), "b": model.bias.detach(), "h": torch.ones(2, dtype=torch.bfloat16,
                                                                                      device=DEV)}
    st.save_file(tensors, tmp_path / "m.safetensors")
    on_cpu = st.load_file(tmp_path / "m.safetensors")
    for k, v in tensors.items():
        assert torch.equal(on_cpu[k], v.cpu())
    # safetensors names devices from a fixed list ('jax' is not one); an
    # index is torch's current accelerator, which is 'jax'.
    on_device = st.load_file(tmp_path / "m.safetensors", device=0)
    for k, v in tensors.items():
        assert on_device[k].device.type == DEV and torch.equal(on_device[k].cpu(), v.cpu())
    # Tied tensors are found shared, as safetensors requires of any device.
    with pytest.raises(RuntimeError, match="share memory"):
        st.save_file({"a": model.weight.detach(), "b": model.weight.detach()}, tmp_path / "tied.safetensors")


def test_deleting_a_tensor_frees_its_memory_at_once():
    torch.jax.synchronize()
    before = torch.jax.memory_allocated()
    big = torch.ones(8 * 2**20, device=DEV)  # 32 MiB, the last result on the device
    assert torch.jax.memory_allocated() - before >= 32 * 2**20
    del big
    assert torch.jax.memory_allocated() - before < 2**20  # no other op ran
    torch.jax.synchronize()  # nothing left to wait for: still fine


def test_torch_accelerator_answers_for_the_device():
    assert torch.accelerator.current_accelerator().type == DEV
    x = torch.ones(2**20, device=DEV)
    assert torch.accelerator.memory_allocated() == torch.jax.memory_allocated() >= x.nbytes
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] >= x.nbytes
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.empty_cache()
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    stream = torch.accelerator.current_stream()  # torch's own type, which dynamo needs
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("jax:0")


def test_events_finish_in_the_order_they_were_recorded():
    """An event whose work is already done still finishes after the events
    recorded before it, which the watcher thread has not stamped yet: CI
    once saw end.query() true and start's time not stamped, so
    start.elapsed_time(end) raised (a watcher thread late under load).  The
    watcher is held here by a point that waits on a gate."""
    import threading

    from pjrt_host._torch._boot import _streams

    x = torch.randn(8, device=DEV)
    x.cpu()  # the device's last result is ready
    gate = threading.Event()

    class Held:
        def is_deleted(self):
            return False

        def block_until_ready(self):
            gate.wait(30)

    _streams._watch_until_done(Held(), _streams._Done())
    start, end = torch.jax.Event(enable_timing=True), torch.jax.Event(enable_timing=True)
    start.record()
    end.record()
    try:
        assert not start.query() and not end.query()  # behind the held point
    finally:
        gate.set()
    end.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0.0


def test_streams_and_events():
    s = torch.jax.current_stream()
    assert s == torch.jax.Stream() == torch.jax.default_stream() and isinstance(s, torch.Stream)
    x = torch.randn(256, 256, device=DEV)
    start, end = torch.jax.Event(enable_timing=True), torch.jax.Event(enable_timing=True)
    start.record()
    with torch.jax.stream(s):
        y = x @ x
    end.record(s)
    end.synchronize()
    assert end.query() and s.query()
    assert start.elapsed_time(end) >= 0.0
    s.wait_event(end)
    s.wait_stream(torch.jax.Stream())
    s.synchronize()
    e = s.record_event()
    e.wait()
    e.synchronize()
    assert isinstance(e, torch.Event) and e.device == torch.device("jax:0")
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.jax.Event().elapsed_time(torch.jax.Event())
    assert y.shape == (256, 256)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_replays_dropout(reentrant):
    """torch.utils.checkpoint restores the device's RNG state for the
    recomputed forward only when ``torch.jax._initialized`` is true."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 16)).to(DEV)
    x = torch.randn(8, 16, device=DEV, requires_grad=True)

    def grads(checkpointed):
        torch.jax.manual_seed(1)
        layer.zero_grad()
        x.grad = None
        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=reentrant)
        else:
            out = layer(x)
        out.sum().backward()
        return [x.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()]

    assert torch.jax._initialized
    for want, got in zip(grads(False), grads(True)):
        torch.testing.assert_close(got, want)


def test_transformers_save_pretrained_and_from_pretrained(tmp_path):
    """A transformers model saved from 'jax' (safetensors, tied embeddings)
    and loaded back with .to('jax') and with device_map='jax' (accelerate)
    equals the CPU model."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    cpu_model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = cpu_model(ids).logits
    on_device = transformers.GPT2LMHeadModel(config)
    on_device.load_state_dict(cpu_model.state_dict())
    on_device.to(DEV).save_pretrained(tmp_path)
    for model in (transformers.GPT2LMHeadModel.from_pretrained(tmp_path).to(DEV),
                  transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map=DEV)):
        assert model.lm_head.weight.device.type == DEV
        assert model.lm_head.weight is model.transformer.wte.weight
        with torch.no_grad():
            got = model.eval()(ids.to(DEV)).logits.cpu()
        torch.testing.assert_close(got, expected)


def test_registration_patches_are_exactly_the_inventory():
    from pjrt_host._torch import _patches, _torch_accelerator

    torch.ones(1, device=DEV)  # the backward hook comes with the first 'jax' tensor

    def resolve(path):
        obj = torch
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    for name in _patches.PATCHES:
        if name.startswith("torch.") and " " not in name:
            assert getattr(resolve(name), "_pjrt_host", False), name
    assert getattr(type(torch._C.Generator).__call__, "_pjrt_host", False)
    wrapped = {n for n in dir(torch.accelerator) if getattr(getattr(torch.accelerator, n), "_pjrt_host", False)}
    assert wrapped == set(_torch_accelerator.FUNCTIONS)
    # Nothing else of torch.Tensor / UntypedStorage / nn.Module / TransformerEncoder is ours.
    for cls, path in ((torch.Tensor, "torch.Tensor"), (torch.UntypedStorage, "torch.UntypedStorage"),
                      (torch.nn.Module, "torch.nn.Module"), (torch.nn.TransformerEncoder, "torch.nn.TransformerEncoder")):
        ours = {f"{path}.{n}" for n, v in vars(cls).items()
                if getattr(v, "_pjrt_host", False) or getattr(getattr(v, "__func__", None), "_pjrt_host", False)}
        assert ours <= set(_patches.PATCHES), ours
