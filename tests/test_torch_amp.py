"""torch.amp.GradScaler on 'jax', step by step against torch CPU's."""

from __future__ import annotations

import pytest
import torch


def _run(device: str, steps: list[float]):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8, growth_interval=2)
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
