"""Dynamic dimensions (docs/dynamic-shapes.md): a dimension that takes a
second size at the same place is padded to a bucket, the ops that know
padding compile once per bucket, and padding never shows in a value."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import pjrt_host
from pjrt_host._torch import _padding
from test_torch_sdpa import _count_ops  # noqa: E402  (the ops the device runs, by name)


class Block(torch.nn.Module):
    """What a transformer layer runs: layer norm, linear layers over a
    merged batch and sequence dim, a split, head views, attention scores
    and their softmax, a residual, a loss over every position."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln(x)
        q, k, v = self.qkv(h).split(16, dim=2)
        q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in (q, k, v))
        p = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        y = (p @ v).transpose(1, 2).reshape(b, t, 16) + x
        logits = self.out(F.gelu(y))
        return F.cross_entropy(logits.view(-1, 10), target.view(-1)) + y.mean(1).sum()


def _step(model: Block, x: torch.Tensor, target: torch.Tensor) -> tuple:
    model.zero_grad()
    loss = model(x, target)
    loss.backward()
    return loss, [p.grad for p in model.parameters() if p.grad is not None]


def _pair(block: type = None) -> tuple:
    """A seeded model of ``block`` (default :class:`Block`) on CPU and its copy on 'jax'."""
    block = block or Block
    torch.manual_seed(0)
    cpu = block()
    dev = block().to("jax")
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


def _compiled() -> int:
    return torch.jax.program_cache_stats()["compiled"] + torch.jax.program_cache_stats()["disk_hits"]


def _assert_like_cpu(got: tuple, cpu: Block, x: torch.Tensor, target: torch.Tensor) -> None:
    """``got`` (a loss and its gradients) is what a step of ``cpu`` gives."""
    want_loss, want_grads = _step(cpu, x, target)
    torch.testing.assert_close(got[0], want_loss, rtol=2e-5, atol=2e-5)
    for a, b in zip(got[1], want_grads):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def _batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of 3 sequences of length ``t`` and their targets (seeded by ``t``)."""
    g = torch.Generator().manual_seed(t)
    return torch.randn(3, t, 16, generator=g), torch.randint(0, 10, (3, t), generator=g)


def _run_lengths(lengths, check=True):
    cpu, dev = _pair()
    compiled = []
    for t in lengths:
        x, target = _batch(t)
        before = _compiled()
        loss, grads = _step(dev, x.to("jax"), target.to("jax"))
        got = (loss.cpu(), [g.cpu() for g in grads])
        compiled.append(_compiled() - before)
        if check:
            _assert_like_cpu(got, cpu, x, target)
    return compiled


def test_a_new_length_in_a_seen_bucket_compiles_nothing():
    # op by op (fused eager, the default, has its twin below: run first in
    # the same mode, it would leave the twin nothing to compile)
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager="op"):
        compiled = _run_lengths([20, 23, 27, 29, 21, 30])
    stats = torch.jax.dynamic_shape_stats()
    # the first two lengths compile exact programs, the third the bucket's;
    # every later length of the bucket (32) runs them: nothing new but, at
    # the 4th and 5th, the division of the mean's gradient by the length
    # (its scalar static, then tried traced: fused eager recompiles the
    # segments the trial ends, so the 4th is only below the 1st, whose
    # count is lower in a process that ran other models first)
    assert all(c <= 4 for c in compiled[4:]) and compiled[3] < compiled[0], compiled
    assert stats["padded_calls"] > 50 and stats["pads"] >= 1
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert "3x32x16" in stats["calls_by_bucket"] or "96x16" in stats["calls_by_bucket"], stats["calls_by_bucket"]


def test_a_length_equal_to_its_bucket_runs_padded():
    # a dynamic dim is padded strictly past its length: 32 goes to the
    # bucket of 48 (which 33 opened), not to an exact storage of 32 -- that
    # ran a program set of its own at every bucket's end
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager="op"):
        compiled = _run_lengths([20, 23, 27, 33, 40, 45, 32])
    assert compiled[-1] == 0, compiled
    assert torch.jax.dynamic_shape_stats()["fallbacks"] == 0, torch.jax.dynamic_shape_stats()["fallbacks_by_reason"]
    assert _padding.room(32) == 48 and _padding.room(31) == 32 and _padding.room(1) == 1


def _positions_and_mask(t: int, device: str) -> torch.Tensor:
    # what a model makes from a sequence's length: position ids and a
    # causal mask (the same line each call: the factories' place)
    pos = torch.arange(t, device=device)
    mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return torch.where(mask, pos * 1.0, -1.0).sum(1)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_factories_of_a_changing_length_make_padded_tensors(eager):
    # from the third length at the line, arange / ones make their result
    # padded to the bucket: a later length of the bucket compiles nothing
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for t in (20, 23, 27, 29, 21, 30, 18):
            before = _compiled()
            got = _positions_and_mask(t, "jax").cpu()
            compiled.append(_compiled() - before)
            torch.testing.assert_close(got, _positions_and_mask(t, "cpu"))
        padded = torch.arange(25, device="jax")  # (another line: exact)
        assert padded._storage.padded is None
    assert compiled[3:] == [0] * 4, compiled


def test_a_view_of_a_padded_tensor_reads_to_the_host_without_a_program():
    # generate()'s new tokens, out[0, n:].tolist(), and its last one,
    # out[0, -1].item(): cut on the host through the view's logical strides,
    # no cut program per length
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager="op"):
        x = torch.zeros(2, 20, dtype=torch.long, device="jax")
        for t in range(20, 30):
            x = torch.cat([x, torch.full((2, 1), t, device="jax")], dim=1)
            c = torch.cat([torch.zeros(2, 20, dtype=torch.long), torch.arange(20, t + 1).expand(2, -1)], dim=1)
            before = _compiled()
            assert x[1, 5:].tolist() == c[1, 5:].tolist()
            assert torch.equal(x.t()[::3].cpu(), c.t()[::3])
            assert x[1, -1].item() == t and x[0, t - 21].item() == c[0, t - 21].item()  # generate()'s last token
            if x._storage.padded is not None:
                assert _compiled() == before
    assert torch.jax.dynamic_shape_stats()["cuts"] == 0


def _padded_on_device(values: torch.Tensor, dims: set) -> torch.Tensor:
    """``values`` on 'jax', its storage padded along ``dims`` to odd buckets
    (the oracle mode's: the padding never lines up with anything)."""
    from pjrt_host._jax_settings import x64_scope

    t = values.to("jax")
    assert x64_scope(_padding.pad_storage)(t._storage, dims, True)  # (as the engine calls it: int64 kept)
    assert t._storage.computed().dtype == t._storage.jax_dtype
    return t


_WRITES = {
    # a slice starting inside the padded dim: its physical view reaches one
    # element into the next row, which must keep its value
    "shifted right": lambda x, y: x[:, 1:].copy_(y[:, :-1]),
    "shifted left": lambda x, y: x[:, :-1].copy_(y[:, 1:]),
    "a scalar into a column": lambda x, y: x[..., 0].fill_(-7),
    "a 0-dim tensor into a column": lambda x, y: x[:, 0].copy_(y[1, 3]),
    "a row from the host": lambda x, y: x[1].copy_(torch.arange(x.shape[1], dtype=x.dtype)),
    "a cast into a slice": lambda x, y: x[:, 2:5].copy_(y[:, :3].double() * 2.5),
    "through a transpose": lambda x, y: x.t()[2:6].copy_(y.t()[1:5]),
    "an in-place op on a slice": lambda x, y: x[:, 3:].add_(y[:, 3:]),
    "a masked fill of a slice": lambda x, y: x[:, 1:].masked_fill_(y[:, 1:] > 50, 0),
    "the whole tensor": lambda x, y: x.copy_(y),
}


@pytest.mark.parametrize("eager", ["op", "fused"])
@pytest.mark.parametrize("form", list(_WRITES))
def test_a_write_into_a_view_of_a_padded_tensor_keeps_it_padded(form, eager):
    # only the view's logical elements change; padding, other rows and the
    # storage's bucket stay as they were
    _padding.reset()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 100, (3, 9), generator=g), torch.randint(0, 100, (3, 9), generator=g)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        x, y = _padded_on_device(a, {0, 1}), _padded_on_device(b, {1})
        _WRITES[form](x, y)
        assert x._storage.padded is not None, "the write cut the storage"
        want = a.clone()
        _WRITES[form](want, b)
        assert torch.equal(x.cpu(), want)
        assert torch.equal(x.sum(1).cpu(), want.sum(1))  # (its padding unread)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["padded_writes"] >= 1 and stats["cuts"] == 0, (stats["cuts_by_op"], stats)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_write_into_a_view_that_merges_padded_dims_gives_cpus_values(eager):
    # x.flatten() of a storage padded along both dims: its logical elements
    # are not its first positions, so a value of the view's logical length
    # cannot be laid into it by padding its end (it is cut: CPU's values)
    a = torch.arange(12.0).reshape(3, 1, 4)
    for write in (lambda t: t.flatten().fill_(2), lambda t: t.flatten().add_(10),
                  lambda t: t.flatten()[2:9].copy_(torch.arange(7.0)), lambda t: t.view(-1).mul_(torch.arange(12.0, device=t.device))):
        want = a.clone()
        write(want)
        with pjrt_host.config(dynamic_shapes=True, eager=eager):
            x = _padded_on_device(a, {0, 2})
            write(x)
            assert torch.equal(x.cpu(), want)


def _shift_right(ids: torch.Tensor, start: int = 0, pad: int = 0) -> torch.Tensor:
    """T5's and BART's decoder inputs from their labels (transformers'
    ``_shift_right``)."""
    shifted = ids.new_zeros(ids.shape)
    shifted[..., 1:] = ids[..., :-1].clone()
    shifted[..., 0] = start
    shifted.masked_fill_(shifted == -100, pad)
    return shifted


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_labels_moved_to_the_device_at_changing_lengths_are_shifted_in_their_bucket(eager):
    # the batch's move counts its sizes at its line, so the labels are
    # padded from their third length; the slice writes keep the shifted
    # ids padded: a new length of a seen bucket compiles nothing
    _padding.reset()
    emb = torch.nn.Embedding(100, 4)
    demb = torch.nn.Embedding(100, 4).to("jax")
    demb.load_state_dict(emb.state_dict())
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in [11, 14, 17, 21, 23, 20, 15, 18, 22, 13]:
            labels = torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(n))
            labels[1, -3:] = -100
            before = _compiled()
            moved = labels.to("jax")
            got = demb(_shift_right(moved)).sum(1)
            assert torch.equal(_shift_right(moved).cpu(), _shift_right(labels))
            torch.testing.assert_close(got.cpu(), emb(_shift_right(labels)).sum(1))
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["padded_writes"] > 0, stats
    # lengths 20, 18, 22 fall in the bucket of 32 the third one (17) opened
    assert compiled[5] == compiled[7] == compiled[8] == 0, compiled


def test_a_batch_moved_at_changing_lengths_is_padded_on_its_way():
    # a batch larger than the host's own pad copies: padded on the host as
    # it moves (no pad program, no copy back from the device), its values
    # and its logical sizes the host tensor's
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        for i, n in enumerate([40, 45, 50, 55, 60]):
            batch = torch.randn(n, 2048, generator=torch.Generator().manual_seed(n))  # 160+ KiB floats...
            batch = batch.double()  # ...as doubles, past HOST_PAD_BYTES
            assert batch.nbytes > _padding.HOST_PAD_BYTES
            before = _compiled()
            moved = batch.to("jax")
            assert _compiled() == before, f"the move of length {n} compiled a program"
            assert moved.shape == batch.shape and moved.dtype == batch.dtype
            assert (moved._storage.padded is not None) == (i >= 2), (n, moved._storage.padded)
            assert torch.equal(moved.cpu(), batch)
            assert torch.equal((moved * 2).sum(0).cpu(), (batch * 2).sum(0))
    assert torch.jax.dynamic_shape_stats()["pads"] == 3


def test_a_modules_own_move_pads_none_of_its_tensors():
    # module.to('jax') moves every parameter and buffer at one line
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        for _ in range(2):
            m = torch.nn.Sequential(*[torch.nn.Linear(n, n + 1) for n in range(3, 9)])
            for n, layer in enumerate(m):  # buffers of every length, a parameter's move between two
                layer.register_buffer("ids", torch.arange(n + 2)[None])
            m.to("jax")
            assert all(p._storage.padded is None for p in [*m.parameters(), *m.buffers()])
    assert torch.jax.dynamic_shape_stats()["pads"] == 0


def test_an_optimizers_state_made_at_one_line_is_never_padded():
    # zeros_like of every parameter comes from one line (opt.step()): its
    # sizes are the parameters', not a length changing at that line (a
    # padded state was cut by the optimizer's foreach ops)
    # (moved from the host: a factory's results of four sizes at one line
    # would be padded, and a ``*_like`` of a padded tensor is padded like it)
    params = [torch.randn(shape).to("jax") for shape in ((32, 16), (24, 32), (8, 24), (40, 8))]
    with pjrt_host.config(dynamic_shapes=True):
        states = [torch.zeros_like(p) for p in params] + [p.new_ones(p.shape) for p in params]
    assert all(s._storage.padded is None for s in states)


def _mask_checks(t: int, device: str) -> list:
    # what generate() asks of an attention mask of the prompt's length,
    # and other reductions a padding value would change
    mask = torch.ones(1, t, dtype=torch.long, device=device)
    x = torch.arange(t, device=device) * 0.5 - 3
    return [mask.all(), (mask == 0).any(-1), x.amin(), x.max(), x.min(), (x / 8 + 1).prod(), mask.bool().all(1)]


def test_any_all_min_max_prod_run_padded():
    _padding.reset()
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager="op"):
        for t in (20, 23, 27, 29, 21, 30):
            before = _compiled()
            got = [v.cpu() for v in _mask_checks(t, "jax")]
            compiled.append(_compiled() - before)
            for a, b in zip(got, _mask_checks(t, "cpu")):
                torch.testing.assert_close(a, b)
    stats = torch.jax.dynamic_shape_stats()
    assert not stats["cuts_by_op"], stats["cuts_by_op"]
    assert compiled[3:] == [0] * 3, compiled


def _membership(t: int, device: str, tested_padded: bool) -> list:
    # what generate()'s stopping criteria and logits processors ask every
    # token: are the ids among the end-of-sequence ones
    ids = (torch.arange(t, device=device) * 7) % 11 + torch.tensor([[0], [1], [2]], device=device)
    eos = torch.tensor([0, 4], device=device)
    if not tested_padded:
        return [torch.isin(ids, eos), torch.isin(ids[:, -2:], eos, invert=True).any(-1), torch.isin(ids, 3)]
    lengths = torch.arange(t, device=device) % 5
    return [torch.isin(4, ids), torch.isin(eos, lengths), torch.isin(ids, test_elements=lengths)]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_isin_runs_padded_elements_and_never_tests_padding(eager):
    """isin is one op (not torch's decomposition): padded elements run
    padded, every length of a bucket one program; padded test elements
    are read exact (their padding would be tested), so their op gets its
    inputs cut, counted by name -- and the values are CPU's."""
    for tested_padded in (False, True):
        _padding.reset()
        compiled = []
        with pjrt_host.config(dynamic_shapes=True, eager=eager):
            for t in (20, 23, 27, 29, 21, 30):
                before = _compiled()
                got = [v.cpu() for v in _membership(t, "jax", tested_padded)]
                compiled.append(_compiled() - before)
                for a, b in zip(got, _membership(t, "cpu", tested_padded)):
                    assert torch.equal(a, b), (t, tested_padded, a, b)
        cuts = torch.jax.dynamic_shape_stats()["cuts_by_op"]
        if tested_padded:
            assert set(cuts) == {"aten::isin.Tensor_Tensor", "aten::isin.Scalar_Tensor"}, cuts
        else:
            assert not cuts, cuts
            assert compiled[3:] == [0] * 3, compiled


def test_a_random_draw_of_a_changing_length_is_padded_and_draws_the_same_numbers():
    # a small draw is made flat in a power-of-two bucket; of a changing
    # length, its elements are placed padded at their logical flat index:
    # the numbers the exact draw gives, one program per bucket
    def draws(dynamic: bool) -> tuple[list, list]:
        torch.manual_seed(7)
        out, compiled = [], []
        with pjrt_host.config(dynamic_shapes=dynamic, eager="op"):
            for t in (20, 23, 27, 29, 25, 30, 22):  # (from 23, 3 * t draws in the bucket of 128)
                before = _compiled()
                x = torch.rand(3, t, device="jax")
                ids = torch.randint(0, 50, (3, t), device="jax")
                out.append(((x * 2).cpu(), (ids + 1).cpu(), x._storage.padded is not None))
                compiled.append(_compiled() - before)
        return out, compiled

    exact, _ = draws(False)
    padded, compiled = draws(True)
    assert [p[2] for p in padded] == [False, False, True, True, True, True, True]
    for (a, b, _), (c, d, _) in zip(exact, padded):
        assert torch.equal(a, c) and torch.equal(b, d)
    assert compiled[3:] == [0] * 4, compiled


class EmbeddedBlock(Block):
    """The block over an embedding of token ids: the index checks of the
    embedding and of the loss's targets read their indices padded too."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().forward(self.emb(ids), target)


def _train_on_ids(block: type, lengths: list) -> list:
    """Training steps of ``block`` on 'jax' with dynamic shapes (ids and
    targets of 3 sequences per length, seeded by it), each compared with
    CPU's; per step, the programs it compiled."""
    _padding.reset()
    cpu, dev = _pair(block)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True):
        for t in lengths:
            g = torch.Generator().manual_seed(t)
            ids, target = torch.randint(0, 50, (3, t), generator=g), torch.randint(0, 10, (3, t), generator=g)
            before = _compiled()
            loss, grads = _step(dev, ids.to("jax"), target.to("jax"))
            got = (loss.cpu(), [g.cpu() for g in grads])
            compiled.append(_compiled() - before)
            _assert_like_cpu(got, cpu, ids, target)
    return compiled


def test_a_training_step_at_a_new_length_of_a_seen_bucket_compiles_no_program():
    # Autograd's mean backward divides an expand of the gradient (the
    # length's size) by the length (a new scalar): the expand is read wider,
    # to the bucket, and the divisor goes traced; the embedding's and the
    # loss's index checks read their indices padded.  The 4th length decides
    # the division's scalar traced; from the 5th nothing compiles.
    compiled = _train_on_ids(EmbeddedBlock, [20, 23, 27, 29, 21, 30, 25, 18, 31, 17])
    stats = torch.jax.dynamic_shape_stats()
    assert compiled[5:] == [0] * 5, compiled
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]


class ShiftedBlock(EmbeddedBlock):
    """A causal language model's loss: each position's logits against the
    next position's target (``logits[:, :-1]``, ``target[:, 1:]``), and a
    term over positions 1 .. t (a slice that starts inside the length)."""

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.emb(ids))
        logits = self.out(F.gelu(h))
        return (F.cross_entropy(logits[:, :-1].reshape(-1, 10), target[:, 1:].reshape(-1))
                + (h[:, 1:] * 2).sum() / 100)


def test_slices_that_start_inside_a_padded_dim_run_padded():
    # target[:, 1:] and h[:, 1:] are read from the padded arrays at a
    # run-time start, the shifted targets padded as the logits' rows are
    _train_on_ids(ShiftedBlock, [20, 23, 27, 29, 21, 30, 25])
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]


class LabelsPaddedBlock(EmbeddedBlock):
    """A causal language model's loss as transformers writes it: the labels
    (the ids themselves) padded by one ignored position, then shifted."""

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.out(F.gelu(self.ln(self.emb(ids)) % 50))
        labels = F.pad(ids % 10, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.view(-1, 10), labels.view(-1), ignore_index=-100)


