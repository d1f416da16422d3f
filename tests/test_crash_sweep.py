"""No Python-level call on the 'jax' device ends the process.

Every public method of ``torch.Tensor`` and ``torch.UntypedStorage``, called
on 'jax' objects with simple arguments, and every function of ``torch.jax``,
each in a subprocess that is restarted after the call that killed it: the
answer must be a result or a Python exception, never a signal.  (This is how
``storage.new()`` was found dereferencing torch's missing allocator.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("crash_sweep_worker.py")

TENSOR_ARGS = ("none", "tensor", "int", "cpu")
STORAGE_ARGS = ("none", "int", "storage", "cpu_storage")
MODULE_ARGS = ("none", "int")


def _public(cls) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None)))


def all_calls() -> list[str]:
    from pjrt_host._torch._boot import _torch_jax

    calls = [f"tensor:{n}:{a}" for n in _public(torch.Tensor) for a in TENSOR_ARGS]
    calls += [f"storage:{n}:{a}" for n in _public(torch.UntypedStorage) for a in STORAGE_ARGS]
    calls += [f"module:{n}:{a}" for n in sorted(_torch_jax.__all__) for a in MODULE_ARGS
              if callable(getattr(_torch_jax, n))]
    return calls


def sweep(calls: list[str]) -> list[tuple[str, object]]:
    """(call, exit status) for each call that ended its process."""
    crashes = []
    rest = calls
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    while rest:
        try:
            proc = subprocess.run([sys.executable, str(WORKER)], input="\n".join(rest), capture_output=True,
                                  text=True, timeout=600, env=env)
            out, status = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as err:
            out, status = err.stdout or "", "timeout"
            out = out.decode() if isinstance(out, bytes) else out
        done = [line[5:] for line in out.splitlines() if line.startswith("CALL ")]
        if status == 0 and out.rstrip().endswith("DONE"):
            break
        last = done[-1] if done else rest[0]
        crashes.append((last, status))
        rest = rest[rest.index(last) + 1:]
    return crashes


@pytest.mark.multiprocess
def test_no_public_call_ends_the_process():
    calls = all_calls()
    assert len(calls) > 2000  # the sweep reaches torch's whole public surface
    assert sweep(calls) == []


def test_the_sweep_sees_a_call_that_ends_the_process(tmp_path, monkeypatch):
    """The sweep itself: a call that kills its process is found and the
    sweep goes on after it."""
    monkeypatch.setattr(sys.modules[__name__], "WORKER", tmp_path / "worker.py")
    (tmp_path / "worker.py").write_text(
        "import os, sys\n"
        "for c in sys.stdin.read().split():\n"
        "    print('CALL', c, flush=True)\n"
        "    if c.startswith('die'): os.abort()\n"
        "print('DONE', flush=True)\n")
    crashes = sweep(["ok:a:none", "die:b:none", "ok:c:none", "die:d:none", "ok:e:none"])
    assert [c for c, _ in crashes] == ["die:b:none", "die:d:none"]
    assert all(status == -6 for _, status in crashes)
