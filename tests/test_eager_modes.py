"""The eager modes (``pjrt_host.config(eager=...)``, ``PJRT_HOST_EAGER``):
``fused`` (ops recorded into segments, the default), ``op`` (each op
compiled and run as it comes) and ``sync`` (op by op, every op a
synchronisation point: its work waited for and its index / value checks
raised at the op, as ``CUDA_LAUNCH_BLOCKING=1``).

Every mode gives the same values and, for a seed, the same random numbers;
what differs is where a value-dependent error surfaces: at the op in sync
mode, at the next synchronisation point in the others.  The mode is a
setting of the thread's configuration stack.  The last tests run samples
of the suite's own files, and of OpInfo, with each non-default mode as the
default (a full OpInfo float32 run op by op is marked slow)."""

from __future__ import annotations

import threading
import traceback

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402

from conftest import run_python  # noqa: E402

MODES = ("op", "fused", "sync")


def _train(mode: str, steps: int = 2) -> tuple[list[float], list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Dropout(0.3),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 5)).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    losses = []
    with pjrt_host.config(eager=mode):
        for _ in range(steps):
            x = torch.randn(8, 12, generator=gen).to("jax")
            y = torch.randint(0, 5, (8,), generator=gen).to("jax")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        drawn = torch.cat([torch.rand(6, device="jax"), torch.randn(6, device="jax"),
                           torch.nn.functional.dropout(torch.ones(12, device="jax"), 0.5)]).cpu()
        weights = [p.detach().cpu() for p in model.parameters()]
    return losses, weights, drawn


def test_every_mode_trains_to_the_same_values_with_the_same_random_numbers():
    op_losses, op_weights, op_drawn = _train("op")
    for mode in ("fused", "sync"):
        losses, weights, drawn = _train(mode)
        # the random draws are bit for bit the same: keys are taken in op order
        assert torch.equal(drawn, op_drawn), mode
        if mode == "sync":  # the same programs as op by op: the same bits
            assert losses == op_losses
            assert all(torch.equal(a, b) for a, b in zip(weights, op_weights))
        else:  # one program per segment: XLA may fuse arithmetic differently
            torch.testing.assert_close(losses, op_losses, rtol=1e-5, atol=1e-6)
            for a, b in zip(weights, op_weights):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _line_raised_from(err: BaseException) -> str | None:
    """The last line of this file the error's traceback passes through."""
    lines = [f.line for f in traceback.extract_tb(err.__traceback__) if f.filename == __file__]
    return lines[-1] if lines else None


def test_an_index_error_raises_at_the_op_in_sync_mode():
    x = torch.arange(5.0, device="jax")
    bad = torch.tensor([1, 7], device="jax")
    with pjrt_host.config(eager="sync"):
        with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5") as info:
            x[bad] * 2
        assert _line_raised_from(info.value) == "x[bad] * 2"
        with pytest.raises(IndexError, match="index out of range in self"):
            torch.nn.functional.embedding(bad, torch.ones(5, 3, device="jax"))
        # value checks too: a bad probability raises at multinomial
        with pytest.raises(RuntimeError, match="probability tensor contains") as info:
            torch.multinomial(torch.tensor([-1.0, 1.0], device="jax"), 1)
        assert _line_raised_from(info.value).startswith("torch.multinomial(")
        # checks=False still turns the checks off
        with pjrt_host.config(checks=False):
            x[bad].cpu()


@pytest.mark.parametrize("mode", ["op", "fused"])
def test_an_index_error_raises_at_the_next_synchronisation_in_the_other_modes(mode):
    x = torch.arange(5.0, device="jax")
    bad = torch.tensor([1, 7], device="jax")
    with pjrt_host.config(eager=mode):
        y = x[bad] * 2  # no error yet: the verdict is on the device
        with pytest.raises(IndexError, match="raised by aten::index.Tensor .* found at the next synchronisation") \
                as info:
            torch.jax.synchronize()
        assert _line_raised_from(info.value) == "torch.jax.synchronize()"
        del y


def test_sync_mode_waits_for_each_op():
    x = torch.randn(512, 512, device="jax")
    with pjrt_host.config(eager="sync"):
        y = x
        for _ in range(4):
            y = y @ x
            assert y._storage.array.is_ready()  # computed before the op returned
        y.add_(1)
        assert y._storage.array.is_ready()