@pytest.mark.parametrize("mode", [True, "all"])
def test_labels_padded_at_the_end_of_their_length_stay_in_its_bucket(mode):
    # F.pad grows the padded length by one (to the bucket of the new length
    # where it passes its own), its values at run-time positions
    from pjrt_host._torch import _dynamic_dims

    _padding.reset()
    cpu, dev = _pair(LabelsPaddedBlock)
    compiled = []
    with pjrt_host.config(dynamic_shapes=mode):
        for t in [20, 23, 27, 29, 21, 30, 25, 26]:
            ids = torch.randint(0, 50, (3, t), generator=torch.Generator().manual_seed(t))
            before = _compiled()
            loss, grads = _step(dev, ids.to("jax"), None)
            got = (loss.cpu(), [g.cpu() for g in grads if g is not None])
            compiled.append(_compiled() - before)
            want, want_grads = _step(cpu, ids, None)
            torch.testing.assert_close(got[0], want, rtol=2e-5, atol=2e-5)
            for a, b in zip(got[1], [g for g in want_grads if g is not None]):
                torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and not stats["cuts_by_op"], (stats["fallbacks_by_reason"], stats["cuts_by_op"])
    assert _dynamic_dims._growing_programs, "the labels were grown padded"
    if mode is True:
        assert compiled[5:] == [0] * 3, compiled


def test_the_gradient_of_a_slice_of_a_padded_dim_is_placed_at_its_start():
    # slice_backward of a padded gradient: placed at the slice's start in
    # the bucket of the input's length, zeros around it, at odd buckets
    from pjrt_host._torch import _dynamic_dims

    torch.manual_seed(2)
    with pjrt_host.config(dynamic_shapes="all"):
        for n in (6, 11):
            x = torch.randn(3, n, 4)
            for part in (slice(1, None), slice(None, -1), slice(2, 5), slice(-3, None)):
                w = torch.randn(x[:, part].shape)
                xd = x.to("jax").requires_grad_()
                ((xd * 1.5)[:, part] * w.to("jax")).sum().backward()
                xc = x.clone().requires_grad_()
                ((xc * 1.5)[:, part] * w).sum().backward()
                torch.testing.assert_close(xd.grad.cpu(), xc.grad, msg=f"{n} {part}")
    assert _dynamic_dims._placing_programs, "the gradients were placed padded"


def test_a_gradient_whose_input_bucket_passes_the_int32_limit_is_placed_exact(monkeypatch):
    """slice_backward's placing program takes the start and length as int32
    scalars: where the input's bucket would pass the limit (lowered here to
    10 elements: the sliced dim's bucket is 14 in the odd buckets, the
    slice's 7), the gradient is placed by the exact route instead."""
    from pjrt_host._torch import _dynamic_dims

    monkeypatch.setattr(_padding, "MAX_SIZE", 10)
    _dynamic_dims._placing_programs.clear()
    torch.manual_seed(2)
    x, w = torch.randn(3, 11, 4), torch.randn(3, 3, 4)
    with pjrt_host.config(dynamic_shapes="all"):
        xd = x.to("jax").requires_grad_()
        product = (xd * 1.5)[:, 2:5] * w.to("jax")
        assert product._storage.padded is not None  # the slice's gradient comes padded
        product.sum().backward()
    xc = x.clone().requires_grad_()
    ((xc * 1.5)[:, 2:5] * w).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    assert not [k for k in _dynamic_dims._placing_programs if k[3] > _padding.MAX_SIZE], \
        list(_dynamic_dims._placing_programs)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_an_index_check_reads_a_padded_index_within_its_logical_sizes(eager):
    # every dim padded, to odd buckets: the indices' padding holds -1 (their
    # logical values less 1), which the checks must not read, while a bad
    # logical value still raises CPU's error (fused eager: the indices are
    # pending, and their bounds and padding are recorded into the segment)
    from pjrt_host._torch import _fused, _index_checks

    _padding.reset()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 4)
    dev = torch.nn.Embedding(50, 4).to("jax")
    dev.load_state_dict(emb.state_dict())
    ids = torch.randint(1, 51, (3, 11))
    target = torch.randint(1, 11, (3, 11))
    target[0, 3] = -99  # -100 once less 1: ignore_index
    with pjrt_host.config(dynamic_shapes="all", eager=eager):
        w = torch.ones(4, 10, device="jax").cpu().to("jax")
        segments = _fused.stats()["segments"]
        logits = dev(ids.to("jax") - 1).flatten(0, 1) @ w
        loss = F.cross_entropy(logits, (target.to("jax") - 1).flatten())
        if eager == "fused":
            assert _fused.stats()["segments"] == segments, "a check ran the segment"
        torch.testing.assert_close(loss.cpu(), F.cross_entropy(emb(ids - 1).flatten(0, 1) @ torch.ones(4, 10),
                                                               (target - 1).flatten()))
        assert _index_checks._padded_programs, "the checks read the indices padded"
        bad = ids.clone()
        bad[2, 7] = 51
        with pytest.raises(IndexError, match="index out of range in self"):
            dev(bad.to("jax") - 1).cpu()
        bad = target.clone()
        bad[1, 5] = 13
        with pytest.raises(IndexError, match="Target 12 is out of bounds"):
            F.cross_entropy(logits, (bad.to("jax") - 1).flatten()).cpu()


def test_fused_eager_records_padded_ops_and_reuses_the_buckets_segments():
    from pjrt_host._torch import _fused

    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        before = _fused.stats()
        compiled = _run_lengths([20, 23, 27, 29, 21, 30])
        after = _fused.stats()
    stats = torch.jax.dynamic_shape_stats()
    # padded ops are recorded into segments (nothing cut to run them), and a
    # later length of the bucket compiles at most the segments around the
    # trial of the mean gradient's division by the length
    assert stats["fallbacks"] == 0 and stats["cuts"] == 0, (stats["fallbacks_by_reason"], stats["cuts_by_op"])
    assert stats["padded_calls"] > 50
    assert after["ops"] - before["ops"] > 150
    # (the 4th length compiles the segments the trial ends, 6-7 programs; the
    # 1st's count depends on what the tests before left compiled: the op
    # programs of these lengths, or every segment's.  Each model instance
    # learns its own dynamic dims, so a model made before does not pad this
    # one's first lengths)
    assert all(c <= 4 for c in compiled[4:]), compiled


def _padded_lane_step(dev: Block, cpu: Block, t: int) -> dict:
    """A checked step at length ``t``: what fused eager's counters and the
    padded calls' counter moved by."""
    before, calls = torch.jax.fused_eager_stats(), torch.jax.dynamic_shape_stats()["padded_calls"]
    x, target = _batch(t)
    loss, grads = _step(dev, x.to("jax"), target.to("jax"))
    _assert_like_cpu((loss.cpu(), [g.cpu() for g in grads]), cpu, x, target)
    after = torch.jax.fused_eager_stats()
    moved = {k: after[k] - before[k] for k in after}
    moved["padded_calls"] = torch.jax.dynamic_shape_stats()["padded_calls"] - calls
    return moved


def test_fused_eager_replays_padded_calls_without_the_engine():
    """Fused eager's replay lane takes padded calls too
    (``_dynamic_dims.PaddedLane``): a step at a new length of a bucket it
    has run replays most of its padded calls (elementwise ops, reductions,
    matmuls, softmax, the loss) without the engine's key, their results'
    logical shapes and padding worked out per call, and gives CPU's loss
    and gradients.  A length at the bucket's full size (nothing read
    padded along it) and a shorter one follow, checked too.  (The suite
    runs with PJRT_HOST_CHECK_REPLAY=1: each call the lane takes is also
    keyed by the engine, and the two must agree.)  Before, every padded
    call took the engine's way."""
    _padding.reset()
    cpu, dev = _pair()
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        for t in (20, 27, 23, 25, 26):  # (the mean's division by the length is traced by then)
            _padded_lane_step(dev, cpu, t)
        moved = _padded_lane_step(dev, cpu, 22)
        assert moved["replayed"] >= 1 and moved["programs"] == 0, moved
        assert moved["padded_calls"] >= 20 and moved["lane_padded"] >= moved["padded_calls"] * 2 // 3, moved
        for t in (32, 19):
            _padded_lane_step(dev, cpu, t)


def test_a_padded_lane_keeps_how_a_call_lines_up_per_layout(monkeypatch):
    """A matmul's, a norm's or the loss's padded lane lines its call up as
    ``prepare`` does, once per layout of its arguments (each padded one's
    read, which holds its logical sizes; the exact ones' sizes; the other
    arguments): lengths seen before, the bucket's full size among them,
    take the kept answers and still give CPU's values (the engine checks
    every call the lane takes)."""
    from pjrt_host._torch import _dynamic_dims

    _padding.reset()
    cpu, dev = _pair()
    lined_up = []
    prepare = _dynamic_dims.PaddedLane._prepare
    monkeypatch.setattr(_dynamic_dims.PaddedLane, "_prepare",
                        lambda self, *a: lined_up.append(self.op.name) or prepare(self, *a))
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        # (a length's first step may record scripts; a later one takes their lanes)
        for t in (20, 27, 23, 25, 26, *(22, 32, 19, 26) * 2):
            _padded_lane_step(dev, cpu, t)
        assert lined_up, "no lane of a full rule took a call"
        for t in (22, 32, 19, 26):
            del lined_up[:]
            moved = _padded_lane_step(dev, cpu, t)
            assert moved["lane_padded"] > 0 and not lined_up, (t, lined_up)


def test_a_padded_lane_that_gave_other_shapes_would_fail_the_suite(monkeypatch):
    """The suite's net under the padded replay lane: a lane whose results'
    shapes or padding differ from the engine's raises at that call."""
    from pjrt_host._torch import _dynamic_dims, _fused

    assert _fused.CHECK
    _padding.reset()
    x = torch.randn(3, 20, 8)
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        for t in (20, 27, 23, 25):
            torch._dynamo.mark_dynamic(d := x[:, :1].expand(3, t, 8).contiguous().to("jax"), 1)
            (torch.softmax(d * 2.0 + 1.0, -1).sum(1) * 3.0).cpu()
        match = _dynamic_dims.PaddedLane.match

        def physical_shapes(self, *args):  # the lane's results said to be their buckets' size, exact
            found = match(self, *args)
            return None if found is None else ([(p, p, None) for _, p, _ in found[0]], found[1])

        monkeypatch.setattr(_dynamic_dims.PaddedLane, "match", physical_shapes)
        with pytest.raises(AssertionError, match="replay lane gave aten::"):
            for _ in range(3):
                d = x[:, :1].expand(3, 22, 8).contiguous().to("jax")
                torch._dynamo.mark_dynamic(d, 1)
                (torch.softmax(d * 2.0 + 1.0, -1).sum(1) * 3.0).cpu()
    monkeypatch.undo()
    torch.jax.synchronize()


def test_a_contraction_over_a_batch_padded_in_neither_input_runs_padded():
    # a merged batch and heads (3 x 2) against a batch of 6 made whole: the
    # batch is padded in neither, so its components differ without a cut
    # (fused eager cut the attention's backward bmm when tests before had
    # left one of its inputs made whole)
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        for t in (5, 9):
            a, b = torch.randn(3, 2, t, 8), torch.randn(6, 8, t)
            da, db = a.to("jax"), b.to("jax")
            torch._dynamo.mark_dynamic(da, 2)
            torch._dynamo.mark_dynamic(db, 2)
            got = torch.bmm((da * 1).reshape(6, t, 8), db * 1)
            torch.testing.assert_close(got.cpu(), torch.bmm(a.reshape(6, t, 8), b))
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["padded_calls"] >= 6


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_gather_along_a_dynamic_dim_wraps_negative_indices_by_its_logical_length(mode):
    # x[:, idx] over a padded length: -1 is the last logical position, not
    # the bucket's; generate()'s input_ids[:, cache_position] at a new prompt
    # length compiled its gather per length before index ran padded
    _padding.reset()
    torch.manual_seed(0)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (5, 9, 13, 7, 11, 14):
            x = torch.randn(2, t, 3)
            idx = torch.tensor([0, -1, t - 2, -t])
            dx = x.to("jax") * 1
            before = _compiled()
            got = dx[:, idx.to("jax")]
            everything = dx[:, torch.arange(t, device="jax") * 1]
            last = dx[:, :, torch.tensor([2, -1], device="jax")]
            torch.testing.assert_close(got.cpu(), x[:, idx])
            torch.testing.assert_close(everything.cpu(), x)
            torch.testing.assert_close(last.cpu(), x[:, :, torch.tensor([2, -1])])
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and stats["cuts"] == 0, (stats["fallbacks_by_reason"], stats["cuts_by_op"])
    assert compiled[3:] == [0, 0, 0], compiled  # 7, 11 and 14 run the bucket's programs


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_gather_along_a_flattened_padded_dim_reads_its_logical_positions(mode):
    # x.reshape(-1)[idx] where x's dims are padded: the flat dim holds each
    # row's padding after its logical elements, so logical position i is not
    # physical position i (fuzz seed 7048 under PJRT_HOST_DYNAMIC_SHAPES=all)
    with pjrt_host.config(dynamic_shapes="all", eager=mode):
        for shape in ((2, 4), (3, 5), (2, 3, 4)):
            x = torch.arange(math.prod(shape)).reshape(shape)
            idx = torch.tensor([3, -1, 4, 0, -2])
            for flat in (lambda t: t.reshape(-1), lambda t: t.flatten(0, 1), lambda t: t.transpose(0, 1).reshape(-1)):
                got = flat(x.to("jax") * 1)[idx.to("jax")]
                assert torch.equal(got.cpu(), flat(x)[idx]), (shape, got.cpu(), flat(x)[idx])


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_matmuls_free_dim_keeps_its_size_when_a_padded_dim_has_it_too(mode):
    """A projection's width of 16 beside rows that are [2 x length] with the
    length padded: at a length of 8 the rows' logical size is 16 as well,
    and the weight's columns took their padding, so the heads after the
    projection were padded along the head dim and the rotary multiply's
    program failed (a Llama with head dim 8 at a prompt of 8; it ran exact
    after the failure).  A free dim of a contraction meets nothing."""
    _padding.reset()
    torch.manual_seed(0)
    w, g = torch.randn(32, 16), torch.randn(16)
    gain = torch.nn.Parameter(g.to("jax"))  # (a parameter is never padded to line up)
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (12, 17, 21, 8):
            x, c = torch.randn(2, t, 32), torch.randn(1, 1, t, 8)
            heads = ((x.to("jax") * 1).reshape(-1, 32) @ w.to("jax")).view(2, t, 2, 8).transpose(1, 2)
            got = (heads * (c.to("jax") * 1)).transpose(1, 2).reshape(2, t, 16) * gain
            want = ((x.reshape(-1, 32) @ w).view(2, t, 2, 8).transpose(1, 2) * c).transpose(1, 2).reshape(2, t, 16) * g
            torch.testing.assert_close(got.detach().cpu(), want)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and stats["cuts"] == 0, (stats["fallbacks_by_reason"], stats["cuts_by_op"])
    assert stats["padded_calls"] > 0


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_every_other_element_stacked_back_runs_padded_both_ways(mode):
    """GPT-J's rotary ``rotate_every_two``: ``x[..., ::2]`` and
    ``x[..., 1::2]`` of activations padded along the length, stacked along
    a new last dim and flattened.  The stack lines its padded inputs up as
    an elementwise op does, and the slices' backward places the gradient at
    every other position of the exact head dim, keeping its padding; both
    cut their inputs at every length before (44 stacks and 46
    slice_backwards in 7 steps of a GPT-J of variable lengths)."""
    _padding.reset()
    torch.manual_seed(0)
    compiled = []

    def rotate(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (5, 9, 13, 7, 11, 14):
            x, w = torch.randn(2, t, 8), torch.randn(2, t, 8)
            dx = (x.to("jax") * 1).requires_grad_()
            before = _compiled()
            got = rotate(dx)
            (got * w.to("jax")).sum().backward()
            xc = x.clone().requires_grad_()
            (rotate(xc) * w).sum().backward()
            torch.testing.assert_close(got.detach().cpu(), rotate(x))
            torch.testing.assert_close(dx.grad.cpu(), xc.grad)
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert not {"aten::stack", "aten::slice_backward"} & set(stats["cuts_by_op"]), stats["cuts_by_op"]
    assert compiled[3:] == [0, 0, 0], compiled  # 7, 11 and 14 run the bucket's programs


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_values_put_along_an_exact_dim_run_padded_along_the_others(mode):
    """The backward of ``qkv[:, :, [-2]]`` (Falcon's keys) is index_put of
    the gradient, padded along the length, into zeros: the values' other
    dims are the tensor's, so the zeros are padded alike and the padded
    gradient lands in their padding.  It cut its inputs at every length
    (22 cuts in 7 steps of a Falcon of variable lengths).  A put that
    overwrites does too; values put by a padded index stay exact (its
    padding would write position 0)."""
    _padding.reset()
    torch.manual_seed(0)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (5, 9, 13, 7, 11, 14):
            x, w = torch.randn(2, t, 4, 3), torch.randn(2, t, 1, 3)
            dx = (x.to("jax") * 1).requires_grad_()
            before = _compiled()
            got = dx[:, :, [-2]]
            (got * w.to("jax")).sum().backward()
            put = torch.ops.aten.index_put(x.to("jax") * 1, [None, None, torch.tensor([1], device="jax")], w.to("jax") * 1)
            xc = x.clone().requires_grad_()
            (xc[:, :, [-2]] * w).sum().backward()
            torch.testing.assert_close(got.detach().cpu(), x[:, :, [-2]])
            torch.testing.assert_close(dx.grad.cpu(), xc.grad)
            torch.testing.assert_close(put.cpu(), torch.ops.aten.index_put(x, [None, None, torch.tensor([1])], w))
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert "aten::index_put" not in stats["cuts_by_op"], stats["cuts_by_op"]
    assert compiled[3:] == [0, 0, 0], compiled  # 7, 11 and 14 run the bucket's programs


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_cache_whose_heads_merged_two_dims_joins_a_new_tokens_heads(mode):
    """Falcon's key/value cache: its heads are key/value heads x their
    groups (2 x 2) merged by a reshape, a new token's are 4.  Neither is
    padded along the heads, so the cat joins them in buckets; it ran as
    "inputs that do not line up" and cut the cache at every token (8 cuts in
    a generate() of 5 prompts), and a cache that then crossed into the next
    bucket laid out the wrong axis of its array (an error, not a result)."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (5, 9, 13, 7, 11):
            x = torch.randn(2, t, 2, 2, 8)
            cache = (x.to("jax") * 1).permute(0, 2, 3, 1, 4).reshape(2, 4, t, 8)
            want = x.permute(0, 2, 3, 1, 4).reshape(2, 4, t, 8)
            for _ in range(12):  # decoding: the cache crosses into the next bucket
                token = torch.randn(2, 1, 4, 8)
                cache = torch.cat([cache, (token.to("jax") * 1).transpose(1, 2)], dim=-2)
                want = torch.cat([want, token.transpose(1, 2)], dim=-2)
            torch.testing.assert_close(cache.cpu(), want)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and stats["cuts"] == 0, (stats["fallbacks_by_reason"], stats["cuts_by_op"])


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_view_merging_a_padded_batch_with_part_of_an_exact_dim_reads_padded(eager):
    # MobileViT's attention: patches of (batch x 4, 24) viewed as (batch x 4
    # x 4, 1, 6), the head dim split off the channels and its outer part
    # merged with the padded batch: not a physical view before, so every
    # matmul of its attention cut (bmm 125 times in 7 steps) and compiled per
    # batch; now the rows are the padded batch, 4 and 4 as one dim
    _padding.reset()
    torch.manual_seed(0)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for b in (2, 3, 5, 7, 6):
            a, w = torch.randn(b * 4, 24), torch.randn(6, 6)
            x = a.to("jax")
            torch._dynamo.mark_dynamic(x, 0)
            x = x * 1
            before = _compiled()
            q = x.view(b * 16, 1, 6)
            scores = q @ q.transpose(1, 2)  # bmm of rows that merged batch, 4 and 4
            mixed = (q @ w.to("jax")).view(b * 4, 24)  # the same view as mm's operand
            torch.testing.assert_close(scores.cpu(), a.view(b * 16, 1, 6) @ a.view(b * 16, 1, 6).transpose(1, 2))
            torch.testing.assert_close(mixed.cpu(), (a.view(b * 16, 1, 6) @ w).view(b * 4, 24))
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])
    assert compiled[3:] == [0, 0], compiled


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_rows_merged_from_a_padded_batch_meet_however_their_exact_parts_split(mode):
    """A weight's gradient contracts rows that merged a padded batch with
    exact dims, split as batch x 8 x 8 in one operand and batch x 64 in the
    other (Swin's and SegFormer's patches): the same layout, which the
    contraction took for two and ran cut at every batch size."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for b in (2, 3, 5, 7, 6, 4):
            x, y = torch.randn(b, 8, 8, 4), torch.randn(b, 64, 3)
            got = (x.to("jax") * 1).reshape(-1, 4).t() @ (y.to("jax") * 1).reshape(-1, 3)
            torch.testing.assert_close(got.cpu(), x.reshape(-1, 4).t() @ y.reshape(-1, 3), rtol=1e-5, atol=1e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["padded_calls"] > 0
    assert stats["fallbacks"] == 0 and stats["cuts"] == 0, (stats["fallbacks_by_reason"], stats["cuts_by_op"])


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_gathers_backward_runs_padded_along_the_dynamic_dim(mode):
    """gather's backward is scatter_add into zeros: over a padded length
    (DeBERTa's relative positions gather along the sequence) its padded
    index (0) adds its padded gradient (0) at position 0, so it runs in the
    bucket's program instead of cutting its inputs at every length; the
    gradients equal CPU's, as does a scatter_add of a source shorter than
    the tensor."""
    _padding.reset()
    torch.manual_seed(0)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for t in (5, 9, 13, 7, 11, 14):
            x = torch.randn(2, t, 3)
            idx = torch.randint(0, t, (2, t, 3))
            w = torch.randn(2, t, 3)
            dx = (x.to("jax") * 1).requires_grad_()
            before = _compiled()
            (dx.gather(1, idx.to("jax") * 1) * w.to("jax")).sum().backward()
            rows = torch.randint(0, t, (2, 2, 3))
            part = torch.randn(2, 2, 3)
            got = (x.to("jax") * 1).scatter_add(1, rows.to("jax"), part.to("jax"))
            xc = x.clone().requires_grad_()
            (xc.gather(1, idx) * w).sum().backward()
            torch.testing.assert_close(dx.grad.cpu(), xc.grad)
            torch.testing.assert_close(got.cpu(), x.scatter_add(1, rows, part))
            compiled.append(_compiled() - before)
    stats = torch.jax.dynamic_shape_stats()
    assert "aten::scatter_add" not in stats["cuts_by_op"], stats["cuts_by_op"]
    assert compiled[3:] == [0, 0, 0], compiled  # 7, 11 and 14 run the bucket's programs


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_a_gather_by_several_index_tensors_runs_padded(mode):
    """x[i, j] with integer index tensors that broadcast, as transformers
    builds its masks (``padding_mask[batch[:, None, None, None],
    positions[None, None, None, :]]``): a padded tensor and a padded
    position index give a padded result, negative indices count from the
    logical end of their dim, and an index beside a slice gathers there.
    Each such call cut its inputs and ran exact at every length (a GPT-2
    training step of a new length compiled its mask programs again)."""
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager=mode):
        for n in (9, 13, 11):
            mask = torch.arange(3 * n).reshape(3, n) % 5 != 0
            values = torch.arange(3 * n * 4, dtype=torch.float32).reshape(3, n, 4)
            dmask, dvalues = mask.to("jax"), values.to("jax")
            torch._dynamo.mark_dynamic(dmask, 1)
            torch._dynamo.mark_dynamic(dvalues, 1)
            dmask, dvalues = dmask | False, dvalues * 1
            batch, pos = torch.arange(3), torch.arange(n)
            dpos = torch.arange(n, device="jax")
            torch._dynamo.mark_dynamic(dpos, 0)
            dpos = dpos * 1
            dbatch = batch.to("jax")
            got = dmask[dbatch[:, None, None, None], dpos[None, None, None, :]]
            assert got._storage.padded is not None
            assert torch.equal(got.cpu(), mask[batch[:, None, None, None], pos[None, None, None, :]])
            back = torch.tensor([-1, 0, -n])
            assert torch.equal(dvalues[dbatch[:, None], back.to("jax")[None, :]].cpu(),
                               values[batch[:, None], back[None, :]])
            assert torch.equal(dvalues[dbatch[:, None], dpos[None, :2] - 3].cpu(), values[batch[:, None], pos[None, :2] - 3])
            assert torch.equal(dvalues[dbatch, :, back.to("jax") % 4].cpu(), values[batch, :, back % 4])
    stats = torch.jax.dynamic_shape_stats()
    assert "aten::index.Tensor" not in stats["cuts_by_op"], stats["cuts_by_op"]
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]


