"""scaled_dot_product_attention on 'jax' honours torch.nn.attention.sdpa_kernel:
the device has the MATH backend (torch's math formulation), which runs
whenever the backends allowed include it, with CPU's results; allowing
only backends it lacks raises torch's "No viable backend" error, as CPU
does for the ones it lacks.  CPU's own behaviour is unchanged.  On the
device's own tensors it is one op each way, with CPU's values, gradients
and double backward."""

from __future__ import annotations

import contextlib

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


def _count_ops(fn):
    """The ATen (and pjrt_host) ops the device runs in ``fn()``, by name."""
    from pjrt_host._torch import _profile

    names = []

    class Scope:
        def __init__(self, name):
            names.append(name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    saved = _profile.op_scope, _profile.active
    _profile.op_scope, _profile.active = Scope, True
    try:
        fn()
    finally:
        _profile.op_scope, _profile.active = saved
    return names


@pytest.mark.parametrize("mode", ["op", "fused"])
@pytest.mark.parametrize("case", ["plain", "causal", "scale", "float mask", "broadcast bool mask", "gqa"])
def test_attention_is_one_op_each_way_with_cpus_values_and_gradients(mode, case):
    """On the device's own tensors sdpa is one op forward and one backward
    (torch's composite ran about 20 and 30, each paying the per-op cost),
    with CPU's values and gradients."""
    import pjrt_host

    g = torch.Generator().manual_seed(1)
    q0, k0, v0 = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g), \
        torch.randn(2, 4, 7, 6, generator=g)
    kwargs = {"causal": {"is_causal": True}, "scale": {"scale": 0.3}}.get(case, {})
    mask = {"float mask": torch.randn(5, 7, generator=g),
            "broadcast bool mask": torch.rand(2, 1, 5, 7, generator=g) > 0.3}.get(case)
    if case == "gqa":
        k0, v0, kwargs = k0[:, :2], v0[:, :2], {"enable_gqa": True}
    results, ops = {}, {}
    for device in ("cpu", "jax"):
        q, k, v = (t.clone().to(device).requires_grad_() for t in (q0, k0, v0))
        weights = torch.arange(2 * 4 * 5 * 6.0).reshape(2, 4, 5, 6).sin().to(device)
        with pjrt_host.config(eager=mode):
            def run():
                out = F.scaled_dot_product_attention(q, k, v, None if mask is None else mask.to(device), **kwargs)
                (out * weights).sum().backward()
                return out
            if device == "jax":
                ops[device] = _count_ops(run)
                out = F.scaled_dot_product_attention(q, k, v, None if mask is None else mask.to(device), **kwargs)
            else:
                out = run()
        results[device] = [out.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
    for got, want in zip(results["jax"], results["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    attention = [n for n in ops["jax"] if "attention" in n or n.startswith("aten::bmm")]
    assert attention == ["pjrt_host::attention", "pjrt_host::attention_backward"], ops["jax"]


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_attention_dropout_backward_sees_the_forwards_mask_and_double_backward_is_cpus(mode):
    """Dropout's mask is drawn once and read by the forward and the
    backward (a value of the identity makes the output the dropped
    weights); a gradient taken with create_graph differentiates again,
    equal to CPU's math backend's (CPU's flash kernel has none)."""
    import pjrt_host

    with pjrt_host.config(eager=mode):
        q = torch.randn(3, 6, 4, device="jax", requires_grad=True)
        k = torch.randn(3, 6, 4, device="jax")
        v = torch.eye(6).expand(3, 6, 6).contiguous().to("jax").requires_grad_()
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        g = torch.randn(3, 6, 6, device="jax")
        (out * g).sum().backward()
        torch.testing.assert_close(v.grad.cpu(), (out.detach().transpose(-1, -2) @ g).cpu())
        dropped = out.detach().cpu()
        assert (dropped == 0).any() and (dropped != 0).any()
        results = {}
        gen = torch.Generator().manual_seed(2)
        inputs = [torch.randn(2, 2, 5, 8, generator=gen) for _ in range(3)]
        for device in ("cpu", "jax"):
            q, k, v = (t.clone().to(device).requires_grad_() for t in inputs)
            with sdpa_kernel([B.MATH]):  # (CPU's flash kernel has no double backward)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                grad_q, = torch.autograd.grad(out.square().sum(), q, create_graph=True)
                grad_q.square().sum().backward()
            results[device] = [grad_q.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
        for got, want in zip(results["jax"], results["cpu"]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_attention_without_a_graph_draws_dropout_as_with_one(mode):
    """Where no gradient is recorded (no_grad, inputs that need none) the
    one op runs without autograd's Function: the same seed draws the same
    dropout mask, and the values are those of a call that records one."""
    import pjrt_host

    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 2, 7, 8, generator=gen).to("jax") for _ in range(3)]
    outs = []
    with pjrt_host.config(eager=mode):
        for way in ("graph", "no_grad", "no_inputs_need_it"):
            torch.manual_seed(11)
            q = inputs[0].clone().requires_grad_(way == "graph")
            context = torch.no_grad() if way == "no_grad" else contextlib.nullcontext()
            with context:
                out = F.scaled_dot_product_attention(q, inputs[1], inputs[2], dropout_p=0.3, is_causal=True)
            assert out.requires_grad == (way == "graph")
            outs.append(out.detach().cpu())
    assert (outs[0] == 0).any() and (outs[0] != 0).any()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("p", [1.5, -0.2])
def test_attention_with_a_dropout_p_out_of_range_raises_torchs_dropout_error(p):
    """A dropout_p outside [0, 1] raises torch's dropout error (CPU's math
    backend raises it from its dropout), padded or not: the one op drew its
    mask from 1 - p and returned a value."""
    q = torch.randn(2, 2, 5, 8, device="jax")
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=p)
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        torch.dropout(torch.randn(3), p, True)  # (CPU's own words: its kernel's check)
