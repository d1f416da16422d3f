"""Fused eager (``pjrt_host.config(eager="fused")``, ``PJRT_HOST_EAGER=fused``):
ops recorded into segments, each run as one program when a value is needed.

What it must keep: results equal to op-by-op eager (to rounding: XLA fuses a
segment's arithmetic), torch's errors at the op, the same random numbers for
a seed, threads apart; what it must give: fewer programs, and a repeated
segment reusing its program.  The last test runs a sample of the suite's
own files with fused eager as the default."""

from __future__ import annotations

import math
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402
from pjrt_host._torch import _config, _fused, _tensor  # noqa: E402
from pjrt_host._torch._signatures import DynamicScalar  # noqa: E402

from conftest import run_python  # noqa: E402

def fused():
    return pjrt_host.config(eager="fused")


def _step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _train(mode: str, steps: int = 4) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 5)).to("jax")
    # The per-parameter step (test_eager_modes trains with the default
    # foreach step in every mode).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    gen = torch.Generator().manual_seed(1)
    losses = []
    with pjrt_host.config(eager=mode):
        for _ in range(steps):
            x = torch.randn(8, 12, generator=gen).to("jax")
            y = torch.randint(0, 5, (8,), generator=gen).to("jax")
            losses.append(_step(model, opt, x, y))
        weights = [p.detach().cpu() for p in model.parameters()]
    return losses, weights


def test_training_equals_op_by_op_with_the_same_random_numbers():
    op_losses, op_weights = _train("op")
    before = _fused.stats()
    fused_losses, fused_weights = _train("fused")
    after = _fused.stats()
    assert after["ops"] - before["ops"] > 50, "nothing was fused"
    assert after["segments"] - before["segments"] < (after["ops"] - before["ops"]) / 3
    # dropout draws the same numbers: the segment takes its keys in op order
    torch.testing.assert_close(fused_losses, op_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(fused_weights, op_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_repeated_segment_reuses_its_program():
    x = torch.randn(16, 16, device="jax")

    def layer(v):
        return (v @ x).tanh() * 0.5 + v

    with fused():
        # warm: twice, so that an op whose scalars the engine tries traced
        # (a scalar that took another value at the same line, in an
        # earlier test of this process) has had its trial, which ends a
        # segment, and compiled the segments that follow it
        for _ in range(2):
            layer(layer(x)).sum().item()
        before = _fused.stats()
        for _ in range(5):
            layer(layer(x)).sum().item()
        after = _fused.stats()
    assert after["segments"] - before["segments"] == 5
    assert after["programs"] == before["programs"], "the same segment compiled again"


def test_an_op_of_ever_new_shapes_keeps_the_signatures_it_uses(monkeypatch):
    # a full op cache forgets its least used half, not every entry: the
    # shape used all along stays built (and fused eager's scripts, which
    # know ops by identity, keep matching it)
    from pjrt_host._torch import _dispatch, _engine

    monkeypatch.setattr(_engine, "CACHE_ENTRIES", 8)
    with pjrt_host.config(dynamic_shapes=False, eager="op"):
        hot = torch.ones(3, 5, device="jax")
        hot.neg()
        op = _dispatch._handlers[torch.ops.aten.neg.default].__self__
        for k in range(4, 24):  # 20 new shapes through a cache of 8
            torch.ones(k, 7, device="jax").neg()
            before = op.misses
            torch.testing.assert_close(hot.neg().cpu(), -torch.ones(3, 5))
            assert op.misses == before, f"the shape used all along was dropped after {k - 3} new ones"
        assert len(op.cache) <= 8


def test_the_recompile_log_says_why_a_segment_compiled_a_new_program(caplog):
    w = torch.randn(8, 8, device="jax")

    def block(x, scale):
        y = (x @ w).relu() * scale + 1
        return (y.sin() - y.cos()).sum(-1)

    def why(run) -> list[str]:
        caplog.clear()
        with caplog.at_level("INFO", logger="pjrt_host.recompiles"):
            run()
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("fused eager: ")]

    # per shape on purpose: with dynamic dimensions the rows changing below
    # would be padded to one bucket (test_dynamic_shapes)
    with fused(), pjrt_host.config(dynamic_shapes=False):
        # warm, over four shapes (an op whose scalar took another value
        # at the same line tries it traced, a trial that ends a segment:
        # it is behind us then)
        for rows in (1, 2, 3, 4, 4):
            block(torch.randn(rows, 8, device="jax"), 2.0).cpu()
        assert why(lambda: block(torch.randn(4, 8, device="jax"), 2.0).cpu()) == []
        [line] = why(lambda: block(torch.randn(6, 8, device="jax"), 2.0).cpu())
        assert "a segment of 8 ops compiles a new program" in line
        assert "op 0 (aten::mm): argument 0 float32[4, 8] -> float32[6, 8]" in line
        assert "input 0 float32[4, 8] -> float32[6, 8]" in line

        def keep_an_intermediate():
            x = torch.randn(6, 8, device="jax")
            y = (x @ w).relu() * 2.0 + 1  # held: one more result of the same ops
            (y.sin() - y.cos()).sum(-1).cpu()

        [line] = why(keep_an_intermediate)
        assert "other results are still held (1 -> 2 of them)" in line


def test_values_nobody_holds_are_never_outputs():
    x = torch.randn(4, 4, device="jax")
    with fused():
        # An op whose scalars the engine tries traced (after a few
        # signatures, in any earlier test) computes its inputs for the
        # trial, ending the segment there: one run first, so that any trial
        # is behind us and the counted run finds every op compiled.
        ((x * x).exp() * x).log().cpu()
        y = ((x * x).exp() * x).log()  # three intermediates, dead at once
        seg = y._storage._array.segment
        live = [ref() for ref, _ in seg.results if ref() is not None]
        assert len(seg.ops) == 4 and len(live) == 1
        torch.testing.assert_close(y.cpu(), ((x.cpu() * x.cpu()).exp() * x.cpu()).log(), equal_nan=True)


def test_dead_intermediates_never_take_memory_and_del_frees():
    x = torch.randn(256, 256, device="jax")
    nbytes = x.numel() * 4
    # bytes counted exactly: nothing padded (the oracle mode would pad x)
    with fused(), pjrt_host.config(dynamic_shapes=False):
        start = torch.jax.memory_allocated()
        y = ((x * 2).exp() + 1).log()  # three intermediates nobody holds
        assert torch.jax.memory_allocated() == start + nbytes  # the segment ran: y, and only y, is a buffer
        del y
        assert torch.jax.memory_allocated() == start  # del frees, as op by op
        z = x * 3
        del z  # never computed: its segment has nothing to return
        assert torch.jax.memory_allocated() == start


def test_in_place_writes_of_a_segment_reuse_their_buffers():
    """A segment is given the arrays only it holds (here the parameter's old
    value and the deleted gradient), so an optimizer-like update writes into
    the parameter's own buffer, as op by op's donated in-place ops do,
    instead of holding old and new values at once."""
    if not _tensor.DONATE:
        pytest.skip("PJRT_HOST_DONATE=0: nothing is donated")
    p = torch.randn(512, 512, device="jax")
    g = torch.randn(512, 512, device="jax")
    expected = p.cpu() * 0.9 - 0.1 * g.cpu()
    buffer = p._storage.array.unsafe_buffer_pointer()
    with fused():
        p.mul_(0.9).add_(g, alpha=-0.1)
        del g
        torch.jax.synchronize()
    assert p._storage.array.unsafe_buffer_pointer() == buffer
    torch.testing.assert_close(p.cpu(), expected)
    # a value something else still holds is read, never given up
    q = torch.randn(64, device="jax")
    alias = q[:]
    keep = q._storage.array
    with fused():
        q.add_(1)
        torch.jax.synchronize()
    assert not keep.is_deleted()
    torch.testing.assert_close(alias.cpu(), q.cpu())


def test_a_segment_run_from_outside_the_dispatcher_keeps_64_bit_types():
    x = torch.arange(4, device="jax")
    with fused():
        y = (x * 3).cumsum(0) + 2**40
        torch.jax.synchronize()  # runs the segment outside any op
    assert y._storage.array.dtype == "int64"
    assert y.tolist() == [2**40, 2**40 + 3, 2**40 + 9, 2**40 + 18]


def test_an_op_whose_lowering_disagrees_with_the_meta_shapes_runs_op_by_op():
    """native_batch_norm in eval: CPU (and the lowering) give empty saved
    statistics where torch's meta kernel gives full-size ones; the tensors
    report the shapes their values have, as op by op."""
    x = torch.randn(3, 2, 4)
    args = (torch.ones(2), torch.zeros(2), torch.zeros(2), torch.ones(2), False, 0.1, 1e-5)
    expected = torch.ops.aten.native_batch_norm(x, *args)
    with fused():
        out = torch.ops.aten.native_batch_norm(x.to("jax"), *[a.to("jax") if isinstance(a, torch.Tensor) else a
                                                              for a in args])
        for o, e in zip(out, expected):
            assert o.shape == e.shape
            torch.testing.assert_close(o.cpu(), e)


def test_torchs_errors_come_at_the_op():
    a, b = torch.ones(2, 3, device="jax"), torch.ones(4, 5, device="jax")
    with fused():
        c = a * 2
        with pytest.raises(RuntimeError, match="broadcast|must match the size"):
            c + b
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            torch.add(c, 1, out=torch.empty(2, 3, dtype=torch.long, device="jax"))
        assert c.sum().item() == 12


def test_in_place_writes_and_views_see_each_other():
    with fused():
        x = torch.zeros(3, 4, device="jax")
        x.add_(1)
        row = x[1]
        row.mul_(5)
        y = x.t() + 1
        x.add_(1)
        expected = torch.zeros(3, 4)
        expected.add_(1)
        expected[1].mul_(5)
        assert torch.equal(y.cpu(), expected.t() + 1)
        expected.add_(1)
        assert torch.equal(x.cpu(), expected)


def test_a_foreach_optimizer_step_stays_in_one_segment_and_equals_cpu():
    """A foreach in-place op runs as its functional op and writes each
    result back; the targets take the results still pending, so AdamW's
    whole foreach step is one segment (it was one program per foreach op,
    each write reading its result), with CPU's values and versions."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    dev.load_state_dict(cpu.state_dict())
    dev.to("jax")
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, foreach=True) for m in (cpu, dev)]
    x = torch.randn(5, 6)
    cpu_writes = None  # (CPU's step runs first)
    with fused():
        for _ in range(3):
            for m, opt, d in zip((cpu, dev), opts, ("cpu", "jax")):
                m(x.to(d)).square().sum().backward()
                torch.jax.synchronize()
                versions = [p._version for p in m.parameters()]
                before = _fused.stats()["segments"]
                opt.step()
                writes = [p._version - v for p, v in zip(m.parameters(), versions)]
                if d == "jax":
                    assert _fused.stats()["segments"] == before, "the step ran a segment before anything read it"
                    assert all(p._storage.pending for p in m.parameters())
                    assert writes == cpu_writes
                else:
                    cpu_writes = writes
                    assert all(writes)
                opt.zero_grad()
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    state = opts[1].state[next(dev.parameters())]
    torch.testing.assert_close(state["exp_avg_sq"].cpu(), opts[0].state[next(cpu.parameters())]["exp_avg_sq"])


def test_a_foreach_write_into_views_other_dtypes_and_held_results_stays_right():
    """Targets the pending hand-over does not take (a view, another dtype)
    are written through copy_, and a value read between the op and its
    segment's run, or after the target is written again, is the right one."""
    def run(d):
        base = torch.arange(8.0, device=d)
        half = torch.ones(4, dtype=torch.float16, device=d)
        plain = torch.zeros(4, device=d)
        torch._foreach_add_([base[2:6], half, plain], [torch.ones(4, device=d)] * 3)
        first = plain.clone()
        torch._foreach_mul_([plain], 3.0)
        plain.add_(1)
        return [base, half, first, plain]

    want = run("cpu")
    with fused():
        got = run("jax")
        torch.jax.synchronize()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w)