def test_off_every_length_compiles_its_own_programs():
    with pjrt_host.config(dynamic_shapes=False):
        compiled = _run_lengths([20, 23, 27], check=False)
    # op by op, each op's programs (more than 10); fused, each segment's
    # (its factories and index checks recorded into them: 3 or more)
    assert all(c >= 3 for c in compiled), compiled


def test_odd_buckets_on_every_dim_never_show_in_a_value():
    # the oracle mode: every dim of every input padded, to odd sizes
    _padding.reset()
    with pjrt_host.config(dynamic_shapes="all"):
        _run_lengths([5, 9, 1, 12])
    assert torch.jax.dynamic_shape_stats()["padded_calls"] > 50


def test_views_reductions_and_merges_see_logical_values_only():
    torch.manual_seed(1)
    with pjrt_host.config(dynamic_shapes="all"):
        for n in (3, 6, 11):
            x = torch.randn(4, n, 6)
            d = x.to("jax")
            d = d * 1.0  # padded from here on
            checks = {
                "sum": lambda z: z.sum(1),
                "mean": lambda z: z.mean(),
                "amax": lambda z: z.amax(1),
                "softmax": lambda z: torch.softmax(z, 1),
                "log_softmax": lambda z: torch.log_softmax(z, 1),
                "cumsum": lambda z: z.cumsum(1),
                "merge": lambda z: z.reshape(-1, 6) @ torch.ones(6, 2, device=z.device),
                "contract": lambda z: z.transpose(1, 2) @ z,
                "last": lambda z: z[:, -1],
                "shifted": lambda z: z[:, :-1].sum(1),
                "cat": lambda z: torch.cat([z, z * 2], dim=2),
                "argmax": lambda z: z.argmax(1),
                "sort": lambda z: z.sort(1).values,
                "item": lambda z: z.sum(),
            }
            for name, f in checks.items():
                torch.testing.assert_close(f(d).cpu(), f(x), msg=name, rtol=1e-5, atol=1e-5)


def test_mark_dynamic_pads_at_the_first_call():
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        x = torch.randn(2, 37, 5, device="jax")
        torch._dynamo.mark_dynamic(x, 1)  # read at the op's next new signature
        y = torch.softmax(x * 3, -1)
        assert y._storage.padded is not None
        torch.testing.assert_close(y.cpu(), torch.softmax(x.cpu() * 3, -1))
    assert torch.jax.dynamic_shape_stats()["pads"] == 1


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_mark_dynamic_adds_a_dim_to_a_tensor_padded_along_another(eager):
    """A tensor padded along its length, then marked dynamic along its
    batch too: the next padded call's miss lays it out wider along the
    batch, so that another batch of the bucket compiles nothing.  Before,
    only an exact tensor was padded for a mark, and each batch size
    compiled the padded programs again."""
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        x = torch.randn(5, 37)
        dx = x.to("jax")
        torch._dynamo.mark_dynamic(dx, 1)
        y = dx * 2
        padded = dx._storage.padded
        assert padded is not None and padded[1][0][2] and not padded[0][0][2]
        torch.testing.assert_close(y.cpu(), x * 2)
        torch._dynamo.mark_dynamic(dx, 0)
        z = torch.softmax(dx, 1)
        assert dx._storage.padded[0][0][2] and dx._storage.padded[1] == padded[1]
        torch.testing.assert_close(z.cpu(), torch.softmax(x, 1))
        other = torch.randn(6, 39)
        d = other.to("jax")
        torch._dynamo.mark_dynamic(d, 0)
        torch._dynamo.mark_dynamic(d, 1)
        (d + 0).cpu()  # padded along both (an exact tensor's marks)
        before = _compiled()
        got = torch.softmax(d, 1).cpu()
        assert _compiled() == before, "another batch of the bucket compiled"
        torch.testing.assert_close(got, torch.softmax(other, 1))


def _cnn(batch_norm: bool) -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8) if batch_norm else nn.Identity(),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(), nn.AvgPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_convolutions_and_poolings_run_padded_along_the_batch(eager):
    """A CNN at batches of new sizes (the last batch of an epoch, a
    serving queue): convolutions, poolings, their backwards and batch norm
    with running statistics compute each sample alone, and batch norm in
    training takes its statistics over the logical samples, so from the
    third size on the batch is padded and a new batch of the bucket
    compiles nothing.  Before, convolution cut its input, and every batch
    size compiled the model's programs again.  Values, and a training
    step's parameters and running statistics, as CPU's."""
    import copy

    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for batch_norm, train in ((True, False), (False, True), (True, True)):
            cpu = _cnn(batch_norm).train(train)
            dev = copy.deepcopy(cpu).to("jax")
            opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, dev)]
            for i, b in enumerate((2, 3, 5, 7, 6)):
                x, y = torch.randn(b, 3, 12, 12), torch.randint(0, 10, (b,))
                before = _compiled()
                if train:
                    for model, opt, dx, dy in ((cpu, opts[0], x, y), (dev, opts[1], x.to("jax"), y.to("jax"))):
                        F.cross_entropy(model(dx), dy).backward()
                        opt.step()
                        opt.zero_grad()
                    # (the parameters and batch norm's running statistics)
                    for (name, p), q in zip(dev.state_dict().items(), cpu.state_dict().values()):
                        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=name)
                else:
                    with torch.no_grad():
                        torch.testing.assert_close(dev(x.to("jax")).cpu(), cpu(x), rtol=1e-5, atol=1e-6)
                if i >= 3:
                    assert _compiled() == before, f"batch {b} compiled ({'training' if train else 'eval'})"
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])


class _Windows(torch.nn.Module):
    """A Swin-like classifier: patches, the feature map padded to whole
    windows along its height and width (by nothing at some sizes), a layer
    norm, windows joined and pooled as Swin's pooler pools (a transposed
    sequence to one: torch restrides that result in place, and autograd's
    backward of it copies the gradient into a flat zeros), a resampling
    joined along the channels, a mean loss."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = torch.nn.Conv2d(3, 8, 2, stride=2)
        self.norm = torch.nn.LayerNorm(8)
        self.pool = torch.nn.AdaptiveAvgPool1d(1)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patches(x)  # (B, 8, 6, 6)
        h = F.pad(p.permute(0, 2, 3, 1), (0, 0, 0, 2, 0, 2))  # whole windows of 4
        h = F.pad(h, (0, 0, 0, 0, 0, 0))  # windows already whole
        h = self.norm(h).flatten(1, 2)  # (B, 64, 8)
        # a decoder's resampling, joined along the channels (SegFormer's):
        # its backward reads a channel slice of the join's gradient
        up = F.interpolate(p, scale_factor=2, mode="bilinear")
        decoded = torch.cat([up, 0.5 * up], 1).mean((2, 3))[:, :10]
        return self.head(self.pool(h.transpose(1, 2)).flatten(1)) + decoded


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_window_model_runs_padded_along_the_batch(eager):
    """constant_pad_nd along exact dims of a batch-padded tensor, a mean of
    all elements, the pooler's restrided result's backward (a padded
    gradient copied into all of an exact storage) and a resampling and its
    backward (over the bucket's whole batch) run padded: before, each cut (Swin's at every new batch: a pad, then the
    matmuls after it, whose inputs no longer lined up, and the gradient's
    copy, and a zeros of the gradient's size made for it), and every batch
    size compiled the model's programs again."""
    import copy

    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        cpu = _Windows()
        dev = copy.deepcopy(cpu).to("jax")
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, dev)]
        # (sizes of their own per mode: a backward's zeros of a size seen
        # before is a program's second call, which compiles it)
        for i, b in enumerate((2, 3, 5, 7, 6, 4, 9) if eager == "op" else (3, 2, 6, 5, 8, 10, 12)):
            x, y = torch.randn(b, 3, 12, 12), torch.randint(0, 10, (b,))
            before = _compiled()
            for model, opt, dx, dy in ((cpu, opts[0], x, y), (dev, opts[1], x.to("jax"), y.to("jax"))):
                out = model(dx)
                (F.cross_entropy(out, dy) + out.pow(2).mean()).backward()
                opt.step()
                opt.zero_grad()
            for (name, p), q in zip(dev.state_dict().items(), cpu.state_dict().values()):
                torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=name)
            up = F.interpolate(x.to("jax"), scale_factor=2, mode="bilinear")
            torch.testing.assert_close(up.cpu(), F.interpolate(x, scale_factor=2, mode="bilinear"))
            # (the loss's counts become run-time scalars by the fifth batch)
            if i >= 5:
                assert _compiled() == before, f"batch {b} compiled"
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])


def test_a_compiled_batch_norm_step_runs_padded_with_its_logical_samples():
    """Batch norm's training lowering and its backward count the logical
    samples from the mask eager's padded route gives them; a padded
    compiled graph gives none, and with the batch padded their statistics
    counted the padding: a compiled training step's gradients were off by
    0.28.  Such an op then kept its graph per shape; a padded graph now
    gives each op with a rule the masks eager gives it, and the forward
    writes the running statistics into the module's buffers (exact values
    into exact inputs, which made it compile per shape): one forward and
    one backward program for the batches 3, 5 and 7, with CPU's gradients
    and running statistics."""
    import copy

    _padding.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    dev = copy.deepcopy(cpu).to("jax")

    def step(model, x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    compiled = torch.compile(step, backend="jax")
    with pjrt_host.config(dynamic_shapes=True):
        for b in (3, 5, 7):
            x = torch.randn(b, 3, 8, 8)
            dx = x.to("jax")
            torch._dynamo.mark_dynamic(dx, 0)
            compiled(dev, dx)
            step(cpu, x)
            for p, q in zip(dev.parameters(), cpu.parameters()):
                torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)
                p.grad = q.grad = None
            for p, q in zip(dev.buffers(), cpu.buffers()):
                torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 2, stats


def test_a_compiled_graph_writes_exact_inputs_in_buckets_and_padded_ones_per_shape():
    """A symbolic graph that writes into its inputs: a counter of fixed
    shape takes its new value from the bucket's program; an input of the
    symbolic size (which the program holds padded) makes the graph compile
    per shape, named, with CPU's values either way."""
    torch._dynamo.reset()
    _padding.reset()

    def count(x, total):
        total.add_(x.sum())
        return x * 2

    def scale(x):
        x.mul_(2)
        return x.sum()

    counting = torch.compile(count, backend="jax")
    scaling = torch.compile(scale, backend="jax")
    total, dtotal = torch.zeros(3), torch.zeros(3, device="jax")
    with pjrt_host.config(dynamic_shapes=True):
        for n in (5, 7, 9, 11):
            x = torch.randn(n, 3)
            dx = x.to("jax")
            torch._dynamo.mark_dynamic(dx, 0)  # (the counter's size stays a number)
            torch.testing.assert_close(counting(dx, dtotal).cpu(), count(x, total))
            torch.testing.assert_close(dtotal.cpu(), total)
            dx, cx = x.to("jax"), x.clone()
            torch._dynamo.mark_dynamic(dx, 0)
            torch.testing.assert_close(scaling(dx).cpu(), scale(cx))
            torch.testing.assert_close(dx.cpu(), cx)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["graph_programs"] == 1, stats  # count's, for the bucket of 16
    reasons = stats["fallbacks_by_reason"]
    assert list(reasons) == ["torch.compile inference graph: it writes into an input with a symbolic size"], reasons


def test_a_compiled_eval_batch_norm_runs_in_buckets():
    """Eval batch norm's saved statistics are empty as the lowering (and
    torch CPU) makes them, where torch's meta kernel says full-size: the
    padded graph refused the shape ("a result of physical shape (0,)") and a
    compiled CNN's inference compiled per batch.  An empty result holds no
    padding and takes the lowering's shape, as eager's padded route does."""
    import copy

    torch._dynamo.reset()
    _padding.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Flatten(1)).eval()
    dev = copy.deepcopy(cpu).to("jax")
    compiled = torch.compile(lambda x: dev(x).sum(1), backend="jax")
    with pjrt_host.config(dynamic_shapes=True), torch.no_grad():
        for b in (2, 3, 5, 7, 6):
            x = torch.randn(b, 3, 6, 6)
            torch.testing.assert_close(compiled(x.to("jax")).cpu(), cpu(x).sum(1))
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 1, stats


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_selects_gradient_keeps_the_batch_padded(eager):
    """``x[:, i]`` of a tensor padded along its batch (a ViT's class token):
    its backward puts the gradient back at position i, zeros around it
    there, the batch padded as it was.  select_backward cut the gradient,
    and the steps of a ViT at new batch sizes compiled 2 programs each."""
    _padding.reset()
    torch.manual_seed(0)
    w = torch.randn(4)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for b, i in ((2, 0), (3, -2), (5, 8), (7, -9)):
            x = torch.randn(b, 9, 4, requires_grad=True)
            dx = x.detach().to("jax").requires_grad_()
            torch._dynamo.mark_dynamic(dx, 0)
            (x[:, i] * w).sum().backward()
            ((dx * 1.0)[:, i] * w.to("jax")).sum().backward()
            assert dx.grad._storage.padded is not None
            torch.testing.assert_close(dx.grad.cpu(), x.grad)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])
    # a position or dim out of range raises CPU's error, padded or not (it returned a gradient)
    g = torch.randn(5, 4)
    for bad in ((1, 9), (1, -10), (3, 0), (-4, 0)):
        with pytest.raises(IndexError) as cpu:
            torch.ops.aten.select_backward(g, [5, 9, 4], *bad)
        with pytest.raises(IndexError) as dev:
            torch.ops.aten.select_backward(g.to("jax"), [5, 9, 4], *bad)
        assert str(dev.value) == str(cpu.value)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_flip_along_exact_dims_runs_padded_and_along_a_padded_dim_exact(eager):
    # flip keeps every other dim's padding at its end; a padded dim it
    # reverses would put its padding first, so that call runs exact
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        x = torch.randn(3, 9, 5)
        dx = x.to("jax") * 1
        torch._dynamo.mark_dynamic(dx, 1)
        y = (dx * 2).flip(0, 2)
        assert y._storage.padded is not None
        torch.testing.assert_close(y.cpu(), (x * 2).flip(0, 2))
        assert torch.jax.dynamic_shape_stats()["cuts"] == 0
        torch.testing.assert_close((dx * 2).flip(1).cpu(), (x * 2).flip(1))
        w = x.clone().requires_grad_()
        dw = dx.detach().clone().requires_grad_()
        torch._dynamo.mark_dynamic(dw, 1)
        (w.flip(-1) * torch.arange(5.0)).cumsum(1).sum().backward()
        (dw.flip(-1) * torch.arange(5.0, device="jax")).cumsum(1).sum().backward()
        torch.testing.assert_close(dw.grad.cpu(), w.grad)
    assert torch.jax.dynamic_shape_stats()["cuts_by_op"].get("aten::flip", 0) >= 1  # flip(1) only


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_operands_padded_along_different_dims_run_padded(eager):
    # A gradient padded along its batch as well as its length meets a
    # tensor padded along the length only (in a long process, the batch dim
    # of a backward's add became dynamic in other models): in an
    # elementwise op the second is padded along the batch too
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        x, y = torch.randn(3, 9, 5), torch.randn(3, 9, 5)
        dx, dy = x.to("jax"), y.to("jax")
        torch._dynamo.mark_dynamic(dx, 0)
        torch._dynamo.mark_dynamic(dy, 1)
        torch.testing.assert_close((dx * dy).sum(1).cpu(), (x * y).sum(1))
        torch.testing.assert_close((dx + dy).cpu(), x + y)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_reshape_that_merges_part_of_an_exact_dim_with_a_padded_one_lines_up_with_exact_tensors(eager):
    # (4, 2) padded along its last dim, viewed as (2, 4): the new last dim is
    # two rows of the exact dim times the padded one.  Its read named the
    # padded component only, so an exact (2, 4) tensor beside it in an
    # elementwise op was padded to (2, 2) and the op raised numpy's
    # ValueError (fuzz run N, seed 13003848 after 13003829: inside a backward)
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        x, y = torch.randn(4, 2), torch.randn(2, 4)
        dx, dy = x.to("jax"), y.to("jax")
        torch._dynamo.mark_dynamic(dx, 1)
        dz = dx * 1
        assert dz._storage.padded is not None
        torch.testing.assert_close((dz.view(2, 4) * dy).cpu(), x.view(2, 4) * y)
        torch.testing.assert_close((dy + dz.reshape(2, 4)).cpu(), y + x.reshape(2, 4))


