"""The ``compile`` section: torch.compile, assume_pure and call_jax
training steps against torch CPU, and DLPack zero-copy with the torch
devices the plugin declares."""

from __future__ import annotations

from typing import Any, Callable

from ._recorder import Recorder, Skip
from ._support import close_to_cpu, plugin_record

__all__ = ["compile_interop"]


def _train_step_matches(torch: Any, make: Callable[[], Any], inputs: Any, compile_fn: Callable[[Any], Any],
                        what: str, buffers: bool = False) -> None:
    """One forward + backward of ``make()`` on CPU and, compiled, on the
    device: output, every gradient (and buffers) as torch CPU's."""
    torch.manual_seed(0)
    cpu_model = make()
    dev_model = make()
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("jax")
    run = compile_fn(dev_model)
    want = cpu_model(inputs)
    got = run(inputs.to("jax"))
    close_to_cpu(torch, got, want, f"{what} output")
    want.square().mean().backward()
    got.square().mean().backward()
    for (n, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        assert q.grad is not None, f"{what}: no gradient for {n}"
        close_to_cpu(torch, q.grad, p.grad, f"{what} gradient of {n}", rtol=1e-3, atol=1e-4)
    if buffers:
        for (n, b), c in zip(cpu_model.named_buffers(), dev_model.buffers()):
            close_to_cpu(torch, c, b, f"{what} buffer {n}")


def _mlp(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))


def _cnn(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def _block(torch: Any) -> Any:
    return torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)


def compile_interop(rec: Recorder, name: str, quick: bool, **_: Any) -> None:
    import torch

    import pjrt_host
    from pjrt_host import interop

    def compiled(m: Any) -> Any:
        return torch.compile(m, backend="jax", fullgraph=True)

    g = torch.Generator().manual_seed(1)
    x_mlp = torch.randn(8, 16, generator=g)
    x_cnn = torch.randn(4, 3, 12, 12, generator=g)
    x_seq = torch.randn(2, 6, 32, generator=g)
    for label, make, x, bufs in (("torch.compile MLP", _mlp, x_mlp, False),
                                 ("torch.compile CNN with BatchNorm", _cnn, x_cnn, True),
                                 ("torch.compile transformer block", _block, x_seq, False)):
        with rec.check(label) as info:
            _train_step_matches(torch, lambda m=make: m(torch), x, compiled, label, buffers=bufs)
            info["detail"] = "forward, backward" + (" and BatchNorm statistics" if bufs else "") + " as torch CPU"
        torch._dynamo.reset()

    with rec.check("assume_pure") as info:
        _train_step_matches(torch, lambda: _block(torch), x_seq, pjrt_host.assume_pure, "assume_pure block")
        info["detail"] = "a transformer block: forward and backward as torch CPU"

    with rec.check("call_jax") as info:
        import jax.numpy as jnp

        x = torch.randn(64, generator=g)
        xd = x.to("jax").requires_grad_()
        y = interop.call_jax(lambda a: jnp.sin(a) * a, xd)
        close_to_cpu(torch, y, torch.sin(x) * x, "call_jax(sin(a) * a)")
        y.sum().backward()
        close_to_cpu(torch, xd.grad, torch.cos(x) * x + torch.sin(x), "gradient through call_jax")
        info["detail"] = "a jax function on 'jax' tensors, forward and backward"

    plugin = plugin_record(name).plugin
    declared = tuple(plugin.zero_copy_torch_devices)
    if not declared:
        rec.add("DLPack zero-copy", "skip", "the plugin declares no zero_copy_torch_devices")
    for device_type in declared:
        with rec.check(f"DLPack zero-copy with torch {device_type!r}") as info:
            _dlpack_zero_copy(torch, device_type, info)


def _dlpack_zero_copy(torch: Any, device_type: str, info: dict) -> None:
    import jax
    import jax.dlpack

    from ... import _runtime

    module = getattr(torch, device_type, None)
    if device_type != "cpu" and not (module is not None and getattr(module, "is_available", lambda: False)()):
        raise Skip(f"torch has no usable {device_type!r} device in this process")
    ours = set(_runtime.runtime().devices)
    t = torch.arange(1024, dtype=torch.float32, device=device_type) * 0.5
    arr = jax.dlpack.from_dlpack(t)
    assert set(arr.devices()) <= ours, f"from_dlpack placed the array on {arr.devices()}, not the plugin's devices"
    assert arr.unsafe_buffer_pointer() == t.data_ptr(), "jax.dlpack.from_dlpack copied the tensor (pointers differ)"
    back = torch.from_dlpack(arr)
    assert back.data_ptr() == t.data_ptr(), "torch.from_dlpack copied the array (pointers differ)"
    moved = t.to("jax")
    assert torch.equal(moved.to(device_type), t), "values differ after .to('jax') and back"
    info["detail"] = f"torch {device_type} tensor <-> jax array share memory both ways"