def test_a_clone_of_a_pending_result_stays_in_the_segment():
    """``clone()`` of a whole tensor shares its array; of a result still
    pending it shares the pending result, instead of running the segment
    (autograd clones each parameter's first gradient: a program each).
    Writes to either side, and the source's end, leave the other as it was."""
    with fused():
        x = torch.arange(6.0, device="jax")
        y = x * 2
        before = _fused.stats()["segments"]
        c = y.clone()
        kept = y.clone()
        if y._storage.padded is None:  # (every dim padded, PJRT_HOST_DYNAMIC_SHAPES=all: a padded copy)
            assert _fused.stats()["segments"] == before and c._storage.pending
        y.add_(1)
        c.mul_(10)
        z = y.clone()
        del y
        assert c.cpu().tolist() == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        assert z.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        assert kept.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        w = torch.ones(3, 2, device="jax", requires_grad=True)
        (w * 3).sum().backward()  # the gradient's first accumulation clones it
        assert w.grad.cpu().tolist() == [[3.0, 3.0]] * 3


def test_a_value_recorded_in_one_thread_is_read_in_another():
    out = {}
    x = torch.randn(8, device="jax")

    def work():
        with fused():
            out["y"] = (x * 3).sin()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["y"]._storage.pending
    torch.testing.assert_close(out["y"].cpu(), (x.cpu() * 3).sin())


def test_synchronize_runs_every_open_segment():
    with fused():
        y = torch.ones(3, device="jax") * 7
        assert y._storage.pending
        torch.jax.synchronize()
        assert not y._storage.pending


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="'op', 'fused'"):
        with pjrt_host.config(eager="lazy"):
            pass
    proc = run_python(["-c", "import torch; torch.ones(1, device='jax')"], env={"PJRT_HOST_EAGER": "lazy"})
    assert proc.returncode != 0 and "PJRT_HOST_EAGER='lazy'" in proc.stderr


def test_segments_line_up_with_a_repeated_block():
    """No value is read between the blocks, yet each block after the first
    ones is a segment of its own, all running one program."""
    w = torch.randn(16, 16, device="jax") / 4

    def block(v):
        for _ in range(3):  # a block with a shorter repeat inside
            v = (v @ w).tanh() * 0.5 + v
        return v

    def run():
        v = torch.randn(4, 16, device="jax")
        for _ in range(16):
            v = block(v)
        return v.sum().item()

    torch.jax.synchronize()  # an empty segment to start from: earlier work may have left ops pending
    with fused():
        run()  # compiles: a first segment until the repeat is seen, then one per block
        # Warm-up may take two runs: an op that met other signatures earlier
        # in the process (sum, in test_torch_training) tries tracing its
        # scalars at its next new one, runs that trial op by op and so ends
        # the segment there once; the runs after it are all alike.
        run()
        before = _fused.stats()
        run()
        after = _fused.stats()
    # 16 blocks of 12 ops, each three bodies of 4 ops (a small body): segments
    # of whole blocks, at least REPEAT_SEGMENT ops each
    assert after["segments"] - before["segments"] >= 3, "the blocks were not split into segments"
    assert after["programs"] == before["programs"], "the same loop compiled again"