def test_the_mode_is_each_threads_own():
    x = torch.arange(5.0, device="jax")
    bad = torch.tensor([7], device="jax")
    seen = {}

    def other():
        try:
            seen["mode"] = pjrt_host._torch._config.current().eager
            seen["y"] = x[bad]  # op by op here: deferred, not raised
        except Exception as err:  # pragma: no cover - the failure the test reports
            seen["error"] = err

    with pjrt_host.config(eager="sync"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen.get("mode") != "sync" and "error" not in seen
        with pytest.raises(IndexError):
            torch.jax.synchronize()  # the other thread's deferred check, at this synchronisation
        with pytest.raises(IndexError):
            x[bad]  # this thread's op: at the op


def test_the_environment_variable_selects_sync_mode():
    script = ("import torch, traceback\n"
              "x = torch.arange(5.0, device='jax'); bad = torch.tensor([7], device='jax')\n"
              "try:\n"
              "    y = x[bad]\n"
              "    print('not at the op')\n"
              "except IndexError as err:\n"
              "    print('raised at line', traceback.extract_tb(err.__traceback__)[0].lineno)\n")
    proc = run_python(["-c", script], env={"PJRT_HOST_EAGER": "sync"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raised at line 4" in proc.stdout  # y = x[bad]
    proc = run_python(["-c", "import torch; torch.ones(1, device='jax')"], env={"PJRT_HOST_EAGER": "eager"})
    assert proc.returncode != 0 and "PJRT_HOST_EAGER='eager'" in proc.stderr and "'sync'" in proc.stderr


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="'op', 'fused', 'sync'"):
        with pjrt_host.config(eager="blocking"):
            pass


# ---------------------------------------------------------------- the suite in each mode


def _passes(args: list[str], mode: str, extra_env: dict[str, str] | None = None, timeout: int = 1200) -> str:
    proc = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                      env={"PJRT_HOST_EAGER": mode, **(extra_env or {})}, timeout=timeout)
    tail = proc.stdout[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
    return tail


# Sync mode raises value-dependent errors at the op, so tests of the
# deferral itself (test_bad_inputs.py, one of test_torch_habits.py) are not
# in its sample.  About a minute on two cores.
SYNC_SAMPLE = ["tests/test_torch_views.py", "tests/test_torch_habits.py",
               "--deselect", "tests/test_torch_habits.py::test_index_errors_by_default_at_the_next_synchronisation"]


def test_a_sample_of_the_suite_passes_in_sync_mode():
    _passes(["-x", *SYNC_SAMPLE], "sync")


# OpInfo cases across the op families: elementwise, reductions, matmuls,
# normalisation, indexing (checked), shapes and views, sorting, random and
# data-dependent ops, in-place forms through torch's variants.
OPINFO_SAMPLE = [
    "add", "mul", "sub", "div.no_rounding_mode", "pow", "exp", "log", "tanh", "sigmoid", "clamp", "where",
    "masked_fill", "sum", "mean", "amax", "var", "argmax", "cumsum", "softmax", "log_softmax", "matmul", "mm",
    "bmm", "addmm", "nn.functional.linear", "nn.functional.layer_norm", "nn.functional.gelu",
    "nn.functional.embedding", "nn.functional.cross_entropy", "nn.functional.conv2d", "index_select", "gather",
    "scatter_add", "index_put", "take_along_dim", "cat", "stack", "transpose", "reshape", "narrow", "expand",
    "sort", "topk", "nonzero", "nn.functional.dropout", "bernoulli", "rand_like", "normal",
]


def _opinfo_ids(names: list[str]) -> list[str]:
    return [f"tests/test_opinfo.py::test_opinfo[{name}-float32]" for name in names]


def test_an_opinfo_sample_passes_op_by_op():
    tail = _passes(_opinfo_ids(OPINFO_SAMPLE), "op", {"PJRT_HOST_OPINFO_DTYPES": "float32"})
    assert "OpInfo on jax:" in tail


# Training, views and in-place writes op by op (the suite runs fused, the
# default); more files with --slow.
OP_SAMPLE = ["tests/test_torch_training.py", "tests/test_torch_views.py"]
OP_SLOW_SAMPLE = ["tests/test_torch_random.py", "tests/test_torch_amp.py", "tests/test_torch_habits.py",
                  "tests/test_bad_inputs.py", "tests/test_fused_optimizers.py"]


@pytest.mark.parametrize("files", [OP_SAMPLE, pytest.param(OP_SLOW_SAMPLE, marks=pytest.mark.slow)],
                         ids=["default", "slow"])
def test_a_sample_of_the_suite_passes_op_by_op(files):
    _passes(["-x", *files], "op")


@pytest.mark.slow
def test_opinfo_float32_passes_op_by_op():
    """Every float32 OpInfo case op by op (about 30 minutes on two shared cores)."""
    tail = _passes(["tests/test_opinfo.py"], "op", {"PJRT_HOST_OPINFO_DTYPES": "float32"}, timeout=3600)
    assert "OpInfo on jax:" in tail