def test_a_head_dim_as_long_as_the_padded_length_is_not_padded():
    # attention over a growing key/value cache at a length equal to the
    # head dim (32, in the bucket of 48): the size alone matched the head
    # dim to the length's padding, the merged heads became 192 wide against
    # the projection's 128, and the program failed at every call.  A
    # contraction pads an exact operand along the dims it meets (its rule's
    # align), not by size: no call falls back (before, the ambiguous size
    # ran the call exact at that length)
    _padding.reset()
    torch.manual_seed(0)
    w = torch.randn(128, 128)
    k, v = torch.randn(4, 24, 32), torch.randn(4, 24, 32)
    with pjrt_host.config(dynamic_shapes=True):
        dw, dk, dv = w.to("jax"), k.to("jax"), v.to("jax")
        for _ in range(10):  # lengths 25 .. 34
            q, nk, nv = torch.randn(4, 1, 32), torch.randn(4, 1, 32), torch.randn(4, 1, 32)
            k, v = torch.cat([k, nk], 1), torch.cat([v, nv], 1)
            dk, dv = torch.cat([dk, nk.to("jax")], 1), torch.cat([dv, nv.to("jax")], 1)
            att = torch.softmax(q.to("jax") @ dk.transpose(1, 2), -1)
            out = (att @ dv).transpose(0, 1).reshape(1, 128) @ dw
            want = (torch.softmax(q @ k.transpose(1, 2), -1) @ v).transpose(0, 1).reshape(1, 128) @ w
            torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)
        assert dk._storage.padded is not None
    reasons = torch.jax.dynamic_shape_stats()["fallbacks_by_reason"]
    assert not reasons, reasons


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_tensor_padded_to_meet_a_padded_one_lines_up_the_tensors_meeting_it(eager):
    """Attention's backward as a GPT-2 training step gave it: the output's
    gradient padded along the length, the query, key, value and the bool
    mask exact.  The query is padded to meet the gradient, and the mask's
    rows meet the query: they are padded too, whatever their order in the
    call.  They were not (the query's padded copy was looked for under the
    query's own id), the program could not be traced and every such call
    compiled twice, falling back to run exact."""
    _padding.reset()
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(2, 4, 27, 16, generator=g) for _ in range(4))
    mask = torch.rand(2, 1, 27, 27, generator=g) > 0.3
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        dgrad = grad.to("jax")
        torch._dynamo.mark_dynamic(dgrad, 2)
        dgrad = torch.sin(dgrad)
        assert dgrad._storage.padded is not None
        got = torch.ops.pjrt_host.attention_backward(dgrad, q.to("jax"), k.to("jax"), v.to("jax"), mask.to("jax"),
                                                      None, 0.0, False, 0.25, False)
        got = [t.cpu() for t in got]
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and stats["padded_calls"] >= 2, stats["fallbacks_by_reason"]
    with pjrt_host.config(dynamic_shapes=False):
        want = torch.ops.pjrt_host.attention_backward(torch.sin(grad.to("jax")), q.to("jax"), k.to("jax"),
                                                       v.to("jax"), mask.to("jax"), None, 0.0, False, 0.25, False)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("eager", ["op", "fused"])