def test_a_block_that_runs_one_op_twice_is_still_found():
    """A layer that ends with an op it also runs further up (a residual
    add after attention and after the MLP) repeats at the layer's length,
    not at the distance between its two adds.  With two layers the end of
    the second is the only op where the two line up, and the repeat was
    looked for only at the nearer add: the layers and what follows them
    ran as one segment, so a new head (a new length of the logits, a new
    stopping flag) compiled the layers again with it.  The segment where
    the repeat is found runs as one piece per layer, each the program of
    every later layer (Segment._run_pieces)."""
    w = torch.randn(16, 16, device="jax") / 4

    def layer(v):
        a = ((v @ w).tanh() * 0.5).sin().exp().cos()
        v = v + a
        b = v.sigmoid().abs().neg().erf().atan().square().log1p().sinh().cosh().rsqrt().reciprocal()
        return v + b  # the same add as above, 12 ops later

    def run(depth, head=lambda v: v.sum()):
        v = torch.randn(4, 16, device="jax")
        for _ in range(depth):
            v = layer(v)
        return head(v).item()

    torch.jax.synchronize()
    with fused():
        for _ in range(2):  # warm-up (see test_segments_line_up_with_a_repeated_block)
            run(2)
        before = _fused.stats()
        run(2)
        after = _fused.stats()
        # each layer a segment, the head one: the layers and the head ran as one
        assert after["segments"] - before["segments"] == 3, after["segments"] - before["segments"]
        run(2, lambda v: (v * 3).amax())  # a new head: a program of its own ops only
        other = _fused.stats()
        run(5)  # a deeper stack runs the two layers' program for each
        deeper = _fused.stats()
    assert other["segments"] - after["segments"] == 3 and deeper["segments"] - other["segments"] == 6
    if _config.current().dynamic_shapes != "all":
        # (with every dim padded, item() reads through the host and the
        # layers' segments hold other results: a program more or two)
        assert after["programs"] == before["programs"]
        assert other["programs"] - after["programs"] == 1, "a new head compiled the layers again"
        assert deeper["programs"] == other["programs"], "a deeper stack compiled its layers again"


def test_two_stopping_flags_of_equal_or_unequal_values_run_one_program():
    """generate()'s stopping criteria make two bool flags a step with
    ``torch.full``, equal until the last token.  Each takes a slot of its
    own: sharing the one cached device flag while equal wired the last
    token's segment otherwise, and it compiled a program of its own."""
    x = torch.randn(4, device="jax")

    def step(last):
        done = torch.full((1,), False, dtype=torch.bool, device="jax")
        flag = torch.full((1,), last, dtype=torch.bool, device="jax")
        return bool(((done | flag) & (x.sum() > -1e9)).all().item())

    torch.jax.synchronize()
    with fused():
        for _ in range(2):  # warm-up: steps whose flags are equal (a bool flag is run-time from its first)
            assert step(False) is False
        before = _fused.stats()
        assert [step(last) for last in (True, False, True)] == [True, False, True]
        after = _fused.stats()
    assert after["programs"] == before["programs"], "a step whose flags differ compiled a program of its own"


def test_a_chain_of_small_ops_runs_in_segments_of_whole_blocks():
    """A loop body of two ops repeats every two ops: segments end at a
    whole number of bodies once they hold REPEAT_SEGMENT ops, not every
    REPEAT_MIN ops (a chain run a few ops at a time costs a program call
    per few ops), and not only at LIMIT.  A block of REPEAT_MIN ops or more
    with no shorter body (a layer) still ends a segment each time."""
    x = torch.randn(128, device="jax")

    def chain():
        v = x
        for _ in range(200):
            v = v * 1.0001 + 0.0001
        return v

    expected = x.cpu()
    for _ in range(200):
        expected = expected * 1.0001 + 0.0001
    torch.jax.synchronize()
    with fused():
        for _ in range(2):  # warm-up may take two runs (see the test above)
            first = chain()
            torch.jax.synchronize()
        before = _fused.stats()
        got = chain()
        torch.jax.synchronize()
        after = _fused.stats()
    segments = after["segments"] - before["segments"]
    assert 400 / _fused.LIMIT < segments <= 400 / _fused.REPEAT_SEGMENT + 2, segments
    assert after["programs"] == before["programs"], "the same chain compiled again"
    assert torch.equal(got.cpu(), first.cpu())
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)  # XLA may fuse x * a + b (FMA)

    # a body of 12 different ops (shapes differ, so each op is another program)
    ws = [torch.randn(4 + k % 3, 4 + (k + 1) % 3, device="jax") / 4 for k in range(3)]

    def layers():
        v = torch.randn(2, 4, device="jax")
        for _ in range(12):
            for w in ws:
                v = (v @ w).tanh() * 0.5 + 0.25
        return v

    with fused(), pjrt_host.config(dynamic_shapes=False):  # (padded to one bucket, they would be one program)
        for _ in range(2):
            layers().cpu()
        before = _fused.stats()
        layers().cpu()
        after = _fused.stats()
    assert after["segments"] - before["segments"] >= 8, "a block of distinct ops did not end its segment"
    assert after["programs"] == before["programs"]


