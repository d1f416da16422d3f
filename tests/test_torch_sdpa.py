"""scaled_dot_product_attention on 'jax' honours torch.nn.attention.sdpa_kernel:
the device has the MATH backend (torch's math formulation), which runs
whenever the backends allowed include it, with CPU's results; allowing
only backends it lacks raises torch's "No viable backend" error, as CPU
does for the ones it lacks.  CPU's own behaviour is unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B = SDPBackend
NO_BACKEND = "No viable backend for scaled_dot_product_attention was found"


def _inputs(device: str, requires_grad: bool = False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask |= torch.eye(5, dtype=torch.bool)  # no fully masked row
    out = [t.to(device).requires_grad_(requires_grad) for t in (q, k, v)]
    return out, mask.to(device)


@pytest.mark.parametrize("backends", [[B.MATH], [B.FLASH_ATTENTION, B.MATH], [B.MATH, B.EFFICIENT_ATTENTION]],
                         ids=lambda b: "+".join(x.name for x in b))
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"mask": True}, {"scale": 0.2}],
                         ids=["plain", "causal", "mask", "scale"])
def test_backends_with_math_run_with_cpus_results(backends, kwargs):
    results = {}
    for device in ("cpu", "jax"):
        (q, k, v), mask = _inputs(device, requires_grad=True)
        call = {name: (mask if name == "mask" else value) for name, value in kwargs.items()}
        if "mask" in call:
            call["attn_mask"] = call.pop("mask")
        with sdpa_kernel([B.MATH]) if device == "cpu" else sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(q, k, v, **call)
            out.square().sum().backward()
            with torch.inference_mode():  # reaches the device undecomposed
                inference = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), **call)
        results[device] = [t.detach().cpu() for t in (out, inference, q.grad, k.grad, v.grad)]
    for want, got in zip(results["cpu"], results["jax"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", [B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.CUDNN_ATTENTION, B.OVERRIDEABLE],
                         ids=lambda b: b.name)
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference"])
def test_only_backends_the_device_lacks_raise_torchs_error(backend, mode):
    (q, k, v), _ = _inputs("jax", requires_grad=mode == "grad")
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[mode]
    with sdpa_kernel([backend]), context(), pytest.raises(RuntimeError, match=NO_BACKEND) as err:
        F.scaled_dot_product_attention(q, k, v)
    # the cause and the fix
    assert f"SDPBackend.{backend.name}" in str(err.value) and "Add SDPBackend.MATH" in str(err.value)
    # the flags are restored on exit: the device computes again
    assert F.scaled_dot_product_attention(q, k, v).shape == q.shape


def test_math_turned_off_through_torch_backends_raises_too():
    (q, k, v), _ = _inputs("jax")
    assert torch.backends.cuda.math_sdp_enabled()
    torch.backends.cuda.enable_math_sdp(False)
    try:
        with pytest.raises(RuntimeError, match=NO_BACKEND):
            F.scaled_dot_product_attention(q, k, v)
    finally:
        torch.backends.cuda.enable_math_sdp(True)


def test_fused_sdp_choice_answers_for_the_device():
    """torch._fused_sdp_choice (the op torch's backend choice is named
    after): MATH on 'jax', torch's error where no backend is left."""
    (q, k, v), _ = _inputs("jax")
    assert torch._fused_sdp_choice(q, k, v) == int(B.MATH)
    with sdpa_kernel([B.FLASH_ATTENTION, B.MATH]):
        assert torch._fused_sdp_choice(q, k, v) == int(B.MATH)
    with sdpa_kernel([B.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError, match=NO_BACKEND):
        torch._fused_sdp_choice(q, k, v)


def test_cpu_keeps_its_own_choice():
    """CPU tensors: flash runs, a backend CPU lacks raises torch's words
    alone, with the device loaded."""
    torch.ones(1, device="jax")
    (q, k, v), _ = _inputs("cpu")
    with sdpa_kernel([B.FLASH_ATTENTION]):
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v),
                                   F.scaled_dot_product_attention(q, k, v))
    assert torch._fused_sdp_choice(q, k, v) == int(B.FLASH_ATTENTION)
    with sdpa_kernel([B.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError) as err:
        F.scaled_dot_product_attention(q, k, v)
    assert str(err.value).startswith(NO_BACKEND) and "pjrt_host" not in str(err.value)