@pytest.mark.parametrize("mask", [None, "float", "bool"])
def test_attention_over_a_padded_cache_is_one_op_per_bucket(eager, mask):
    """scaled_dot_product_attention over a growing key/value cache (as
    generate() decodes): once the cache is padded, attention is the one op
    (torch's composite ran about 20 ops a call on it), which masks the key
    positions past the logical length itself; it compiles once per bucket,
    never cuts the cache, and gives CPU's values (an explicit mask of the
    logical length too, float or bool)."""
    _padding.reset()
    torch.manual_seed(0)
    k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        dk, dv = k.to("jax"), v.to("jax")
        compiled, ops = [], []
        for step in range(30):  # lengths 4 .. 33
            q, nk, nv = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
            k, v = torch.cat([k, nk], -2), torch.cat([v, nv], -2)
            dk, dv = torch.cat([dk, nk.to("jax")], -2), torch.cat([dv, nv.to("jax")], -2)
            m = None
            if mask == "float":
                m = torch.where(torch.arange(k.shape[-2]) % 3 == 1, -1e9, 0.0).view(1, 1, 1, -1)
            elif mask == "bool":
                m = (torch.arange(k.shape[-2]) % 3 != 1).view(1, 1, 1, -1)
            before = _compiled()
            got = []
            ops.append(_count_ops(lambda: got.append(F.scaled_dot_product_attention(
                q.to("jax"), dk, dv, None if m is None else m.to("jax")).cpu())))
            compiled.append(_compiled() - before)
            torch.testing.assert_close(got[0], F.scaled_dot_product_attention(q, k, v, m), rtol=1e-5, atol=1e-6)
        assert dk._storage.padded is not None
    padded_steps = [i for i, names in enumerate(ops) if "pjrt_host::attention" in names]
    assert padded_steps and all("aten::bmm" not in ops[i] for i in padded_steps), ops[-1]
    assert not any(compiled[13:28]), str(compiled)  # lengths 17 .. 31: in the bucket of 32, compiled at 16
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_causal_attention_over_padded_lengths_trains_as_on_cpu(eager):
    """Causal self-attention as a training step runs it, over lengths that
    change (a dimension marked dynamic): the one op forward and backward
    reads the padded query, key and value, and the values and gradients are
    CPU's at every length."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        _causal_attention_trains_as_on_cpu()
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


def _causal_attention_trains_as_on_cpu() -> None:
    """Causal attention's training step over lengths 5, 9, 12 marked
    dynamic: one op each way over the padded inputs, CPU's gradients."""
    for n in (5, 9, 12):
        q, k, v = (torch.randn(2, 2, n, 8, requires_grad=True) for _ in range(3))
        w = torch.randn(2, 2, n, 8)
        dq, dk, dv = (t.detach().to("jax").requires_grad_() for t in (q, k, v))
        for t in (dq, dk, dv):
            torch._dynamo.mark_dynamic(t, 2)
        dq2, dk2, dv2 = dq * 1, dk * 1, dv * 1  # padded from here on
        assert dk2._storage.padded is not None
        names = _count_ops(lambda: (F.scaled_dot_product_attention(dq2, dk2, dv2, is_causal=True)
                                  * w.to("jax")).sum().backward())
        (F.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum().backward()
        assert "pjrt_host::attention" in names and "pjrt_host::attention_backward" in names, names
        for got, want in ((dq.grad, q.grad), (dk.grad, k.grad), (dv.grad, v.grad)):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_gradients_expand_is_read_wider_only_where_its_forward_was_padded(eager):
    """Backward ops run on autograd's thread, where no line of user code is
    on the stack: counting their sizes there would pool every backward's.
    Sums over tensors of three head counts, then attention whose lengths are
    dynamic: the gradient of its sum is padded along the length its forward
    read padded, never along the heads, which three other gradients had
    given three sizes (attention's backward keeps its head dim exact: it
    ran cut before).  Values and gradients are CPU's."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        # exact sums, each on its own line: only their gradients' expands meet
        xs = [torch.randn(2, heads, 4, 8).to("jax").requires_grad_() for heads in (1, 3, 5)]
        (xs[0] * 2).sum().backward()
        (xs[1] * 2).sum().backward()
        (xs[2] * 2).sum().backward()
        assert all(x.grad._storage.padded is None for x in xs)
        _causal_attention_trains_as_on_cpu()
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("mask", [None, "full", "broadcast"])
@pytest.mark.parametrize("dims", [[1, 2], [0, 1, 2]], ids=["heads", "batch+heads"])
def test_attention_lines_its_operands_up_with_one_padded_along_batch_or_heads(mask, dims):
    """Attention's operands meet along the batch and the heads as well as
    along their lengths and head dims: a query (forward) or an output's
    gradient (backward) padded along them lines the others up with it,
    where the program failed on the shapes and the call ran cut."""
    _padding.reset()
    torch.manual_seed(0)
    n = 9
    q, k, v, g = (torch.randn(2, 2, n, 8) for _ in range(4))
    m = None if mask is None else torch.randn(2, 2, n, n) if mask == "full" else torch.randn(1, 2, 1, n)
    with pjrt_host.config(dynamic_shapes=True):
        dq, dk, dv, dg = (t.to("jax") for t in (q, k, v, g))
        for t in (dk, dv):
            torch._dynamo.mark_dynamic(t, 2)
        torch._dynamo.mark_dynamic(dq, dims)
        torch._dynamo.mark_dynamic(dg, dims)
        dq, dk, dv, dg = dq * 1, dk * 1, dv * 1, dg * 1
        dm = None if m is None else m.to("jax")
        out = F.scaled_dot_product_attention(dq, dk, dv, dm)
        grads = torch.ops.pjrt_host.attention_backward(dg, dq, dk, dv, dm, None, 0.0, False, None, False)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qq, kk, vv, m)
    want.backward(g)
    torch.testing.assert_close(out.cpu(), want.detach(), rtol=1e-4, atol=1e-5)
    for got, w in zip(grads, (qq.grad, kk.grad, vv.grad)):
        torch.testing.assert_close(got.cpu(), w, rtol=1e-4, atol=1e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_attention_with_dropout_over_padded_lengths_makes_its_causal_mask_padded(eager):
    """Attention with dropout over inputs padded along their head dim too
    (the oracle's every dim padded) runs torch's composite, whose causal
    mask is ``ones(L, S)`` of the inputs' lengths: it is made
    padded at once (its line first runs when the inputs are padded, so it
    was exact for two more lengths, and GPT-2's default config compiled its
    segments again in each bucket).  A second length of a bucket compiles
    nothing, and every length draws what the exact run of its seed draws."""
    _padding.reset()
    made = []
    for n in (33, 37, 41):
        x = torch.randn(3, 2, n, 8)
        with pjrt_host.config(dynamic_shapes=False):
            # exact: mark_dynamic below decides what is padded
            inputs = [(x * c).to("jax") for c in (1.0, 0.5, 2.0)]
        outs = {}
        for mode in (False, True):
            with pjrt_host.config(dynamic_shapes=mode, eager=eager):
                q, k, v = inputs
                if mode:
                    for t in (q, k, v):
                        torch._dynamo.mark_dynamic(t, 2)
                        torch._dynamo.mark_dynamic(t, 3)
                    q, k, v = q * 1, k * 1, v * 1  # padded from here on
                    assert all(t._storage.padded[3][0][0] > 8 for t in (q, k, v))
                    before = _compiled()
                torch.manual_seed(n)
                outs[mode] = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True).cpu()
                if mode:
                    made.append(_compiled() - before)
        torch.testing.assert_close(outs[True], outs[False])
    # (fused eager: the first length's segment broke where its inputs were
    # first padded, so the second length records the whole one once)
    assert made[1:] == [0, 0] if eager == "op" else made[2:] == [0], made
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("eager", ["op", "fused"])
@pytest.mark.parametrize("case", ["causal", "cross gqa"])
def test_attention_with_dropout_over_padded_lengths_is_one_op_drawing_as_exact(eager, case):
    """Attention with dropout over padded inputs is the one op forward and
    backward: dropout's mask (``pjrt_host::attention_keep``) is padded with
    the query's and key's lengths, each logical weight dropped as the exact
    run of the seed drops it.  It took torch's composite over padded inputs
    until 2026-12-01, whose forward layer segments compiled again in every
    bucket of GPT-2's default config (dropout 0.1).  A second length of a
    bucket compiles nothing op by op, a third nothing in fused eager."""
    _padding.reset()
    made = []
    # lengths no other case of this test ran at these lines: a size that ran
    # exact at a place stays exact there (_padding.runs_padded)
    # (queries and keys, n + 6, inside bucket 48)
    for n in (33, 37, 41) if eager == "op" else (34, 36, 39):
        heads_k, lk = (2, n + 6) if case == "cross gqa" else (4, n)
        g = torch.Generator().manual_seed(n)
        inputs = (torch.randn(3, 4, n, 8, generator=g), torch.randn(3, heads_k, lk, 8, generator=g),
                  torch.randn(3, heads_k, lk, 8, generator=g))
        weights = torch.randn(3, 4, n, 8, generator=g)
        kwargs = {"is_causal": True} if case == "causal" else {"enable_gqa": True}
        results = {}
        for mode in (False, True):
            with pjrt_host.config(dynamic_shapes=False):
                leaves = [t.to("jax").requires_grad_() for t in inputs]  # (exact: mark_dynamic pads below)
                w = weights.to("jax")
            with pjrt_host.config(dynamic_shapes=mode, eager=eager):
                q, k, v = (t * 1.0 for t in leaves)
                if mode:
                    for t in (q, k, v):
                        torch._dynamo.mark_dynamic(t, 2)
                    torch._dynamo.mark_dynamic(w, 2)
                    q, k, v, w = q * 1, k * 1, v * 1, w * 1  # padded from here on
                    assert q._storage.padded is not None and k._storage.padded is not None
                    before = _compiled()

                outs = []

                def run():
                    torch.manual_seed(n)
                    outs.append(F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, **kwargs))
                    (outs[-1] * w).sum().backward()

                if mode:
                    ops = _count_ops(run)
                    made.append(_compiled() - before)
                else:
                    run()
            results[mode] = [outs[-1].detach().cpu()] + [t.grad.cpu() for t in leaves]
        for got, want in zip(results[True], results[False]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert not (results[False][0] == 0).all()
        attention = [o for o in ops if "attention" in o or o.startswith("aten::bmm")]
        assert attention == ["pjrt_host::attention_keep", "pjrt_host::attention",
                             "pjrt_host::attention_backward"], ops
    # (fused eager: where a replayed script cuts its segments settles over
    # its first calls, so the second length may compile one segment -- alone
    # in its process, this case's did; after its sibling cases it did not)
    assert made[1:] == [0, 0] if eager == "op" else made[2:] == [0], made
    stats = torch.jax.dynamic_shape_stats()
    assert stats["cuts"] == 0 and stats["fallbacks"] == 0, stats


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_length_that_ran_exact_at_a_line_runs_its_exact_programs_again(eager):
    """Prompts of 12 tokens, then 17, then 12 again: the third prefill runs
    the programs the first left (the 12 ran exact there, and stays exact),
    not padded programs of bucket 16 that nothing ran before.  The lines
    also saw a decode step's length 1 between them, so 12 was no longer
    among the first two sizes there; until 2026-12-03 the third prefill
    compiled again."""
    def f(x):
        return (x.softmax(-1) * 2).sum(-1) + x.mean(-1)

    made, got = [], []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (12, 1, 17, 12):
            x = torch.arange(2 * n, dtype=torch.float32).reshape(2, n) / 7
            before = _compiled()
            got.append(f(x.to("jax")).cpu())
            made.append(_compiled() - before)
            torch.testing.assert_close(got[-1], f(x))
    assert made[3] == 0, made
    assert made[2] > 0, made  # (17: the third size there, padded into bucket 32)


def test_a_line_that_runs_layers_of_every_width_pads_no_width():
    # one line of code (a Linear's forward) runs layers of widths 8 and 24:
    # the widths are the parameters', not a dim that changes
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 24).to("jax"), torch.nn.Linear(24, 8).to("jax")]
    with pjrt_host.config(dynamic_shapes=True):
        for t in (5, 7, 9, 11):
            h = torch.randn(t, 8, device="jax")
            for layer in layers:
                h = torch.relu(layer(h))
            assert h._storage.padded is None or all(len(d) == 1 and (d[0][0] == d[0][1] or i == 0)
                                                    for i, d in enumerate(h._storage.padded)), h._storage.padded


def test_the_setting_is_read_from_the_environment():
    code = "import pjrt_host; print(pjrt_host.config().__enter__().dynamic_shapes)"
    for value, expected in (("1", "True"), ("0", "False"), ("all", "all"), ("", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**__import__("os").environ, "PJRT_HOST_DYNAMIC_SHAPES": value})
        assert out.stdout.strip().splitlines()[-1] == expected, out.stderr
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PJRT_HOST_DYNAMIC_SHAPES": "sometimes"})
    assert bad.returncode != 0 and "PJRT_HOST_DYNAMIC_SHAPES='sometimes'" in bad.stderr


@pytest.mark.parametrize("n", [1, 16, 17, 128, 129, 200, 1000])
def test_buckets_bound_the_padding(n):
    b = _padding.bucket(n)
    assert b >= n and (n <= 1 or b % 16 == 0)
    assert b <= max(16, n * 1.25 + 16)
    odd = _padding.bucket(n, odd=True)
    assert odd > n or n <= 1


def test_fused_eager_keeps_a_padded_clone_and_a_cache_start_in_the_segment():
    """Fused eager: a clone of a padded result still pending shares it (a
    copy: a later write to the original does not reach it), and a cat of a
    pending view of a padded storage (a cache's first key: ``cat([empty,
    k.transpose()])``) is recorded with it.  Both ran the segment first until
    2026-12-01: each GPT-2 layer ran as two or three programs in every new
    bucket, where the exact run has one."""
    from pjrt_host._torch import _fused

    x = torch.randn(3, 37, 8)
    with pjrt_host.config(dynamic_shapes=False):
        dx = x.to("jax")
    torch._dynamo.mark_dynamic(dx, 1)
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        y = dx * 2.0
        assert y._storage.padded is not None and y._storage.pending
        before = _fused.stats()["segments"]
        copy = y.clone()
        start = torch.cat([torch.tensor([], device="jax"), (y + 1.0).transpose(0, 1)], dim=0)
        assert _fused.stats()["segments"] == before, "the clone or the cat ran the segment"
        assert copy._storage.padded is not None and copy._storage.pending
        assert start._storage.pending
        y.mul_(0.0)  # the original written: the copy keeps its values
        torch.testing.assert_close(copy.cpu(), x * 2.0)
        torch.testing.assert_close(start.cpu(), (x * 2.0 + 1.0).transpose(0, 1))
        torch.testing.assert_close(y.cpu(), torch.zeros_like(x))


@pytest.mark.parametrize("length", [37, 47])
def test_fused_eager_records_a_padded_index_check_and_a_labels_pad(length):
    """Fused eager: an embedding's check of padded token ids already
    computed, and ``F.pad(labels, (0, 1), value=-100)`` of them (a causal
    LM's loss), are recorded into the segment: each ran a program of its
    own at every call (two of a GPT-2 step's eight programs at a new
    bucket, where the exact run compiles six).  47 ids are padded to 48,
    which their padded labels fill: an exact result, recorded too.  A bad
    id still raises torch's error at the next synchronisation."""
    from pjrt_host._torch import _fused

    ids = torch.randint(0, 50, (4, length))
    emb = torch.nn.Embedding(50, 8)
    dev = torch.nn.Embedding(50, 8).to("jax")
    dev.load_state_dict(emb.state_dict())
    with pjrt_host.config(dynamic_shapes=False):
        d = ids.to("jax")
    torch._dynamo.mark_dynamic(d, 1)
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        d = d + 0
        d.cpu()  # computed, padded
        assert d._storage.padded is not None and not d._storage.pending
        before = _fused.stats()["segments"]
        out = dev(d) * 2.0
        labels = F.pad(d, (0, 1), value=-100)
        assert _fused.stats()["segments"] == before, "the check or the pad ran a program of its own"
        assert labels._storage.pending and (labels._storage.padded is None) == (length == 47)
        torch.testing.assert_close(out.cpu(), emb(ids) * 2.0)
        torch.testing.assert_close(labels.cpu(), F.pad(ids, (0, 1), value=-100))
        bad = ids.clone()
        bad[3, 30] = 50
        with pjrt_host.config(dynamic_shapes=False):
            b = bad.to("jax")
        torch._dynamo.mark_dynamic(b, 1)
        b = b + 0
        b.cpu()
        with pytest.raises(IndexError, match="index out of range in self"):
            dev(b).cpu()


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_cache_growing_by_one_runs_one_program_per_bucket(eager):
    # a key/value cache as generate() grows it: cat along the padded dim
    torch.manual_seed(0)
    k = torch.randn(2, 5, 8)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        dk = k.to("jax")
        compiled = []
        joined = []
        for step in range(40):
            new = torch.randn(2, 8, 1)
            before = _compiled()
            # a computed view, as a projection's heads are (pending in fused
            # eager: the join reads it in the segment)
            dk = torch.cat([dk, (new.to("jax") * 1.0).transpose(1, 2)], dim=1)
            if dk._storage.padded is not None:  # joined in its bucket: recorded in fused eager
                joined.append(step)
                assert dk._storage.pending == (eager == "fused")
            scores = torch.softmax(dk @ dk[:, -1:].transpose(1, 2), dim=1)
            got = (scores.cpu(), dk.cpu())
            compiled.append(_compiled() - before)
            k = torch.cat([k, new.transpose(1, 2)], dim=1)
            torch.testing.assert_close(got[0], torch.softmax(k @ k[:, -1:].transpose(1, 2), dim=1))
            torch.testing.assert_close(got[1], k)
        assert dk._storage.padded is not None and len(joined) > 30, joined
    # lengths 6 .. 45: within the buckets of 32 and 48 no step compiles;
    # the entry into 48 compiles in two steps (the join at 32 pads to 48:
    # a length equal to its bucket would run exact, a third step)
    assert sum(compiled[28:]) <= 3, compiled
    assert sum(1 for c in compiled[20:] if c) <= 2, compiled


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_cache_that_only_a_cat_sees_grow_becomes_dynamic(eager):
    """generate()'s key/value cache and ids: the growing tensor is an item
    of a cat's list (no op that reads it through a view pads it), so the
    cat itself finds the growth -- a third size at its line -- and pads it;
    from then on the cat joins in buckets and attention reads the padded
    cache.  Values are CPU's."""
    torch.manual_seed(0)
    heads, width = 2, 8
    q_proj = torch.randn(width, width) / 3
    cache, ids = torch.randn(1, heads, 3, width // heads), torch.tensor([[1, 2, 3]])
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        dcache, dids, dproj = cache.to("jax"), ids.to("jax"), q_proj.to("jax")
        compiled = []
        for step in range(36):
            x = torch.randn(1, 1, width)
            new = (x @ q_proj).view(1, 1, heads, width // heads).transpose(1, 2)
            before = _compiled()
            dnew = (x.to("jax") @ dproj).view(1, 1, heads, width // heads).transpose(1, 2)
            dcache = torch.cat([dcache, dnew], dim=-2)
            scores = torch.softmax(dnew @ dcache.transpose(-1, -2) / 2.0, dim=-1) @ dcache
            dids = torch.cat([dids, scores.flatten().argmax().reshape(1, 1).to(dids.dtype)], dim=-1)
            got = (scores.cpu(), dids.cpu())
            compiled.append(_compiled() - before)
            cache = torch.cat([cache, new], dim=-2)
            want = torch.softmax(new @ cache.transpose(-1, -2) / 2.0, dim=-1) @ cache
            ids = torch.cat([ids, want.flatten().argmax().reshape(1, 1)], dim=-1)
            torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)
            assert torch.equal(got[1], ids)
        assert dcache._storage.padded is not None and dids._storage.padded is not None
    # lengths 4 .. 39 (step + 4): from the third size on, programs only in
    # the first steps of a bucket (16, 32 from length 17, 48 from 33), none
    # later within one
    text = str(list(enumerate(compiled)))
    assert not any(compiled[18:28]) and not any(compiled[33:]), text
    assert sum(1 for n in compiled[3:] if n) <= 10, text


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_cat_result_fed_back_to_its_cat_is_dynamic_from_the_second_step(eager):
    """An accumulator (``acc = torch.cat([acc, new])``: a key/value cache,
    ``generate()``'s ids) is padded the first time its own result comes
    back, not at its third size: so a second loop from a fresh start (a
    second ``generate()`` of the same prompt) runs the first loop's programs,
    but for at most one segment in fused eager, and a third compiles
    nothing.  A cat of tensors that are not its results keeps the third-size
    rule.  Values are CPU's."""
    torch.manual_seed(0)
    start = torch.randn(2, 5)
    steps = [torch.randn(2, 1) for _ in range(12)]

    def loop(check):
        acc = start.to("jax")
        sums = []
        for i, new in enumerate(steps):
            acc = torch.cat([acc, new.to("jax")], dim=1)
            sums.append(acc.softmax(-1).sum(-1).cpu())
            if check and i == 1:  # the second cat: its first input is the first cat's result
                assert acc._storage.padded is not None
        return acc.cpu(), sums

    want = start
    for new in steps:
        want = torch.cat([want, new], dim=1)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        acc, sums = loop(check=True)
        counts = []
        for _ in range(2):
            before = _compiled()
            again, sums_again = loop(check=False)
            counts.append(_compiled() - before)
        # (fused eager: the second loop's first step, whose start is padded at
        # once, may cut its segment where the first loop's did not: one program)
        assert counts[0] <= (1 if eager == "fused" else 0) and counts[1] == 0, counts
        # two different tensors at one cat's line: exact until a third size
        a, b = torch.randn(1, 3, device="jax"), torch.randn(1, 4, device="jax")
        for x, y in [(a, b), (b, b)]:
            joined = torch.cat([x, y], dim=1)
            assert joined._storage.padded is None and x._storage.padded is None
    torch.testing.assert_close(acc, want)
    torch.testing.assert_close(again, want)
    for got, step in zip(sums_again, sums):
        torch.testing.assert_close(got, step)
    torch.testing.assert_close(sums[-1], want.softmax(-1).sum(-1))


def test_a_second_generate_joins_its_first_token_as_the_first_did():
    """A decoder's key and value caches as transformers' DynamicCache grows
    them: a cat onto an empty tensor takes the prompt (the prefill), then a
    cat per token, each result fed back; both caches' cats have one key.
    Fused eager replays the second call's prefill on its replay lane, which
    must note each cat's result at its place as the cat's handler does, or
    the first token's cats of the second call ran exact (not joined in the
    cache's bucket) and compiled what the first call never needed -- each
    later call of a GPT-2's generate() compiled 3 or 4 programs more."""
    torch.manual_seed(0)
    wk, wv = torch.randn(8, 8), torch.randn(8, 8)
    prompt = torch.randn(1, 5, 8)
    tokens = [torch.randn(1, 1, 8) for _ in range(5)]

    def generate(dev, joined=None):
        keys = values = torch.zeros(1, 2, 0, 4, device=dev)
        outs = []
        for x in [prompt, *tokens]:
            x = x.to(dev)
            k = (x @ wk.to(dev)).view(1, -1, 2, 4).transpose(1, 2)
            v = (x @ wv.to(dev)).view(1, -1, 2, 4).transpose(1, 2)
            keys = torch.cat([keys, k], dim=-2)
            values = torch.cat([values, v], dim=-2)
            outs.append(((k @ keys.transpose(-1, -2)).softmax(-1) @ values).sum().item())
            if joined is not None:
                joined.append((keys._storage.padded is not None, values._storage.padded is not None))
        return outs

    want = generate("cpu")
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        torch.jax.synchronize()  # (ops an earlier test left queued would share the first call's first segment)
        first = []
        torch.testing.assert_close(torch.tensor(generate("jax", first)), torch.tensor(want))
        # the prompt exact, every token joined
        assert first == [(False, False)] + [(True, True)] * len(tokens), first
        for _ in range(2):
            again, before = [], _compiled()
            torch.testing.assert_close(torch.tensor(generate("jax", again)), torch.tensor(want))
            assert again == first
            assert _compiled() == before


def test_a_second_transformers_generate_compiles_nothing():
    """transformers' GPT-2 ``generate()`` of one prompt, three times, fused
    eager: the calls after the first compile nothing, and give CPU's tokens.
    The first call cats its first token exact (DynamicCache keeps the
    prefill's keys as they are) and joins from the second on; a later call
    joins its first token at once. The replay lane, which expects the join
    there, must not go on with the first call's script of an exact cat (the
    same op, other arguments: the cat's handler decides), or every later
    call compiled that token's exact programs again (3 a call)."""
    transformers = pytest.importorskip("transformers")

    transformers.set_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cpu = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, 100, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = cpu.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        dev = cpu.to("jax")
        try:
            made = []
            for _ in range(3):
                before = _compiled()
                with torch.no_grad():
                    got = dev.generate(ids.to("jax"), max_new_tokens=12, min_new_tokens=12, do_sample=False)
                assert torch.equal(got.cpu(), want)
                made.append(_compiled() - before)
        finally:
            cpu.to("cpu")
    assert made[1:] == [0, 0], made


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_join_that_crosses_into_the_next_bucket_runs_that_buckets_program(eager):
    """The join whose result outgrows its accumulator's bucket (length 15 to
    16 goes from the bucket of 16 to 32) lays the accumulator out in the new
    bucket first, so that it runs the same join as the bucket's later
    lengths instead of a program (and, fused, a segment) of its own.  A view
    taken before the crossing still reads its values.  Values are CPU's."""
    from pjrt_host._torch import _dynamic_dims

    torch.manual_seed(0)
    start = torch.randn(2, 5)
    steps = [torch.randn(2, 1) for _ in range(40)]
    _dynamic_dims._join_programs.clear()
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        acc, want = start.to("jax"), start
        for new in steps:
            before_view, want_before = acc[:, 1:4].t(), want[:, 1:4].t()
            acc, want = torch.cat([acc, new.to("jax")], dim=1), torch.cat([want, new], dim=1)
            torch.testing.assert_close(acc.softmax(-1).sum(-1).cpu(), want.softmax(-1).sum(-1))
            torch.testing.assert_close(before_view.cpu(), want_before)
        assert acc._storage.padded is not None
    torch.testing.assert_close(acc.cpu(), want)
    with pytest.raises(IndexError, match="Dimension out of range"):  # as CPU, not a join along dim 5 % 2
        torch.cat([acc, acc], dim=5)
    crossings = [key for key in _dynamic_dims._join_programs if key[0][0][1] != key[3]]
    assert not crossings, crossings  # (the accumulator's bucket is the result's in every join)
    assert {key[3] for key in _dynamic_dims._join_programs} >= {16, 32, 48}


def test_a_cache_join_reads_its_views_inside_its_own_program(monkeypatch):
    """A key/value cache as transformers grows it: the new token's keys are
    a view (split, view, transpose) of a projection, the cache a view of a
    padded storage.  The join reads both through their views inside its
    program: one dispatch per token, where each view's read was a program
    of its own before (3 of the 4 programs a GPT-2 layer ran per token for
    its cache)."""
    from pjrt_host import _program_cache

    calls = []
    original = _program_cache.Kept.__call__
    monkeypatch.setattr(_program_cache.Kept, "__call__", lambda self, *a: (calls.append(self.name), original(self, *a))[1])
    results = {}
    for dev in ("cpu", "jax"):
        torch.manual_seed(0)
        qkv = torch.randn(1, 12, 3 * 8)
        cache = qkv[:, :4].to(dev).split(8, dim=2)[1].view(1, 4, 2, 4).transpose(1, 2)
        with pjrt_host.config(dynamic_shapes=True, eager="op"):
            for step in range(8):
                token = qkv[:, 4 + step: 5 + step].to(dev)
                key = token.split(8, dim=2)[1].view(1, 1, 2, 4).transpose(1, 2)
                if step == 5:
                    calls.clear()
                cache = torch.cat([cache, key], dim=-2)
            results[dev] = cache.cpu()
            if dev == "jax":
                assert cache._storage.padded is not None
                assert "pjrt_host.read" not in calls and calls.count("pjrt_host.join") == 3, calls
    torch.testing.assert_close(results["jax"], results["cpu"])


def test_a_cache_join_replays_on_the_lane_token_after_token(monkeypatch):
    """Fused eager: a key/value cache growing by a token, as a decoder's
    layers grow theirs, takes the replay lane once its loop repeats (the
    join's own lane, ``_dynamic_dims.JoinLane``): no call reaches the
    join's handler within a bucket, and a call whose cache crosses into the
    next bucket takes the engine's way, which lays the cache out there
    first.  Values equal CPU's at every token; the suite's
    PJRT_HOST_CHECK_REPLAY=1 checks each lane call against the join's key."""
    from pjrt_host._torch import _dynamic_dims, _fused

    joins = []
    original = _dynamic_dims.join
    monkeypatch.setattr(_dynamic_dims, "join", lambda *a, **k: (joins.append(1), original(*a, **k))[1])
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    tokens = [torch.randn(1, 8) for _ in range(40)]
    results = {}
    for dev in ("cpu", "jax"):
        wd = w.to(dev)
        cache = (tokens[0] @ w).view(1, 2, 1, 4).to(dev)
        values, per_token = [], []
        with pjrt_host.config(dynamic_shapes=True, eager="fused"):
            for step, token in enumerate(tokens[1:]):
                x = token.to(dev)
                key = (x @ wd).view(1, 1, 2, 4).transpose(1, 2)  # (a pending view of the projection)
                before_lane, before = _fused.stats()["lane_padded"], len(joins)
                cache = torch.cat([cache, key], dim=2)
                scores = (key @ cache.transpose(-1, -2)).softmax(-1)
                values.append((scores @ cache).sum().item())  # (a read a token, as a decoder's stopping check)
                per_token.append((cache.shape[2], len(joins) - before, _fused.stats()["lane_padded"] - before_lane))
        results[dev] = (values, cache.cpu())
        if dev == "jax":
            assert cache._storage.padded is not None
            late = [(n, handled) for n, handled, _ in per_token[16:]]
            # within a bucket the join's handler is not reached; a crossing (a
            # length one past a bucket's) grows the cache there
            crossings = [n for n, handled in late if handled]
            assert len(crossings) <= 2 and all(_padding.room(n - 1) != _padding.room(n) for n in crossings), late
            assert all(lane >= 1 for n, handled, lane in per_token[16:] if not handled), per_token
    torch.testing.assert_close(torch.tensor(results["jax"][0]), torch.tensor(results["cpu"][0]))
    torch.testing.assert_close(results["jax"][1], results["cpu"][1])


def test_a_join_past_the_int32_limit_runs_exact(monkeypatch):
    """A join, a gradient placed in its bucket and a pad at the end carry
    lengths as int32 scalars: one whose bucket would pass the limit runs
    exact instead (the limit lowered here to 40 elements, as a cat of more
    than 2**31 rows cannot be made on this machine)."""
    monkeypatch.setattr(_padding, "MAX_SIZE", 40)
    results = {}
    for dev in ("cpu", "jax"):
        torch.manual_seed(0)
        steps = [torch.randn(2, 3) for _ in range(16)]
        cache = torch.randn(2, 20).to(dev)
        with pjrt_host.config(dynamic_shapes=True, eager="op"):
            for i, s in enumerate(steps):
                cache = torch.cat([cache, s.to(dev)], dim=1)
                if dev == "jax" and cache.shape[1] < 32 and i >= 3:
                    assert cache._storage.padded is not None  # in its bucket while the bucket fits
            padded = F.pad(cache, (0, 3))
        results[dev] = (cache.cpu(), padded.cpu())
        if dev == "jax":
            assert cache._storage.padded is None and padded._storage.padded is None
    for got, want in zip(results["jax"], results["cpu"]):
        torch.testing.assert_close(got, want)


def test_a_growing_cat_beside_an_empty_part_joins_the_rest():
    """block_diag's decomposition cats each block between zeros, some of
    them empty along the cat's dim: once the growing part is padded, the
    join places the others and skips the empty ones."""
    with pjrt_host.config(dynamic_shapes=True):
        for n in range(1, 7):
            a, b = torch.randn(2, n), torch.randn(2, 3)
            got = torch.cat([a.to("jax"), torch.zeros(2, 0, device="jax"), b.to("jax")], dim=1)
            torch.testing.assert_close(got.cpu(), torch.cat([a, torch.zeros(2, 0), b], dim=1))


def test_a_padded_cat_promotes_over_the_empty_parts_it_skips():
    """torch skips an empty 1-d part of a cat for its shape but not for its
    dtype: int64 values and an empty float64 give float64, also once the
    call's place has taken three sizes (fuzz seed 11000187 gave int64)."""
    def cat(parts):
        return torch.cat(parts, -1)

    with pjrt_host.config(dynamic_shapes=True):
        a = torch.randn(8, device="jax")
        assert cat([a, a]).dtype == torch.float32
        empty = torch.zeros(0, dtype=torch.float64, device="jax")
        assert cat([empty, empty]).dtype == torch.float64
        got = cat([torch.arange(4, device="jax"), empty])
        assert got.dtype == torch.float64 and got.tolist() == [0.0, 1.0, 2.0, 3.0]


# ---------------------------------------------------------------- the oracle: the suite with every dim padded

def _passes_padded(args: list[str], extra_env: dict | None = None) -> str:
    from conftest import run_python

    proc = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                      env={"PJRT_HOST_DYNAMIC_SHAPES": "all", **(extra_env or {})}, timeout=1500)
    tail = proc.stdout[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
    return tail


def test_a_sample_of_the_suite_passes_with_every_dim_padded():
    # fused eager (the default) records padded ops: views and in-place
    # writes over padded storages, and the fused tests (they train models);
    # not the two that start processes to check settings and a clean exit
    # (10 s, no padded op in them that the rest does not run)
    _passes_padded(["-x", "tests/test_torch_views.py", "tests/test_fused_eager.py",
                    "-k", "not exits_cleanly and not unknown_mode"])


@pytest.mark.slow
def test_a_sample_of_the_suite_passes_op_by_op_with_every_dim_padded():
    # (slow: the default run has op by op's sample and the padded default's;
    # this is their product, 90 s on two cores)
    # views and writes over padded storages, training, CPU parity, op by op
    _passes_padded(["-x", "tests/test_torch_views.py", "tests/test_torch_training.py"], {"PJRT_HOST_EAGER": "op"})


def test_an_opinfo_sample_passes_with_every_dim_padded():
    from test_eager_modes import OPINFO_SAMPLE, _opinfo_ids

    ids = _opinfo_ids(OPINFO_SAMPLE) + [i.replace("-float32]", "-bfloat16]") for i in _opinfo_ids(OPINFO_SAMPLE[:24])]
    tail = _passes_padded(ids, {"PJRT_HOST_OPINFO_DTYPES": "float32,bfloat16"})
    assert "OpInfo on jax:" in tail


@pytest.mark.slow
def test_opinfo_float32_passes_with_every_dim_padded():
    """Every float32 OpInfo case with every dim padded to odd buckets."""
    tail = _passes_padded(["tests/test_opinfo.py"], {"PJRT_HOST_OPINFO_DTYPES": "float32"})
    assert "OpInfo on jax:" in tail


def test_dropout_over_padding_draws_what_an_exact_draw_draws():
    # the same seed draws the same numbers with buckets and without
    x = torch.randn(3, 11, 6)
    masks = {}
    for mode in (False, "all", True):
        with pjrt_host.config(dynamic_shapes=mode):
            torch.manual_seed(7)
            d = x.to("jax") * 1.0
            if mode is True:
                torch._dynamo.mark_dynamic(d, 1)
                d = d * 1.0
            masks[mode] = [F.dropout(d, 0.5, training=True).cpu() for _ in range(2)]
    for mode in ("all", True):
        for a, b in zip(masks[mode], masks[False]):
            torch.testing.assert_close(a, b)


def test_in_place_draws_over_padding_draw_what_exact_draws_draw_and_compile_once_per_bucket():
    """In-place dropout (``empty_like`` of the activation, ``bernoulli_``,
    ``div_``, ``mul_``), ``bernoulli_`` and ``uniform_`` into a padded
    tensor, ``randn_like`` and ``rand_like`` of one (a diffusion step's
    noise): each logical element takes what an exact draw gives it, and a
    new batch of a seen bucket compiles nothing.  Before, the mask was drawn
    flat into a bucket of elements and copied to the exact shape: two
    programs per batch size (MobileViT's in-place dropout)."""
    def step(x: torch.Tensor) -> list:
        y = x * 2.0
        y = F.dropout(y, 0.3, training=True, inplace=True)
        z = (x + 1.0).bernoulli_(0.4)
        w = (x - 1.0).uniform_(-2.0, 3.0)
        noise = torch.randn_like(y) + torch.rand_like(y)
        return [t.cpu() for t in (y, z, w, noise)]

    xs = {n: torch.randn(n, 12) for n in (5, 7, 9, 13)}
    drawn = {}
    for mode in (True, False):  # (padded first: the exact run's per-shape programs are not there yet)
        with pjrt_host.config(dynamic_shapes=mode):
            _padding.reset()
            for n, x in xs.items():
                torch.manual_seed(n)
                before = _compiled()
                drawn[mode, n] = step(x.to("jax"))
                if mode and n == 13:  # (9 opened the bucket of 16; 13 reuses it)
                    assert _compiled() == before
            if mode:
                stats = torch.jax.dynamic_shape_stats()
                assert stats["cuts"] == 0, stats["cuts_by_op"]
    for n in xs:
        for got, want in zip(drawn[True, n], drawn[False, n]):
            torch.testing.assert_close(got, want)
    y = drawn[True, 13][0]
    assert 0 < (y == 0).sum() < y.numel()  # (a mask was drawn)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_an_in_place_draw_through_a_view_the_padded_route_drops_uses_no_more_of_the_seed(eager):
    """An in-place draw into a view of a padded storage that the padded
    route tries and then drops (a ``reshape(-1)`` merging two padded dims:
    the write back cannot be described) runs exact -- and must draw what
    the exact run draws, and leave the seed's later numbers where the exact
    run leaves them.  The padded try used up a draw: every number after it
    came one draw late (fuzz seed 28011039, ``exponential_``)."""
    def program(dev):
        torch.manual_seed(5)
        out = []
        for draw in (lambda t: t.exponential_(), lambda t: t.normal_(1.0, 2.0), lambda t: t.uniform_(-1.0, 1.0),
                     lambda t: t.bernoulli_(0.3), lambda t: t.log_normal_()):
            x = torch.arange(8, dtype=torch.float32).reshape(2, 4).to(dev) * 1.0
            draw(x.reshape(-1))
            out += [x.cpu(), torch.ones(3, device=dev).exponential_().cpu()]  # (and the draw after it)
        return out

    with pjrt_host.config(eager=eager, dynamic_shapes=False):
        want = program("jax")
    with pjrt_host.config(eager=eager, dynamic_shapes="all"):
        got = program("jax")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_pooler_reading_the_first_token_of_padded_lengths_compiles_once_per_bucket():
    """BERT's pooler and classification heads read ``hidden[:, 0]``: the
    gradient of that select (batch x width) holds no padded dim, and
    torch's ``select_backward`` is keyed by the input's sizes, so each length
    compiled a program (every step of a Trainer fine-tuning on padded
    batches).  It is placed in the bucket the forward's input was read in.
    Torch's dropout backward (``mask.type_as(grad_output)``) cut a padded
    gradient beside an exact mask, of which only the dtype is read."""
    torch.manual_seed(0)
    w = torch.randn(16, 3)
    grads = {}
    for mode in (True, False):
        with pjrt_host.config(dynamic_shapes=mode):
            _padding.reset()
            for n in (5, 7, 9, 13):
                x = torch.randn(4, n, 16, generator=torch.Generator().manual_seed(n))
                got = []
                for dev in ("cpu", "jax"):
                    h = x.clone().to(dev).requires_grad_()
                    wd = w.clone().to(dev).requires_grad_()
                    before = _compiled()
                    ((h * 2.0).tanh()[:, 0] @ wd).square().sum().backward()
                    if dev == "jax" and mode and n == 13:  # (9 opened the bucket of 16)
                        assert _compiled() == before
                    got.append((h.grad.cpu(), wd.grad.cpu()))
                grads[mode, n] = got
            if mode:
                exact = torch.ones(4, 13, 16, dtype=torch.bool, device="jax")
                padded = h.grad * 1.0  # (the last length's gradient, padded to 16)
                assert padded._storage.padded is not None
                with torch.inference_mode():  # (type_as reaches the device undecomposed, as inside a decomposition)
                    cast = exact.type_as(padded)
                torch.testing.assert_close(cast.cpu(), torch.ones(4, 13, 16))
                stats = torch.jax.dynamic_shape_stats()
                assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])
    for (cpu_h, cpu_w), (dev_h, dev_w) in grads.values():
        torch.testing.assert_close(dev_h, cpu_h)
        torch.testing.assert_close(dev_w, cpu_w)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_beam_search_reorders_a_padded_cache_and_repeats_a_padded_mask_in_their_buckets(eager):
    """Beam search as transformers runs it: the prompt's mask repeated per
    beam (``repeat_interleave``: its batch dim merges batch and beams, exact
    components both) and read by ``mask[batch[:, None], positions[None, :]]``,
    and a key/value cache grown by a token per step and reordered each step
    by the surviving beams (``index_select(0, beam_idx)``).  Both cut the
    padded tensors to their logical sizes: a program per length and step
    (GPT-2's beam search compiled 3-12 programs at prompts of seen buckets).
    Now a length of a seen bucket compiles nothing; values are CPU's."""
    torch.manual_seed(0)
    beams, width = 3, 4
    wk = torch.randn(width, width)

    def search(dev, n, stats):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(2, n, width, generator=g).to(dev)
        mask = torch.ones(2, n, dtype=torch.long)
        mask[0, :2] = 0
        mask = mask.to(dev).repeat_interleave(beams, dim=0)  # (batch x beams, n)
        rows = torch.arange(2 * beams, device=dev)
        seen = mask[rows[:, None], torch.arange(n, device=dev)[None, :]]  # transformers' padding mask
        cache = (x @ wk.to(dev)).repeat_interleave(beams, dim=0) * seen[..., None]
        outs = []
        for step in range(4):
            order = torch.tensor([(i + step) % (2 * beams) for i in range(2 * beams)]).to(dev)
            token = torch.randn(2 * beams, 1, width, generator=g).to(dev)
            cache = torch.cat([cache.index_select(0, order), token], dim=1)
            outs.append(cache.softmax(1).sum(1).cpu())
        if stats is not None:
            stats.append(torch.jax.dynamic_shape_stats()["cuts_by_op"])
        return outs

    lengths = (5, 9, 13, 11, 14)  # 13 opens the bucket of 16 at the third size; 11 and 14 are in it
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        _padding.reset()
        for n in lengths:
            before, stats = _compiled(), []
            got = search("jax", n, stats)
            for a, b in zip(got, search("cpu", n, None)):
                torch.testing.assert_close(a, b)
            if n in (11, 14):
                assert _compiled() == before, n
            assert not any(op in stats[0] for op in ("aten::index_select", "aten::index.Tensor")), stats[0]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_indices_as_many_as_a_padded_length_reorder_without_a_cut(eager):
    """index_select's indices meet none of the tensor's dims: their count
    (6 beams) says nothing of its padded length, even where that length is
    6 too and the batch is 6.  T5's beam search reorders its caches so, and
    the ambiguous size ran each reorder cut (4 a call); now it runs padded,
    with CPU's values."""
    beams = 6
    wk = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))

    def reorder(dev, n):
        x = torch.randn(beams, n, 4, generator=torch.Generator().manual_seed(n)).to(dev)  # padded at its third length
        cache = x @ wk.to(dev)
        order = torch.tensor([(i + n) % beams for i in range(beams)]).to(dev)
        return [cache.index_select(0, order).softmax(1).cpu(), cache.index_select(1, (order % n)[:n % 3 + 1]).cpu()]

    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        _padding.reset()
        for n in (3, 4, 6, 5):  # 6: the third length, padded, as long as the batch
            got = reorder("jax", n)
            for a, b in zip(got, reorder("cpu", n)):
                torch.testing.assert_close(a, b)
            if n >= 6:
                assert "aten::index_select" not in torch.jax.dynamic_shape_stats()["cuts_by_op"], n


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_assisted_decodings_reads_of_padded_logits_stay_in_their_buckets(eager):
    """Assisted generation checks the assistant's k candidate tokens against
    the model's logits of the last k + 1 positions, padded along the length:
    it copies each position's row (``new[:, i, :].clone()``, whose stride
    torch keeps from the longer tensor), takes the argmax over the
    vocabulary, compares the candidates (none at the last step: empty
    tensors) and reads a max and a min along the length.  Each of these cut
    the padded logits (a program per length); now none does, and a length of
    a seen bucket compiles nothing.  Values, dtypes and strides are CPU's
    (ties and NaN too)."""
    torch.manual_seed(0)
    vocab = 7

    def check(dev, n, k):
        logits = torch.randn(1, n, vocab, generator=torch.Generator().manual_seed(n))
        logits[0, 1, 3] = float("nan")
        logits[0, 2, :] = float("-inf")
        logits = logits.to(dev) * 1.0
        new = logits[:, -k - 1:]
        rows = [new[:, i, :].clone() for i in range(k + 1)] + [new[:, 0, :].to(torch.float64)]
        selected = new.argmax(-1)
        candidates = torch.arange(k, device=dev)[None, :] % vocab
        matched = ((candidates == selected[:, :-1]).cumsum(-1) < 1).sum()
        extremes = (*new.max(1), *new.min(1, keepdim=True), new.argmin(1), logits.argmax(1))
        return [(r.stride(), r.cpu()) for r in rows], [t.cpu() for t in (selected, matched, *extremes)]

    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        _padding.reset()
        for n in (9, 12, 14, 11, 13):  # 14 opens the bucket of 16 at the third size; 11 and 13 are in it
            before = _compiled()
            for k in (3, 1, 0):
                (rows, outs), (want_rows, want_outs) = check("jax", n, k), check("cpu", n, k)
                for (stride, row), (want_stride, want_row) in zip(rows, want_rows):
                    assert stride == want_stride
                    torch.testing.assert_close(row, want_row, equal_nan=True)
                for got, want in zip(outs, want_outs):
                    assert got.dtype == want.dtype
                    torch.testing.assert_close(got, want, equal_nan=True)
            if n in (11, 13):
                assert _compiled() == before, n
        stats = torch.jax.dynamic_shape_stats()
        assert stats["cuts"] == 0 and stats["fallbacks"] == 0, (stats["cuts_by_op"], stats["fallbacks_by_reason"])


