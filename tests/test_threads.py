"""Threads training different models at once (eager, compiled, assume_pure)
each get exactly what the same training run alone gives: ops, compiled
programs, random state and autograd keep to their thread.  The full run
(8 threads x 200 steps) is benchmarks/bench_threads.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_threads  # noqa: E402


def test_threads_training_at_once_equal_each_run_alone():
    n, steps = 6, 12
    alone = [bench_threads.train(bench_threads.KINDS[i % 3], i, steps) for i in range(n)]
    together, errors = bench_threads.run_threads(n, steps)
    assert not errors, errors
    # To rounding: XLA:CPU's thread pool may split a reduction differently
    # while other threads compute; another thread's values leaking in would
    # be far off.
    for i, (a, b) in enumerate(zip(alone, together)):
        torch.testing.assert_close(b[0], a[0], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"thread {i} ({bench_threads.KINDS[i % 3]}) losses: {m}")
        for p, q in zip(a[1], b[1]):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


# Not strict: whether the other thread is inside a trace at that moment
# depends on what earlier tests left cached.
@pytest.mark.xfail(strict=False, reason="torch.compile() returns the model uncompiled while another thread traces an "
                   "assume_pure function: the trace sets torch.compiler's process-wide exporting flag")
def test_torch_compile_while_another_thread_traces():
    import threading
    import warnings

    import pjrt_host

    started, release = threading.Event(), threading.Event()

    def slow(x):
        started.set()
        release.wait(30)
        return x * 2

    t = threading.Thread(target=lambda: pjrt_host.assume_pure(slow)(torch.ones(2, device="jax")))
    t.start()
    started.wait(30)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled = torch.compile(torch.nn.Linear(2, 2), backend="jax")
    finally:
        release.set()
        t.join()
    assert not isinstance(compiled, torch.nn.Linear)
