"""Same seed, same numbers, whatever ran before: every random op on the
'jax' device, with the global seed and with a ``torch.Generator('jax')``,
eager and compiled, draws in a process that has used these ops before
exactly what a fresh process draws.

An op's compiled form depends on what the process did before it (its
scalars are traced after a second signature, a trial runs it twice), so
each check compares against a fresh child process."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from conftest import run_python  # noqa: E402

# Run here and in a fresh child: every random op the device has, with a
# 'jax' generator, with the global seed, and inside a compiled function.
DRAWS = r'''
import torch

def eager_draws(g):
    kw = {} if g is None else {"generator": g}
    x = torch.empty(4, device="jax")
    w = torch.ones(5, device="jax")
    return [torch.randn(3, device="jax", **kw), torch.rand(2, 3, device="jax", **kw),
            torch.randint(0, 100, (5,), device="jax", **kw), torch.randint(7, (2,), device="jax", **kw),
            torch.randperm(6, device="jax", **kw), x.normal_(**kw).clone(), x.normal_(2.0, 3.0, **kw).clone(),
            x.uniform_(**kw).clone(), x.uniform_(-1.0, 1.0, **kw).clone(),
            x.bernoulli_(0.5, **kw).clone(), x.bernoulli_(0.25, **kw).clone(),
            torch.bernoulli(torch.full((4,), 0.5, device="jax"), **kw),
            x.exponential_(**kw).clone(), x.random_(0, 10, **kw).clone(), x.cauchy_(**kw).clone(),
            x.log_normal_(**kw).clone(), x.geometric_(0.3, **kw).clone(),
            torch.normal(torch.zeros(3, device="jax"), torch.ones(3, device="jax"), **kw),
            torch.multinomial(w, 3, **kw), torch.multinomial(w, 8, replacement=True, **kw),
            torch.nn.functional.dropout(torch.ones(8, device="jax"), 0.5),
            torch.nn.functional.dropout(torch.ones(8, device="jax"), 0.25),
            torch.poisson(w * 3, **kw), torch.binomial(w * 10, w * 0.4, **kw),
            torch._standard_gamma(w * 2, **kw), torch._sample_dirichlet(w, **kw)]

def compiled_draws():
    f = torch.compile(lambda a: torch.nn.functional.dropout(a, 0.5) + torch.rand_like(a), backend="jax")
    return [f(torch.ones(8, device="jax"))]

def all_draws():
    g = torch.Generator(device="jax")
    g.manual_seed(123)
    torch.manual_seed(7)
    return [t.cpu().tolist() for t in eager_draws(g) + eager_draws(None) + compiled_draws()]
'''


def _fresh_draws() -> list:
    code = DRAWS + "\nimport json\nprint(json.dumps(all_draws()))\n"
    proc = run_python(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _warm_every_random_op() -> None:
    """Call every random op with several signatures and scalars, with and
    without generators: the history that once changed a seeded draw."""
    other = torch.Generator(device="jax").manual_seed(1)
    for n in (3, 4, 5, 6):
        x = torch.empty(n, device="jax")
        for kw in ({}, {"generator": other}):
            x.bernoulli_(0.1 * n, **kw)
            x.normal_(0.5 * n, 1.0, **kw)
            x.uniform_(-n, n, **kw)
            x.exponential_(1.0 / n, **kw)
            x.random_(0, n + 2, **kw)
            x.geometric_(0.1 * n, **kw)
            torch.rand(n, device="jax", **kw)
            torch.multinomial(torch.ones(n, device="jax"), 2, **kw)
        torch.nn.functional.dropout(torch.ones(n, 2, device="jax"), 0.1 * n)  # a trial of traced p


def test_a_seed_draws_what_a_fresh_process_draws_after_any_history():
    expected = _fresh_draws()
    namespace: dict = {}
    exec(DRAWS, namespace)
    # Before any history here, and after each op has seen other signatures.
    first = namespace["all_draws"]()
    _warm_every_random_op()
    after = namespace["all_draws"]()
    for i, (want, got_first, got_after) in enumerate(zip(expected, first, after, strict=True)):
        assert got_first == want, f"draw {i}: {got_first} in this process, {want} in a fresh one"
        assert got_after == want, f"draw {i} after other calls: {got_after}, fresh: {want}"


def _part_moments(z: "torch.Tensor") -> list[float]:
    z = z.cpu().to(torch.complex128)
    return [float(z.real.mean()), float(z.real.var()), float(z.imag.mean()), float(z.imag.var())]


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_complex_draws_fill_both_parts_as_cpu_does_eager_and_compiled(name):
    """torch draws a complex rand / randn part by part: rand's real and
    imaginary parts are each uniform in [0, 1), randn's each normal with
    variance 1/2 (so |z|^2 averages 1).  Eager, compiled and ``*_like`` in
    a compiled graph draw the same distribution as CPU torch."""
    n = 20000
    factory, like = getattr(torch, name), getattr(torch, f"{name}_like")
    torch.manual_seed(0)
    cpu = _part_moments(factory(n, dtype=torch.complex64))
    eager = factory(n, dtype=torch.complex64, device="jax")
    compiled = torch.compile(lambda x: factory(x.shape, dtype=torch.complex64, device=x.device), backend="jax")
    compiled_like = torch.compile(lambda x: like(x), backend="jax")
    drawn = {"eager": eager, "compiled": compiled(torch.empty(n, device="jax")),
             "compiled *_like": compiled_like(torch.empty(n, dtype=torch.complex64, device="jax"))}
    for how, z in drawn.items():
        assert z.dtype == torch.complex64, how
        got = _part_moments(z)
        assert float(z.imag.abs().max().cpu()) > 0, f"{how}: the imaginary part is all zeros"
        for moment, (g, want) in enumerate(zip(got, cpu)):
            assert abs(g - want) < 0.03, f"{how} {name}: moments {got}, CPU {cpu} (differs at {moment})"


# ---------------------------------------------------------------- random state

DEV = "jax"


def cpu(t):
    return t.detach().cpu()



def test_manual_seed_reproducible():
    torch.manual_seed(123)
    a1, b1 = torch.randn(5, device=DEV), torch.rand(3, device=DEV)
    d1 = torch.nn.functional.dropout(torch.ones(50, device=DEV), 0.5)
    torch.manual_seed(123)
    a2, b2 = torch.randn(5, device=DEV), torch.rand(3, device=DEV)
    d2 = torch.nn.functional.dropout(torch.ones(50, device=DEV), 0.5)
    assert torch.equal(cpu(a1), cpu(a2)) and torch.equal(cpu(b1), cpu(b2)) and torch.equal(cpu(d1), cpu(d2))
    torch.manual_seed(124)
    assert not torch.equal(cpu(torch.randn(5, device=DEV)), cpu(a1))


def test_successive_draws_differ():
    torch.manual_seed(0)
    assert not torch.equal(cpu(torch.randn(8, device=DEV)), cpu(torch.randn(8, device=DEV)))
    x = torch.empty(6, device=DEV)
    first = cpu(x.normal_())
    assert not torch.equal(first, cpu(x.normal_()))


def test_rng_state_round_trip():
    torch.jax.manual_seed(7)
    state = torch.jax.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = cpu(torch.randn(4, device=DEV))
    torch.jax.set_rng_state(state)
    assert torch.equal(cpu(torch.randn(4, device=DEV)), a)
    with torch.random.fork_rng(device_type=DEV):
        torch.randn(4, device=DEV)
    assert torch.jax.initial_seed() == 7


def test_generator_argument_is_reproducible():
    g = torch.Generator().manual_seed(5)
    a = cpu(torch.empty(4, device=DEV).normal_(generator=g))
    g = torch.Generator().manual_seed(5)
    b = cpu(torch.empty(4, device=DEV).normal_(generator=g))
    assert torch.equal(a, b)


def test_random_in_place_ops():
    x = torch.empty(1000, device=DEV)
    assert 0.4 < cpu(x.uniform_()).mean() < 0.6
    assert set(cpu(x.bernoulli_(0.5)).unique().tolist()) <= {0.0, 1.0}
    assert cpu(x.exponential_()).min() >= 0
    i = torch.empty(100, dtype=torch.int64, device=DEV).random_(0, 5)
    assert cpu(i).max() < 5 and cpu(i).min() >= 0
    probs = torch.tensor([[0.0, 1.0, 0.0]], device=DEV)
    assert cpu(torch.multinomial(probs, 2, replacement=True)).tolist() == [[1, 1]]


def test_a_bad_bound_is_refused_after_the_ops_scalars_are_traced():
    """Once a random op's scalars are traced (new bounds share one program),
    torch's checks on their values still run for each new value: the meta
    kernel's (normal_'s std) and the CPU kernel's (uniform_'s range,
    bernoulli_'s p).  They once ran only at the first compile, so the result
    depended on which tests had run before."""
    x = torch.empty(4, device="jax")
    for n in (3, 4, 5, 6):
        x.normal_(0.5 * n, 1.0)
        x.uniform_(-n, n)
        x.bernoulli_(0.1 * n)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        x.normal_(0.0, -1.0)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range"):
        x.uniform_(3.0, -1.0)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\]"):
        x.bernoulli_(1.5)
    assert x.normal_(0.0, 2.0).shape == (4,)


def test_torch_distributions_sample_and_score_on_the_device():
    """torch.distributions checks its arguments (``validate_args``, on by
    default) with ``torch._is_all_true``; its samplers are poisson,
    binomial, _standard_gamma and _sample_dirichlet.  Draws are jax's, not
    CPU's: checked by their statistics over many draws."""
    D = torch.distributions
    n = 20000
    normal = D.Normal(torch.zeros(3, device=DEV), torch.full((3,), 2.0, device=DEV))
    assert torch.allclose(cpu(normal.log_prob(torch.ones(3, device=DEV))),
                          D.Normal(torch.zeros(3), torch.full((3,), 2.0)).log_prob(torch.ones(3)))
    # CPU's refusal of an invalid argument (validate_args given: torch.compile
    # turns the default off for the whole process, on every device)
    with pytest.raises(ValueError, match="scale"):
        D.Normal(torch.zeros(2, device=DEV), torch.tensor([1.0, -1.0], device=DEV), validate_args=True)
    assert cpu(D.Categorical(logits=torch.zeros(4, device=DEV)).sample((n,))).bincount().min() > n / 4 * 0.9

    rates = torch.tensor([0.0, 0.5, 4.0, 60.0], device=DEV)
    p = cpu(torch.poisson(rates.expand(n, 4)))
    assert p.dtype == torch.float32 and torch.equal(p, p.round()) and p[:, 0].max() == 0 and p.min() >= 0
    assert torch.allclose(p.mean(0), cpu(rates), rtol=0.05, atol=0.02)
    count, prob = torch.tensor([0.0, 10.0, 100.0], device=DEV), torch.tensor([0.5, 0.3, 0.9], device=DEV)
    b = cpu(torch.binomial(count.expand(n, 3), prob.expand(n, 3)))
    assert (b <= cpu(count)).all() and b.min() >= 0 and torch.equal(b, b.round())
    assert torch.allclose(b.mean(0), cpu(count * prob), rtol=0.03, atol=0.02)
    gamma = cpu(D.Gamma(torch.tensor([0.5, 3.0], device=DEV), torch.tensor([1.0, 2.0], device=DEV)).sample((n,)))
    assert torch.allclose(gamma.mean(0), torch.tensor([0.5, 1.5]), rtol=0.05) and gamma.min() > 0
    alpha = torch.tensor([0.5, 1.0, 2.5], device=DEV)
    d = cpu(D.Dirichlet(alpha).sample((n,)))
    assert torch.allclose(d.sum(-1), torch.ones(n), atol=1e-5)
    assert torch.allclose(d.mean(0), cpu(alpha / alpha.sum()), atol=0.01)
    beta = cpu(D.Beta(torch.tensor([2.0], device=DEV), torch.tensor([6.0], device=DEV)).sample((n,)))
    assert abs(beta.mean().item() - 0.25) < 0.01

    # Gamma.rsample's backward: d sample / d alpha, as CPU computes it for the same sample
    a, x = torch.tensor([0.3, 1.0, 7.5]), torch.tensor([0.1, 1.2, 6.0])
    assert torch.allclose(cpu(torch._standard_gamma_grad(a.to(DEV), x.to(DEV))), torch._standard_gamma_grad(a, x),
                          rtol=1e-4)
    conc = torch.tensor([0.5, 2.0], device=DEV, requires_grad=True)
    D.Gamma(conc, 1.0).rsample((4,)).sum().backward()
    assert conc.grad is not None and torch.isfinite(cpu(conc.grad)).all()

    for rate in (-1.0, float("nan")):  # CPU's check refuses a NaN rate too
        with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
            cpu(torch.poisson(torch.tensor([1.0, rate], device=DEV)))
    # CPU's samplers at their edges: a negative count has no successes; a
    # gamma draw is never below the smallest normal float (alpha <= 0 too)
    assert cpu(torch.binomial(torch.tensor([-1.0, 0.0], device=DEV), torch.tensor([0.5, 0.5], device=DEV))).tolist() \
        == [0.0, 0.0]
    tiny = torch.finfo(torch.float32).tiny
    assert cpu(torch._standard_gamma(torch.tensor([-1.0, 0.0], device=DEV))).tolist() == [tiny, tiny]


def test_bernoulli_with_a_number_p_draws_whatever_self_holds():
    """``x.bernoulli_(0.5)`` (p is torch's default, left out of the call's
    arguments) and ``torch.bernoulli(x, p)`` draw whatever x holds: its values
    are not probabilities.  The value check took them for p and raised
    "Expected p_in >= 0 && p_in <= 1" for tensors of 16 elements and more
    (smaller ones are drawn into a fresh bucket); found by
    tests/fuzz_programs.py.  A tensor of probabilities is still checked."""
    import pjrt_host

    for shape in ((16,), (2, 2, 4), (4,)):
        x = torch.full(shape, 3.0, device="jax")
        x.bernoulli_(0.5)
        y = torch.full(shape, -2.0, device="jax").bernoulli_()
        z = torch.bernoulli(torch.full(shape, 7.0, device="jax"), 0.25)
        torch.jax.synchronize()
        for t in (x, y, z):
            assert set(t.cpu().unique().tolist()) <= {0.0, 1.0}
    with pjrt_host.config(checks="sync"), pytest.raises(RuntimeError, match="p_in >= 0"):
        torch.bernoulli(torch.full((16,), 3.0, device="jax"))
