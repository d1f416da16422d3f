"""What compiles when on the device: scalars that change, new shapes of small
random tensors, lowerings that branch on a scalar, the traced-scalar trial,
and which in-place writes donate their arrays."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)
from pjrt_host._torch import _fused  # noqa: E402

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


def test_changing_scalars_do_not_recompile_forever():
    """An optimizer passes a new step size every step: after a few values the
    op traces its scalars instead of compiling once per value (counted as
    XLA compilations, through jax's public monitoring events)."""
    import jax

    compiles = []

    def listener(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        x = torch.rand(8, device=DEV)
        y = torch.rand(8, device=DEV) + 1
        late = 0
        for i in range(12):
            if i == 8:
                late = len(compiles)
            out = torch.addcdiv(x, x, y, value=0.1 * (i + 1))
            z = x / (1.0 + i)
            torch.testing.assert_close(out.cpu(), torch.addcdiv(x.cpu(), x.cpu(), y.cpu(), value=0.1 * (i + 1)))
            torch.testing.assert_close(z.cpu(), x.cpu() / (1.0 + i))
        assert compiles, "the listener saw no compilation at all: the event name changed"
        assert len(compiles) == late, f"{len(compiles) - late} compilations in the last 4 steps"
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_a_scalar_is_traced_when_it_changes_at_one_place_not_when_constants_differ():
    """A scalar becomes a run-time value when it takes a second value at the
    same line (as a dimension becomes dynamic at its second size); constants
    that differ between lines (``pow(x, 3.0)`` in an activation, ``pow(x,
    2.0)`` in its backward) or come with new shapes stay compiled in, so a
    fused segment around them keeps its program (a trial ends a segment)."""
    from pjrt_host._torch import _dispatch

    op = torch.ops.aten.pow.Tensor_Scalar
    x = torch.rand(5, 3, device=DEV) + 0.5
    _dispatch._handlers.pop(op, None)  # a fresh engine op: what earlier tests taught it is not counted
    for n in range(2, 6):  # one constant per shape: compiled in
        torch.testing.assert_close(cpu(torch.rand(n, device=DEV) ** 3.0).shape, torch.Size([n]))
    a = torch.pow(x, 3.0)
    b = torch.pow(x, 2.0)  # another line, another constant
    compiled = _dispatch._handlers[op].__self__
    assert compiled.dynamic is None, "constants of different lines or shapes made the op trace its scalar"
    for e in (1.5, 2.5, 3.5):
        c = torch.pow(x, e)  # one line, a scalar that changes: traced from its second value on
        torch.testing.assert_close(cpu(c), cpu(x) ** e)
    assert compiled.dynamic is True
    torch.testing.assert_close(cpu(a), cpu(x) ** 3.0)
    torch.testing.assert_close(cpu(b), cpu(x) ** 2.0)


def test_small_random_tensors_of_new_shapes_do_not_compile_each_shape():
    """rand / randn / randint of at most 64k elements draw in power-of-two
    buckets: shapes of one bucket compile the random program once (XLA:CPU
    takes ~0.4 s per random program; cutting the draw to its shape compiles
    per shape, cheaply), and the draws stay reproducible.  Programs are
    counted by the torch op jax names them after, never by their seconds."""
    import jax

    compiles = []

    def listener(event: str, duration: float, fun_name: str = "", **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(fun_name)

    def random_programs(op: str) -> int:
        return sum(1 for name in compiles if name == f"jit(aten.{op})")

    torch.rand(7, 3, device=DEV)  # bucket 32, and the cut to (7, 3)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for shape in ((5, 5), (2, 13), (29,)):  # the same bucket of 32, new shapes
            torch.rand(*shape, device=DEV)
        assert random_programs("rand") == 0, f"the random program compiled again for new shapes: {compiles}"
        # in-place draws too, with new bounds per call, as nn.init gives each layer
        for n, bound in ((300, 0.5), (301, 0.25)):
            torch.empty(n, device=DEV).uniform_(-bound, bound)  # the trial of traced bounds happens here
        compiles.clear()
        for n, bound in ((302, 0.125), (333, 0.1), (400, 0.3)):
            w = torch.empty(n, device=DEV).uniform_(-bound, bound)
            assert float(w.abs().max()) <= bound
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert any(compiles), "the listener saw no compilation at all: the event changed"
    assert random_programs("uniform_") <= 1, f"3 draws of one bucket with new bounds compiled: {compiles}"
    torch.manual_seed(3)
    a = torch.randn(3, 4, device=DEV)
    torch.manual_seed(3)
    b = torch.randn(3, 4, device=DEV)
    torch.manual_seed(3)
    c = torch.randn(10, device=DEV)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu().reshape(-1)[:10], c.cpu())
    assert torch.randint(3, 9, (40,), device=DEV).cpu().min() >= 3 and a.shape == (3, 4)


def test_an_op_whose_lowering_branches_on_a_scalar_stays_compiled():
    """dropout's lowering branches on p: tracing p fails, and the op goes on
    compiling p as a constant (it once fell back to running op by op for the
    rest of the process).  The exact route's trial is the subject: a padded
    dropout (PJRT_HOST_DYNAMIC_SHAPES=all) never tries a random op's scalars
    traced, it compiles each p, and its op stays undecided."""
    from pjrt_host._torch import _dispatch

    x = torch.ones(64, device=DEV)
    with pjrt_host.config(dynamic_shapes=False):
        for p in (0.1, 0.2, 0.3, 0.0, 0.5, 1.0, 0.25):
            y = torch.nn.functional.dropout(x, p)
            kept = y.cpu()[y.cpu() != 0]
            assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p))) if p < 1 else not kept.numel()
    op = _dispatch._handlers[torch.ops.aten.native_dropout.default].__self__
    assert op.dynamic is False and op.eager is False