def test_the_steps_after_the_first_compile_next_to_nothing():
    """A step's constants (GPT-2's tanh GELU: ``0.5 * x``, ``pow(x, 3.0)``,
    ``0.044715 * ...`` in one line, and their backward's ``pow(x, 2.0)``)
    stay compiled in: none of them starts a trial of traced scalars
    halfway through the first step, so the second step's segments are the
    first's."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out, self.norm = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x):
            h = self.fc(self.norm(x))
            h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))
            return x + self.drop(self.out(h))

    model = torch.nn.Sequential(*[Block() for _ in range(3)]).to("jax")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, 16, device="jax")

    def compiled() -> int:
        stats = torch.jax.program_cache_stats()
        return stats["compiled"] + stats["disk_hits"] + _fused.stats()["programs"]

    def step() -> int:
        """The programs the step's forward and backward compiled (the
        optimizer's first step makes its state, its second donates it: it
        compiles in both)."""
        before = compiled()
        loss = model(x).square().mean()
        loss.backward()
        torch.jax.synchronize()
        made = compiled() - before
        opt.step()
        opt.zero_grad()
        torch.jax.synchronize()  # the optimizer's segment too, within its step
        return made

    with fused():
        first, second, third = step(), step(), step()
    # (before, the second step's forward and backward compiled 10 programs:
    # trials turned pow and mul traced halfway through the first; what is
    # left is a segment that donates less in the second step, because a
    # segment still pending holds one of its inputs.  With every dim padded
    # (the oracle mode), mul meets its fourth signature -- the trial of its
    # scalars -- in the second step: the segments around it compile again)
    oracle = _config.current().dynamic_shapes == "all"
    assert first > 0 and second <= (8 if oracle else 2) and third == 0, (first, second, third)


def test_a_segment_does_not_depend_on_the_values_of_its_python_scalars():
    """A random draw's counter, a view's offset and the like go into a
    segment as Python scalars.  Each takes its own input: shared by
    identity (CPython shares the ints -5..256), the segment's ops read
    one input where the counter had reached the offset's value, and a
    GPT-2 training step compiled three new programs at its 9th and 18th
    steps, where its draws' counter passed 128 and 256 (the offsets of
    the key and value in its fused attention projection)."""
    torch.manual_seed(0)
    x = torch.randn(6, 12, device="jax")

    def compiled() -> int:
        stats = torch.jax.program_cache_stats()
        return stats["compiled"] + stats["disk_hits"] + _fused.stats()["programs"]

    made = []
    with fused():
        for _ in range(10):  # the draw's counter goes 1, 2, 3, ... past the view's offset of 5
            before = compiled()
            y = torch.nn.functional.dropout(x[:, 5:] * 2.0, 0.5) + 1.0
            y.sum().item()
            made.append(compiled() - before)
    # (the second call may still compile: the first learns which ops fuse)
    assert made[0] > 0 and made[2:] == [0] * 8, made


def _replay_counts(run) -> tuple[int, int, int]:
    before = _fused.stats()
    run()
    after = _fused.stats()
    return tuple(after[k] - before[k] for k in ("segments", "replayed", "programs"))


def test_a_loop_replays_its_segments_and_gives_op_by_ops_values():
    """After a loop's segments have run once, each later one is matched op
    by op against its script (``stats()["replayed"]``: a segment all of
    whose ops matched, ending where the script ended, found its program
    without a key), with op by op's values.  Two threads replaying at once
    keep their own scripts."""
    w = torch.randn(16, 16, device="jax") / 4
    x = torch.randn(4, 16, device="jax")

    def layer(v, k):
        return (v @ w).tanh() * 0.5 + v * k

    def run():
        v = x
        for k in range(24):  # another scalar per layer: the same line, so traced after the first
            v = layer(v, 1.0 + k / 24)
        return v.sum(1).cpu()

    with pjrt_host.config(eager="op"):
        expected = run()
    torch.jax.synchronize()
    with fused():
        for _ in range(3):  # warm: the scripts and what follows each are known after this
            run()
        segments, replayed, programs = _replay_counts(run)
        got = run()
    assert segments >= 1 and replayed == segments, (segments, replayed)
    assert programs == 0
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)

    results, errors = {}, []

    def work(name):
        try:
            with fused():
                for _ in range(3):
                    results[name] = run()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got in results.values():
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_replay_lane_takes_only_the_call_it_recorded(monkeypatch):
    """In a replayed segment, a call that is the one recorded at its place
    skips the engine (``stats()["lane"]``: no key is built, no cache
    looked up).  A call that differs from it in anything the engine keys
    or wires -- an input that is a view, the same tensor at two places that
    were two tensors, inputs swapped, another dtype, a scalar of another
    sign, a CPU scalar tensor -- takes the engine's way, with op by op's
    values, and the loop replays again after it.  Another tensor of the
    same shape wherever the recording had one is the same call: it
    replays, reading the new tensor's values.  matmul's ``_unsafe_view`` (a
    wrapper that acts only on padded inputs) replays as its engine op.
    (The suite checks every replayed call against the engine's key:
    PJRT_HOST_CHECK_REPLAY.)"""
    w1 = torch.randn(8, 8, device="jax") / 3
    w2 = torch.randn(8, 8, device="jax") / 3
    b1 = torch.randn(8, device="jax")
    b2 = torch.randn(8, device="jax")
    x = torch.randn(2, 4, 8, device="jax")  # (a batch: matmul's result is an _unsafe_view of its mm)

    def run(change=None):
        v = x
        for i in range(6):
            a, c, bias, s = w1, w2, b1, 0.5
            here = i == 3
            if here and change == "view":
                a = w1.t()
            if here and change == "aliased":
                c = w1
            if change == "other bias":  # in every layer: the same wiring
                bias = b2
            if here and change == "negative zero":
                s = -0.0
            if here and change == "cpu scalar":
                s = torch.tensor(0.5)
            u = (v @ c) - (v @ a) if here and change == "swapped" else (v @ a) - (v @ c)
            if here and change == "dtype":
                u = u.double()
            v = ((u.tanh() + bias) * s + v).float()
        return v.sum(-1).cpu()

    # (the suite's sample run with every dim padded pads every call: the lane
    # replays exact calls only, and there the values are what is checked)
    exact = _config.current().dynamic_shapes != "all"
    changes = [None, "view", "aliased", "other bias", "negative zero", "cpu scalar", "swapped", "dtype"]
    with pjrt_host.config(eager="op"):
        expected = {change: run(change) for change in changes}
    torch.jax.synchronize()
    keys = []
    with fused():
        for _ in range(3):
            run()
        real_record = _fused.record
        monkeypatch.setattr(_fused, "record", lambda op, *a, **k: keys.append(op.name) or real_record(op, *a, **k))
        before = _fused.stats()["lane"]
        torch.testing.assert_close(run(), expected[None], rtol=1e-5, atol=1e-6)
        assert not exact or _fused.stats()["lane"] - before >= 6 * 6, "the replayed calls took the engine's way"
        assert not exact or not keys, keys  # (what the engine records: nothing; the read is no op recorded)
        for change in changes[1:]:
            torch.testing.assert_close(run(change), expected[change], rtol=1e-5, atol=1e-6, msg=change)
            # (the segment after the other one is new: the run after it replays)
            torch.testing.assert_close(run(), expected[None], rtol=1e-5, atol=1e-6, msg=change)
            before = _fused.stats()["lane"]
            torch.testing.assert_close(run(), expected[None], rtol=1e-5, atol=1e-6, msg=change)
            assert not exact or _fused.stats()["lane"] - before >= 6 * 6, change
        keys.clear()
        before = _fused.stats()["lane"]
        torch.testing.assert_close(run("other bias"), expected["other bias"], rtol=1e-5, atol=1e-6)
        assert not exact or _fused.stats()["lane"] - before >= 6 * 6
        assert not exact or not [k for k in keys if "add" in k], keys


def test_the_replay_lane_takes_an_exact_cat(monkeypatch):
    """An exact cat recorded in a script (rotary embeddings' halves, twice
    a layer at every token of a Llama's ``generate()``) replays on the lane
    like any engine op: cat's handler, which looks for a growing tensor
    first (``_dynamic_dims.grows``), is not reached.  Its parts in another
    order are another call, with op by op's values."""
    from pjrt_host._torch import _dynamic_dims

    x = torch.randn(2, 4, 8, device="jax")

    def run(swapped=False):
        v = x
        for i in range(6):
            h1, h2 = v[..., :4], v[..., 4:]
            parts = [-h1, h2] if swapped and i == 3 else [h2, -h1]
            v = torch.cat(parts, dim=-1) * 0.5 + v
        return v.cpu()

    exact = _config.current().dynamic_shapes != "all"
    with pjrt_host.config(eager="op"):
        expected = run(), run(True)
    looked = []
    real_grows = _dynamic_dims.grows
    monkeypatch.setattr(_dynamic_dims, "grows", lambda *a: looked.append(1) or real_grows(*a))
    with fused():
        for _ in range(3):
            run()
        looked.clear()
        before = _fused.stats()["lane"]
        torch.testing.assert_close(run(), expected[0])
        assert not exact or _fused.stats()["lane"] - before >= 6 * 4, "the replayed calls took the engine's way"
        assert not exact or not looked, "a replayed cat took its handler"
        torch.testing.assert_close(run(True), expected[1])
        torch.testing.assert_close(run(), expected[0])


def test_the_replay_lane_takes_a_contiguous_copy_of_a_view():
    """``.contiguous()`` of a transposed or permuted view (an attention's
    heads, five times a ViT layer and step) is recorded as a read of the
    view; in a replayed script it takes the lane, with op by op's values.
    A copy of another layout there (another permutation, a cast, a copy
    in another memory format, a view with an offset that moved) takes the
    clone's own way and is right too."""
    x = torch.randn(2, 3, 4, 5, device="jax")

    def run(other=None):
        v = x
        for i in range(6):
            if other == "perm" and i == 3:
                c = v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3).contiguous()
            elif other == "format" and i == 3:
                c = v.clone(memory_format=torch.channels_last)
            elif other == "offset" and i == 3:
                c = torch.cat([v[:, :, 1:], v[:, :, :1]], dim=2).transpose(1, 2).contiguous().transpose(1, 2)
            else:
                c = v.transpose(1, 2).contiguous().transpose(1, 2)
            v = c * 0.5 + v
        return v.cpu()

    exact = _config.current().dynamic_shapes != "all"
    with pjrt_host.config(eager="op"):
        expected = {other: run(other) for other in (None, "perm", "format", "offset")}
    with fused():
        for _ in range(3):
            run()
        before = _fused.stats()
        torch.testing.assert_close(run(), expected[None])
        after = _fused.stats()
        ops, lane = after["ops"] - before["ops"], after["lane"] - before["lane"]
        assert not exact or lane == ops, f"{ops - lane} of {ops} calls took the engine's way"
        for other in ("perm", "format", "offset", None):
            torch.testing.assert_close(run(other), expected[other], msg=other)


