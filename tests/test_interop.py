"""JAX interop and @assume_pure, through the public API as users write it.

Each test is one thing the peers get wrong or one feature they have (see
docs/interop.md): values and gradients equal eager over shapes A, B, A, B;
writes into arguments and buffers land as eager leaves them; random ops get
a fresh key per call; nesting; the trace cache; the JAX side (jit, grad,
vmap over torch code).  The private torch behaviour the tracer relies on
(AOT export keeping input writes as ``copy_`` into the inputs) is pinned by
test_aot_export_keeps_input_writes_as_copies.
"""

from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import pjrt_host
from pjrt_host import interop

DEV = "jax"


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.lin = torch.nn.Linear(d, 2 * d)
        self.conv = torch.nn.Conv1d(2, 2, 3, padding=1)
        self.norm = torch.nn.LayerNorm(2 * d)
        self.out = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.norm(torch.relu(self.lin(x)))
        h = self.conv(h.reshape(h.shape[0], 2, -1)).reshape(h.shape)
        return self.out(h) + x


class _CompileCounter:
    """XLA compilations, by program name, through jax's public monitoring
    events (every thread: backward runs on autograd's)."""

    def __enter__(self):
        self.names = []

        def listener(event, duration, fun_name="?", **_):
            if event == "/jax/core/compile/backend_compile_duration":
                self.names.append(fun_name)

        self._listener = listener
        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


# ---------------------------------------------------------------- assume_pure: values and gradients


def test_function_values_and_gradients_over_shapes_a_b_a_b():
    @pjrt_host.assume_pure
    def f(a, b):
        return torch.sin(a @ b).sum(-1)

    w = torch.randn(8, 3)
    for rows in (4, 5, 4, 5):
        x = torch.randn(rows, 8)
        xj = x.to(DEV).requires_grad_()
        wj = w.to(DEV).requires_grad_()
        y = f(xj, wj)
        y.square().sum().backward()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        yc = torch.sin(xc @ wc).sum(-1)
        yc.square().sum().backward()
        close(y, yc)
        close(xj.grad, xc.grad)
        close(wj.grad, wc.grad)
    info = f.cache_info()
    assert (info.traces, info.hits, info.size) == (2, 2, 2)


