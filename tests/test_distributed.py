"""Several processes on this machine, on loopback: the launch command, spawn,
two simulated hosts, and the failure cases.  Every process tree runs in its
own session and is killed if it outlives its bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pjrt_host import _env as env_settings
from pjrt_host import _process
from pjrt_host._launch import free_port

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "test_distributed_worker.py")

# What a launcher or a cluster would set: none of it may leak from the
# environment running the tests into the jobs they start.
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_PREFIXES = ("PJRT_", "PYTEST_", "TORCHELASTIC_", "SLURM_", "OMPI_", "JAX_COORDINATOR", "JAX_LOCAL")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    env.update({"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_COORDINATOR_TIMEOUT": "60",
                "PJRT_HOST_HEARTBEAT_TIMEOUT": "5", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=str(REPO), stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        out, _ = proc.communicate()
        pytest.fail(f"still running after {timeout} s; output:\n{out[-4000:]}")
    return proc.returncode, out


def _run(args: list[str], timeout: float = 120, **extra: str) -> tuple[int, str]:
    return _finish(_start(args, _env(**extra)), timeout)


def _launch(*args: str, timeout: float = 120, **extra: str) -> tuple[int, str]:
    return _run(["-m", "pjrt_host", "launch", *args], timeout, **extra)


def _results(outdir: Path, count: int) -> list[dict]:
    files = sorted(outdir.glob("rank*.json"))
    assert len(files) == count, [f.name for f in files]
    return [json.loads(f.read_text()) for f in files]


def _check_collectives(results: list[dict], per_host: int) -> None:
    n = len(results)
    ranks = list(range(n))
    assert sorted(r["rank"] for r in results) == ranks
    for r in results:
        rank = r["rank"]
        assert r["process_count"] == r["world_size"] == r["jax_process_count"] == n
        assert r["jax_process_index"] == rank
        assert r["local_world_size"] == per_host and r["local_rank"] == rank % per_host
        assert r["host_index"] == rank // per_host and r["host_count"] == n // per_host
        assert r["global_devices"] == n and r["local_devices"] == 1
        # x = [0, 1, 2] + 10 * rank on every rank
        assert r["sum"] == [i * n + 10 * sum(ranks) for i in range(3)]
        assert r["mean"] == pytest.approx([i + 10 * sum(ranks) / n for i in range(3)])
        assert r["max"] == max(k * 7 % 5 for k in ranks)
        assert r["gather"] == [[k, k * k] for k in ranks]
        assert r["broadcast"] == [i + 10.0 * (n - 1) for i in range(3)]
        assert r["wrapped"] == [sum(k + 1 for k in ranks)] * 2
        # torch tensors on the 'jax' device go through the same collectives
        assert r["torch_sum"] == r["sum"] and r["torch_sum_device"] == "jax:0"
        assert r["torch_gather"] == [[k] for k in ranks] and r["torch_gather_dtype"] == "torch.int64"


# -- jobs that work -------------------------------------------------------------


@pytest.mark.parametrize("nproc, mode", [(2, "plain"), (4, "collectives")])
def test_launch_runs_collectives(tmp_path: Path, nproc: int, mode: str) -> None:
    # "plain": the workers only call pjrt_host.devices(), which must set the
    # process up exactly as initialize() does.
    code, out = _launch("--nproc-per-node", str(nproc), WORKER, mode, str(tmp_path))
    assert code == 0, out[-4000:]
    _check_collectives(_results(tmp_path, nproc), per_host=nproc)


def test_spawn_runs_collectives(tmp_path: Path) -> None:
    # Four processes here, two through the launch command above: on two
    # cores every extra process tree costs a torch import per process.
    code, out = _run([WORKER, "spawn", str(tmp_path), "4"], timeout=150)
    assert code == 0, out[-4000:]
    _check_collectives(_results(tmp_path, 4), per_host=4)


def test_two_hosts_on_loopback(tmp_path: Path) -> None:
    master, coordinator = free_port(), free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(master),
              "--coordinator-port", str(coordinator)]
    hosts = [_start(["-m", "pjrt_host", "launch", *common, "--node-rank", str(rank), WORKER, "collectives",
                     str(tmp_path)], _env()) for rank in (0, 1)]
    finished = [_finish(proc, 150) for proc in hosts]
    for code, out in finished:
        assert code == 0, out[-4000:]
    _check_collectives(_results(tmp_path, 4), per_host=2)


# -- failures -------------------------------------------------------------------


def test_a_crashing_rank_stops_the_others(tmp_path: Path) -> None:
    # Rank 1 exits 7 once all three are up; ranks 0 and 2 would sleep for
    # 120 s: the launcher must stop them and exit with rank 1's code.
    code, out = _launch("--nproc-per-node", "3", WORKER, "crash", timeout=90)
    assert code == 7, out[-4000:]
    assert "rank 1 exited with code 7" in out
    assert "The first to fail was rank 1" in out
    assert "was not stopped" not in out


@pytest.mark.parametrize("service", ["process", "rank0"])
def test_a_rank_on_another_host_dying_stops_the_others(service: str) -> None:
    # No launcher watches both processes here, as with two hosts.  With the
    # coordination service in its own process (the default), rank 0 hears
    # of the death at once, may go on to save its state, and is ended
    # after PJRT_HOST_DEAD_PEER_GRACE; with the service inside rank 0 (jax's
    # way), jax notices the missing heartbeats and ends rank 0.
    env = {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PJRT_HOST_COORDINATOR_PORT": str(free_port()),
           "PJRT_HOST_HEARTBEAT_TIMEOUT": "3", "PJRT_HOST_DEAD_PEER_GRACE": "2",
           "PJRT_HOST_COORDINATION_SERVICE": service}
    ranks = [_start([WORKER, "crash"], _env(RANK=str(rank), GROUP_RANK=str(rank), **env)) for rank in (0, 1)]
    code1, out1 = _finish(ranks[1], 60)
    code0, out0 = _finish(ranks[0], 60)  # it would sleep 120 s if nobody stopped it
    assert code1 == 7, out1[-3000:]
    assert code0 != 0, out0[-3000:]
    if service == "process":
        assert code0 == 134, out0[-3000:]
        assert "pjrt_host: rank 0: rank 1 of the job died" in out0, out0[-3000:]
        assert "ago and this process has not exited: ending it (PJRT_HOST_DEAD_PEER_GRACE)" in out0, out0[-3000:]
    else:
        assert "another task died" in out0 or "stopped sending heartbeats" in out0, out0[-3000:]


def test_a_host_that_never_comes_ends_the_launch() -> None:
    master = free_port()
    code, out = _launch("--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                        "--master-port", str(master), WORKER, "collectives", "unused", timeout=90,
                        PJRT_HOST_COORDINATOR_TIMEOUT="2")
    assert code == 1, out[-3000:]
    assert f"pjrt_host launch: host 0 of 2 could not start the job through 127.0.0.1:{master}" in out, out[-3000:]


def test_unreachable_coordinator_names_the_address() -> None:
    port = free_port()  # nothing listens there
    code, out = _run(["-c", "import pjrt_host; pjrt_host.devices()"], timeout=60,
                     RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port - 1), PJRT_HOST_COORDINATOR_TIMEOUT="2")
    assert code != 0
    assert "CoordinatorUnreachableError" in out
    assert f"could not reach the coordinator at 127.0.0.1:{port} within 2 s" in out, out[-3000:]
    assert "plugin 'cpu_ref'" in out


def test_peers_that_never_join_stop_rank_0_with_the_address() -> None:
    port = free_port()
    code, out = _run(["-c", "import pjrt_host; pjrt_host.devices()"], timeout=60,
                     RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), PJRT_HOST_COORDINATOR_PORT=str(port),
                     PJRT_HOST_COORDINATOR_TIMEOUT="2")
    assert code != 0
    assert (f"pjrt_host: plugin 'cpu_ref': rank 0 of 2 is still waiting at the coordinator 127.0.0.1:{port} for "
            "the other processes to join; when PJRT_HOST_COORDINATOR_TIMEOUT (2 s) runs out") in out, out[-3000:]


def test_configure_multiprocess_raising_names_the_plugin() -> None:
    code, out = _run([WORKER, "broken"], timeout=60, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1",
                     LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    assert code != 0
    assert "DistributedSetupError: pjrt_host: plugin 'broken_mp'" in out, out[-3000:]
    assert ("configure_multiprocess(local_rank=1, local_world_size=2) raised on rank 1 of 2: "
            "RuntimeError: no topology for this many processes") in out


def test_coordinator_off_is_refused_by_a_plugin_that_requires_it() -> None:
    code, out = _run(["-c", "import pjrt_host; pjrt_host.devices()"], timeout=60,
                     RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), PJRT_HOST_XLA_COORDINATOR="off")
    assert code != 0
    assert "plugin 'cpu_ref'" in out and "PJRT_HOST_XLA_COORDINATOR=off" in out, out[-3000:]


def test_one_process_needs_no_coordinator() -> None:
    code, out = _run(["-c", (
        "import pjrt_host, pjrt_host.distributed as d, jax.numpy as jnp\n"
        "layout = d.initialize()\n"
        "assert (layout.rank, layout.world_size, layout.launcher) == (0, 1, 'single process'), layout\n"
        "assert d.all_reduce(jnp.arange(3), 'sum').tolist() == [0, 1, 2]\n"
        "assert d.all_gather(jnp.arange(2)).tolist() == [[0, 1]]\n"
        "d.barrier()\n"
        "from pjrt_host import _collectives\n"
        "class Box:\n"
        "    def __init__(self, array): self.array = array\n"
        "_collectives.register_array_type(Box, lambda box: box.array, lambda array, like: Box(array))\n"
        "out = d.all_reduce(Box(jnp.arange(3)), 'max')\n"
        "assert isinstance(out, Box) and out.array.tolist() == [0, 1, 2]\n"
        "print('ok')\n")], timeout=60)
    assert code == 0 and "ok" in out, out[-3000:]


# -- the layout, from each launcher's environment ---------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name in _LAUNCHER_VARS or name.startswith(_LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    return monkeypatch


def test_layout_from_torchrun(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3",
                        "MASTER_PORT": "29500"}.items():
        clean_env.setenv(name, value)
    layout = _process.detect_layout()
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size) == (5, 8, 1, 4)
    assert (layout.host_index, layout.host_count, layout.launcher) == (1, 2, "torchrun")
    assert layout.coordinator_address == "10.1.2.3:29501"
    clean_env.setenv("PJRT_HOST_COORDINATOR_PORT", "4444")
    assert _process.detect_layout().coordinator_address == "10.1.2.3:4444"
    clean_env.setenv("PJRT_HOST_COORDINATOR_ADDRESS", "head:1234")
    assert _process.detect_layout().coordinator_address == "head:1234"


def test_layout_from_slurm_through_jax_cluster_detection(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[003-004]", "SLURM_NTASKS": "4",
                        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                        "SLURM_TASKS_PER_NODE": "2(x2)"}.items():
        clean_env.setenv(name, value)
    layout = _process.detect_layout()
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size) == (3, 4, 1, 2)
    assert (layout.host_index, layout.host_count, layout.launcher) == (1, 2, "slurm")
    assert layout.coordinator_address.startswith("node003:")


def test_plugin_host_index_wins(clean_env: pytest.MonkeyPatch) -> None:
    from pjrt_host import DevicePlugin

    class KnowsItsHost(DevicePlugin):
        def host_index(self) -> int:
            return 9

    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        clean_env.setenv(name, value)
    assert _process.detect_layout(KnowsItsHost()).host_index == 9


def test_inconsistent_environment_is_explained(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "4")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK=4 is not in \[0, WORLD_SIZE=2\).*pjrt_host launch"):
        _process.detect_layout()


def test_timeouts_are_read_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert env_settings.coordinator_timeout() == 300.0 and env_settings.heartbeat_timeout() == 10.0
    clean_env.setenv("PJRT_HOST_COORDINATOR_TIMEOUT", "7.5")
    clean_env.setenv("PJRT_HOST_HEARTBEAT_TIMEOUT", "3")
    assert env_settings.coordinator_timeout() == 7.5 and env_settings.heartbeat_timeout() == 3.0
    clean_env.setenv("PJRT_HOST_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="PJRT_HOST_HEARTBEAT_TIMEOUT='soon' is not a number of seconds"):
        env_settings.heartbeat_timeout()


@pytest.mark.parametrize("value, expected", [("0", False), ("off", False), ("NO", False), ("1", True), ("on", True),
                                             (" true ", True), ("", True)])
def test_flags_share_one_vocabulary(clean_env: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    clean_env.setenv("PJRT_HOST_CLUSTER_DETECTION", value)
    assert env_settings.cluster_detection_enabled() is expected


def test_a_bad_flag_or_timeout_is_refused_not_defaulted(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PJRT_HOST_CLUSTER_DETECTION", "maybe")
    with pytest.raises(ValueError, match="PJRT_HOST_CLUSTER_DETECTION='maybe' is not a boolean; expected 1/0"):
        env_settings.cluster_detection_enabled()
    clean_env.setenv("PJRT_HOST_PROBE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="PJRT_HOST_PROBE_TIMEOUT='soon' is not a number of seconds"):
        env_settings.probe_timeout()