def test_a_padded_input_beside_one_that_does_not_broadcast_raises_cpus_error():
    # a padded (5, 5) and an exact (5, 6) mask: the exact tensor's last dim was
    # aligned with the padded one and padded to its bucket, and numpy's
    # "cannot reshape array of size 25 into shape (5,6)" reached the caller
    # (found by the bad-input sweep: masked_fill, the margin and Poisson losses)
    raised = {}
    with pjrt_host.config(dynamic_shapes="all"):
        for dev in ("cpu", "jax"):
            x = torch.randn(5, 5, device=dev) * 1.0  # padded on the device from here on
            if dev == "jax":
                assert x._storage.padded is not None
            for name, call in (("masked_fill", lambda: x.masked_fill(torch.zeros(5, 6, dtype=torch.bool, device=dev), 1.0)),
                               ("add", lambda: x + torch.ones(6, device=dev))):
                with pytest.raises(RuntimeError, match="must match the size of tensor b") as info:
                    call()
                raised[dev, name] = str(info.value)
    assert raised["jax", "masked_fill"] == raised["cpu", "masked_fill"]
    assert raised["jax", "add"] == raised["cpu", "add"]


def test_an_embedding_gradient_scaled_by_frequency_counts_no_padded_index():
    # scale_grad_by_freq divides each row's gradient by how often its index
    # occurs; the padded indices (filled 0) counted as more occurrences of
    # row 0 and shrank its gradient (found by the oracle: every dim padded)
    torch.manual_seed(0)
    idx = torch.tensor([[0, 1, 0, 2, 3], [0, 4, 1, 0, 2]])
    w, g = torch.randn(6, 3), torch.randn(2, 5, 3)
    grads = {}
    with pjrt_host.config(dynamic_shapes="all"):
        for dev in ("cpu", "jax"):
            for scale in (True, False):
                weight = w.clone().to(dev).requires_grad_()
                F.embedding(idx.to(dev), weight, scale_grad_by_freq=scale).backward(g.to(dev))
                grads[dev, scale] = weight.grad.cpu()
    for scale in (True, False):
        torch.testing.assert_close(grads["jax", scale], grads["cpu", scale])


def test_a_contraction_of_dims_padded_in_two_ways_runs_exact_without_tracing():
    # mm of a merged [B*T] view (padding between its rows) against a
    # [B*T, D] tensor padded at its end: the contracted dims are laid out
    # differently, and the padded route traced a program that failed on
    # every call (dot_general of 49 against 14) before it ran exact; it now
    # sees they do not line up (found by the oracle, op by op: the
    # weight gradients of tests/test_torch_training.py's transformers)
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 4), torch.randn(10, 3)
    with pjrt_host.config(dynamic_shapes="all", eager="op"):
        _padding.reset()
        aj, bj = a.to("jax") * 1, b.to("jax") * 1  # padded by the mul
        got = (aj.view(-1, 4).t() @ bj).cpu()
        reasons = torch.jax.dynamic_shape_stats()["fallbacks_by_reason"]
    torch.testing.assert_close(got, a.view(-1, 4).t() @ b)
    assert not any("program failed" in r for r in reasons), reasons
    assert reasons.get("aten::mm: inputs that do not line up") == 1, reasons


def test_one_logical_size_padded_to_two_buckets_runs_exact_without_tracing():
    # a tensor padded under the test mode's odd buckets (5 rows in 7) beside
    # one padded at the default setting (5 in 16): broadcasting lines the
    # rows up, and the padded route traced a program that failed on every
    # such call (add of 7 against 16) before it ran exact; it now sees they
    # do not line up.  The same for every op broadcasting aligns.
    torch.manual_seed(0)
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    ops = {"add": torch.add, "mul": torch.mul, "where": lambda x, y: torch.where(x > 0, x, y),
           "stack": lambda x, y: torch.stack([x, y]), "addcmul": lambda x, y: torch.addcmul(x, x, y)}
    for name, op in ops.items():
        with pjrt_host.config(dynamic_shapes="all"):
            aj = a.to("jax") * 1
        bj = b.to("jax")
        torch._dynamo.mark_dynamic(bj, 0)
        bj = bj * 1
        assert aj._storage.padded[0][0][0] != bj._storage.padded[0][0][0], (aj._storage.padded, bj._storage.padded)
        _padding.reset()
        got = op(aj, bj).cpu()
        reasons = torch.jax.dynamic_shape_stats()["fallbacks_by_reason"]
        torch.testing.assert_close(got, op(a, b))
        assert not any("program failed" in r for r in reasons), (name, reasons)
        assert any("do not line up" in r for r in reasons), (name, reasons)


def test_a_16_bit_mean_of_a_padded_tensor_sums_in_float32_as_cpu():
    # torch CPU's mean of float16 / bfloat16 sums in float32 and rounds once;
    # the padded mean (its sum over the logical count) summed in the 16-bit
    # dtype: a float16 row of 60000s overflowed to inf, and other rows were
    # rounded twice (found by the oracle: every dim padded)
    x = torch.full((4, 10), 60000.0, dtype=torch.float16)
    x[:, 0] = 30000.0
    y = (torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3 + 7).to(torch.bfloat16)
    with pjrt_host.config(dynamic_shapes="all"):
        for t in (x, y):
            d = t.to("jax") * 1  # padded from here on
            assert d._storage.padded is not None
            for dim in (1, (0, 1)):
                got = d.mean(dim)
                assert got.dtype == t.dtype
                torch.testing.assert_close(got.cpu(), t.mean(dim), rtol=0, atol=0)


def test_a_dim_longer_than_an_int32_stays_exact():
    # a dynamic dim's logical size travels as an int32: a lazy randn of 2**42
    # elements, padded by the oracle at its sum, raised an OverflowError
    # where the exact route raises torch's OutOfMemoryError (found by the
    # oracle: test_torch_habits.py's out-of-memory test)
    with pjrt_host.config(dynamic_shapes="all"):
        with pytest.raises(torch.OutOfMemoryError):
            torch.randn(2**42, device="jax").sum().item()
        assert (torch.ones(3, device="jax") * 2).sum().item() == 6
    assert _padding.dynamic_ok(2**30) and not _padding.dynamic_ok(2**31 - 2)  # (its bucket is 2263057008)
    assert _padding.dynamic_ok(2**31 - 9, odd=True) and not _padding.dynamic_ok(2**31 - 3, odd=True)