def test_a_lane_that_took_another_call_would_fail_the_suite(monkeypatch):
    """The suite's net under the replay lane (PJRT_HOST_CHECK_REPLAY=1, set
    by conftest): a lane that took a call the engine keys otherwise (here
    its argument check is made to take anything) raises at that call."""
    assert _fused.CHECK
    if _config.current().dynamic_shapes == "all":
        # (the padded lane's net: test_dynamic_shapes.py::test_a_padded_lane_that_gave_other_shapes_would_fail_the_suite)
        pytest.skip("every call is padded in this run: this net is the exact lane's")
    x = torch.randn(16, device="jax")

    def run(scale):
        v = x
        for i in range(12):
            v = v * (scale if i == 6 else 1.5) + 1.0
        return v.cpu()

    with fused():
        for _ in range(3):
            run(1.5)
        before = _fused.stats()["lane"]
        run(1.5)
        assert _fused.stats()["lane"] - before == 24

        def anything(v, k, dyn, place):  # the values encoding gives, whatever the key
            if isinstance(v, _tensor.JaxTensor):
                dyn.append(v._storage._array)
            elif type(k) is DynamicScalar:  # (mul's scalars may be traced: earlier tests change them)
                dyn.append(v)
            return True

        monkeypatch.setattr(_fused, "matches", anything)
        with pytest.raises(AssertionError, match="replay lane took a call of aten::mul"):
            run(2)  # (an int: keyed apart from 1.5 whether mul's scalars are compiled in or traced)
    monkeypatch.undo()
    torch.jax.synchronize()


def test_a_segment_whose_results_all_died_is_still_replayed_after():
    """A segment that ends with none of its results held still runs its
    ops (as every queued op runs on torch's other devices), and it is what
    the next segment follows: both replay their scripts (the ops after it
    recorded afresh every time, and a loop of ops whose results die never
    replayed at all)."""
    x = torch.randn(128, device="jax")

    def run():
        for _ in range(30):
            x * 1.0001
        torch.jax.synchronize()  # ends a segment that holds no result: it runs all the same
        return (x.tanh() + 1).cpu()

    with pjrt_host.config(eager="op"):
        expected = run()
    torch.jax.synchronize()
    with fused():
        for _ in range(3):
            run()
        segments, replayed, programs = _replay_counts(run)
        got = run()
    assert (segments, replayed, programs) == (2, 2, 0)
    torch.testing.assert_close(got, expected)


def test_ops_whose_results_nobody_reads_run_before_synchronize_returns():
    """A timing loop as torch users write it for any device (``a @ b``
    dropped, then a synchronize) measures the work: each op whose results
    nothing holds and no later op reads is still computed, in a segment
    that ends at the synchronize and in one that ends itself where the loop
    repeats.  The fused count of programs run equals the ops queued, and a
    dropped result's program is the one for its held form (no new
    program when the result is kept the next time)."""
    from pjrt_host._torch import _fused

    a = torch.randn(64, 64, device="jax")
    b = torch.randn(64, 64, device="jax")
    with fused():
        for _ in range(2):
            a @ b
            torch.jax.synchronize()
        computed = []
        original = _fused.Segment._run

        def spy(self, script, replayed, ext, live, donated):
            computed.append(len(live))
            return original(self, script, replayed, ext, live, donated)

        _fused.Segment._run = spy
        try:
            a @ b
            torch.jax.synchronize()
            assert computed == [1]  # the dropped product is computed
            computed.clear()
            for _ in range(40):
                a @ b
            torch.jax.synchronize()
            assert sum(computed) == 40, computed  # each matmul of the loop, in the segments its repeats make
            before = _fused.stats()["programs"]
            kept = a @ b
            torch.jax.synchronize()
            assert _fused.stats()["programs"] == before  # the held product: the dropped one's program
        finally:
            _fused.Segment._run = original
    torch.testing.assert_close(kept.cpu(), a.cpu() @ b.cpu())


def test_a_replay_that_stops_matching_records_the_rest_and_a_read_ends_only_its_own_script():
    """A segment whose ops stop matching its script (another op, other
    inputs) is recorded from there on as new, with the right values, and the
    loop replays again afterwards.  A script that a read ended is not a
    place to cut when the read does not come: the segment goes on."""
    w = torch.randn(8, 8, device="jax") / 3
    x = torch.randn(2, 8, device="jax")

    def run(act):
        v = x
        for i in range(6):
            v = (v @ w) * 0.5 + v
            v = act(v) if i == 3 else v.tanh()
        return v.sum(1).cpu()

    with pjrt_host.config(eager="op"):
        expected = {f: run(f) for f in (torch.tanh, torch.sigmoid)}
    torch.jax.synchronize()
    with fused():
        for _ in range(3):
            run(torch.tanh)
        segments, replayed, _ = _replay_counts(lambda: run(torch.tanh))
        assert replayed == segments
        got = run(torch.sigmoid)  # the fourth layer differs from the script
        torch.testing.assert_close(got, expected[torch.sigmoid], rtol=1e-5, atol=1e-6)
        for _ in range(2):
            got = run(torch.tanh)
        torch.testing.assert_close(got, expected[torch.tanh], rtol=1e-5, atol=1e-6)
        segments, replayed, programs = _replay_counts(lambda: run(torch.tanh))
        assert replayed == segments and programs == 0

        def first_half():
            v = x
            for _ in range(2):
                v = (v @ w).relu() + v
            return v

        for _ in range(3):
            first_half().cpu()  # a segment the read ends
        segments, replayed, _ = _replay_counts(lambda: first_half().cpu())
        assert (segments, replayed) == (1, 1)
        # the same ops, then more before the read: one segment, not a cut where the read was
        segments, _, _ = _replay_counts(lambda: (first_half() * 3).sum().cpu())
        assert segments == 1, segments


def test_a_segment_that_fails_names_its_failure_to_every_later_reader():
    """A segment whose program fails raises the failure where it is read,
    and every later read of its results says why they do not exist (not an
    unrelated error on an uncomputed value). The failure here: an input's
    jax array deleted through interop after the op was recorded."""
    x = torch.arange(4.0, device="jax")
    torch.jax.synchronize()  # (a factory is recorded too: x computed before the segment that reads it)
    # unpadded: jax_view of a padded x would cut it to a new array, and the
    # segment would read the padded one, which stays
    with fused(), pjrt_host.config(dynamic_shapes=False):
        y = x * 2  # recorded: its segment reads x's array
        z = y + 1
        pjrt_host.interop.jax_view(x).delete()
        with pytest.raises(RuntimeError, match="deleted") as first:
            y.cpu()
        with pytest.raises(RuntimeError, match="fused eager segment of 2 ops that failed earlier") as later:
            z.cpu()
    assert later.value.__cause__ is first.value
    assert (torch.arange(3, device="jax") + 1).tolist() == [1, 2, 3]  # the device goes on


def test_a_segment_compiling_in_the_background_runs_op_by_op_until_its_program_is_ready(monkeypatch):
    # PJRT_HOST_FUSED_COMPILE=background: a new segment's program compiles on
    # a thread; meanwhile the segment runs through each op's own program,
    # with the same values, and once the program is ready it is the one run
    monkeypatch.setenv("PJRT_HOST_FUSED_COMPILE", "background")
    w = torch.randn(8, 8, device="jax")
    b = torch.randn(8, device="jax")

    def block(x):
        y = torch.tanh(x @ w + b) * 0.5
        return (y.exp() - y.sin()).sum(-1)  # 6 ops: one segment per call

    x = torch.randn(5, 8)
    with fused(), pjrt_host.config(dynamic_shapes=False):
        before = _fused.stats()
        first = block(x.to("jax")).cpu()
        during = _fused.stats()
        assert during["op_by_op"] == before["op_by_op"] + 1, (before, during)
        for future in list(_fused._pending):
            future.result(timeout=120)
        again = block(x.to("jax")).cpu()
        after = _fused.stats()
    assert after["op_by_op"] == during["op_by_op"], "the ready program was not used"
    assert after["programs"] == during["programs"]
    want = block(x.to("jax")).cpu()  # op by op
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(again, want)


