"""torch.amp.GradScaler on 'jax', step by step against torch CPU's; torch.jax.amp,
torch.cuda.amp's deprecated aliases for the device."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch


def _run(device: str, steps: list[float], make_scaler=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = (make_scaler or (lambda **kw: torch.amp.GradScaler(device, **kw)))(init_scale=2.0 ** 8, growth_interval=2)
    x = torch.linspace(-1, 1, 24).reshape(4, 6).to(device)
    scales = []
    for poison in steps:
        opt.zero_grad()
        loss = (model(x) * poison).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)  # skipped when a gradient is inf / NaN
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, [p.detach().cpu() for p in model.parameters()]


def test_grad_scaler_matches_cpu_including_skipped_steps():
    # 1.0: clean steps (the scale grows every 2); inf: gradients overflow, the
    # step is skipped and the scale backs off.
    steps = [1.0, 1.0, 1.0, float("inf"), 1.0, 1.0, float("nan"), 1.0]
    cpu_scales, cpu_params = _run("cpu", steps)
    jax_scales, jax_params = _run("jax", steps)
    assert jax_scales == cpu_scales
    assert cpu_scales[3] == cpu_scales[2] / 2  # the inf step backed off
    for want, got in zip(cpu_params, jax_params):
        torch.testing.assert_close(got, want)


def test_unscale_reports_non_finite_gradients():
    grads = [torch.tensor([1.0, 2.0], device="jax"), torch.tensor([float("inf")], device="jax")]
    found = torch.zeros(1, device="jax")
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor([0.5], device="jax"))
    assert found.item() == 1.0 and grads[0].tolist() == [0.5, 1.0]
    clean = [torch.tensor([4.0], device="jax")]
    found = torch.zeros(1, device="jax")
    torch._amp_foreach_non_finite_check_and_unscale_(clean, found, torch.tensor([0.25], device="jax"))
    assert found.item() == 0.0 and clean[0].item() == 1.0


@pytest.mark.parametrize("found,tracker,expected", [(0.0, 0, (1.0, 1)), (0.0, 1, (2.0, 0)), (1.0, 1, (0.5, 0))])
def test_update_scale_as_torch(found, tracker, expected):
    scale = torch.tensor([1.0], device="jax")
    growth = torch.tensor([tracker], dtype=torch.int32, device="jax")
    torch._amp_update_scale_(scale, growth, torch.tensor([found], device="jax"), 2.0, 0.5, 2)
    assert (scale.item(), growth.item()) == expected


@pytest.mark.parametrize("scale_shape", [(), (1,)])
@pytest.mark.parametrize("tracker_shape", [(), (1,)])
@pytest.mark.parametrize("found", [0.0, 1.0, float("nan")])
def test_update_scale_of_one_element_tensors_of_any_shape_as_cpu(scale_shape, tracker_shape, found):
    """CPU takes any one-element scale and growth tracker (a 0-d scale with
    a (1,) tracker raised "output with shape [] doesn't match the broadcast
    shape [1]" here), updates both in place and returns the scale; a NaN
    found_inf backs off, as CPU's `if (*found_inf)` (it grew here)."""
    results = {}
    for dev in ("cpu", "jax"):
        scale = torch.full(scale_shape, 4.0, device=dev)
        growth = torch.full(tracker_shape, 1, dtype=torch.int32, device=dev)
        out = torch._amp_update_scale_(scale, growth, torch.tensor([found], device=dev), 2.0, 0.5, 2)
        results[dev] = (out.shape, scale.shape, growth.shape, scale.cpu().tolist(), growth.cpu().tolist())
    assert results["jax"] == results["cpu"]


@pytest.mark.parametrize("which", ["current_scale", "growth_tracker", "found_inf"])
def test_update_scale_refuses_more_than_one_element_as_cpu(which):
    for dev in ("cpu", "jax"):
        args = {"current_scale": torch.ones((), device=dev), "growth_tracker": torch.zeros((), dtype=torch.int32, device=dev),
                "found_inf": torch.zeros(1, device=dev)}
        args[which] = args[which].expand(2).clone() if args[which].dim() else args[which].repeat(2)
        with pytest.raises(RuntimeError, match=f"^{which} must be a 1-element tensor\\."):
            torch._amp_update_scale_(*args.values(), 2.0, 0.5, 2)


def test_autocast_runs_torchs_float32_list_in_float32():
    """torch.autocast('jax') follows torch's accelerator (cuda) policy: the
    matmul family in the autocast dtype; softmax, norms, losses, exp/log and
    reductions of 16-bit inputs in float32; everything else as it comes."""
    x = torch.randn(4, 8, device="jax")
    w = torch.randn(3, 8, device="jax")
    with torch.autocast("jax", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, w)
        assert h.dtype == torch.bfloat16
        assert torch.softmax(h, -1).dtype == torch.float32
        assert torch.log_softmax(h, -1).dtype == torch.float32
        assert torch.nn.functional.layer_norm(h, (3,)).dtype == torch.float32
        assert torch.nn.functional.mse_loss(h, torch.zeros_like(h)).dtype == torch.float32
        assert h.exp().dtype == torch.float32 and h.sum().dtype == torch.float32
        assert (h + 1).dtype == torch.bfloat16 and torch.relu(h).dtype == torch.bfloat16
        assert x.double().exp().dtype == torch.float64  # only 16-bit inputs are widened
        inside = torch.softmax(h, -1)
    assert torch.equal(inside.cpu(), torch.softmax(h.float(), -1).cpu())  # computed from the float32 input


def _future_warning(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert len(future) == 1, [str(w.message) for w in caught]
    return result, future[0]


def test_torch_jax_amp_is_torch_cuda_amp_for_the_device():
    """The module's names and signatures are torch.cuda.amp's; it imports as
    a module; each alias warns as torch.cuda.amp's does, naming the
    torch.amp call to use."""
    import torch.cuda.amp as cuda_amp
    import torch.jax.amp as jax_amp
    from torch.jax.amp import GradScaler, autocast  # noqa: F401

    assert torch.jax.amp is jax_amp
    assert set(jax_amp.__all__) == set(cuda_amp.__all__)

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for name in ("autocast", "GradScaler"):
        assert params(getattr(jax_amp, name).__init__) == params(getattr(cuda_amp, name).__init__), name
    for name in ("custom_fwd", "custom_bwd"):
        assert params(getattr(jax_amp, name)) == params(getattr(cuda_amp, name)), name
    assert jax_amp.amp_definitely_not_available() is False
    _, message = _future_warning(jax_amp.autocast)
    assert message == "`torch.jax.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('jax', args...)` instead."
    _, message = _future_warning(jax_amp.GradScaler)
    assert "torch.amp.GradScaler('jax', args...)" in message


def test_torch_jax_amp_autocast_is_torch_autocast_on_the_device():
    x = torch.randn(4, 8, device="jax")
    w = torch.randn(3, 8, device="jax")
    context, _ = _future_warning(torch.jax.amp.autocast)
    with context:  # torch.cuda.amp's default dtype: float16
        assert torch.is_autocast_enabled("jax") and not torch.is_autocast_enabled("cpu")
        h = torch.nn.functional.linear(x, w)
        assert h.dtype == torch.float16 and torch.softmax(h, -1).dtype == torch.float32
    context, _ = _future_warning(torch.jax.amp.autocast, dtype=torch.bfloat16)
    with context:
        inside = torch.nn.functional.linear(x, w)
    assert inside.dtype == torch.bfloat16
    with torch.autocast("jax", dtype=torch.bfloat16):
        same = torch.nn.functional.linear(x, w)
    assert torch.equal(inside.cpu(), same.cpu())
    decorated, _ = _future_warning(torch.jax.amp.autocast, dtype=torch.bfloat16)
    assert decorated(lambda a, b: a @ b.t())(x, w).dtype == torch.bfloat16
    off, _ = _future_warning(torch.jax.amp.autocast, enabled=False)
    with off:
        assert torch.nn.functional.linear(x, w).dtype == torch.float32


def test_torch_jax_amp_grad_scaler_steps_as_cpu():
    steps = [1.0, 1.0, float("inf"), 1.0]
    cpu_scales, cpu_params = _run("cpu", steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        jax_scales, jax_params = _run("jax", steps, make_scaler=torch.jax.amp.GradScaler)
    assert jax_scales == cpu_scales
    for want, got in zip(cpu_params, jax_params):
        torch.testing.assert_close(got, want)


def test_torch_jax_amp_custom_fwd_casts_inputs_under_autocast():
    class Square(torch.autograd.Function):
        pass

    def forward(ctx, a):
        ctx.save_for_backward(a)
        ctx.dtype_seen = a.dtype
        return a * a

    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return 2 * a * grad

    Square.forward = staticmethod(_future_warning(torch.jax.amp.custom_fwd, forward, cast_inputs=torch.float32)[0])
    Square.backward = staticmethod(_future_warning(torch.jax.amp.custom_bwd, backward)[0])
    x = torch.tensor([1.0, -2.0, 3.0], device="jax", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("jax", dtype=torch.bfloat16):
        y = Square.apply(x)
    assert y.dtype == torch.float32  # cast_inputs: the forward ran in float32
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.cpu().float().tolist() == [2.0, -4.0, 6.0]
