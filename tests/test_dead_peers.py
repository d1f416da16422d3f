"""A rank of a 'pjrt' torch.distributed job dies (SIGKILL) in the middle of
training: the survivor gets a Python exception naming the collective and
the dead rank, is not ended by jax's coordination service, saves a
torch.save and a DCP checkpoint and exits with its own code -- rank 1
killed, rank 0 killed (which started the coordination service), and with
asynchronous collectives (``work.wait()``).  Under ``torchrun
--max-restarts=1`` the job restarts from its last checkpoint and reaches the
same losses as a run that was never killed.  Real processes, two ranks, on
cpu_ref (tests/dead_peers_worker.py is the program)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "dead_peers_worker.py")
_DROP = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Short, so the survivors below outlive it by far: jax's coordination
#: service would have ended them this long after the death.
HEARTBEAT = 3

pytestmark = pytest.mark.multiprocess


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _DROP and not k.startswith(("PJRT_", "PYTEST_", "TORCHELASTIC_", "JAX_"))}
    env.update({"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_COORDINATOR_TIMEOUT": "60", "PYTHONUNBUFFERED": "1",
                "PJRT_HOST_HEARTBEAT_TIMEOUT": str(HEARTBEAT)})
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(outdir: Path, *args: str) -> tuple[dict[int, int], dict[int, str], float]:
    """Two ranks as plain processes with torchrun's variables (no launcher
    agent, which would stop the survivor itself: this is what a rank on
    another host sees); their exit statuses, outputs and the seconds the
    job took."""
    # the coordinator's port given too: by default MASTER_PORT + 1, which
    # nothing checked was free (CI once: rank 0 exited 1 before training, and
    # rank 1 found no coordinator)
    master = _free_port()
    coordinator = master
    while coordinator in (master, master + 1):
        coordinator = _free_port()
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master), PJRT_HOST_COORDINATOR_PORT=str(coordinator),
               WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    began = time.monotonic()
    procs = {r: subprocess.Popen([sys.executable, WORKER, str(outdir), *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, cwd=str(REPO), start_new_session=True,
                                 env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in (0, 1)}
    outputs = {}
    try:
        for r, proc in procs.items():
            outputs[r], _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a rank was still running after 120 s:\n" + "\n".join(
            (p.communicate()[0] or "")[-3000:] for p in procs.values()))
    return {r: p.returncode for r, p in procs.items()}, outputs, time.monotonic() - began


def _both(out: dict[int, str]) -> str:
    """Both ranks' last output, for a failed assertion: the survivor's alone
    hid why the other exited."""
    return "\n".join(f"--- rank {r}:\n{text[-3000:]}" for r, text in sorted(out.items()))


def _check_survivor(outdir: Path, rank: int, output: str) -> dict:
    import torch

    report = json.loads((outdir / f"error{rank}.json").read_text())
    assert report["type"] == "RuntimeError", report
    assert "Terminating process" not in output and "bad_cast" not in output, output[-3000:]
    # It went on long after jax's heartbeat timeout: not ended by jax.
    assert report["saved"] - report["time"] >= 2 * HEARTBEAT, report
    saved = torch.load(outdir / f"survivor{rank}" / "state.pt")
    assert saved["step"] >= 1 and set(saved["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(outdir / f"survivor{rank}" / "dcp", outdir / "from_dcp.pt")  # the DCP checkpoint reads back
    from_dcp = torch.load(outdir / "from_dcp.pt")["model"]
    assert all(torch.equal(from_dcp[k], saved["model"][k]) for k in saved["model"])
    return report


def test_rank_1_killed_mid_training(tmp_path):
    """DDP training, rank 1 SIGKILLed at step 3: rank 0's collective raises
    naming itself and rank 1; rank 0 outlives jax's heartbeat timeout,
    saves its last good state (torch.save and DCP) and exits 3."""
    status, out, _ = _run_ranks(tmp_path, "--kill-rank", "1", "--kill-step", "3", "--linger", str(2 * HEARTBEAT))
    assert status == {0: 3, 1: -signal.SIGKILL}, _both(out)
    error = _check_survivor(tmp_path, 0, out[0])["error"]
    assert error.startswith("pjrt_host: all_reduce of a 'jax' tensor"), error
    assert "rank 1 of the group did not answer" in error and "rank 1 of the job died" in error, error


def test_rank_0_killed_mid_training(tmp_path):
    """Rank 0 -- which started jax's coordination service and holds
    torch's store -- SIGKILLed at step 3: rank 1 is not ended with it; its
    collective raises naming itself and rank 0; it saves and exits 3."""
    status, out, _ = _run_ranks(tmp_path, "--kill-rank", "0", "--kill-step", "3", "--linger", str(2 * HEARTBEAT))
    assert status == {0: -signal.SIGKILL, 1: 3}, _both(out)
    error = _check_survivor(tmp_path, 1, out[1])["error"]
    assert error.startswith("pjrt_host: all_reduce of a 'jax' tensor"), error
    assert "rank 0 of the job died" in error, error
    assert "pjrt_host: rank 1: rank 0 of the job died" in out[1]


def test_async_collectives_name_the_dead_rank(tmp_path):
    """Gradients averaged with all_reduce(async_op=True) and work.wait():
    the same named error."""
    status, out, _ = _run_ranks(tmp_path, "--async", "--kill-rank", "1", "--kill-step", "3",
                                "--linger", str(2 * HEARTBEAT))
    assert status == {0: 3, 1: -signal.SIGKILL}, _both(out)
    error = _check_survivor(tmp_path, 0, out[0])["error"]
    assert error.startswith("pjrt_host: all_reduce of a 'jax' tensor"), error
    assert "rank 1 of the group did not answer" in error


def test_work_wait_raises_the_named_error():
    """An asynchronous collective's Work checks its results in wait(): one
    that failed raises the group's named error there (on cpu_ref a dead
    peer mostly shows when the collective is issued, so the failing result
    is simulated here)."""
    import torch  # noqa: F401

    from pjrt_host._torch._c10d._group import CheckedWork, completed_work

    class Mesh:
        waited = []

        def wait(self, run, key, result, started=None):
            self.waited.append((run, key, result))
            raise RuntimeError(f"pjrt_host: {key[0]} ... failed: rank 1 of the group did not answer")

    class Result:  # stands for a jax array (held weakly)
        pass

    kept = Result()
    work = CheckedWork(completed_work([]), [(Mesh(), 7, ("all_reduce", "sum", (4,), "float32"), kept)])
    assert work.is_completed() and work.get_future().done()
    with pytest.raises(RuntimeError, match="rank 1 of the group did not answer"):
        work.wait()
    assert Mesh.waited == [(7, ("all_reduce", "sum", (4,), "float32"), kept)]
    assert work.wait() is True  # checked once
    dropped = CheckedWork(completed_work([]), [(Mesh(), 8, ("all_reduce",), Result())])
    assert dropped.wait() is True  # a result nobody holds any more has nothing to check


def test_a_failed_collective_read_later_is_named(monkeypatch):
    """A collective issued asynchronously (DDP's buckets) whose result
    failed after it was issued shows where a value is read (a copy to the
    host, item(), synchronize()): there the group's named error is raised,
    jax's error as its cause.  Other errors pass unchanged.  (Simulated: on
    cpu_ref a dead peer mostly makes the collective fail as it is issued.)"""
    import collections
    import weakref

    import torch  # noqa: F401

    from pjrt_host._torch._c10d import _mesh
    from pjrt_host._torch._sync import names_failed_collectives

    class Failed:  # stands for a collective's result whose computation failed
        def is_ready(self):
            return True

        def block_until_ready(self):
            raise ValueError("UNKNOWN: Gloo all-reduce failed: Connection reset by peer")

    class Pending(Failed):  # not computed yet: never waited for here
        def is_ready(self):
            return False

    class Mesh:
        named = []

        def _failure(self, run, key, cause):
            self.named.append((run, key, type(cause).__name__))
            return RuntimeError(f"pjrt_host: {key[0]} ... failed: rank 1 of the group did not answer")

    failed, pending = Failed(), Pending()
    key = ("all_reduce", "sum", (161,), "float32")
    monkeypatch.setattr(_mesh, "_recent", collections.deque([(Mesh(), 2, key, weakref.ref(pending)),
                                                             (Mesh(), 3, key, weakref.ref(failed))]))

    @names_failed_collectives
    def read():
        failed.block_until_ready()  # a value computed from the failed result, read

    with pytest.raises(RuntimeError, match="pjrt_host: all_reduce ... failed: rank 1") as info:
        read()
    assert isinstance(info.value.__cause__, ValueError)
    assert Mesh.named == [(3, key, "ValueError")]

    @names_failed_collectives
    def other():
        raise ValueError("not a collective's")

    with pytest.raises(ValueError, match="not a collective's"):
        other()


def _losses(outdir: Path) -> dict[int, float]:
    """Rank 0's loss per step, the last attempt's where a step ran twice."""
    lines = [json.loads(line) for line in (outdir / "losses0.jsonl").read_text().splitlines()]
    return {d["step"]: d["loss"] for d in sorted(lines, key=lambda d: d["attempt"])}


def _train(outdir: Path, launcher: str, *extra: str) -> None:
    """The worker's 8 steps, 2 ranks, at most one restart, under torchrun
    (static rendezvous, as `python -m pjrt_host launch` uses: with
    --standalone's c10d rendezvous, torch 2.13 hands a restarted group a
    store holding the previous attempt's keys; see docs/distributed.md) or
    under ``python -m pjrt_host launch``."""
    outdir.mkdir()
    if launcher == "torchrun":
        command = [str(Path(sys.executable).with_name("torchrun")), "--rdzv-backend", "static", "--master-addr",
                   "127.0.0.1", "--master-port", str(_free_port()), "--nnodes", "1", "--node-rank", "0"]
    else:
        command = [sys.executable, "-m", "pjrt_host", "launch"]
    command += ["--nproc-per-node", "2", "--max-restarts", "1", WORKER, str(outdir), "--steps", "8", "--every", "2",
                *extra]
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=str(REPO), timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="module")
def unkilled_losses(tmp_path_factory) -> dict[int, float]:
    outdir = tmp_path_factory.mktemp("unkilled") / "run"
    _train(outdir, "torchrun")
    losses = _losses(outdir)
    assert sorted(losses) == list(range(8))
    return losses


@pytest.mark.slow  # about 12-15 s per case, plus 8 s once for the run never killed
@pytest.mark.parametrize("launcher, killed", [("torchrun", 1), ("torchrun", 0), ("pjrt_host launch", 1)])
def test_a_restart_resumes_from_the_checkpoint(tmp_path, unkilled_losses, launcher, killed):
    """--max-restarts=1: rank ``killed`` is SIGKILLed at step 5; the agent
    restarts the group, which resumes from the checkpoint of step 4 and
    computes the same losses as a run that was never killed."""
    outdir = tmp_path / "killed"
    _train(outdir, launcher, "--kill-rank", str(killed), "--kill-step", "5")
    lines = [json.loads(line) for line in (outdir / "losses0.jsonl").read_text().splitlines()]
    assert {d["attempt"] for d in lines} == {0, 1}
    assert min(d["step"] for d in lines if d["attempt"] == 1) == 4  # resumed from the checkpoint
    assert _losses(outdir) == unkilled_losses


def test_the_settings_refuse_a_typo(monkeypatch):
    from pjrt_host import EnvironmentSettingError
    from pjrt_host import _env

    assert _env.coordination_service_mode() == "process" and _env.dead_peer_grace() == 300.0
    monkeypatch.setenv("PJRT_HOST_COORDINATION_SERVICE", "Rank0")
    monkeypatch.setenv("PJRT_HOST_DEAD_PEER_GRACE", "0")
    assert _env.coordination_service_mode() == "rank0" and _env.dead_peer_grace() == 0.0
    monkeypatch.setenv("PJRT_HOST_COORDINATION_SERVICE", "helper")
    with pytest.raises(EnvironmentSettingError, match="PJRT_HOST_COORDINATION_SERVICE='helper'"):
        _env.coordination_service_mode()
    monkeypatch.setenv("PJRT_HOST_DEAD_PEER_GRACE", "-1")
    with pytest.raises(EnvironmentSettingError, match="PJRT_HOST_DEAD_PEER_GRACE"):
        _env.dead_peer_grace()