def test_a_process_exits_cleanly_with_compiles_in_the_background():
    code = ("import torch, pjrt_host\n"
            "x = torch.randn(64, 64, device='jax')\n"
            "with pjrt_host.config(eager='fused'):\n"
            "    for k in range(6):\n"
            "        y = ((x @ x).tanh() * (k + 2)).softmax(-1)[:, :k + 3].sum()\n"
            "        print(round(float(y), 3))\n")
    proc = run_python(["-c", code], env={"PJRT_HOST_FUSED_COMPILE": "background"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.split()) == 6
    bad = run_python(["-c", "import torch, pjrt_host; x = torch.ones(2, device='jax')\n"
                      "with pjrt_host.config(eager='fused'): (x + 1).cpu()"],
                     env={"PJRT_HOST_FUSED_COMPILE": "later"})
    assert bad.returncode != 0 and "PJRT_HOST_FUSED_COMPILE='later'" in bad.stderr, bad.stderr[-2000:]


def test_the_recompile_log_names_a_join_whose_parts_changed(caplog):
    """A recorded join's key is not an engine key: the log, asked why a
    segment holding one compiled, says what changed instead of raising
    from inside the segment's run (it did, with the log at INFO, in GPT-2's
    generate())."""
    torch.manual_seed(0)
    rows = [torch.randn(2, 1, 4) for _ in range(40)]
    expected = cache = torch.randn(2, 3, 4)
    for r in rows:
        expected = torch.cat([expected, r + 1], dim=1)
    cache = cache.to("jax")
    with fused(), pjrt_host.config(dynamic_shapes=True), caplog.at_level("INFO", logger="pjrt_host.recompiles"):
        for r in rows:  # through the buckets of 16, 32 and 48 rows
            cache = torch.cat([cache, r.to("jax") + 1], dim=1)  # a pending part: the join is recorded
            (cache * 2).sum().item()
    torch.testing.assert_close(cache.cpu(), expected)
    lines = [r.getMessage() for r in caplog.records if "pjrt_host.join" in r.getMessage()]
    assert lines and all("->" in line for line in lines), lines


def test_a_factory_is_recorded_into_the_segment_that_reads_it():
    """A factory that draws nothing is an op without inputs in the segment:
    a mask's ones, the position ids' arange and a fill value are made inside
    the program of the ops that read them, with no program of their own."""
    from pjrt_host._torch import _factories

    with fused(), pjrt_host.config(dynamic_shapes=False):  # (the oracle's padding reads some values first)
        before, programs = _fused.stats()["ops"], set(_factories._compiled)
        mask = torch.ones(5, 7, device="jax", dtype=torch.bool).tril()
        pos = torch.arange(2, 9, device="jax")
        out = torch.where(mask, pos * 1.5, torch.full((), -1.0, device="jax"))
        assert mask._storage.pending and pos._storage.pending
        recorded = _fused.stats()["ops"] - before
        got = out.cpu()
    want = torch.where(torch.ones(5, 7, dtype=torch.bool).tril(), torch.arange(2, 9) * 1.5, torch.full((), -1.0))
    torch.testing.assert_close(got, want)
    assert recorded == 6, recorded  # ones, tril, arange, mul, full, where
    assert set(_factories._compiled) == programs, "a factory ran a program of its own"


def test_a_factory_of_a_changing_length_is_recorded_padded():
    # position ids of a new length at the same line: from the third length
    # on, made in the bucket of the length (padded) inside the segment
    with fused(), pjrt_host.config(dynamic_shapes=True):
        for n in (20, 23, 27, 29, 21):
            pos = torch.arange(n, device="jax")
            total = (pos * 2).sum()
            if n in (29, 21):
                assert pos._storage.pending and pos._storage.padded is not None
            assert total.item() == n * (n - 1)


def test_a_copy_of_a_view_is_recorded_into_the_segment():
    """clone() of a view and _to_copy (a cast, or a copy of a view) read
    their storage through the view inside the segment: the copies are
    pending, made by no read program of their own, with CPU's values."""
    from pjrt_host import _program_cache

    base = torch.randn(6, 5)
    ints = torch.randint(-9, 9, (4, 6))
    calls = []
    original = _program_cache.Kept.__call__
    try:
        _program_cache.Kept.__call__ = lambda self, *a: (calls.append(self.name), original(self, *a))[1]
        with fused(), pjrt_host.config(dynamic_shapes=False):  # (the oracle's padding reads some values first)
            x = base.to("jax") * 2
            i = ints.to("jax")
            copies = [x.t().contiguous(), x[1:4, ::2].clone(), x[:, -1].to(torch.float64, copy=True),
                      i[:, 1:4].to(torch.float32), i.to(torch.bfloat16), x.t()[2].clone()]
            assert all(c._storage.pending for c in copies)
            got = [c.cpu() for c in copies]
    finally:
        _program_cache.Kept.__call__ = original
    want = [(base * 2).t().contiguous(), (base * 2)[1:4, ::2].clone(), (base * 2)[:, -1].to(torch.float64),
            ints[:, 1:4].to(torch.float32), ints.to(torch.bfloat16), (base * 2).t()[2].clone()]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w)
    assert "pjrt_host.read" not in calls and "pjrt_host.cast" not in calls, calls


def test_a_copy_of_a_view_of_a_padded_storage_is_recorded_padded():
    # generate()'s input_ids[..., -n:].clone() over ids grown in their bucket
    torch.manual_seed(0)
    rows = [torch.randint(0, 50, (2, 1)) for _ in range(24)]
    expected = ids = torch.randint(0, 50, (2, 3))
    ids = ids.to("jax")
    with fused(), pjrt_host.config(dynamic_shapes=True):
        for step, r in enumerate(rows):
            ids = torch.cat([ids, r.to("jax")], dim=1)
            expected = torch.cat([expected, r], dim=1)
            tail = ids[:, -5:].clone()
            whole = ids.to(torch.float32)
            if step > 8:
                assert ids._storage.padded is not None and tail._storage.pending
            torch.testing.assert_close(tail.cpu(), expected[:, -5:])
            torch.testing.assert_close(whole.cpu(), expected.float())


def test_an_index_check_is_recorded_into_the_segment():
    """A deferred index check in fused eager is an op of the segment (the
    ids' min and max computed inside its program, read at the next
    synchronisation point): no program of its own, no early run of the
    segment that makes the ids, and a bad id still raises CPU's error."""
    from pjrt_host import _program_cache

    w = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 9], [0, 3, 3]])
    calls = []
    original = _program_cache.Kept.__call__
    try:
        _program_cache.Kept.__call__ = lambda self, *a: (calls.append(self.name), original(self, *a))[1]
        with fused(), pjrt_host.config(dynamic_shapes=False):
            wd = w.to("jax")
            made = ids.to("jax") * 1  # pending: its segment also computes the check
            out = torch.nn.functional.embedding(made, wd) * 2
            assert made._storage.pending and out._storage.pending
            got = out.cpu()
            assert not [c for c in calls if c.startswith("pjrt_host.minmax")], calls
            bad = torch.nn.functional.embedding(made + 5, wd)
            with pytest.raises(IndexError, match="index out of range in self"):
                bad.cpu()
    finally:
        _program_cache.Kept.__call__ = original
    torch.testing.assert_close(got, torch.nn.functional.embedding(ids, w) * 2)


def test_atan2_of_zeros_made_inside_a_segment_is_cpus():
    """XLA:CPU's atan2 gives NaN at two zeros when its inputs are made in
    the same program (an arange recorded into the segment; fuzz seed
    8001783), 0 or pi otherwise: the lowering gives C's answers there."""
    ys = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0])
    xs = torch.tensor([0.0, 0.0, -0.0, -0.0, 0.0])
    with fused():
        a = torch.arange(2, device="jax")
        got = torch.atan2(a, a).cpu()
        signed = torch.atan2(ys.to("jax") * 1, xs.to("jax") * 1).cpu()
    want = torch.atan2(torch.arange(2), torch.arange(2))
    torch.testing.assert_close(got, want)
    expected = torch.atan2(ys, xs)
    torch.testing.assert_close(signed, expected)
    assert torch.equal(torch.signbit(signed), torch.signbit(expected))