def test_sync_mode_waits_for_a_padded_result_without_cutting_it():
    # eager="sync" waited for each op's result through Storage.array, which
    # cuts a padded array for good: every padded result was cut at its op,
    # the next op padded it again, and sync ran other programs than op by op
    # (test_eager_modes.py's bit-for-bit weights; found by the oracle)
    x = torch.randn(4, 10)
    with pjrt_host.config(dynamic_shapes="all", eager="sync"):
        d = x.to("jax") * 2  # padded from here on
        assert d._storage.padded is not None
        cuts = torch.jax.dynamic_shape_stats()["cuts"]
        y = (d + 1).sum(1)
        assert d._storage.padded is not None and torch.jax.dynamic_shape_stats()["cuts"] == cuts
        torch.testing.assert_close(y.cpu(), (x * 2 + 1).sum(1))


# ------------------------------------------------------------ torch.compile(backend='jax')
#
# dynamo's symbolic graphs (automatic dynamic at the second size,
# mark_dynamic, dynamic=True) run one program per bucket of their sizes
# (pjrt_host/_compile/_padded_graph.py), through eager's rules.


class _XlaCompiles:
    """Counts XLA compiles (every program of the process: the graphs', and
    any eager op's around them)."""

    def __enter__(self) -> "_XlaCompiles":
        import jax

        self.count = 0

        def listener(event: str, duration: float, **kwargs) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                self.count += 1

        self._listener = listener
        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listener)


def _compiled_lengths(lengths, mark: bool, *, dynamic=None, check: bool = True):
    """Training steps of the transformer-like Block (linear, layer norm,
    softmax attention, cross-entropy) compiled with backend='jax', one per
    length, compared with torch CPU's; returns per step the XLA compiles
    and the graph programs (padded) it made."""
    torch._dynamo.reset()
    cpu, dev = _pair()
    compiled = torch.compile(dev, backend="jax", dynamic=dynamic)
    out = []
    for t in lengths:
        x, target = _batch(t)
        xd, td = x.to("jax"), target.to("jax")
        if mark:
            torch._dynamo.mark_dynamic(xd, 1)
            torch._dynamo.mark_dynamic(td, 1)
        programs = torch.jax.dynamic_shape_stats()["graph_programs"]
        with _XlaCompiles() as xla:
            dev.zero_grad()
            loss = compiled(xd, td)
            loss.backward()
            got = (loss.cpu(), [p.grad.cpu() for p in dev.parameters()])
        out.append((xla.count, torch.jax.dynamic_shape_stats()["graph_programs"] - programs))
        if check:
            _assert_like_cpu(got, cpu, x, target)
    return out


def _compiled_linear_pair(n_in: int, n_out: int) -> tuple:
    """A fresh start for a compiled test (dynamo's caches, the padded
    route's counts) and a CPU ``nn.Linear`` with its copy on 'jax'."""
    torch._dynamo.reset()
    _padding.reset()
    torch.manual_seed(0)
    cpu = torch.nn.Linear(n_in, n_out)
    dev = torch.nn.Linear(n_in, n_out)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("jax")


def _trains_like_cpu(f, cpu, dev, inputs) -> None:
    """``f(module, x)`` compiled on 'jax' with buckets on, its loss and the
    weight's gradient for each of ``inputs`` as CPU's eager ones."""
    compiled = torch.compile(f, backend="jax")
    with pjrt_host.config(dynamic_shapes=True):
        for x in inputs:
            cpu.zero_grad()
            dev.zero_grad()
            want = f(cpu, x)
            want.backward()
            got = compiled(dev, x.to("jax"))
            got.backward()
            torch.testing.assert_close(got.cpu(), want)
            torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad)


def _trains_in_the_bucket_of_32(f, cpu, dev) -> None:
    """:func:`_trains_like_cpu` on ``[2, n, 4]`` inputs at 5 lengths of the
    bucket of 32, with no fallback: one forward and one backward program."""
    g = torch.Generator().manual_seed(1)
    _trains_like_cpu(f, cpu, dev, [torch.randn(2, n, 4, generator=g) for n in (18, 21, 25, 19, 30)])
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 2, stats


def test_compiled_mark_dynamic_runs_one_program_per_bucket():
    # 5 lengths in the bucket of 32, odd ones among them, then one of 48's
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        steps = _compiled_lengths([17, 23, 31, 20, 29, 40], mark=True)
    stats = torch.jax.dynamic_shape_stats()
    assert steps[0][1] == 2, steps  # a forward and a backward program for the bucket 32
    assert all(s == (0, 0) for s in steps[1:5]), steps  # no XLA compile at all for 4 more lengths
    assert steps[5][1] == 2, steps  # the next bucket: its own two
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["calls_by_bucket"].get("3x32x16", 0) >= 5, stats["calls_by_bucket"]


def test_compiled_automatic_dynamic_runs_one_program_per_bucket():
    # dynamo compiles the first length static, the second as a symbolic
    # graph: from there on, the bucket's programs
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=True):
        steps = _compiled_lengths([18, 21, 25, 19, 30, 27], mark=False)
    assert steps[1][1] == 2, steps
    assert all(s == (0, 0) for s in steps[2:]), steps
    assert torch.jax.dynamic_shape_stats()["fallbacks"] == 0


def test_a_compiled_size_whose_bucket_passes_the_int32_limit_runs_per_shape(monkeypatch):
    """Symbolic sizes travel into a bucket's program as int32 scalars: a
    call whose bucket would pass the limit (lowered here to 40, as a size
    past 2**31 cannot be made on this machine) runs its per-shape program,
    and the graph's other calls still run in buckets."""
    torch._dynamo.reset()
    _padding.reset()
    monkeypatch.setattr(_padding, "MAX_SIZE", 40)

    def f(x):
        return torch.softmax(x * 2, dim=0).sum(1)

    g = torch.compile(f, backend="jax", dynamic=True)
    with pjrt_host.config(dynamic_shapes=True), torch.no_grad():
        for n in (5, 7, 50, 11):
            x = torch.randn(n, 3)
            torch.testing.assert_close(g(x.to("jax")).cpu(), f(x), rtol=1e-5, atol=1e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["graph_programs"] == 1, stats  # 5, 7 and 11 in the bucket of 16
    assert list(stats["fallbacks_by_reason"].values()) == [1], stats  # 50 alone


def test_compiled_off_compiles_per_shape():
    _padding.reset()
    with pjrt_host.config(dynamic_shapes=False):
        steps = _compiled_lengths([17, 23, 31], mark=True, check=False)
    assert all(s[1] == 0 and s[0] >= 2 for s in steps), steps  # no padded program; each length compiles


def test_compiled_dynamic_true_inference_matches_cpu_at_odd_sizes():
    torch._dynamo.reset()
    _padding.reset()

    def f(x, w):
        h = torch.softmax(x @ w, dim=-1)
        return h.reshape(-1), (x ** 2).mean(0), h.amax(0)

    g = torch.compile(f, backend="jax", dynamic=True)
    w = torch.randn(6, 6)
    with pjrt_host.config(dynamic_shapes=True), torch.no_grad():
        for n in (3, 5, 7, 11, 13):  # one bucket (16)
            x = torch.randn(n, 6)
            got = g(x.to("jax"), w.to("jax"))
            want = f(x, w)
            for a, b in zip(got, want):
                assert tuple(a.shape) == tuple(b.shape)
                torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["graph_programs"] == 1 and stats["fallbacks"] == 0, stats


def test_compiled_graph_with_an_op_without_a_rule_falls_back_per_shape(caplog):
    # flip has no padded rule: the graph compiles per shape, as before
    # buckets, says why, and its values are right
    torch._dynamo.reset()
    _padding.reset()

    def f(x):
        return (x.flip(1) * 2).sum(1), torch.softmax(x, 1)

    g = torch.compile(f, backend="jax")
    with pjrt_host.config(dynamic_shapes=True), caplog.at_level("INFO", logger="pjrt_host.recompiles"):
        for n in (5, 7, 9, 11):
            x = torch.randn(3, n)
            for a, b in zip(g(x.to("jax")), f(x)):
                torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["graph_programs"] == 0, stats
    reasons = stats["fallbacks_by_reason"]
    assert any(k.startswith("torch.compile inference graph: aten::flip") for k in reasons), reasons
    assert sum(reasons.values()) == 3, reasons  # every call of the symbolic graph (the first length is static)
    assert "compiles once per shape, not per bucket: aten::flip" in caplog.text, caplog.text


@pytest.mark.parametrize("shift", ["pad-then-slice", "slice-both"])
def test_compiled_labels_shifted_by_a_pad_or_a_slice_run_in_buckets(shift):
    """A causal-LM loss shifts its labels by one: transformers' loss pads
    them at the end (``F.pad(labels, (0, 1), value=-100)``, then ``[..., 1:]``),
    hand-written ones cut the logits' last position and the labels' first.
    Along a symbolic length these are sizes ``s + 1`` and ``s - 1``, which
    made the graph compile per length (a transformers model trained under
    torch.compile with ``labels=`` compiled its forward at every length).
    Now each has the physical size of its expression: values and gradients
    as CPU's, no fallback, one program per bucket."""
    import torch.nn.functional as F

    cpu, dev = _compiled_linear_pair(8, 11)

    def loss(lin, h, labels):
        logits = lin(h)
        if shift == "pad-then-slice":
            labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
            return F.cross_entropy(logits.float().view(-1, 11), labels.view(-1), ignore_index=-100)
        return F.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))

    compiled = torch.compile(loss, backend="jax")
    g = torch.Generator().manual_seed(1)
    programs = []
    with pjrt_host.config(dynamic_shapes=True):
        for n in (18, 21, 25, 19, 30, 27, 32):
            h = torch.randn(2, n, 8, generator=g)
            labels = torch.randint(0, 11, (2, n), generator=g)
            labels[0, -3:] = -100  # (the padding collator's ignored positions)
            cpu.zero_grad()
            dev.zero_grad()
            want = loss(cpu, h, labels)
            want.backward()
            before = torch.jax.dynamic_shape_stats()["graph_programs"]
            with _XlaCompiles() as xla:
                got = compiled(dev, h.to("jax"), labels.to("jax"))
                got.backward()
                torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)
            programs.append((xla.count, torch.jax.dynamic_shape_stats()["graph_programs"] - before))
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert programs[1][1] == 2, programs  # the symbolic graphs' forward and backward, bucket 32
    assert all(p == (0, 0) for p in programs[2:]), str(programs)  # every later length: nothing compiled


def test_a_compiled_backward_reads_a_padded_gradient_still_pending_in_fused_eager():
    """A compiled graph that returns a padded value beside its loss: the
    backward gets that output's gradient as zeros autograd makes eagerly,
    which fused eager leaves pending, padded as the output.  The padded
    graph passed the storage's raw array, its pending placeholder, into the
    program: a TypeError out of ``loss.backward()`` at the bucket's second
    length (a GPT-2 under torch.compile returns its logits beside its loss)."""
    cpu, dev = _compiled_linear_pair(8, 8)

    def f(lin, x):
        y = lin(x)
        return y.sum(), y * 2

    compiled = torch.compile(f, backend="jax")
    g = torch.Generator().manual_seed(1)
    with pjrt_host.config(dynamic_shapes=True, eager="fused"):
        for n in (18, 21, 25, 19, 27):
            x = torch.randn(2, n, 8, generator=g)
            cpu.zero_grad()
            dev.zero_grad()
            want, _ = f(cpu, x)
            want.backward()
            loss, y = compiled(dev, x.to("jax"))
            loss.backward()
            torch.testing.assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-4)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 2, stats  # the bucket of 32: its forward and its backward


def test_compiled_position_ids_and_index_checks_of_a_symbolic_length_run_in_buckets():
    """Two things every transformers model does along its length compiled
    per length: a slice of a buffer along an exact dim to a symbolic length
    (BERT's ``position_ids[:, :seq_length]``) and an index checked against a
    symbolic size (a Llama's padding mask read at ``kv_idx``).  The slice now
    takes the length's bucket from the buffer, and the check compares with
    the traced logical size: values as CPU's, one program per bucket, and an
    index out of the logical range still raises torch's IndexError, at a
    length whose bucket holds it."""
    torch._dynamo.reset()
    _padding.reset()

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 4)
            self.register_buffer("ids", torch.arange(64).expand(1, -1), persistent=False)

        def forward(self, x, at):
            pos = self.emb(self.ids[:, : x.shape[1]])
            return (x.unsqueeze(-1) * pos).sum(-1)[:, at]

    torch.manual_seed(0)
    cpu = Positions()
    dev = Positions()
    dev.load_state_dict(cpu.state_dict())
    dev.to("jax")
    compiled = torch.compile(dev, backend="jax")
    g = torch.Generator().manual_seed(1)
    counts = []
    with pjrt_host.config(dynamic_shapes=True):
        for n in (18, 21, 25, 19, 30):
            x = torch.randn(2, n, generator=g)
            at = torch.randint(-n, n, (5,), generator=g)
            before = torch.jax.dynamic_shape_stats()["graph_programs"]
            with _XlaCompiles() as xla:
                got = compiled(x.to("jax"), at.to("jax")).cpu()
            counts.append((xla.count, torch.jax.dynamic_shape_stats()["graph_programs"] - before))
            torch.testing.assert_close(got, cpu(x, at))
        x = torch.randn(2, 27, generator=g)
        with pytest.raises(IndexError, match="out of bounds"):
            cpu(x, torch.tensor([3, 27]))
        with pytest.raises(IndexError, match="out of bounds"):  # 27 < 32: inside the bucket, past the length
            compiled(x.to("jax"), torch.tensor([3, 27]).to("jax")).cpu()
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert counts[1][1] == 1 and all(c == (0, 0) for c in counts[2:]), counts


def test_compiled_writes_through_views_of_a_symbolic_length_run_in_buckets():
    """An encoder-decoder shifts its labels right by writing through views
    (transformers' ``shift_tokens_right``): functionalized, a ``copy`` into
    a slice from 1, a ``slice_scatter`` of it into the base, a ``select``
    and ``select_scatter`` at position 0, all along the symbolic length (and
    a ``select`` from its end, as ``logits[:, -1]``).
    BART and T5 trained under torch.compile compiled their forward per
    length; now a later length of a bucket compiles nothing, with CPU's
    values and gradients (-100 labels among them)."""
    torch._dynamo.reset()
    _padding.reset()

    def shift_tokens_right(ids, pad, start):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = start
        shifted.masked_fill_(shifted == -100, pad)
        return shifted

    torch.manual_seed(0)
    cpu = torch.nn.Embedding(50, 4)
    dev = torch.nn.Embedding(50, 4)
    dev.load_state_dict(cpu.state_dict())
    dev.to("jax")

    def f(emb, labels):
        shifted = shift_tokens_right(labels, 0, 2)
        return (emb(shifted).sum(-1) * (shifted[:, 1] + shifted[:, -1] + 1).unsqueeze(1)).sum()

    compiled = torch.compile(f, backend="jax")
    g = torch.Generator().manual_seed(1)
    counts = []
    with pjrt_host.config(dynamic_shapes=True):
        for n in (18, 21, 25, 19, 30, 32):
            labels = torch.randint(0, 50, (2, n), generator=g)
            labels[0, -3:] = -100
            cpu.zero_grad()
            dev.zero_grad()
            want = f(cpu, labels)
            want.backward()
            before = torch.jax.dynamic_shape_stats()["graph_programs"]
            with _XlaCompiles() as xla:
                got = compiled(dev, labels.to("jax"))
                got.backward()
                torch.testing.assert_close(got.cpu(), want)
                torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad)
            counts.append((xla.count, torch.jax.dynamic_shape_stats()["graph_programs"] - before))
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert counts[1][1] == 2 and all(c == (0, 0) for c in counts[2:]), counts


def test_compiled_selects_along_a_symbolic_length_and_their_gradients_run_in_buckets():
    """``h[:, -1]`` (a classifier on the last token, generate()'s next-token
    logits) and ``h[:, 1]`` along a symbolic length, trained: the select
    from the end reads the logical last position, and the gradients are
    placed there, zeros elsewhere.  Both forms made the graph compile per
    length."""
    cpu, dev = _compiled_linear_pair(4, 4)

    def f(lin, x):
        h = lin(x)
        return (h[:, -1] * 2 + h[:, 1]).sum()

    _trains_in_the_bucket_of_32(f, cpu, dev)


def test_a_compiled_backward_reads_a_batch_merged_with_its_tokens_as_the_forward_laid_it_out():
    """A ViT's ``[B, 17, C]`` viewed as ``[B*17, C]`` for its linear layers,
    the batch symbolic: the merged dim holds the batch outer, 17 rows per
    sample.  The backward took that saved input as 17 outer and the batch
    inner (all ``c*s`` sizes were read so), met a gradient laid out the
    forward's way ("dims of size 17*s padded in two ways") and compiled per
    batch.  An input padded so is now read as it is laid out."""
    cpu, dev = _compiled_linear_pair(4, 3)

    def f(lin, x):
        h = torch.tanh(lin(x.reshape(-1, 4))).reshape(x.shape[0], 5, 3)
        return h[:, 0].square().sum() + h.mean()

    g = torch.Generator().manual_seed(1)
    _trains_like_cpu(f, cpu, dev, [torch.randn(b, 5, 4, generator=g) for b in (2, 3, 5, 7, 6, 9)])
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 2, stats


def test_a_compiled_join_along_a_symbolic_length_and_its_gradient_run_in_buckets():
    """``torch.cat`` along a symbolic length (a key/value cache growing by a
    token) and slices of a number of positions from the logical end
    (``hidden[:, -1:]``, transformers' ``logits_to_keep``), trained: the
    join places each part at its run-time offset, its gradient is sliced
    from a symbolic start.  Each of these compiled the graph per length."""
    cpu, dev = _compiled_linear_pair(4, 4)

    def f(lin, x):
        h = lin(x)
        joined = torch.cat([h, h[:, :1] * 3], dim=1)  # a length of s + 1
        return (joined.softmax(1) * joined).sum() + joined[:, -2:].square().sum() + h[:, -1:].sum()

    _trains_in_the_bucket_of_32(f, cpu, dev)


def test_a_compiled_cache_grown_by_a_token_at_every_call_runs_in_buckets():
    """A decoding step compiled alone: the cache it returned (joined to the
    room of ``s + 1``) comes back as its next input, of a new symbolic
    length, and is read in that length's bucket; one program per bucket,
    CPU's values at every step."""
    torch._dynamo.reset()
    _padding.reset()

    def step(cache, x):
        cache = torch.cat([cache, x], dim=1)
        weights = (x @ cache.transpose(1, 2)).softmax(-1)
        return cache, weights @ cache

    compiled = torch.compile(step, backend="jax")
    g = torch.Generator().manual_seed(2)
    cache = torch.randn(2, 3, 8, generator=g)
    dev = cache.to("jax")
    with pjrt_host.config(dynamic_shapes=True):
        for _ in range(20):  # lengths 4 .. 23: the buckets of 16 and 32
            x = torch.randn(2, 1, 8, generator=g)
            cache, want = step(cache, x)
            dev, got = compiled(dev, x.to("jax"))
            torch.testing.assert_close(got.cpu(), want)
            assert dev.shape == cache.shape
        torch.testing.assert_close(dev.cpu(), cache)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["graph_programs"] == 2, stats