def test_in_place_writes_donate_only_arrays_nothing_else_holds():
    """An in-place op or a write through a view gives the storage's old
    buffer to the computation when nothing else holds its array (XLA then
    writes the result into that same buffer); a clone sharing the array, an
    array lent out, or the array passed twice, keep their values."""
    def buffer(t):
        return t._storage.array.unsafe_buffer_pointer()

    def program(t):
        t.add_(1)
        t[2:4].mul_(10)
        t[5:6].copy_(torch.tensor([-1.0], device=DEV))

    # op by op gives any array; fused eager's segments only those of
    # DONATE_MIN_BYTES or more (a small value's holders change from run to
    # run, and each change would compile the segment again)
    for mode, n in (("op", 8), ("fused", _fused.DONATE_MIN_BYTES // 4)):
        with pjrt_host.config(eager=mode):
            program(torch.arange(float(n), device=DEV))  # compiled (an op trying traced scalars runs twice, undonated)
            x = torch.arange(float(n), device=DEV)
            before = buffer(x)
            program(x)
            assert x.cpu().tolist()[:8] == [1.0, 2.0, 30.0, 40.0, 5.0, -1.0, 7.0, 8.0]
            assert buffer(x) == before, mode  # updated in place, three times
    y = torch.arange(8.0, device=DEV)
    kept = y._storage.array  # lent out: must survive
    z = y.clone()  # shares the array until one of the two is written
    y.add_(1)
    y[0:2].mul_(3)
    assert not kept.is_deleted() and kept.tolist() == list(range(8))
    assert z.cpu().tolist() == [float(i) for i in range(8)] and y.cpu().tolist()[:3] == [3.0, 6.0, 3.0]
    w = torch.ones(4, device=DEV)
    w.add_(w)  # the same array as input and target
    assert w.cpu().tolist() == [2.0] * 4


def test_the_traced_scalar_trial_compares_results_as_documented():
    """An op that traces its scalars keeps doing so only where the traced
    program's results equal the per-value program's: equal values, floats
    within 1e-6 relative, NaN where both have NaN; dtype or shape differences
    never pass (the comparison runs on the host, _scalar_trials._same)."""
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from pjrt_host._torch._scalar_trials import _same

    nan = float("nan")
    assert _same(jnp.array([1.0, nan, -0.0]), jnp.array([1.0, nan, 0.0]))
    assert _same(jnp.array([1.0]), jnp.array([1.0 + 1e-7]))
    assert not _same(jnp.array([1.0]), jnp.array([1.001]))
    assert not _same(jnp.array([nan]), jnp.array([1.0]))
    assert not _same(jnp.array([1.0, 2.0]), jnp.array([1.0]))
    assert not _same(jnp.array([1], jnp.int32), jnp.array([1.0]))
    assert _same(jnp.array([3, 4]), jnp.array([3, 4])) and not _same(jnp.array([3, 4]), jnp.array([3, 5]))
    half = np.array([1.5, 2.0], ml_dtypes.bfloat16)
    assert _same(jnp.asarray(half), jnp.asarray(half)) and not _same(jnp.asarray(half), jnp.asarray(half * 2))
    assert _same(jnp.array([1 + 2j]), jnp.array([1 + 2j])) and not _same(jnp.array([1 + 2j]), jnp.array([1 - 2j]))
    assert _same(jnp.array([True, False]), jnp.array([True, False]))


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_scalars_that_compare_equal_keep_their_own_programs(eager):
    """-0.0 equals 0.0 and a complex zero's parts may be -0.0: keyed by
    equality alone, ``x * -0.0`` ran the program of ``x * 0.0`` and gave
    +0 where CPU gives -0 (and ``torch.full((2,), -0.0)`` after
    ``torch.full((2,), 0.0)`` made +0s).  A NaN equals nothing, so every new
    NaN object compiled again; they share one program now."""
    from pjrt_host._torch import _dispatch

    x = torch.ones(4)
    d = x.to(DEV)
    with pjrt_host.config(eager=eager):
        for s in (0.0, -0.0, 0.0, complex(0.0, -0.0), complex(-0.0, 0.0), 0j):
            got, want = cpu(d * s), x * s
            assert torch.equal(got, want)
            # equal compares -0 with 0 as equal: the signs themselves
            assert torch.equal(torch.signbit(torch.view_as_real(got) if got.is_complex() else got),
                               torch.signbit(torch.view_as_real(want) if want.is_complex() else want)), s
        # factories (and where's scalars, which become factories' tensors)
        for s in (0.0, -0.0):
            for make in (lambda dev: torch.full((2,), s, device=dev), lambda dev: torch.scalar_tensor(s, device=dev),
                         lambda dev: torch.ones(2, device=dev).new_full((2,), s),
                         lambda dev: torch.where(torch.ones(2, device=dev) > 0, s, 1.0)):
                assert torch.equal(torch.signbit(cpu(make(DEV))), torch.signbit(make("cpu"))), s
        mul = _dispatch._handlers[torch.ops.aten.mul.Tensor].__self__
        before = mul.misses
        for _ in range(4):
            assert torch.isnan(cpu(d * float("nan"))).all()
        assert mul.misses - before <= 1