def test_module_values_and_gradients_and_optimizer_training():
    torch.manual_seed(0)
    ref = Block()
    model = Block().to(DEV)
    model.load_state_dict(ref.state_dict())
    pure = pjrt_host.assume_pure(model)
    assert list(pure.parameters()) == list(model.parameters())
    assert pure.state_dict().keys() == ref.state_dict().keys()
    opt = torch.optim.SGD(pure.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for batch in (3, 5, 3, 5):
        x = torch.randn(batch, 16)
        for m, o, inp in ((pure, opt, x.to(DEV)), (ref, opt_ref, x)):
            o.zero_grad()
            m(inp).square().mean().backward()
            o.step()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        close(p, q, 1e-4)
    assert pure.cache_info().traces == 2


def test_partial_gradients_over_positional_and_keyword_arguments():
    @pjrt_host.assume_pure
    def f(a, b, *, c, scale):
        return (a * b + c).sum() * scale

    a = torch.randn(4, device=DEV, requires_grad=True)
    b = torch.randn(4, device=DEV)
    c = torch.randn(4, device=DEV, requires_grad=True)
    f(a, b, c=c, scale=2.0).backward()
    close(a.grad, 2 * b)
    close(c.grad, torch.full((4,), 2.0))
    assert b.grad is None


def test_no_grad_outputs_need_no_grad():
    f = pjrt_host.assume_pure(lambda x: x * 2)
    x = torch.randn(3, device=DEV, requires_grad=True)
    with torch.no_grad():
        y = f(x)
    assert not y.requires_grad
    assert f(x).requires_grad


def test_integer_outputs_are_not_differentiable():
    @pjrt_host.assume_pure
    def f(x):
        return x.square().sum(), x.argmax()

    x = torch.randn(5, device=DEV, requires_grad=True)
    s, i = f(x)
    assert not i.requires_grad and i.dtype == torch.int64
    s.backward()
    close(x.grad, 2 * x)


# ---------------------------------------------------------------- writes into arguments and buffers


def test_batchnorm_running_statistics_are_written_back():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm1d(6)
    bn = torch.nn.BatchNorm1d(6).to(DEV)
    pure = pjrt_host.assume_pure(bn)
    for _ in range(3):
        x = torch.randn(10, 6)
        close(pure(x.to(DEV)), ref(x))
    close(bn.running_mean, ref.running_mean)
    close(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == 3
    pure.eval()
    ref.eval()
    x = torch.randn(4, 6)
    close(pure(x.to(DEV)), ref(x))
    assert int(bn.num_batches_tracked) == 3


def test_in_place_write_into_an_argument_and_into_a_view_argument():
    @pjrt_host.assume_pure
    def f(x, v):
        x.add_(1)
        v.mul_(10)
        return x * 2

    base = torch.arange(6.0, device=DEV)
    x = torch.zeros(3, device=DEV)
    y = f(x, base[2:4])
    close(x, torch.ones(3))
    close(y, torch.full((3,), 2.0))
    close(base, torch.tensor([0.0, 1, 20, 30, 4, 5]))


def test_write_into_an_argument_that_requires_grad_is_refused_naming_it():
    @pjrt_host.assume_pure
    def f(x, w):
        w.add_(1)
        return x * w

    x = torch.randn(3, device=DEV)
    w = torch.randn(3, device=DEV, requires_grad=True)
    with pytest.raises(interop.PurityError, match=r"argument 1 \(shape \(3,\)"):
        f(x, w)


def test_aot_export_keeps_input_writes_as_copies():
    """Pins torch's private ``_aot_export_function(keep_input_mutations=True)``:
    a write into an input stays a ``copy_`` into that placeholder."""
    from pjrt_host._compile._trace import fake_tensors, trace

    traced = trace(lambda a, b: (a.add_(1), b * 2)[1], fake_tensors([((3,), torch.float32, 0)] * 2), "t")
    assert traced.mutated == [0]


# ---------------------------------------------------------------- random


def test_random_ops_get_a_fresh_key_per_call_and_follow_manual_seed():
    @pjrt_host.assume_pure
    def f(x):
        return torch.nn.functional.dropout(x, 0.5) + torch.rand_like(x)

    x = torch.ones(64, device=DEV)
    torch.manual_seed(7)
    a, b = f(x).cpu(), f(x).cpu()
    assert not torch.equal(a, b)
    torch.manual_seed(7)
    close(f(x), a)
    close(f(x), b)
    torch.randn(3, device=DEV).cpu()  # no tracer leaked into the device's generator
    assert f.cache_info().traces == 1


def test_dropout_gradients_use_the_forward_mask():
    @pjrt_host.assume_pure
    def f(x):
        return torch.nn.functional.dropout(x, 0.5)

    x = torch.ones(256, device=DEV, requires_grad=True)
    y = f(x)
    y.sum().backward()
    close(x.grad, y.detach())  # d(mask * x / 0.5)/dx == the output itself for x = 1


# ---------------------------------------------------------------- nesting and torch.compile


def test_call_jax_inside_assume_pure_and_assume_pure_inside_assume_pure():
    inner = pjrt_host.assume_pure(lambda x: x * 3)

    @pjrt_host.assume_pure
    def outer(x, w):
        return interop.call_jax(jnp.tanh, inner(x) @ w).sum()

    x = torch.randn(2, 4, device=DEV)
    w = torch.randn(4, 3, device=DEV, requires_grad=True)
    outer(x, w).backward()
    wc = w.detach().cpu().requires_grad_()
    torch.tanh((x.cpu() * 3) @ wc).sum().backward()
    close(w.grad, wc.grad)
    assert inner.cache_info().traces == 0  # traced as part of outer's graph


def test_assume_pure_inside_torch_compile_is_one_graph():
    pure = pjrt_host.assume_pure(lambda x, w: torch.tanh(x @ w))

    def f(x, w):
        return pure(x, w).sum() * 2

    compiled = torch.compile(f, backend="jax", fullgraph=True)  # fullgraph: a graph break raises
    x = torch.randn(3, 4, device=DEV)
    w = torch.randn(4, 2, device=DEV, requires_grad=True)
    compiled(x, w).backward()
    wc = w.detach().cpu().requires_grad_()
    (torch.tanh(x.cpu() @ wc).sum() * 2).backward()
    close(w.grad, wc.grad)


def test_call_jax_inside_torch_compile_runs_between_graphs():
    def f(x):
        return interop.call_jax(jnp.sin, x * 2).sum()

    compiled = torch.compile(f, backend="jax")
    x = torch.randn(5, device=DEV, requires_grad=True)
    compiled(x).backward()
    close(x.grad, 2 * torch.cos(2 * x.detach()))


# ---------------------------------------------------------------- the cache


def test_five_training_steps_trace_once_and_compile_forward_and_backward_once():
    pure = pjrt_host.assume_pure(torch.nn.Linear(8, 8).to(DEV))
    x = torch.randn(4, 8, device=DEV)
    for _ in range(2):  # warm: the eager ops of the test itself (sum, grad accumulation) compile here
        pure(x).sum().backward()
    pure.cache_clear()
    with _CompileCounter() as c:
        for _ in range(5):
            pure(x).sum().backward()
    assert pure.cache_info().traces == 1
    # Only the function's own programs: an eager op of the loop may compile
    # again in a worker whose earlier test files filled jax's bounded caches.
    own = [name for name in c.names if "Linear." in name]
    assert own == ["jit(Linear.forward)", "jit(Linear.backward)"], c.names


def test_cache_is_bounded_lru_and_counts():
    f = pjrt_host.assume_pure(lambda x: x + 1, maxsize=2)
    for n in (1, 2, 3, 2, 1):
        f(torch.zeros(n, device=DEV))
    info = f.cache_info()
    assert (info.traces, info.hits, info.size, info.maxsize) == (4, 1, 2, 2)


def test_non_tensor_arguments_key_the_cache_and_unhashable_ones_are_named():
    f = pjrt_host.assume_pure(lambda x, k, mode: x * k if mode == "mul" else x + k)
    x = torch.ones(2, device=DEV)
    for k in (1.0, 2.0, 3.0):
        close(f(x, k, "mul"), torch.full((2,), k))
    close(f(x, 3.0, "add"), torch.full((2,), 4.0))
    assert f.cache_info().traces == 4
    with pytest.raises(TypeError, match="argument 1 is a ndarray, which is not hashable"):
        f(x, np.ones(2), "mul")


def test_frequent_retracing_warns_with_what_changed():
    f = pjrt_host.assume_pure(lambda x: x * 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in range(1, 10):
            f(torch.zeros(n, device=DEV))
    messages = [str(w.message) for w in seen if "traced" in str(w.message)]
    assert len(messages) == 1
    assert "argument 0: tensor (7,) torch.float32 -> tensor (8,) torch.float32" in messages[0]


def test_threads_share_one_cache_safely():
    f = pjrt_host.assume_pure(lambda x: x * 2)
    errors = []

    def work(n):
        try:
            for _ in range(10):
                close(f(torch.full((n,), float(n), device=DEV)), torch.full((n,), 2.0 * n))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in (1, 2, 3, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = f.cache_info()
    assert info.hits + info.misses == 40 and info.size == 3


def test_cpu_argument_and_captured_module_get_errors_that_say_what_to_do():
    f = pjrt_host.assume_pure(lambda x: x * 2)
    with pytest.raises(RuntimeError, match=r"argument 0 is a tensor on cpu .* move it there first"):
        f(torch.ones(2))
    model = torch.nn.Linear(2, 2).to(DEV)
    g = pjrt_host.assume_pure(lambda x: model(x))
    with pytest.raises(interop.PurityError, match=r"reads model from outside its arguments"):
        g(torch.ones(2, device=DEV))


# ---------------------------------------------------------------- call_jax


def test_call_jax_values_pytrees_static_arguments_and_partial_gradients():
    def jf(inputs, *, scale):
        return {"y": jnp.sin(inputs["a"]) * inputs["b"] * scale, "i": jnp.argmax(inputs["a"])}

    a = torch.randn(5, device=DEV, requires_grad=True)
    b = torch.randn(5, device=DEV)
    out = interop.call_jax(jf, {"a": a, "b": b}, scale=2.0)
    close(out["y"], torch.sin(a.detach()) * b * 2)
    assert out["i"].item() == int(a.detach().argmax())
    out["y"].sum().backward()
    close(a.grad, torch.cos(a.detach()) * b * 2)
    assert b.grad is None


def test_call_jax_is_traced_once_per_signature():
    interop.call_jax_cache_clear()

    def jf(x, n):
        return x * n

    for n in (2, 2, 3):
        interop.call_jax(jf, torch.ones(3, device=DEV), n)
    interop.call_jax(jf, torch.ones(4, device=DEV), 2)
    info = interop.call_jax_cache_info()
    assert (info.traces, info.hits) == (3, 1)


def test_call_jax_grad_equals_torch_autograd():
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w = torch.randn(4, 3, device=DEV)
    x = torch.randn(2, 4, device=DEV)
    g = interop.call_jax(jax.grad(loss), w, x)
    wc = w.cpu().requires_grad_()
    (torch.tanh(x.cpu() @ wc) ** 2).sum().backward()
    close(g, wc.grad)


def test_call_jax_refuses_cpu_tensors_and_unhashable_statics():
    with pytest.raises(RuntimeError, match="move it there first"):
        interop.call_jax(jnp.sin, torch.ones(2))
    with pytest.raises(TypeError, match="ndarray, which is not hashable"):
        interop.call_jax(lambda x, s: x, torch.ones(2, device=DEV), np.ones(2))


# ---------------------------------------------------------------- the JAX side


def test_views_share_the_device_buffer_and_map_dtypes_and_functions():
    t = torch.randn(3, 4, device=DEV)
    a = interop.jax_view(t)
    assert isinstance(a, jax.Array) and a.shape == (3, 4)
    assert a is interop.jax_view({"t": t})["t"]
    back = interop.torch_view(a)
    assert back.device.type == DEV
    assert interop.jax_view(back) is a  # the same array, no copy either way
    assert interop.jax_view(torch.bfloat16) == jnp.bfloat16
    assert interop.torch_view(jnp.dtype("int32")) == torch.int32
    assert interop.torch_view(jnp.float16) == torch.float16
    with pytest.raises(TypeError, match=r"Move it first: t.to\('jax'\)"):
        interop.jax_view(torch.ones(2))
    tsin = interop.torch_view(jnp.sin)
    close(tsin(t), torch.sin(t))
    jgelu = interop.jax_view(torch.nn.functional.gelu)
    close(interop.torch_view(jgelu(a)), torch.nn.functional.gelu(t))


def test_call_torch_under_jit_grad_and_vmap():
    def tf(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    x = jnp.asarray(torch.randn(3, 4).numpy())
    w = jnp.asarray(torch.randn(4, 2).numpy())
    value = interop.call_torch(tf, x, w)
    assert jnp.allclose(jax.jit(lambda x, w: interop.call_torch(tf, x, w))(x, w), value)
    g = jax.grad(lambda w: interop.call_torch(tf, x, w))(w)
    wc = torch.from_numpy(jax.device_get(w).copy()).requires_grad_()
    tf(torch.from_numpy(jax.device_get(x).copy()), wc).backward()
    assert jnp.allclose(g, wc.grad.numpy(), atol=1e-5)
    rows = jax.vmap(lambda r: interop.call_torch(torch.sin, r))(x)
    assert jnp.allclose(rows, jnp.sin(x), atol=1e-6)


def test_extract_jax_grad_equals_torch_autograd_and_jits():
    torch.manual_seed(0)
    model = Block().to(DEV)
    params, fn = interop.extract_jax(model)
    assert set(params) == {k for k, _ in model.named_parameters()}
    x = torch.randn(3, 16, device=DEV)

    def loss(p, x):
        return jnp.mean(fn(p, x) ** 2)

    grads = jax.jit(jax.grad(loss))(params, interop.jax_view(x))
    model(x).square().mean().backward()
    for name, p in model.named_parameters():
        assert jnp.allclose(grads[name], interop.jax_view(p.grad), atol=1e-5), name


def test_extract_jax_refuses_batchnorm_writes_and_keyless_dropout_under_jit():
    bn = torch.nn.BatchNorm1d(4).to(DEV)
    params, fn = interop.extract_jax(bn)
    x = jnp.ones((3, 4))
    with pytest.raises(interop.PurityError, match=r"running_mean.*running_var.*module.eval\(\)"):
        fn(params, x)
    bn.eval()
    assert fn(params, x).shape == (3, 4)

    drop = torch.nn.Dropout(0.5).to(DEV)
    params, fn = interop.extract_jax(drop)
    with pytest.raises(interop.PurityError, match="Pass a key"):
        jax.jit(fn)(params, jnp.ones(64))
    a = jax.jit(fn)(params, jnp.ones(64), rng=jax.random.key(0))
    b = jax.jit(fn)(params, jnp.ones(64), rng=jax.random.key(1))
    assert not jnp.array_equal(a, b)


def test_jax_jit_outputs_train_with_torch_optim():
    model = torch.nn.Linear(4, 1).to(DEV)
    step = interop.jax_jit(lambda params, x, y: (torch.func.functional_call(model, params, (x,)) - y).square().mean())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4, device=DEV), torch.randn(16, 1, device=DEV)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = step(dict(model.named_parameters()), x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert step.cache_info().traces == 1


def test_an_object_argument_holding_tensors_is_named():
    class Holder:
        def __init__(self, t):
            self.t = t

    f = pjrt_host.assume_pure(lambda x, h: x + h.t)
    with pytest.raises(interop.PurityError, match="Its arguments include Holder objects"):
        f(torch.ones(2, device=DEV), Holder(torch.ones(2, device=DEV)))


def test_is_compiling_is_true_while_tracing_as_under_torch_export():
    """Pins torch's private ``_compiling_state_context``: library code that
    avoids data-dependent branches under ``torch.compiler.is_compiling()``
    (transformers' attention masks) traces as it does under torch.export."""

    @pjrt_host.assume_pure
    def f(x):
        if not torch.compiler.is_compiling() and bool((x > 0).all()):  # a data-dependent branch
            return x
        return x.relu()

    close(f(torch.tensor([-1.0, 2.0], device=DEV)), torch.tensor([0.0, 2.0]))
    assert not torch.compiler.is_compiling()


def _xla_compiles():
    seen = []

    def listener(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    return seen


class _Scaled(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.factor = factor

    def forward(self, x):
        shift = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, 3.0], device=x.device) * self.factor
        return torch.nn.functional.gelu(self.lin(x)) * 2.0 + shift


def test_identical_layers_under_their_own_assume_pure_compile_once():
    """Each layer of a stack under its own assume_pure (PyTorch/XLA's
    pattern) traces separately, but layers that are the same program (same
    graph, shapes, constants) share one compilation, forward and backward;
    each still computes with its own weights."""
    torch.manual_seed(0)
    layers = [_Scaled(1.0) for _ in range(4)]
    dev = torch.nn.Sequential(*[pjrt_host.assume_pure(l.to(DEV)) for l in layers])
    x = torch.randn(3, 6)
    compiles = _xla_compiles()
    # Two other layers first: the first layer's programs (its input needs no
    # gradient), the next one's (it does), and the loss's eager ops.
    # Its output held as the real run holds it: the loss's segment then
    # donates the same inputs (a variant of its own otherwise).
    warm = torch.nn.Sequential(*[pjrt_host.assume_pure(_Scaled(1.0).to(DEV)) for _ in range(2)])
    held = warm(x.to(DEV))
    held.square().sum().backward()
    first = len(compiles)
    out = dev(x.to(DEV))
    out.square().sum().backward()
    assert len(compiles) == first, len(compiles) - first  # four more layers, no new program
    grads = [l.lin.weight.grad.cpu() for l in layers]
    cpu_layers = [_Scaled(1.0) for _ in range(4)]
    for c, l in zip(cpu_layers, layers):
        c.load_state_dict({k: v.cpu() for k, v in l.state_dict().items()})
    want = torch.nn.Sequential(*cpu_layers)(x)
    want.square().sum().backward()
    close(out.cpu(), want.detach(), 1e-4)
    for g, c in zip(grads, cpu_layers):
        close(g, c.lin.weight.grad, 1e-4)


def test_layers_with_other_constants_do_not_share_a_program():
    torch.manual_seed(0)
    a, b = _Scaled(1.0).to(DEV), _Scaled(3.0).to(DEV)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 6, device=DEV)
    with torch.no_grad():
        ya, yb = pjrt_host.assume_pure(a)(x), pjrt_host.assume_pure(b)(x)
        ea, eb = a(x), b(x)
    close(ya.cpu(), ea.cpu(), 1e-5)
    close(yb.cpu(), eb.cpu(), 1e-5)
    assert not torch.allclose(ya.cpu(), yb.cpu())