def test_a_segment_after_a_new_one_still_replays():
    """A segment whose script follows a new one (the segment before it ran
    at a new shape) has no script to expect from it.  It replays the latest
    script that began with its first op, so one new shape early in a step
    leaves the rest of the step on the replay lane."""
    w = torch.randn(16, 16, device="jax")
    y = torch.randn(32, device="jax")

    def step(n):
        a = (torch.ones(n, 16, device="jax") @ w).tanh().sum().item()  # a new shape each call
        b = (y * 2 + 1).exp().cos().sum().item()  # the same ops every call
        return a, b

    torch.jax.synchronize()
    with fused(), pjrt_host.config(dynamic_shapes=False):
        for n in (3, 4, 5):
            step(n)
        segments, replayed, _ = _replay_counts(lambda: step(6))
    assert (segments, replayed) == (2, 1), (segments, replayed)


def test_a_new_shape_after_an_optimizers_ops_compiles_only_the_new_ops():
    """An optimizer's step ends a training step and the next step's first
    ops join its segment.  When those come at a new shape, the optimizer's
    last ops (a large program: a _foreach op's result per parameter) run
    as a piece of their own, whose program every later new shape reuses:
    at a new length only the new ops compile, not the optimizer's with
    them (0.65-0.87 s of a GPT-2 step's 4-5 s at each new bucket).  Losses
    stay op by op's."""
    def train(lengths):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(50, 16), *[torch.nn.Linear(16, 16) for _ in range(12)])
        model.to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        g = torch.Generator().manual_seed(1)
        losses, compiled = [], []
        for n in lengths:
            ids = torch.randint(0, 50, (2, n), generator=g).to("jax")
            before = {id(s) for s in _fused._scripts.values() if any(v[2] is not None for v in s.variants)}
            loss = model(ids).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            compiled.append([s for s in _fused._scripts.values()
                             if id(s) not in before and any(v[2] is not None for v in s.variants)])
        return losses, compiled

    lengths = (5, 6, 7, 8, 9, 10, 11)
    with pjrt_host.config(eager="op"):
        expected, _ = train(lengths)
    torch.jax.synchronize()
    with fused(), pjrt_host.config(dynamic_shapes=False):
        losses, compiled = train(lengths)
    assert losses == pytest.approx(expected, rel=1e-5)
    # the optimizer's state is made at the 2nd step; the 3rd step's first
    # ops join its 1st whole, the 4th leaves them at the new length and
    # compiles them as a piece: from the 5th on, no new program holds them
    late = [[op.name for op, _, _ in s.ops] for step in compiled[4:] for s in step]
    assert late and not any(name.startswith("aten::_foreach") for names in late for name in names), late


def _foreach_run(device, steps, monkeypatch=None):
    """AdamW's foreach step (weight decay, amsgrad) over parameters of
    several shapes; per step, the number of tensors fused eager's lanes
    made (``monkeypatch``: counted on a 'jax' run) and each parameter's
    and state tensor's version."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(device).requires_grad_() for s in [(5, 3), (7,), (2, 3, 4), (9,)]]
    opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, amsgrad=True, foreach=True)
    made, versions = [], []
    if monkeypatch is not None:
        real = _fused.result_tensor
        count = [0]

        def counting(*args, **kwargs):
            count[0] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_fused, "result_tensor", counting)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        before = 0 if monkeypatch is None else count[0]
        with fused():
            opt.step()
            torch.jax.synchronize()  # as a training step's read of its loss
            versions.append([t._version for t in params + [v for s in opt.state.values() for v in s.values()]])
        made.append(0 if monkeypatch is None else count[0] - before)
    return params, opt, made, versions


def test_a_replayed_foreach_step_writes_its_targets_in_place(monkeypatch):
    """The foreach in-place ops of an optimizer step, replayed, give each
    target its result still pending, with no tensor made per result (a
    GPT-2 AdamW step writes 364 of them: a tensor each was a third of its
    cost), and count each write in the target's version as CPU's kernels
    do; the step is CPU's foreach step."""
    params, opt, made, versions = _foreach_run("jax", 6, monkeypatch)
    cpu_params, cpu_opt, _, cpu_versions = _foreach_run("cpu", 6)
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    for sa, sb in zip(opt.state.values(), cpu_opt.state.values()):
        for k in sb:
            torch.testing.assert_close(sa[k].cpu(), sb[k], rtol=1e-5, atol=1e-6)
    assert versions == cpu_versions
    # replayed: only the ops that make new tensors (the denominator's
    # sqrt) make them; written back, every in-place op made one per target
    assert made[4:] == [len(params)] * 2, made


def test_a_small_inputs_changing_holders_compile_nothing_again():
    """A segment is given (donated) the arrays only it holds, but not
    small ones: whether a flag, a token or a mask's row is still held
    elsewhere changes from run to run, and each change compiled the
    segment again (a variant donating the other set).  A large one is
    still given, and values stay right either way."""
    if not _tensor.DONATE:
        pytest.skip("PJRT_HOST_DONATE=0: nothing is donated")
    w = torch.randn(64, device="jax")
    big = torch.randn(_fused.DONATE_MIN_BYTES // 4, device="jax")
    with fused():
        made, kept = [], None
        for step in range(8):
            before = _fused.stats()["programs"]
            t = w[:1] * 2
            torch.jax.synchronize()  # (t computed: the next segment reads its array)
            kept = t if step % 2 else None  # held elsewhere at every other step
            u = (t + 1) * 3
            del t
            assert u.item() == pytest.approx((w[:1].cpu().item() * 2 + 1) * 3)
            made.append(_fused.stats()["programs"] - before)
        assert sum(made[1:]) == 0, made
        # a large array nothing else holds is still given to the segment
        buffer = big._storage.array.unsafe_buffer_pointer()
        expected = big.cpu() * 2 + 1
        big.mul_(2).add_(1)
        torch.jax.synchronize()
        assert big._storage.array.unsafe_buffer_pointer() == buffer
        torch.testing.assert_close(big.cpu(), expected)
    del kept


def test_factories_replay_on_the_lane_with_their_flags(monkeypatch):
    """The factories a decoding loop makes every step (``arange`` of the
    vocabulary, ``full`` of a stopping flag, a scalar tensor of -inf) take
    fused eager's replay lane once the loop repeats: no meta kernel, no
    key.  A flag ``full`` takes at run time is the call's own (False at
    every step, True at the last, as generate()'s criteria make it); a
    value of another type at the same place (1 where True was) takes the
    factory's way and torch's dtype.  The same factory spelt otherwise
    before (``device='jax:0'``) is one op, and both spellings take its
    lane.  The same factories recorded under other settings before (an
    earlier test's) leave no lane this loop's settings cannot take.
    Values equal CPU's."""
    from pjrt_host._torch import _factories

    ways = []  # the factories that take their own way (their device index is looked up first)
    original = _factories._target_index
    monkeypatch.setattr(_factories, "_target_index", lambda kwargs: (ways.append(1), original(kwargs))[1])
    torch.manual_seed(0)
    scores = torch.randn(12, 2, 10)
    with pjrt_host.config(eager="fused"):  # other settings, the same ops (the way CI's order found)
        for _ in range(3):
            (torch.full((2,), True, device="jax") | True).cpu()
            (torch.scalar_tensor(-math.inf, device="jax") + 1).cpu()
    with pjrt_host.config(eager="fused", dynamic_shapes=False):
        for _ in range(3):  # the same factories spelt otherwise first (another module's): one op, two spellings
            (torch.arange(10, device="jax:0") + 1).cpu()
            (torch.full((2,), True, device=torch.device("jax")) | True).cpu()
    results = {}
    for dev in ("cpu", "jax"):
        out, per_step = [], []
        with pjrt_host.config(eager="fused", dynamic_shapes=False):
            for step in range(12):
                s = scores[step].to(dev)
                before = len(ways)
                vocab = torch.arange(s.shape[-1], device=dev)
                banned = torch.isin(vocab, torch.tensor([3, 7], device=dev))
                s = torch.where(banned, torch.scalar_tensor(-math.inf, device=dev), s)
                done = torch.full((s.shape[0],), step == 11, device=dev)  # (a flag, True at the last step)
                other = torch.full((2,), 1 if step == 10 else True, device=dev)  # (1 at one step: int64)
                out.append((s.argmax(-1).cpu(), (done | (s.max(-1).values > 1.5)).cpu(), other.cpu()))
                per_step.append(len(ways) - before)
        results[dev] = out
        if dev == "jax":
            steady = [n for i, n in enumerate(per_step) if i >= 4 and i not in (10, 11)]
            assert steady and max(steady) == 0, per_step
    for got, want in zip(results["jax"], results["cpu"]):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w)


