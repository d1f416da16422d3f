"""Out-of-range indices in compiled programs (torch.compile(backend='jax'),
assume_pure, call_torch) raise the error eager mode raises, at the next
synchronisation point (pjrt_host.config(checks=...)): an XLA gather
or scatter would clip or drop them.  So do the argument values eager
refuses (an integer division by zero, a probability outside [0, 1])."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import torch._dynamo  # noqa: E402

import pjrt_host  # noqa: E402
from pjrt_host import interop  # noqa: E402

nn = torch.nn


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.jax.synchronize()  # a test leaves no failed check behind for the next


def ones(n=2):
    return torch.ones(n, device="jax")


# op -> fn(x, i) with x = arange(10.), i a 1-d index; every checked op family
OPS = {
    "aten::index": lambda x, i: x[i] * 2,
    "aten::index_put": lambda x, i: x.index_put((i,), ones()),
    "aten::index_select": lambda x, i: x.index_select(0, i),
    "aten::index_add": lambda x, i: x.index_add(0, i, ones()),
    "aten::index_copy": lambda x, i: x.index_copy(0, i, ones()),
    "aten::index_fill": lambda x, i: x.index_fill(0, i, 1.0),
    "aten::embedding": lambda x, i: nn.functional.embedding(i, x.view(10, 1)),
    "aten::gather": lambda x, i: x.gather(0, i),
    "aten::gather (take_along_dim)": lambda x, i: torch.take_along_dim(x, i),
    "aten::scatter": lambda x, i: x.scatter(0, i, ones()),
    "aten::scatter_add": lambda x, i: x.scatter_add(0, i, ones()),
    "aten::scatter_reduce": lambda x, i: x.scatter_reduce(0, i, ones(), "amax"),
    "aten::take": lambda x, i: x.take(i),
    # class targets of a loss (a wrong class count gave a NaN or a wrong loss)
    "aten::nll_loss_forward": lambda x, i: nn.functional.cross_entropy(x.view(1, 10).expand(2, 10), i),
}


def eager_error(fn, *args):
    with pjrt_host.config(checks="sync"), pytest.raises(Exception) as caught:
        fn(*args)
    return caught.value


@pytest.mark.parametrize("op", list(OPS))
def test_compiled_op_raises_eagers_error_at_the_next_synchronisation(op):
    fn = OPS[op]
    x = torch.arange(10.0, device="jax")
    bad = torch.tensor([3, 12], device="jax")
    expected = eager_error(fn, x, bad)
    compiled = torch.compile(fn, backend="jax")
    compiled(x, bad)  # the call itself returns: the verdict is read later
    with pytest.raises(type(expected)) as caught:
        torch.jax.synchronize()
    text = str(caught.value)
    assert text.startswith(str(expected)), text
    assert op.split(" ")[0] in text and "torch.compile(backend='jax')" in text
    assert "next synchronisation point" in text and "checks" in text
    assert __file__ in text  # the line of user code that called the op


def test_the_issue_examples():
    x = torch.arange(10.0, device="jax")
    i = torch.tensor([3, 12], device="jax")
    f = torch.compile(lambda x, i: x[i] * 2, backend="jax")
    with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 10"):
        f(x, i).cpu()
    g = torch.compile(lambda x, i: x.index_add(0, i, torch.ones(2, device="jax")), backend="jax")
    with pytest.raises((IndexError, RuntimeError), match="aten::index_add"):
        g(x, i).tolist()


def test_in_range_values_and_negatives_give_cpus_result():
    cpu = torch.arange(10.0)
    i = torch.tensor([3, -1, -10, 9])
    f = lambda x, i: (x[i] * 2, x.take(i), x.index_put((i,), torch.zeros(4, device=x.device)))  # noqa: E731
    got = torch.compile(f, backend="jax")(cpu.to("jax"), i.to("jax"))
    for g, e in zip(got, f(cpu, i)):
        assert g.cpu().tolist() == e.tolist()
    torch.jax.synchronize()


def test_a_loss_skips_its_ignore_index_as_cpu_does():
    logits = torch.arange(12.0).view(4, 3)
    for ignore, target, bad in ((-100, [2, -100, 0, 1], [2, 7, 0, 1]), (7, [2, 7, 0, 1], [2, -100, 0, 1])):
        torch._dynamo.reset()
        f = lambda x, t: nn.functional.cross_entropy(x, t, ignore_index=ignore)  # noqa: E731
        compiled = torch.compile(f, backend="jax")
        got = compiled(logits.to("jax"), torch.tensor(target, device="jax"))
        assert torch.allclose(got.cpu(), f(logits, torch.tensor(target)))
        with pytest.raises(IndexError, match=f"Target {bad[1]} is out of bounds"):
            compiled(logits.to("jax"), torch.tensor(bad, device="jax")).cpu()
        torch.jax.synchronize()


def test_negatives_out_of_range_and_where_torch_refuses_them():
    x = torch.arange(10.0, device="jax")
    f = torch.compile(lambda x, i: x[i] * 2, backend="jax")
    with pytest.raises(IndexError, match="index -11 is out of bounds"):
        f(x, torch.tensor([-11], device="jax")).cpu()
    gather = torch.compile(lambda x, i: x.gather(0, i), backend="jax")
    with pytest.raises(RuntimeError, match="index -1 is out of bounds.*aten::gather"):
        gather(x, torch.tensor([-1], device="jax")).cpu()  # gather takes no negative index, as on CPU


def test_sync_raises_at_the_call():
    x = torch.arange(10.0, device="jax")
    f = torch.compile(lambda x, i: x[i] * 2, backend="jax")
    with pjrt_host.config(checks="sync"), pytest.raises(IndexError, match="found at the call"):
        f(x, torch.tensor([12], device="jax"))


def test_off_compiles_without_the_check():
    x = torch.arange(10.0, device="jax")
    f = torch.compile(lambda x, i: x[i] * 2, backend="jax")
    with pjrt_host.config(checks=False):
        out = f(x, torch.tensor([3, 12], device="jax"))
        torch.jax.synchronize()
    assert out.cpu().tolist()[0] == 6.0  # the second value is what the lowering makes of 12: unchecked
    # and the same function, checked again once the setting is back
    with pytest.raises(IndexError):
        f(x, torch.tensor([3, 12], device="jax")).cpu()


def test_a_failed_check_is_raised_once_and_later_calls_run():
    x = torch.arange(10.0, device="jax")
    f = torch.compile(lambda x, i: x[i] * 2, backend="jax")
    f(x, torch.tensor([12], device="jax"))
    f(x, torch.tensor([11], device="jax"))
    with pytest.raises(IndexError, match="index 12 "):  # the first failure; those queued after it are dropped
        torch.jax.synchronize()
    assert f(x, torch.tensor([1], device="jax")).cpu().tolist() == [2.0]


def test_training_step_with_valid_tokens_matches_unchecked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50)).to("jax")
    tokens = torch.randint(0, 50, (4, 6), device="jax")
    compiled = torch.compile(model, backend="jax")

    def step():
        for p in model.parameters():
            p.grad = None
        loss = nn.functional.cross_entropy(compiled(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        return loss.item(), model[0].weight.grad.cpu()

    loss_on, grad_on = step()
    with pjrt_host.config(checks=False):
        loss_off, grad_off = step()
    assert loss_on == loss_off and torch.equal(grad_on, grad_off)
    with pytest.raises(IndexError, match="index out of range in self.*aten::embedding.*forward graph"):
        compiled(torch.tensor([[50]], device="jax")).sum().backward()
        torch.jax.synchronize()


def test_dynamic_shapes_check_each_size():
    f = torch.compile(lambda x, i: x[i] + 1, backend="jax", dynamic=True)
    for n in (10, 20):
        x = torch.arange(float(n), device="jax")
        assert f(x, torch.tensor([n - 1], device="jax")).cpu().tolist() == [float(n)]
        with pytest.raises(IndexError, match=f"index {n} is out of bounds for dimension 0 with size {n}"):
            f(x, torch.tensor([n], device="jax")).cpu()


# ------------------------------------------------------------ assume_pure


def test_assume_pure_checks_its_indices():
    x = torch.arange(10.0, device="jax")
    f = pjrt_host.assume_pure(lambda x, i: x[i] * 2)
    f(x, torch.tensor([3, 12], device="jax"))
    with pytest.raises(IndexError, match=r"index 12 is out of bounds.*aten::index.*assume_pure"):
        torch.jax.synchronize()
    assert f(x, torch.tensor([-1, 0], device="jax")).cpu().tolist() == [18.0, 0.0]
    with pjrt_host.config(checks=False):
        f(x, torch.tensor([12], device="jax")).cpu()  # unchecked: no error
    with pjrt_host.config(checks="sync"), pytest.raises(IndexError, match="found at the call"):
        f(x, torch.tensor([12], device="jax"))


def test_assume_pure_module_with_gradient_checks_its_indices():
    emb = pjrt_host.assume_pure(nn.Embedding(10, 3).to("jax"))
    emb(torch.tensor([1, 9], device="jax")).sum().backward()
    torch.jax.synchronize()
    with pytest.raises(IndexError, match="index out of range in self.*aten::embedding"):
        emb(torch.tensor([10], device="jax")).sum().backward()
        torch.jax.synchronize()


# ------------------------------------------------------------ value checks


def _ints(*v):
    return torch.tensor(v, device="jax")


def _floats(*v):
    return torch.tensor(v, dtype=torch.float32, device="jax")


# op -> (fn, bad arguments, good arguments): every argument value eager refuses
# where a compiled program would give a value
VALUE_OPS = {
    "aten::floor_divide": (lambda a, b: a // b, (_ints(5, 7, 9), _ints(2, 0, 3)), (_ints(5, 7, 9), _ints(2, 1, 3))),
    "aten::remainder": (lambda a, b: a % b, (_ints(5, 7), _ints(0, 3)), (_ints(5, 7), _ints(4, 3))),
    "aten::fmod": (lambda a, b: torch.fmod(a, b), (_ints(5, -7), _ints(2, 0)), (_ints(5, -7), _ints(2, 3))),
    "aten::div": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (_ints(5, -7), _ints(0, 2)),
                  (_ints(5, -7), _ints(3, 2))),
    "aten::binary_cross_entropy": (lambda p, t: nn.functional.binary_cross_entropy(p, t), (_floats(0.5, 1.5), _floats(0, 1)),
                                   (_floats(0.5, 0.25), _floats(0, 1))),
    "aten::bernoulli": (lambda p: torch.bernoulli(p) * 0, (_floats(0.5, -0.5),), (_floats(0.5, 1.0),)),
    "aten::searchsorted": (lambda s, v, i: torch.searchsorted(s, v, sorter=i),
                           (_floats(3, 1, 2), _floats(1.5, 2.5), _ints(1, 2, 3)),
                           (_floats(3, 1, 2), _floats(1.5, 2.5), _ints(1, 2, 0))),
}


@pytest.mark.parametrize("op", list(VALUE_OPS))
def test_compiled_op_refuses_the_values_eager_refuses(op):
    fn, bad, good = VALUE_OPS[op]
    expected = eager_error(fn, *bad)
    compiled = torch.compile(fn, backend="jax")
    compiled(*bad)
    with pytest.raises(type(expected)) as caught:
        torch.jax.synchronize()
    text = str(caught.value)
    assert text.startswith(str(expected)), text
    assert op in text and "torch.compile(backend='jax')" in text and f"called from {__file__}:" in text
    # the same program with values CPU accepts gives CPU's result
    assert compiled(*good).cpu().tolist() == fn(*(a.cpu() for a in good)).tolist()
    with pjrt_host.config(checks="sync"), pytest.raises(type(expected), match="found at the call"):
        compiled(*bad)


def test_a_python_zero_divisor_is_refused_by_every_call():
    f = torch.compile(lambda a: a // 0 + a % 0, backend="jax")
    with pytest.raises(RuntimeError, match="ZeroDivisionError.*aten::floor_divide.*torch.compile"):
        f(_ints(5, 7)).cpu()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(_ints(1)).cpu()
    # a float division by zero is not refused, on CPU or here
    g = torch.compile(lambda a: a // 0.0, backend="jax")
    assert g(_floats(1.0, -1.0)).cpu().tolist() == (torch.tensor([1.0, -1.0]) // 0.0).tolist()


def test_value_checks_under_checkify_and_off():
    from jax.experimental import checkify

    fn = lambda a, b: a // b  # noqa: E731
    a, bad = jax.numpy.array([5, 7]), jax.numpy.array([2, 0])
    checked = jax.jit(checkify.checkify(lambda a, b: interop.call_torch(fn, a, b), errors=checkify.user_checks))
    err, _ = checked(a, bad)
    assert "ZeroDivisionError (raised by aten::floor_divide" in err.get()
    err, out = checked(a, jax.numpy.array([2, 7]))
    assert err.get() is None and out.tolist() == [2, 1]
    compiled = torch.compile(fn, backend="jax")
    with pjrt_host.config(checks=False):
        compiled(_ints(5, 7), _ints(2, 0)).cpu()  # unchecked: jax's value, no error
    torch.jax.synchronize()


def test_linalg_infos_and_their_checks_under_a_callers_jit():
    """LAPACK-style infos (cholesky_ex, lu_factor_ex, inv_ex), argmax, and
    the old torch.cholesky's value check, traced inside a caller's jax.jit
    with 64-bit types off: they once failed MLIR's verifier (an argmax's
    int64 index, traced as int64 and lowered as int32)."""
    from jax.experimental import checkify

    m = jax.numpy.array([[4.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 0.0, 1.0]])
    bad = jax.numpy.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    for fn in (lambda a: torch.linalg.cholesky_ex(a)[1], lambda a: torch.linalg.lu_factor_ex(a)[2],
               lambda a: torch.linalg.inv_ex(a)[1]):
        assert int(jax.jit(lambda a: interop.call_torch(fn, a))(m)) == 0
    # argmax and max(dim) (a classifier's prediction) likewise
    for fn in (lambda a: torch.argmax(a, 1), lambda a: torch.max(a, 1)[1], lambda a: torch.argmin(a)):
        got = jax.jit(lambda a: interop.call_torch(fn, a))(m)
        assert got.tolist() == fn(torch.tensor(np.asarray(m))).tolist()
    assert int(jax.jit(lambda a: interop.call_torch(lambda t: torch.linalg.cholesky_ex(t)[1], a))(bad)) == 2
    checked = jax.jit(checkify.checkify(lambda a: interop.call_torch(torch.cholesky, a), errors=checkify.user_checks))
    assert checked(m)[0].get() is None
    assert "the leading minor of order 2 is not positive-definite" in checked(bad)[0].get()


# ------------------------------------------------------------ torch functions as JAX functions


def test_call_torch_checks_on_values_and_under_checkify():
    from jax.experimental import checkify

    xa, bad = jax.numpy.arange(10.0), jax.numpy.array([3, 12])
    fn = lambda x, i: x[i] * 2  # noqa: E731
    interop.call_torch(fn, xa, bad)
    with pytest.raises(IndexError, match="index 12 is out of bounds.*call_torch"):
        torch.jax.synchronize()

    checked = jax.jit(checkify.checkify(lambda x, i: interop.call_torch(fn, x, i), errors=checkify.user_checks))
    err, _ = checked(xa, bad)
    assert "index 12 is out of bounds for dimension 0 with size 10" in err.get()
    err, out = checked(xa, jax.numpy.array([3, -1]))
    assert err.get() is None and out.tolist() == [6.0, 18.0]
    # without checkify, under jit: no check, no host work per call
    assert jax.jit(lambda x, i: interop.call_torch(fn, x, i))(xa, bad).tolist()[0] == 6.0
    torch.jax.synchronize()


def test_the_calling_line_under_a_torch_function_mode():
    """set_default_device leaves torch's DeviceContext mode on the stack,
    whose frame is then the innermost of the traced stack: the error still
    names the user's line."""
    torch.set_default_device("jax")
    torch.set_default_device("cpu")
    try:
        compiled = torch.compile(lambda x, i: x[i] * 2, backend="jax")
        compiled(torch.arange(10.0, device="jax"), torch.tensor([3, 12], device="jax"))
        with pytest.raises(IndexError) as caught:
            torch.jax.synchronize()
    finally:
        torch.set_default_device(None)
    assert f"called from {__file__}:" in str(caught.value) and "_door.py" not in str(caught.value)
