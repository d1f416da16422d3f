"""Out of memory in the middle of a compiled step: ``torch.OutOfMemoryError``
naming the compiled graph, and the process keeps working once the step's
tensors are freed.

The route is the one the eager out-of-memory tests take
(``test_torch_habits``): a result of 16 TiB, far beyond the device (cpu_ref:
the machine's memory), which XLA fails to allocate.  cpu_ref runs programs
asynchronously and reports that failure only in the results; a device that
raises RESOURCE_EXHAUSTED from the call itself takes the ``except`` path of
the same code.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

HUGE = 2**21  # HUGE x HUGE float32: 16 TiB


def _ooms() -> int:
    return torch.jax.memory_stats()["num_ooms"]


def test_a_compiled_step_out_of_memory_is_torchs_error_naming_the_graph():
    def step(x, w, big: bool):
        h = torch.relu(x @ w)
        return h.sum().reshape(1, 1).expand(HUGE, HUGE) * 2 if big else h

    compiled = torch.compile(step, backend="jax")
    w = torch.randn(4, 4, device="jax")
    before = _ooms()
    with pytest.raises(torch.OutOfMemoryError) as info:
        compiled(torch.randn(1, 4, device="jax"), w, True).sum().item()
    text = str(info.value)
    assert "out of memory on jax:0" in text and "the inference graph of torch.compile(backend='jax')" in text, text
    assert "tried to allocate 16.00 TiB" in text and "empty_cache" in text, text
    assert _ooms() == before + 1
    # The process goes on: the same compiled function with a batch that fits,
    # and eager ops.
    x = torch.randn(3, 4)
    got = compiled(x.to("jax"), w, False)
    torch.testing.assert_close(got.cpu(), step(x, w.cpu(), False), rtol=1e-5, atol=1e-5)
    assert (torch.arange(3, device="jax") + 1).tolist() == [1, 2, 3]


def test_a_training_step_out_of_memory_leaves_the_model_usable():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = [p.detach().cpu().clone() for p in model.parameters()]

    @torch.compile(backend="jax")
    def loss_of(x, blow_up: bool):
        y = model(x)
        if blow_up:  # a step that also makes a tensor the device cannot hold
            line = torch.ones(HUGE, device="jax")
            return y.mean(), line[:, None] * y.sum() * line[None, :]
        return y.mean(), None

    with pytest.raises(torch.OutOfMemoryError) as info:
        loss, _ = loss_of(torch.randn(2, 4, device="jax"), True)
        loss.backward()
        opt.step()
    assert "the forward graph of torch.compile(backend='jax')" in str(info.value), str(info.value)
    opt.zero_grad(set_to_none=True)
    del info
    torch.jax.empty_cache()
    # Parameters kept their values; training goes on.
    for p, s in zip(model.parameters(), saved):
        torch.testing.assert_close(p.detach().cpu(), s)
    x = torch.randn(2, 4)
    loss, _ = loss_of(x.to("jax"), False)
    loss.backward()
    opt.step()
    reference = torch.nn.Linear(4, 4)
    with torch.no_grad():
        for r, s in zip(reference.parameters(), saved):
            r.copy_(s)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).mean().backward()
    ref_opt.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)


def test_a_graph_that_overwrites_its_inputs_says_their_values_are_lost():
    """A compiled in-place update is given its inputs' buffers (donation):
    when the call fails for memory, the error says those values are gone
    and how to keep them, instead of a later read failing on a deleted
    array with no cause."""
    state = torch.ones(2**20, device="jax")  # 4 MiB

    @torch.compile(backend="jax")
    def update(s):
        s.mul_(2)
        line = torch.ones(HUGE, device="jax")
        return line[:, None] * s.sum() * line[None, :]

    with pytest.raises(torch.OutOfMemoryError) as info:
        update(state)
    text = str(info.value)
    assert "overwrites 1 of its inputs in place" in text and "PJRT_HOST_DONATE=0" in text, text
    assert "(4.0 MiB)" in text, text
    del info
    torch.jax.empty_cache()
    assert (torch.arange(3, device="jax") * 2).tolist() == [0, 2, 4]  # the device goes on