def test_compiled_generate_with_transformers_default_cache_runs_in_buckets():
    """``model.forward`` compiled, ``generate()`` with transformers' default
    DynamicCache (the cache a ``torch.cat`` along the length at every token)
    and prompts of new lengths: CPU's tokens, no graph compiled per length."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    _padding.reset()
    transformers.set_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cpu = transformers.GPT2LMHeadModel(config).eval()
    dev = transformers.GPT2LMHeadModel(config).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("jax").forward = torch.compile(dev.forward, backend="jax")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad(), pjrt_host.config(dynamic_shapes=True):
        for n in (5, 7, 6, 9):
            prompt = torch.randint(1, 100, (1, n), generator=g)
            want = cpu.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            got = dev.generate(prompt.to("jax"), max_new_tokens=8, min_new_tokens=8, do_sample=False)
            assert got.cpu().tolist() == want.tolist(), n
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]
    assert stats["padded_calls"] > 0, stats


@pytest.mark.parametrize("buckets", [True, False])
def test_compiled_views_with_symbolic_arguments_are_the_views_cpu_returns(buckets):
    """Outputs that are views of an input or of another output, made by view
    ops with symbolic arguments (``chunk`` of a symbolic dim, ``flatten()``
    then ``unbind``): AOTAutograd makes them again with ``as_strided`` on the
    base, from the layout the graph's result reports.  The graph's result is
    a fresh one (row-major, offset 0), so ``x.chunk(2, 1)[0]`` read ``x``'s
    first row twice and ``x.flatten().unbind(-1)[3]`` read element 0,
    silently (fuzz seeds 28003606, 28004230).  A view whose own layout is
    plain ints after such an op is one too: ``x.flatten().narrow(0, 1, 3)``
    (size 3, offset 1) read from offset 0 (fuzz seed 28012010).  Values,
    and writes through the views, as CPU's."""
    def f(x):
        y = x * 2
        return x.chunk(2, 1)[0], x.flatten().unbind(-1)[3], y, y.chunk(2, 1)[1], x.flatten().narrow(0, 1, 3)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="jax", dynamic=True)
    with pjrt_host.config(dynamic_shapes=buckets):
        for n in (4, 6, 5):
            x = torch.arange(3 * n, dtype=torch.float32).reshape(3, n)
            d = x.to("jax")
            want, got = f(x), compiled(d)
            for w, g in zip(want, got):
                torch.testing.assert_close(g.cpu(), w)
                assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            want[0].add_(100)
            got[0].add_(100)
            want[3].sub_(1)
            got[3].sub_(1)
            torch.testing.assert_close(d.cpu(), x)
            torch.testing.assert_close(got[2].cpu(), want[2])


def test_a_compiled_view_chain_whose_size_no_input_binds_keeps_the_programs_result():
    """An output made again from another output through view ops whose
    symbolic argument no input's size binds (fuzz seed 28004720: an
    ``as_strided`` of an empty slice, beside a view written by a random
    draw): the program's own result is kept, where evaluating the argument
    raised a KeyError out of the compiled call."""
    def program(v0):
        v2 = torch.mul(v0, v0)
        v3 = v0 * v2
        v4 = v3.float()
        v5 = v4.detach()
        v6 = v5.view(-1)
        v7 = v4 ** 2
        v8 = v7[:, :, 3:3]
        v6.uniform_()
        return v0, v2, v3, v4, v5, v6, v7, v8, v8.as_strided((4, 2), (1, 4), 3)

    torch._dynamo.reset()
    x = torch.randint(-4, 5, (3, 1, 4), generator=torch.Generator().manual_seed(21207))
    want = program(x)
    with pjrt_host.config(dynamic_shapes="all"):
        got = torch.compile(program, backend="jax", dynamic=True)(x.to("jax"))
    for i in (0, 1, 2, 6, 7, 8):  # (3, 4 and 5 hold the draw: another stream than CPU's)
        torch.testing.assert_close(got[i].cpu(), want[i])


def test_a_compiled_view_of_sizes_a_guard_narrowed_to_one_value_is_cpus():
    """``as_strided`` with an offset on a ``dynamic=True`` input makes a
    guard that narrows the input's symbolic sizes to one value each, after
    the graph's ``diagonal`` recorded its size as ``Min(s0, s1)`` of the
    symbols: the placeholders then report numbers, no size was bound to the
    symbols, and the output's layout raised "Cannot convert symbols to int"
    out of the compiled call (fuzz seed 28008578). As aot_eager on CPU."""
    def program(v0):
        v2 = torch.nn.functional.gelu(v0)
        return v0, v2, v2.as_strided((2, 2), (2, 1), 3), v0.diagonal()

    torch._dynamo.reset()
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) - 3
    want = program(x)
    with pjrt_host.config(dynamic_shapes="all"):
        got = torch.compile(program, backend="jax", dynamic=True)(x.to("jax"))
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w)
        assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()


def test_a_compiled_negative_index_counts_from_the_logical_end_with_checks_off():
    """``x[:, i]`` with ``i = -1`` along a symbolic length, index checks off
    (``checks=False``, where the check no longer refused the padded graph):
    the lowering wraps a negative index by the logical length only with the
    mask of logical positions, which a padded graph did not give, so it
    read the bucket's last place, padding: 0 where CPU gives the last
    element, silently.  The graph now gives every op with a rule the masks
    eager's padded route gives."""
    torch._dynamo.reset()
    _padding.reset()
    f = torch.compile(lambda x, i: x[:, i], backend="jax")
    with pjrt_host.config(checks=False, dynamic_shapes=True):
        for n in (18, 21, 25, 19):
            x = torch.arange(2 * n, dtype=torch.float32).reshape(2, n)
            i = torch.tensor([-1, 0, 2, -n])
            assert torch.equal(f(x.to("jax"), i.to("jax")).cpu(), x[:, i]), n
    assert torch.jax.dynamic_shape_stats()["graph_programs"] == 1


def test_compiled_dropout_draws_in_buckets_what_it_draws_per_shape():
    # a random op with a rule (dropout) runs padded: each logical element
    # draws what the per-shape program draws for it, from the same key
    torch._dynamo.reset()
    _padding.reset()

    def f(x):
        return F.dropout(torch.softmax(x, -1), p=0.5, training=True) * 3

    g = torch.compile(f, backend="jax")
    for n in (9, 13, 11, 15):
        x = torch.randn(2, n, 12)
        got = {}
        for on in (True, False):
            torch.manual_seed(n)
            xd = x.to("jax")
            torch._dynamo.mark_dynamic(xd, 1)
            with pjrt_host.config(dynamic_shapes=on):
                got[on] = g(xd).cpu()
        assert torch.equal(got[True], got[False]), n
        kept = got[True] != 0
        assert 0.3 < kept.float().mean() < 0.7
        torch.testing.assert_close(got[True][kept], (torch.softmax(x, -1) * 6)[kept], rtol=1e-5, atol=1e-6)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["graph_programs"] == 1, stats  # 9 .. 15: the bucket of 16
    assert not any("random" in k for k in stats["fallbacks_by_reason"]), stats["fallbacks_by_reason"]


def test_an_embedding_that_meets_fixed_shapes_at_several_places_stays_exact():
    """One embedding table indexed at several places, each with its own
    fixed shape (T5's token ids of its encoder and its decoder, its
    relative positions), never pads: the sizes its index check counts are
    counted per place, as an op's inputs are.  Counted per op, a dim met
    three sizes within the first step, and every later step of these fixed
    shapes ran padded (T5 3.5x slower than exact)."""
    _padding.reset()
    torch.manual_seed(0)
    table = torch.nn.Embedding(50, 8).to("jax")
    encoder_ids = torch.randint(0, 50, (4, 32), device="jax")
    decoder_ids = torch.randint(0, 50, (4, 16), device="jax")
    encoder_positions = torch.randint(0, 50, (32, 32), device="jax")
    decoder_positions = torch.randint(0, 50, (16, 16), device="jax")
    with pjrt_host.config(dynamic_shapes=True):
        for _ in range(3):
            tokens = table(encoder_ids).sum()
            tokens = tokens + table(decoder_ids).sum()
            positions = table(encoder_positions).sum()
            positions = positions + table(decoder_positions).sum()
            (tokens + positions).item()
    stats = torch.jax.dynamic_shape_stats()
    assert stats["pads"] == 0 and stats["padded_calls"] == 0, stats


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """An attention function shared by every module (as transformers'
    ``sdpa_attention_forward`` is)."""
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1).sum(-1)


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return _scores(self.proj(x), memory)


def test_module_instances_of_fixed_sizes_on_one_line_stay_exact():
    """Instances of one module class, each with its own fixed sizes (an
    encoder's self-attention over 32 positions, a decoder's over 12, the
    cross-attention between them, a pooled stage's over 16), run the same lines of code: each
    instance is a place of its own, so no dim counts three sizes and
    nothing pads.  With the line alone as the place, Whisper's training
    step of fixed shapes ran padded (40 % more elements, 18 programs
    compiled again in its second step)."""
    _padding.reset()
    torch.manual_seed(0)
    encoder, decoder, cross, pooled = (_Attention().to("jax") for _ in range(4))
    source = torch.randn(2, 32, 8, device="jax")
    target = torch.randn(2, 12, 8, device="jax")
    pooled_source = torch.randn(2, 16, 8, device="jax")
    with pjrt_host.config(dynamic_shapes=True):
        for _ in range(3):
            total = encoder(source, source).sum() + decoder(target, target).sum() + cross(target, source).sum()
            total = total + pooled(pooled_source, pooled_source).sum()
            total.item()
    stats = torch.jax.dynamic_shape_stats()
    assert stats["pads"] == 0 and stats["padded_calls"] == 0, stats


def _marked(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` on the device, padded along ``dim`` (a dim marked dynamic,
    read by the op's next new signature)."""
    d = t.to("jax")
    torch._dynamo.mark_dynamic(d, dim)
    d = torch.sin(d) if d.is_floating_point() else d | 0 if d.dtype == torch.bool else d + 0
    return d


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_an_in_place_op_on_padded_inputs_runs_padded_and_its_target_takes_the_padding(eager):
    """An in-place op runs as its functional op; over padded inputs its
    target takes the padded result (an exact target beside a padded
    operand becomes padded).  torch's SiLU backward computes ``1 -
    sigmoid`` as ``empty_like(s).fill_(1).sub_(s)``: the ``*_like``
    factory of a padded tensor is padded too, so that chain cut nothing.
    It cut every MLP activation of a Llama training step, which then
    compiled at every length.  A view target, or a dtype the target cannot
    hold, still takes the exact route (torch's error)."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (9, 13):
            x, y = torch.randn(3, n, 4), torch.randn(3, n, 4)
            dy = _marked(y, 1)
            assert dy._storage.padded is not None
            want_y = torch.sin(y)
            target = x.to("jax")
            target.sub_(dy)
            assert target._storage.padded is not None
            torch.testing.assert_close(target.cpu(), x - want_y)
            target.mul_(2).add_(dy, alpha=3)
            torch.testing.assert_close(target.cpu(), (x - want_y) * 2 + 3 * want_y)
            for like, want in ((torch.empty_like(dy).fill_(1), torch.ones(3, n, 4)),
                               (torch.zeros_like(dy), torch.zeros(3, n, 4)),
                               (torch.full_like(dy, 2.5, dtype=torch.float64), torch.full((3, n, 4), 2.5, dtype=torch.float64)),
                               (dy.new_ones(dy.shape), torch.ones(3, n, 4))):
                assert like._storage.padded is not None
                torch.testing.assert_close(like.cpu(), want)
            one_minus = torch.empty_like(dy).fill_(1).sub_(dy)
            torch.testing.assert_close(one_minus.cpu(), 1 - want_y)
            a = torch.sin(x).requires_grad_()
            da = _marked(x, 1).detach().requires_grad_()
            (F.silu(a) * want_y).sum().backward()
            (F.silu(da) * dy).sum().backward()
            assert da.grad._storage.padded is not None
            torch.testing.assert_close(da.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
            row = x.to("jax")
            row[0].add_(dy[0])  # a view target: exact
            torch.testing.assert_close(row.cpu()[0], x[0] + want_y[0])
            ints = torch.zeros(3, n, 4, dtype=torch.int64, device="jax")
            with pytest.raises(RuntimeError, match="result type Float can't be cast"):
                ints.add_(dy)
    stats = torch.jax.dynamic_shape_stats()
    cuts = stats["cuts_by_op"]
    assert set(cuts) <= {"aten::add_.Tensor"}, cuts  # (the view target's, and the refused dtype's)
    assert stats["fallbacks"] == 0, stats["fallbacks_by_reason"]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_labels_padded_at_a_line_and_masks_cast_at_a_line_become_dynamic(eager):
    """Tensors fresh from the host at every step that no op with a rule
    reads first: a causal LM's labels grown by ``F.pad(labels, (0, 1),
    value=-100)`` and transformers' ``attention_mask.to(torch.bool)``.
    Their dim becomes dynamic at the pad's or the cast's line when it takes
    a third size there, so a later length of the bucket compiles nothing
    (each compiled its pad or cast, and the segment around it, at every
    length)."""
    _padding.reset()
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (20, 23, 27, 30, 25):
            labels = torch.arange(2 * n).reshape(2, n) % 7
            mask = (torch.arange(2 * n).reshape(2, n) % 5 != 0).long()
            before = _compiled()
            grown = F.pad(labels.to("jax"), (0, 1), value=-100)
            cast = mask.to("jax").to(torch.bool)
            assert torch.equal(grown.cpu(), F.pad(labels, (0, 1), value=-100))
            assert torch.equal(cast.cpu(), mask.bool())
            assert torch.equal((cast.sum(-1) + grown[:, 1:].sum(-1)).cpu(), mask.bool().sum(-1) + labels[:, 1:].sum(-1)
                               + torch.tensor(-100))
            compiled.append(_compiled() - before)
    assert grown._storage.padded is not None and cast._storage.padded is not None
    assert compiled[3:] == [0, 0], compiled  # 30 and 25 run the bucket's programs (27 made them)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_the_gradient_of_a_slice_along_an_exact_dim_keeps_its_padding(eager):
    """Rotary embeddings slice the head dim in halves (exact) of a tensor
    padded along the length: each half's gradient is placed in the head dim
    with its padding kept, not cut (38 cuts in 6 steps of a Llama)."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (9, 13):
            x = torch.randn(2, n, 8)
            a = torch.sin(x).requires_grad_()
            da = _marked(x, 1).detach().requires_grad_()
            for t in (a, da):
                half = t.shape[-1] // 2
                rotated = torch.cat((-t[..., half:], t[..., :half]), -1)
                (rotated * t.detach()).sum().backward()  # (a gradient padded as t is)
            assert da.grad._storage.padded is not None
            torch.testing.assert_close(da.grad.cpu(), a.grad)
    stats = torch.jax.dynamic_shape_stats()
    assert "aten::slice_backward" not in stats["cuts_by_op"], stats["cuts_by_op"]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_gather_by_a_padded_index_and_layouts_alike_but_for_ones_run_padded(eager):
    """Three calls real models make with padded inputs, each of which cut
    them (or failed to trace and ran exact): RoBERTa gathers its token
    types by its padded position ids; Gemma projects its attention output
    read as ``[2 x T]`` rows of a ``[2, 1, 1, T]`` layout against a
    ``[2, T]`` one (the same elements but for dims of size 1); T5's
    softmax backward meets a gradient padded along both lengths with an
    output padded along one."""
    _padding.reset()
    torch.manual_seed(0)
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (9, 13):
            types = torch.arange(40).reshape(1, 40) % 3
            pos = torch.arange(n).expand(2, n) + torch.tensor([[0], [2]])
            dpos = _marked(pos, 1)
            got = torch.gather(types.to("jax").expand(2, -1), 1, dpos)
            assert got._storage.padded is not None
            assert torch.equal(got.cpu(), torch.gather(types.expand(2, -1), 1, pos))

            a, b = torch.randn(2, 1, 1, n, 4), torch.randn(2, n, 6)
            da, db = _marked(a, 3), _marked(b, 1)
            got = da.reshape(2 * n, 4).t() @ db.reshape(2 * n, 6)
            torch.testing.assert_close(got.cpu(), torch.sin(a).reshape(2 * n, 4).t() @ torch.sin(b).reshape(2 * n, 6),
                                       rtol=1e-5, atol=1e-5)

            g, out = torch.randn(2, 3, n, n), torch.softmax(torch.randn(2, 3, n, n), -1)
            dg = _marked(g, 2) + _marked(torch.zeros(2, 3, n, n), 3)  # padded along both lengths
            dout = _marked(out, 3)
            want = torch.ops.aten._softmax_backward_data(torch.sin(g), torch.sin(out), -1, torch.float32)
            got = torch.ops.aten._softmax_backward_data(dg, dout, -1, torch.float32)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    stats = torch.jax.dynamic_shape_stats()
    assert stats["fallbacks"] == 0 and not stats["cuts_by_op"], (stats["fallbacks_by_reason"], stats["cuts_by_op"])


class _Positions(torch.nn.Module):
    """BERT's embeddings: position ids and token types sliced from buffers
    of the longest length, the token types gathered by the positions and
    expanded over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.words = torch.nn.Embedding(50, 8)
        self.places = torch.nn.Embedding(64, 8)
        self.kinds = torch.nn.Embedding(2, 8)
        self.register_buffer("position_ids", torch.arange(64).expand(1, -1), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, 64, dtype=torch.long), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        positions = self.position_ids[:, :n]
        kinds = torch.gather(self.token_type_ids.expand(ids.shape[0], -1), 1, positions.expand(ids.shape[0], -1))
        return self.words(ids) + self.places(positions) + self.kinds(kinds)


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_slices_of_a_longer_buffer_are_read_wider_and_a_new_length_compiles_nothing(eager):
    """A slice of a buffer longer than the bucket (BERT's position ids and
    token types, ``self.position_ids[:, :L]``) cannot be padded in place:
    it is read wider, the buffer's next elements masked as padding, by the
    ops and by their index checks.  Each step at a new length compiled the
    embedding, its check and the gather again."""
    _padding.reset()
    cpu, dev = _pair(_Positions)
    compiled = []
    with pjrt_host.config(dynamic_shapes=True, eager=eager):
        for n in (20, 23, 27, 30, 25):
            ids = torch.randint(0, 50, (2, n))
            before = _compiled()
            got = dev(ids.to("jax"))
            torch.testing.assert_close(got.cpu(), cpu(ids))
            compiled.append(_compiled() - before)
        # the check of a slice read wider sees its logical values only: the
        # buffer's next elements (99, out of range) are padding
        rows = torch.cat([torch.arange(64), torch.full((36,), 99)]).to("jax").expand(1, -1)
        for start, n in ((0, 20), (0, 23), (0, 27), (34, 30)):
            torch.testing.assert_close(dev.places(rows[:, start:start + n]).cpu(),
                                       cpu.places(torch.arange(start, start + n).view(1, -1)))
        with pytest.raises(IndexError, match="index out of range"):
            dev.places(rows[:, 40:70]).cpu()
    assert compiled[3:] == [0, 0], compiled
    stats = torch.jax.dynamic_shape_stats()
    assert not stats["cuts_by_op"] and not stats["fallbacks"], (stats["cuts_by_op"], stats["fallbacks_by_reason"])


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_view_read_wider_then_changed_in_place_is_read_as_it_is_now(eager):
    """A view marked to be read wider (its dims, by number) then changed by
    an in-place view op (``unsqueeze_``): the mark named dims it no longer
    has, and the next op raised numpy's ValueError (fuzz seed 23000157,
    padded modes).  The mark is dropped once the view's shape changes."""
    x = torch.arange(12).reshape(3, 1, 4)
    with pjrt_host.config(dynamic_shapes="all", eager=eager):
        v = x.to("jax").unbind(-3)[0]
        assert torch.equal(torch.sub(v, v, alpha=2).cpu(), -x[0])
        v.unsqueeze_(0)
        assert torch.equal(torch.round(v / 4).cpu(), torch.round(x[0].unsqueeze(0) / 4))