def test_a_segments_program_takes_no_host_scalar(monkeypatch):
    """A segment's Python ints (views' run-time offsets, a join's lengths)
    reach its program as device arrays made once per value (from its
    second sighting), of the type jit gives the int (weakly typed), not as
    host scalars moved at every call.  Values equal CPU's, int results
    keep their dtype."""
    import numpy as np

    seen = []
    original = _fused._scalars_on_device
    monkeypatch.setattr(_fused, "_scalars_on_device",
                        lambda ext, device: (original(ext, device), seen.append(list(ext)))[0])
    torch.manual_seed(0)
    base = torch.randn(64)
    counts = torch.arange(64, dtype=torch.int32)
    results = {}
    for dev in ("cpu", "jax"):
        x, c = base.to(dev), counts.to(dev)
        out = []
        with pjrt_host.config(eager="fused", dynamic_shapes=False):
            for step in range(12):
                i = step % 6
                y = (x[i:i + 8] * 2 + x[i + 1:i + 9]).sum()  # (views at run-time offsets)
                n = c[i:i + 4] + 1  # (int32 stays int32)
                out.append((y.item(), n.dtype, n.cpu()))
        results[dev] = out
    for (y, dt, n), (y0, dt0, n0) in zip(results["jax"], results["cpu"]):
        assert dt == dt0 == torch.int32
        torch.testing.assert_close(torch.tensor(y), torch.tensor(y0))
        torch.testing.assert_close(n, n0)
    assert seen and any(ext for ext in seen)
    # (a value met for the first time stays a host scalar: a loop's counter
    # would otherwise make an array at every call; the offsets repeat)
    late = seen[len(seen) // 2:]
    host = [type(v).__name__ for ext in late for v in ext if type(v) in (int, np.int32)]
    assert not host, host
    scalars = [v for ext in seen for v in ext if getattr(v, "shape", None) == () and v.weak_type]
    assert scalars, "the views' offsets should reach the programs as weakly typed device scalars"
    assert len({id(v) for v in scalars}) <= 8, "one device array per offset value, not one per call"
    # a counter that changes every step is not given an array at each value
    made = len(_fused._scalar_arrays)
    x = base.to("jax")
    with pjrt_host.config(eager="fused", dynamic_shapes=False):
        for step in range(1000, 1030):
            assert (x[2:10] * 2 + step).sum().item() == pytest.approx((base[2:10] * 2 + step).sum().item())
    assert len(_fused._scalar_arrays) - made <= 2


def test_an_optimizer_after_autograds_thread_replays_on_the_lane(monkeypatch):
    """A training step's backward runs in autograd's device thread, which
    runs the forward's last segment (it reads the loss) and leaves its own
    last gradients pending.  The optimizer's foreach ops that follow in the
    main thread replay on the lane all the same: the done segment is left
    for the next one, as the engine's way leaves it, and the other
    thread's pending gradients run first.  No foreach op takes the
    engine's way in a steady step, and the step is CPU's (exact dims:
    padded targets are written back, not given their results)."""
    def train(device, steps, recorded=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16),
                                    torch.nn.Linear(16, 4)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(6, 8, generator=g).to(device), torch.randint(0, 4, (6,), generator=g).to(device)
        losses = []
        for i in range(steps):
            if recorded is not None:
                recorded.append([])
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    recorded: list = []
    real = _fused.record

    def spy(op, *args, **kwargs):
        recorded[-1].append(str(op))
        return real(op, *args, **kwargs)

    monkeypatch.setattr(_fused, "record", spy)
    with fused(), pjrt_host.config(dynamic_shapes=False):  # (padded targets take the written-back way)
        losses, params = train("jax", 7, recorded)
    cpu_losses, cpu_params = train("cpu", 7)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any("_foreach" in op for op in recorded[0]), recorded[0]  # (the spy sees the engine's way)
    assert not [op for step in recorded[4:] for op in step if "_foreach" in op], recorded[4:]


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_foreach_ops_whose_targets_alias_write_in_order_as_cpu(mode):
    """A foreach in-place op whose list holds one storage twice, or writes
    a tensor that another position reads, runs position by position as
    CPU's kernels do (the functional op computes every position from the
    old values); repeated, as a replayed segment."""
    def run(device):
        out = []
        a = torch.ones(3, device=device)
        b = torch.zeros(4, 2, device=device)
        c = torch.full((2,), 3.0, device=device)
        for _ in range(3):
            torch._foreach_add_([a, a], 1.0)
            torch._foreach_mul_([a, b[1]], 2.0)
            torch._foreach_add_([b, b[2]], [1.0, 2.0])
            torch._foreach_add_([c, b[0]], [b[3], c])
            out.append([t.cpu().clone() for t in (a, b, c)] + [(a._version, b._version, c._version)])
        return out

    with pjrt_host.config(eager=mode):
        got = run("jax")
    for x, y in zip(got, run("cpu")):
        for p, q in zip(x[:3], y[:3]):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert x[3] == y[3]


def test_a_loops_last_pass_leaves_for_what_follows_on_the_lane():
    """A model's layers replay one script each, then its head's, which
    begins with the same op (a layer's norm, then the head's matmul where a
    layer has its linear's addmm). The segment after the last layer
    expects another layer, and the one after the embedding the head that
    followed last time: at the op where the two scripts part, the replay
    lane goes on with the other one, as the engine's way does, without
    taking that way (before: two calls a step took it, GPT-2's mm and addmm
    at every decoding token)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    ws = [torch.randn(16, 16) * 0.2 for _ in range(4)]
    bs = [torch.randn(16) for _ in range(4)]
    head = torch.randn(16, 10)
    x = torch.randn(3, 16)

    def step(device):
        h = x.to(device)
        for w, b in zip(ws, bs):
            w, b = w.to(device), b.to(device)
            a = F.linear(F.layer_norm(h, (16,)), w, b)
            h = h + torch.tanh(a) * torch.sigmoid(a) - a.relu() * 0.5
            h = h + F.gelu(F.linear(F.layer_norm(h, (16,)), w.t(), b)) * 0.3
        return F.linear(F.layer_norm(h, (16,)), head.to(device).t()).softmax(-1).cpu()

    expected = step("cpu")
    exact = _config.current().dynamic_shapes != "all"
    with fused():
        for _ in range(3):
            torch.testing.assert_close(step("jax"), expected)
        before = _fused.stats()
        torch.testing.assert_close(step("jax"), expected)
        after = _fused.stats()
    ops, lane = after["ops"] - before["ops"], after["lane"] - before["lane"]
    assert ops >= 59 and (not exact or lane == ops), f"{ops - lane} of {ops} calls took the engine's way"


def test_an_empty_tensor_made_every_step_replays_on_the_lane():
    """transformers' DynamicCache cats each layer's keys onto a fresh
    ``torch.tensor([])`` every forward: an empty tensor, whose storage has
    no array until read, is matched by the replay lane as the recorded
    call's (its shared array of no elements), so the join replays."""
    x = torch.randn(2, 3, 4, device="jax")

    def step():
        empty = torch.tensor([], device="jax")
        return (torch.cat([empty, x * 2], dim=-2) + 1).sum().item()

    with fused(), pjrt_host.config(dynamic_shapes=False):  # (exact: a padded x's join takes its own way)
        for _ in range(4):
            step()
        before = _fused.stats()
        got = step()
        after = _fused.stats()
    assert after["ops"] - before["ops"] == after["lane"] - before["lane"] == 4, (before, after)
    assert got == pytest.approx((x.cpu() * 2 + 1).sum().item(), rel=1e-6)
