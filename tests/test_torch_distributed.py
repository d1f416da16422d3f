"""torch.distributed on 'jax' tensors through the 'pjrt' c10d backend, in
real processes: every collective against its definition, DDP and FSDP2
training against one process on the full batch, DTensor, launched by
``python -m pjrt_host launch`` and by torchrun, one and two devices per
process; and a CPU-only program that gets gloo's behaviour by default and
never imports jax."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKER = str(REPO / "tests" / "torch_distributed_worker.py")
_DROP = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")

pytestmark = pytest.mark.multiprocess


def _run(launcher: list[str], mode: str, outdir: Path, **env: str) -> dict[int, dict]:
    child = {k: v for k, v in os.environ.items()
             if k not in _DROP and not k.startswith(("PJRT_", "PYTEST_", "TORCHELASTIC_", "JAX_"))}
    child.update({"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_COORDINATOR_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"})
    child.update(env)
    proc = subprocess.Popen([sys.executable, *launcher, WORKER, mode, str(outdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child, cwd=str(REPO), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running after 240 s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-6000:]
    return {r: json.loads((outdir / f"rank{r}.json").read_text()) for r in (0, 1)}


def _check_collectives(results: dict[int, dict]) -> None:
    for r, got in results.items():
        assert got["backend_name"] == "jax:pjrt"
        assert got["cpu_sum"] == [3.0]  # a CPU tensor through the same group (gloo)
        assert got["SUM"] == [10.0, 12.0, 14.0, 16.0]
        assert got["AVG"] == [5.0, 6.0, 7.0, 8.0]
        assert got["MAX"] == [10.0, 11.0, 12.0, 13.0] and got["MIN"] == [0.0, 1.0, 2.0, 3.0]
        assert got["PRODUCT"] == [0.0, 11.0, 24.0, 39.0]
        assert got["bxor"] == [1 ^ 2, 0]
        assert got["gather"] == [[0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0]]
        assert got["gather_tensor"] == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
        # rank r's input is arange(4) * (r + 1); rank r gets the sum's chunk r
        assert got["reduce_scatter"] == [[0.0, 3.0], [6.0, 9.0]][r]
        assert got["broadcast"] == [10.0, 11.0, 12.0, 13.0]
        assert got["all_to_all"] == [[0.0, 1.0, 100.0, 101.0], [2.0, 3.0, 102.0, 103.0]][r]
        assert got["view"] == [[0.0] * 4, [3.0] * 4, [0.0] * 4]
        assert got["all_to_all_uneven"] == [[0.0, 100.0], [1.0, 1.0, 101.0, 101.0]][r]
        assert got["ring"] == [float(1 - r)] * 2
        if r == 1:
            assert got["recv"] == [0.0, 5.0, 10.0]
        assert got["subgroup"] == [3.0, 3.0]
        assert got["two_threads"] == [3.0 * 2 ** 19] * 3  # 1 + 2, then doubled 19 times


def test_collectives_ddp_dtensor_fsdp2_under_pjrt_host_launch(tmp_path):
    results = _run(["-m", "pjrt_host", "launch", "--nproc-per-node", "2"], "all", tmp_path)
    _check_collectives(results)
    for got in results.values():
        assert got["ddp_diff"] < 1e-6
        assert got["dtensor_local"] == [[4, 4], "jax:0"]
        assert abs(got["dtensor_sum"][0] - got["dtensor_sum"][1]) < 1e-4
        assert got["dtensor_matmul_diff"] < 1e-5
        assert got["fsdp_diff"] < 1e-5
        assert got["fsdp_local_numel"] * 2 == got["total_numel"]  # parameter memory falls as 1/world
        assert got["fsdp_gpt2_diff"] < 1e-6
        assert got["fsdp_mixed_precision"] == ["torch.bfloat16", "torch.float32", "torch.float32"]
        assert got["dcp_diff"] == 0.0  # the DCP checkpoint loads back exactly into 2 processes
    # ... and reshards into one process.
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(tmp_path / "dcp", tmp_path / "one.pt")
    one = torch.load(tmp_path / "one.pt")["model"]
    full = torch.load(tmp_path / "full.pt")
    assert sorted(one) == sorted(full)
    for k in full:
        assert torch.equal(one[k], full[k]), k


def test_collectives_under_torchrun_with_two_devices_per_process(tmp_path):
    results = _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"], "collectives",
                   tmp_path, PJRT_HOST_CPU_REF_DEVICES="2")
    _check_collectives(results)


def test_cpu_only_program_gets_gloo_behaviour_without_jax(tmp_path):
    """init_process_group() with no backend, in a program that never makes
    a 'jax' tensor: CPU collectives work as with gloo, and jax is never
    imported (the 'jax' device is the accelerator, so its backend is the
    default; it runs CPU tensors on gloo)."""
    results = _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"], "cpu", tmp_path)
    for got in results.values():
        assert got["cpu_sum"] == [3.0]
        assert got["jax_imported"] is False


def test_one_process_group_and_wrong_backend_error():
    import torch
    import torch.distributed as dist

    dist.init_process_group("pjrt", rank=0, world_size=1, store=dist.HashStore())
    try:
        assert dist.get_backend() == "pjrt"
        x = torch.arange(4.0, device="jax")
        dist.all_reduce(x)
        out = torch.empty(4, device="jax")
        dist.all_gather_into_tensor(out, x)
        assert out.tolist() == x.tolist() == [0.0, 1.0, 2.0, 3.0]
        group = dist.group.WORLD
        with pytest.raises(ValueError, match="the peer must be another rank of the group"):
            group.send([x], 0, 0)
    finally:
        dist.destroy_process_group()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(RuntimeError, match="backend 'gloo'.*'pjrt'"):
            dist.all_gather_into_tensor(torch.empty(4, device="jax"), torch.ones(4, device="jax"))
    finally:
        dist.destroy_process_group()


def test_a_group_bound_to_the_device_with_device_id(monkeypatch):
    """init_process_group(..., device_id=torch.device('jax', 0)), as
    Lightning calls it on torch >= 2.3 (env:// rendezvous, one rank), works:
    torch asks the group for that device's backend (it raised "No backend
    type associated with device type jax"), and new groups are made, not
    split from it.  (torch binds the device on the C++ group that the
    Python one replaces, so ``bound_device_id`` stays None, as for any
    group created by a Python backend.)"""
    import socket

    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("pjrt", rank=0, world_size=1, device_id=torch.device("jax", 0))
    try:
        group = dist.group.WORLD
        assert group._get_backend(torch.device("jax", 0)) is group
        assert group._get_backend(torch.device("cpu")).supports_splitting in (True, False)  # gloo's own
        x = torch.arange(4.0, device="jax")
        dist.all_reduce(x)
        dist.barrier()
        sub = dist.new_group([0])
        y = torch.ones(2, device="jax")
        dist.all_reduce(y, group=sub)
        assert x.tolist() == [0.0, 1.0, 2.0, 3.0] and y.tolist() == [1.0, 1.0]
        with pytest.raises(RuntimeError, match="No backend type associated with device type meta: the 'pjrt' "
                                               "process group runs collectives of 'jax' and 'cpu' tensors"):
            group._get_backend(torch.device("meta"))
    finally:
        dist.destroy_process_group()


def test_ranks_calling_different_shapes_raise_on_every_rank(tmp_path):
    """Launched, a collective whose shapes differ across ranks ends a
    process inside XLA:CPU's transport (SIGABRT); the ranks agree on each
    new collective signature first, so both raise, naming both shapes."""
    results = _run(["-m", "pjrt_host", "launch", "--nproc-per-node", "2"], "mismatch", tmp_path)
    for got in results.values():
        assert "called different collectives" in got["error"]
        assert "(4,)" in got["error"] and "(5,)" in got["error"]


def test_collectives_called_in_another_order_raise_under_torch_distributed_debug_detail(tmp_path):
    """Signatures every rank has run before, called in another order:
    launched, they would end a process inside XLA:CPU's transport (a size
    mismatch aborts in gloo).  With TORCH_DISTRIBUTED_DEBUG=DETAIL, as
    torch's own wrapper group does, each collective is compared first, and
    both ranks raise, naming both."""
    results = _run(["-m", "pjrt_host", "launch", "--nproc-per-node", "2"], "order", tmp_path,
                   TORCH_DISTRIBUTED_DEBUG="DETAIL")
    for got in results.values():
        assert "called different collectives" in got["error"], got
        assert "(4,)" in got["error"] and "(6,)" in got["error"], got


def _run_ranks(mode: str, outdir: Path) -> tuple[dict[int, int], str]:
    """Two ranks as plain processes (no launcher agent, which would stop
    the other rank at once: this is the view of a rank on another host);
    their exit statuses and rank 0's output."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = {k: v for k, v in os.environ.items()
             if k not in _DROP and not k.startswith(("PJRT_", "PYTEST_", "TORCHELASTIC_", "JAX_"))}
    child.update({"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_COORDINATOR_TIMEOUT": "60", "PYTHONUNBUFFERED": "1",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                  "LOCAL_WORLD_SIZE": "2"})
    procs = {r: subprocess.Popen([sys.executable, WORKER, mode, str(outdir)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, cwd=str(REPO), start_new_session=True,
                                 env={**child, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in (0, 1)}
    outputs = {}
    try:
        for r, proc in procs.items():
            outputs[r], _ = proc.communicate(timeout=240)  # a hang guard, far above the group's 20 s timeout
    except subprocess.TimeoutExpired:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"a rank was still running after 240 s: {mode}\n" + "\n".join(
            (p.communicate()[0] or "")[-3000:] for p in procs.values()))
    return {r: p.returncode for r, p in procs.items()}, outputs[0]


def test_a_rank_killed_inside_an_all_reduce_is_named_by_the_survivor(tmp_path):
    """Rank 1 exits while rank 0 is inside an all_reduce: rank 0's
    all_reduce raises (it does not wait for the group's timeout), naming
    the collective and rank 1, and rank 0's process ends."""
    status, output = _run_ranks("killed", tmp_path)
    assert status[1] == 3, output[-4000:]
    assert status[0] != 0, output[-4000:]
    got = json.loads((tmp_path / "rank0.json").read_text())
    error = got["error"]
    assert error is not None, "the all_reduce returned although rank 1 had died"
    assert "all_reduce of a 'jax' tensor of shape (1024,)" in error
    assert "rank 1 of the group did not answer" in error
    assert "failed:" in error and "timeout" not in error.split("Cause")[0]  # detected, not timed out


@pytest.mark.slow  # ~35 s (it waits out the group's timeout); the killed-rank case runs by default
def test_a_rank_that_never_joins_an_all_reduce_is_named_after_the_groups_timeout(tmp_path):
    """Rank 1 is alive but never joins rank 0's all_reduce: rank 0 waits
    the process group's timeout, then raises, naming the collective, the
    timeout and rank 1."""
    status, output = _run_ranks("stuck", tmp_path)
    assert status[1] == 0 and status[0] != 0, output[-4000:]
    error = json.loads((tmp_path / "rank0.json").read_text())["error"]
    assert error is not None, "the all_reduce returned although rank 1 never joined it"
    assert "all_reduce of a 'jax' tensor of shape (1024,)" in error
    assert "did not complete within the process group's timeout" in error
    assert "rank 1 of the group did not answer" in error
