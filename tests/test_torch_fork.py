"""Worker processes and the 'jax' device, as torch.cuda behaves: a child made
by fork() after its parent created the PJRT client raises a clear error at
its first use of the device (it used to hang), while its CPU work and the
DataLoader's fork workers that only make CPU tensors go on as before; spawn
workers may return 'jax' tensors, which cross as CPU copies.

Each case runs in a fresh Python process with a time limit, so a hang fails
the test instead of stopping the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
LIMIT = 240  # seconds; each script takes a few seconds when nothing hangs


def _run(tmp_path: Path, prefix: str, code: str) -> dict:
    """Run ``prefix`` then ``code`` as a script (spawn needs one to
    re-import) and return the JSON object it prints last."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(prefix) + textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                              timeout=LIMIT, stdin=subprocess.DEVNULL, cwd=str(tmp_path))
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the script did not finish in {LIMIT} s (a hang):\n{err.stdout}\n{err.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# A child that reports one action's outcome through a pipe; the parent gives
# up on it after a while (a hang reads as "hang", and the child is killed).
_FORK_HELPERS = """
import json, os, select, signal, sys, warnings
warnings.simplefilter("ignore")  # jax warns at every fork() of a process that imported it
import torch
import pjrt_host

def in_child(action):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            result = {"ok": repr(action())[:200]}
        except BaseException as e:
            result = {"raised": type(e).__name__, "is_runtime_error": isinstance(e, RuntimeError),
                      "message": str(e)}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 90)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"hang": True}
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)
"""


def _assert_fork_error(outcome: dict, what: str) -> None:
    assert "raised" in outcome, f"{what}: {outcome}"
    assert outcome["is_runtime_error"], f"{what}: {outcome}"
    message = outcome["message"]
    assert "fork()" in message and "'spawn'" in message, f"{what}: {message}"
    assert "multiprocessing_context='spawn'" in message, f"{what}: {message}"


def test_forked_child_raises_on_device_use_and_keeps_cpu(tmp_path):
    out = _run(tmp_path, _FORK_HELPERS, """
        import io
        x = torch.arange(3.0, device="jax")
        parent_count = torch.jax.device_count()
        actions = {
            "op": lambda: x + 1,
            "to_cpu": lambda: x.cpu(),
            "tolist": lambda: x.tolist(),
            "print": lambda: str(x),
            "numpy": lambda: x.detach().numpy(),
            "dlpack": lambda: x.__dlpack__(),
            "factory": lambda: torch.ones(2, device="jax"),
            "random": lambda: torch.randn(2, device="jax"),
            "to_device": lambda: torch.ones(2).to("jax"),
            "save": lambda: torch.save(x, io.BytesIO()),
            "load": lambda: torch.load(io.BytesIO(saved), map_location="jax"),
        }
        buf = io.BytesIO()
        torch.save(torch.ones(2), buf)
        saved = buf.getvalue()
        result = {name: in_child(fn) for name, fn in actions.items()}
        result["cpu"] = in_child(lambda: (torch.arange(4.0) * 2).sum().item())
        result["metadata"] = in_child(lambda: (tuple(x.shape), str(x.device), str(x.dtype)))
        result["bad_fork"] = in_child(lambda: torch.jax._is_in_bad_fork())
        result["initialized"] = in_child(lambda: torch.jax.is_initialized())
        result["count"] = in_child(lambda: torch.jax.device_count())
        result["manual_seed"] = in_child(lambda: torch.manual_seed(3) is not None)
        result["parent_count"] = parent_count
        result["parent_bad_fork"] = torch.jax._is_in_bad_fork()
        result["parent_after"] = (x * 2).tolist()  # the parent's device is untouched
        print(json.dumps(result))
    """)
    for name in ("op", "to_cpu", "tolist", "print", "numpy", "dlpack", "factory", "random", "to_device", "save",
                 "load"):
        _assert_fork_error(out[name], name)
    assert out["cpu"] == {"ok": "12.0"}
    assert out["metadata"] == {"ok": "((3,), 'jax:0', 'torch.float32')"}
    # As torch.cuda in a forked child: in a bad fork, not initialized, the
    # parent's device count, and torch.manual_seed leaves the device alone.
    assert out["bad_fork"] == {"ok": "True"}
    assert out["initialized"] == {"ok": "False"}
    assert out["count"] == {"ok": str(out["parent_count"])}
    assert out["manual_seed"] == {"ok": "True"}
    assert out["parent_bad_fork"] is False
    assert out["parent_after"] == [0.0, 2.0, 4.0]


def test_fork_before_the_client_exists_leaves_the_child_free(tmp_path):
    # Only a client that exists at fork() time is inherited; a child of a
    # process that never used the device makes its own.
    out = _run(tmp_path, _FORK_HELPERS, """
        result = {"parent_initialized": torch.jax.is_initialized(),
                  "child": in_child(lambda: (torch.ones(2, device="jax") + 1).tolist()),
                  "child_bad_fork": in_child(lambda: torch.jax._is_in_bad_fork())}
        result["parent_after"] = (torch.ones(2, device="jax") * 3).tolist()
        print(json.dumps(result))
    """)
    assert out["parent_initialized"] is False
    assert out["child"] == {"ok": "[2.0, 2.0]"}
    assert out["child_bad_fork"] == {"ok": "False"}
    assert out["parent_after"] == [3.0, 3.0]


_DATASETS = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import pjrt_host
from torch.utils.data import DataLoader, Dataset, TensorDataset


class OnDevice(Dataset):
    '''Items made on the 'jax' device inside the worker.'''

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i), device="jax"), "i": i}
"""


def test_dataloader_fork_workers_with_cpu_data_work_after_the_client(tmp_path):
    # The common case: the model is on 'jax', the data loads on the CPU in
    # forked workers (each calls torch.manual_seed), batches move in the parent.
    out = _run(tmp_path, _DATASETS, """
        if __name__ == "__main__":
            w = torch.ones(2, device="jax")
            loader = DataLoader(TensorDataset(torch.arange(8.0).reshape(4, 2)), batch_size=2, num_workers=1,
                                multiprocessing_context="fork")
            sums = [(batch.to("jax") * w).sum().item() for (batch,) in loader]
            print(json.dumps({"sums": sums}))
    """)
    assert out["sums"] == [6.0, 22.0]


def test_dataloader_fork_worker_touching_the_device_raises_clearly(tmp_path):
    out = _run(tmp_path, _DATASETS, """
        if __name__ == "__main__":
            torch.ones(1, device="jax").sum().item()  # the parent's client exists
            loader = DataLoader(OnDevice(), batch_size=2, num_workers=1, multiprocessing_context="fork")
            try:
                next(iter(loader))
                result = {"raised": None}
            except Exception as e:
                result = {"raised": type(e).__name__, "is_runtime_error": isinstance(e, RuntimeError),
                          "message": str(e)}
            print(json.dumps(result))
    """)
    _assert_fork_error(out, "DataLoader fork worker")
    assert "DataLoader worker process 0" in out["message"]


def test_dataloader_spawn_workers_return_device_tensors(tmp_path):
    out = _run(tmp_path, _DATASETS, """
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing as mp


        def send(queue, received):
            p = torch.nn.Parameter(torch.arange(3.0, device="jax"))
            queue.put({"param": p, "frozen": torch.ones(2, device="jax"), "view": torch.arange(6.0, device="jax")[1::2]})
            received.wait(120)  # torch shares CPU tensors by file descriptor: the sender must outlive the get


        if __name__ == "__main__":
            torch.ones(1, device="jax").sum().item()  # the parent's client exists
            loader = DataLoader(OnDevice(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
            batches = [{"type": type(b["x"]).__name__, "device": str(b["x"].device), "x": b["x"].tolist(),
                        "i": b["i"].tolist()} for b in loader]
            ctx = mp.get_context("spawn")
            queue, received = ctx.Queue(), ctx.Event()
            proc = ctx.Process(target=send, args=(queue, received))
            proc.start()
            got = queue.get(timeout=120)
            received.set()
            proc.join(120)
            try:  # a non-leaf that requires grad: torch's own refusal, at once
                ForkingPickler.dumps(torch.nn.Parameter(torch.ones(2, device="jax")) * 2)
                refusal = None
            except RuntimeError as e:
                refusal = str(e)
            param = got["param"]
            print(json.dumps({
                "batches": batches,
                "param": [isinstance(param, torch.nn.Parameter), param.requires_grad, str(param.device),
                          param.tolist()],
                "frozen": [got["frozen"].requires_grad, got["frozen"].tolist()],
                "view": [str(got["view"].device), got["view"].tolist()],
                "refusal": refusal, "exitcode": proc.exitcode,
            }))
    """)
    assert out["batches"] == [
        {"type": "JaxTensor", "device": "jax:0", "x": [[0.0, 0.0], [1.0, 1.0]], "i": [0, 1]},
        {"type": "JaxTensor", "device": "jax:0", "x": [[2.0, 2.0], [3.0, 3.0]], "i": [2, 3]},
    ]
    assert out["param"] == [True, True, "jax:0", [0.0, 1.0, 2.0]]
    assert out["frozen"] == [False, [1.0, 1.0]]
    assert out["view"] == ["jax:0", [1.0, 3.0, 5.0]]
    assert "Cowardly refusing to serialize non-leaf tensor which requires_grad" in out["refusal"]
    assert out["exitcode"] == 0


def test_no_bad_fork_in_this_process():
    assert torch.jax._is_in_bad_fork() is False
