"""The program cache on disk: a script run a second time finds its programs,
processes compiling at once share one directory safely, and the settings
(directory, off switch, size bound) behave as documented.  Each case runs
real child processes over a temporary directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

from conftest import REPO, run_python  # noqa: E402

# A small training step: eager ops, a backward, an optimizer.
SCRIPT = r"""
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to("jax")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8, device="jax")
loss = model(x).square().mean()
loss.backward()
opt.step()
# the host's own small programs: an index check, a view read, a cast, a
# value check (each kept like the ops', so a warm process traces nothing)
emb = torch.nn.Embedding(10, 4).to("jax")(torch.tensor([[1, 2], [3, 9]], device="jax"))
view = model[0].weight.t()[2:5].cpu()
half = model[0].weight.to(torch.float16)
rank = torch.linalg.matrix_rank(model[0].weight)
print(json.dumps({"loss": loss.item(), "weight": model[0].weight.sum().item(),
                  "more": [emb.sum().item(), view.sum().item(), half.float().sum().item(), rank.item()],
                  "stats": torch.jax.program_cache_stats()}))
"""


def run(env: dict[str, str], script: str = SCRIPT) -> dict:
    proc = run_python(["-c", script], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def test_a_second_process_loads_every_program_from_disk(tmp_path):
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path)}
    first = run(env)
    second = run(env)
    s1, s2 = first["stats"], second["stats"]
    _loads_everything(first, second)
    # every one without tracing its op again (eager ops, factories, the
    # cut of a bucketed random draw)
    assert s1["untraced"] == 0 and s2["untraced"] == s2["programs"]
    # loaded ahead, on a thread, from the manifest of what the first run of
    # this script used (the results above are the same)
    assert s1["prefetched"] == 0 and 0 < s2["prefetched"] <= s2["programs"]
    # one directory per plugin, jaxlib version and entry format, private to the user
    import jaxlib

    where = tmp_path / "cpu_ref" / f"jaxlib-{jaxlib.__version__}" / "entries-1"
    assert s1["directory"] == str(where)
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert _entries(where)


PROBES = r"""
import json, torch
from pjrt_host._torch import _meta
probes, metas = [], []
check, meta = _meta.check_cpu_kernel, _meta.run_meta
def counted(func, args, kwargs):
    probes.append(str(func))
    return check(func, args, kwargs)
def counted_meta(func, args, kwargs):
    metas.append(str(func))
    return meta(func, args, kwargs)
_meta.check_cpu_kernel, _meta.run_meta = counted, counted_meta
x = torch.randn(4, 8, device="jax")
y = (x @ x.t()).abs().sum(0)
values, indices = x.max(dim=1)  # a tuple of two dtypes
flags = x > 0
refused = []
try:  # CPU's kernel refuses this; a warm process must still say so
    torch.addmm(torch.ones(2, 2, device="jax"), torch.ones(2, 2, device="jax"),
                torch.ones(2, 2, dtype=torch.int64, device="jax"))
except RuntimeError as err:
    refused.append(str(err))
try:  # the result's dtype (from the meta kernel) cannot be written into an int tensor
    torch.ones(3, dtype=torch.int64, device="jax").add_(torch.ones(3, device="jax"))
except RuntimeError as err:
    refused.append(str(err))
results = [(str(t.dtype), list(t.shape), t.cpu().tolist()) for t in (y, values, indices, flags)]
print(json.dumps({"probes": len(probes), "metas": len(metas), "results": results, "refused": refused}))
"""


def test_a_second_process_does_not_ask_torch_again_what_it_learnt(tmp_path):
    """What a process learns about a new call by running torch is kept
    beside its program: CPU's kernel check (it runs the call on CPU
    tensors) when CPU accepts the call, and the meta kernel's result shapes
    and dtypes.  A warm process asks neither again, gives the same
    results, and still raises the errors the first raised."""
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path)}
    first, second = run(env, PROBES), run(env, PROBES)
    assert first["results"] == second["results"] and first["refused"] == second["refused"]
    assert "must have the same dtype" in first["refused"][0], first["refused"]
    assert "result type Float can't be cast to the desired output type Long" in first["refused"][1]
    # the second process asks torch only about the two refused calls (nothing is kept for a refusal)
    assert first["probes"] >= 6 and second["probes"] == 2, (first["probes"], second["probes"])
    assert first["metas"] >= 6 and second["metas"] <= 2, (first["metas"], second["metas"])


def test_a_second_fused_eager_process_compiles_nothing(tmp_path):
    """Fused eager's segments are the same in the second process (an op's
    traced-scalar trial, which ends a segment, runs there too), so every
    segment's program is on disk, and loads without tracing its ops."""
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path), "PJRT_HOST_EAGER": "fused"}
    first = run(env)
    second = run({**env, "PJRT_HOST_CACHE_PREFETCH": "0"})  # each program loaded as it is asked for
    _loads_everything(first, second)
    assert second["stats"]["untraced"] == second["stats"]["programs"]
    assert second["stats"]["prefetched"] == 0


def _loads_everything(first: dict, second: dict) -> None:
    s1, s2 = first["stats"], second["stats"]
    assert s1["compiled"] > 5 and s1["disk_writes"] == s1["compiled"] and s1["disk_hits"] == 0
    # (fewer: a trial of traced scalars the first ran is not run again)
    assert 0 < s2["programs"] <= s1["programs"]
    assert s2["disk_hits"] == s2["programs"] and s2["compiled"] == 0 and s2["disk_writes"] == 0
    assert (first["loss"], first["weight"]) == (second["loss"], second["weight"])
    assert first.get("more") == second.get("more")


# Ops on two devices: in place (donated), through views, out=, random draws.
TWO_DEVICES = r"""
import json, torch
torch.manual_seed(0)
values = []
for dev in ("jax:0", "jax:1"):
    x = torch.zeros(6, device=dev)
    x[2:4] += 1
    torch.add(x, 1, out=x)
    b = torch.empty(16, device=dev).uniform_(-1, 1)
    for n in (2, 3, 4):  # new bounds: the op's scalars are tried traced
        b.add_(torch.empty(16, device=dev).uniform_(-n, n))
    m = torch.randn(3, 3, device=dev) @ torch.ones(3, 3, device=dev)
    values.append([x.tolist(), b.tolist(), m.tolist()])
print(json.dumps({"values": values, "stats": torch.jax.program_cache_stats()}))
"""


def test_programs_kept_untraced_run_on_their_device_and_survive_a_new_version(tmp_path):
    """Programs loaded without tracing are each compiled for one device (an
    op that only overwrites its tensor, uniform_, ran on jax's default
    device and its program never loaded for jax:1), and give what the
    first process computed.  A new pjrt_host finds jax's
    entries of the old one's programs but none of its own (the source is in
    their key): it compiles them rather than load jax's entries, and keeps
    them, so the process after it compiles nothing -- an executable jax
    loaded cannot be serialized again whole on XLA:CPU (it failed with
    "Function ... not found"), and the first process after an upgrade
    loaded every program from jax's entries and kept none: the second
    compiled them all."""
    # op by op: the programs counted are the ops' own (fused eager's are its
    # segments', around them)
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path), "PJRT_HOST_CPU_REF_DEVICES": "2", "PJRT_HOST_EAGER": "op"}
    first = run(env, TWO_DEVICES)
    ours = [f for f in os.listdir(first["stats"]["directory"]) if f.startswith("pjrt_host-")]
    assert ours and any("uniform_" in f for f in ours)
    for f in ours:  # as a new version of pjrt_host finds the directory
        os.unlink(os.path.join(first["stats"]["directory"], f))
    # loaded only as asked for: the counts are of the programs each run uses
    second = run({**env, "PJRT_HOST_CACHE_PREFETCH": "0"}, TWO_DEVICES)
    third = run({**env, "PJRT_HOST_CACHE_PREFETCH": "0"}, TWO_DEVICES)
    assert second["values"] == first["values"] and third["values"] == first["values"]
    assert second["stats"]["untraced"] == 0
    assert third["stats"]["compiled"] == 0 and third["stats"]["untraced"] == third["stats"]["programs"] > 0
    # the third takes the second's verdict on tracing uniform_'s bounds: no
    # trial (whose static programs the others made), the same numbers
    assert third["stats"]["programs"] < second["stats"]["programs"]


# Two signatures of one op (a Python int and a float scalar) that lower to
# one XLA module: the second compile is a hit in jax's cache.
SAME_MODULE = r"""
import json, torch
x = torch.arange(5.0, device="jax")
torch.jax.synchronize()  # x made first: each mul is a program of its own (fused eager records a factory too)
values = [torch.mul(x, 2).tolist(), torch.mul(x, 2.0).tolist()]
print(json.dumps({"values": values, "stats": torch.jax.program_cache_stats()}))
"""


def test_two_programs_that_lower_alike_are_both_kept_untraced(tmp_path):
    """The second of two programs that lower to the same module is loaded by
    jax from the first one's entry, and XLA:CPU cannot serialize such an
    executable (nor a second compile of the module in one process) whole:
    it ran with "NOT_FOUND: Function broadcast_multiply_fusion not found".
    The first one's bytes are kept under the second's key, so a second
    process loads both without tracing and computes the same."""
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path)}
    first = run(env, SAME_MODULE)
    second = run(env, SAME_MODULE)
    assert first["stats"]["disk_hits"] == 1  # the second mul, from jax's entry of the first
    assert second["values"] == first["values"] == [[0.0, 2.0, 4.0, 6.0, 8.0]] * 2
    assert second["stats"]["compiled"] == 0 and second["stats"]["untraced"] == second["stats"]["programs"]


# Ops whose programs call jaxlib's LAPACK kernels on XLA:CPU.
LAPACK = r"""
import json, torch
torch.manual_seed(0)
a = torch.randn(4, 4).to("jax")
spd = a @ a.T + 4 * torch.eye(4, device="jax")
results = [torch.linalg.eigvals(a).abs(), torch.linalg.cholesky(spd), torch.linalg.svdvals(a),
           torch.linalg.qr(a).R.abs(), torch.linalg.eigvalsh(spd), torch.linalg.solve(spd, a)]
print(json.dumps({"values": [r.cpu().tolist() for r in results], "stats": torch.jax.program_cache_stats()}))
"""


def test_programs_that_call_lapack_load_untraced_in_a_new_process(tmp_path):
    """jaxlib binds its LAPACK kernels as it lowers a program that calls
    them; a second process that loads such programs without lowering
    anything ended in a segmentation fault at its first linalg.eigvals."""
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path)}
    first = run(env, LAPACK)
    second = run(env, LAPACK)  # run() asserts the process exits 0
    assert second["stats"]["compiled"] == 0 and second["stats"]["untraced"] == second["stats"]["programs"]
    assert second["values"] == first["values"]


def test_the_default_directory_is_the_users_cache(tmp_path):
    out = run({"XDG_CACHE_HOME": str(tmp_path), "PJRT_HOST_CACHE_DIR": ""})
    assert out["stats"]["directory"].startswith(str(tmp_path / "pjrt_host" / "cpu_ref"))


# Leaves as soon as the device is up when told to: the prefetch threads are
# then still loading what the full run used.
EARLY_EXIT = r"""
import json, os, sys, torch
x = torch.ones(3, device="jax")
if os.environ.get("LEAVE_EARLY"):
    sys.exit(0)
y = (torch.randn(64, 64, device="jax") @ torch.randn(64, 64, device="jax")).softmax(-1).sum(0)
z = torch.nn.functional.gelu(y).cumsum(0)
print(json.dumps({"z": z.tolist(), "stats": torch.jax.program_cache_stats()}))
"""


def test_a_process_that_exits_while_programs_load_ahead_exits_cleanly(tmp_path):
    """Prefetch threads load executables while the script may already be
    leaving: the interpreter's exit stops and waits for them before jaxlib
    goes (a load during teardown would crash), the early process's shorter
    manifest replaces the full one, and the run after it is correct."""
    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path)}
    full = run(env, EARLY_EXIT)
    for _ in range(2):
        proc = run_python(["-c", EARLY_EXIT], env={**env, "LEAVE_EARLY": "1"}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr, proc.stderr[-3000:]
    again = run(env, EARLY_EXIT)
    assert again["z"] == full["z"] and again["stats"]["compiled"] == 0


def test_off_switch_keeps_programs_in_memory_only(tmp_path):
    out = run({"PJRT_HOST_CACHE_DIR": str(tmp_path / "c"), "PJRT_HOST_PROGRAM_CACHE": "0"})
    assert out["stats"]["directory"] is None and out["stats"]["disk_writes"] == 0
    assert out["stats"]["compiled"] > 0
    assert not (tmp_path / "c").exists()


def test_an_unusable_directory_warns_and_the_device_works(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = run({"PJRT_HOST_CACHE_DIR": str(blocker)})
    assert out["stats"]["directory"] is None and out["stats"]["compiled"] > 0
    assert "compiled programs are not kept on disk" in out["stderr"] and "PJRT_HOST_CACHE_DIR" in out["stderr"]


def test_a_bad_size_setting_names_the_variable(tmp_path):
    proc = run_python(["-c", "import torch; torch.ones(2, device='jax')"],
                      env={"PJRT_HOST_CACHE_DIR": str(tmp_path), "PJRT_HOST_CACHE_MAX_BYTES": "lots"})
    assert proc.returncode != 0
    assert "PJRT_HOST_CACHE_MAX_BYTES='lots' is not a whole number" in proc.stderr


def test_a_cache_directory_the_user_gave_jax_is_kept(tmp_path):
    script = ("import jax; jax.config.update('jax_compilation_cache_dir', %r)\n" % str(tmp_path / "mine")) + SCRIPT
    out = run({"PJRT_HOST_CACHE_DIR": str(tmp_path / "ours")}, script)
    assert out["stats"]["directory"] is None
    assert not (tmp_path / "ours").exists()


# Eager ops and a training step on DEVICE, after every process of the test
# has started (the go file), so that all compile the same programs at once.
AT_ONCE = r"""
import json, os, sys, time, torch
device = os.environ["DEVICE"]
go = os.environ.get("GO_FILE")
while go and not os.path.exists(go):
    time.sleep(0.01)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8).to(device)
eager = [(x * 2 + 1).exp().sum().item(), x.softmax(-1).cumsum(0).tolist(), (x @ x.t()).diag().tolist()]
for _ in range(2):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
stats = torch.jax.program_cache_stats() if device != "cpu" else None
print(json.dumps({"eager": eager, "loss": loss.item(), "weights": [p.detach().cpu().tolist() for p in model.parameters()],
                  "stats": stats}))
"""


def test_eight_processes_filling_one_directory_at_once_compute_what_cpu_does(tmp_path):
    """Eight processes start together on an empty cache (as the ranks of a
    job do), each writing the same entries at the same moments: every one
    gets CPU's numbers, the directory holds no partial file afterwards, and
    a ninth finds every program on disk."""
    import numpy as np

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "PYTEST_"))}
    env.pop("JAX_PLATFORMS", None)
    env.update(PJRT_HOST_CACHE_DIR=str(tmp_path / "cache"), DEVICE="jax", GO_FILE=str(tmp_path / "go"))
    procs = [subprocess.Popen([sys.executable, "-c", AT_ONCE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL) for _ in range(8)]
    (tmp_path / "go").write_text("")
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        assert "not used" not in stderr and "not kept on disk" not in stderr, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    cpu = run({"DEVICE": "cpu"}, AT_ONCE)
    for out in outs:
        for key in ("eager", "loss", "weights"):
            assert np.allclose(_flat(out[key]), _flat(cpu[key]), rtol=1e-5, atol=1e-6), key
    leftovers = [f.name for f in (tmp_path / "cache").rglob("*") if f.name.startswith(".tmp-")]
    assert not leftovers
    # the ninth in the eight's environment (the suite's own PJRT_ settings,
    # a dynamic-shapes mode, would make it compile other programs)
    done = subprocess.run([sys.executable, "-c", AT_ONCE], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in env.items() if k != "GO_FILE"}, cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    ninth = json.loads(done.stdout.strip().splitlines()[-1])
    assert ninth["stats"]["compiled"] == 0 and ninth["stats"]["untraced"] == ninth["stats"]["programs"] > 0
    assert _flat(ninth["weights"]) == _flat(outs[0]["weights"])


def _flat(value) -> list:
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [value]


def test_the_size_bound_evicts_the_least_recently_used(tmp_path):
    from pjrt_host import _program_cache

    store = _program_cache._store(str(tmp_path), 10_000)
    assert store._scanned.wait(30)  # the directory's size, read on a thread of its own
    for i in range(8):
        store.put(f"k{i}", bytes(1000))
        os.utime(tmp_path / f"k{i}", (i, i))  # k0 the oldest
    assert store.get("k0") == bytes(1000)  # a hit makes k0 the newest
    store.put("big", bytes(3000))  # 11,000 bytes: down to 3/4 of the bound, oldest first
    left = _entries(tmp_path)
    assert left == ["big", "k0", "k5", "k6", "k7"]
    assert store.get("k1") is None
    store.put("k7", b"other")  # an existing entry is kept as it is
    assert store.get("k7") == bytes(1000)


def test_a_directory_over_the_bound_is_evicted_once_its_size_is_read(tmp_path):
    """The directory's size is read on a thread of its own (a stat of each
    entry took seconds at every process start for a large cache), so a
    process never waits for it; once read, a directory past the bound
    (another process's writes, a smaller bound) is evicted as a write
    past it would be, the least recently used first, and a write made
    while the size was still being read is counted too."""
    from pjrt_host import _program_cache

    first = _program_cache._store(str(tmp_path), 100_000)
    assert first._scanned.wait(30)
    for i in range(12):
        first.put(f"k{i}", bytes(1000))
        os.utime(tmp_path / f"k{i}", (i, i))  # k0 the oldest
    assert len(_entries(tmp_path)) == 12  # under the first bound
    second = _program_cache._store(str(tmp_path), 10_000)
    assert second._scanned.wait(30)
    left = _entries(tmp_path)
    assert sum(os.path.getsize(tmp_path / f) for f in left) <= 7_500 and "k11" in left and "k0" not in left, left
    assert second.get("k11") == bytes(1000)
    second.put("new", bytes(4000))  # past the bound again: evicted at the write
    assert sum(os.path.getsize(tmp_path / f) for f in _entries(tmp_path)) <= 7_500


def _entries(directory) -> list[str]:
    """The entries of a store's directory: not its size record, nor a write under way."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_a_process_reads_the_directorys_size_from_the_record_the_others_kept(tmp_path):
    """A stat of every entry at every process start cost seconds of a CPU
    beside the program in a large cache: the size is recorded at a scan,
    and each write appends its bytes, so the next process reads one file.
    A record that is stale, damaged or absent is scanned again."""
    from pjrt_host import _program_cache, _program_files

    first = _program_cache._store(str(tmp_path), 100_000)
    assert first._scanned.wait(30)
    for i in range(3):
        first.put(f"k{i}", bytes(1000))
    on_disk = sum(os.path.getsize(tmp_path / f) for f in _entries(tmp_path))
    record = tmp_path / _program_files.DiskStore._SIZE_FILE
    assert record.read_text().count("\n+") == 3
    second = _program_cache._store(str(tmp_path), 100_000)
    assert second._scanned.wait(30) and second._size == on_disk

    # the record is what is read, not the directory: one that says less is believed
    record.write_text(f"v1 5 {record.read_text().split()[2]}\n")
    third = _program_cache._store(str(tmp_path), 100_000)
    assert third._scanned.wait(30) and third._size == 5
    for stale in ("v1 5 0\n", "v1 5 %d\n" % (time.time() + 86400), "v2 5 %d\n" % time.time(), "garbage\n+12\n", ""):
        record.write_text(stale)
        again = _program_cache._store(str(tmp_path), 100_000)
        assert again._scanned.wait(30) and again._size == on_disk, stale
        assert record.read_text().split()[1] == str(on_disk)  # the scan recorded anew
    record.unlink()
    last = _program_cache._store(str(tmp_path), 100_000)
    assert last._scanned.wait(30) and last._size == on_disk and record.exists()


def test_a_run_stays_under_the_size_bound(tmp_path):
    out = run({"PJRT_HOST_CACHE_DIR": str(tmp_path), "PJRT_HOST_CACHE_MAX_BYTES": "40000"})
    where = out["stats"]["directory"]
    files = [f for f in os.listdir(where) if not f.startswith(".size")]
    assert out["stats"]["disk_writes"] > len(files) > 0
    assert sum(os.path.getsize(os.path.join(where, f)) for f in files) <= 40000
    assert not any(f.startswith(".tmp-") for f in files)


def test_jax_internals_the_cache_relies_on():
    """The private jax names that plugging the store in uses: a jax upgrade
    that moves them fails here, not silently in every user's cold start."""
    from jax._src import compilation_cache
    from jax._src.compilation_cache_interface import CacheInterface

    assert {"get", "put"} <= set(CacheInterface.__abstractmethods__)
    assert hasattr(compilation_cache, "_cache") and hasattr(compilation_cache, "_cache_initialized")
    assert hasattr(compilation_cache._cache_initialized_mutex, "acquire")
    import inspect

    # jax reads the store through _get_cache, and makes its own only while _cache is None
    assert "_cache" in inspect.getsource(compilation_cache._get_cache)


@pytest.mark.parametrize("layout, where, refused", [
    ({"c": 0o700}, None, None),
    ({"c": 0o755}, None, None),  # readable by others, written only by its owner
    ({"c": 0o777}, "c", "can be written by its group and others (mode 0777)"),
    ({"c": 0o775}, "c", "can be written by its group (mode 0775)"),
    ({"c": 0o757}, "c", "can be written by others (mode 0757)"),
    # sticky, as /tmp: others may add names (another user's cpu_ref is then
    # refused as theirs) but cannot move or replace ours
    ({"c": 0o1777}, None, None),
    ({"p": 0o1777, "p/c": 0o700}, None, None),
    ({"p": 0o777, "p/c": 0o700}, "p", "can be written by its group and others (mode 0777)"),  # c can be replaced
    ({"c": 0o700, "c/cpu_ref": 0o1777}, "c/cpu_ref", "can be written by its group and others (mode 1777)"),
])
def test_a_cache_directory_others_can_write_is_refused(tmp_path, layout, where, refused):
    """The rule of OpenSSH's StrictModes: the directory and every one above
    it belong to this user or root and only their owner writes them,
    except a sticky directory above."""
    from pjrt_host import _program_files

    for rel, mode in layout.items():
        (tmp_path / rel).mkdir()
        os.chmod(tmp_path / rel, mode)
    entries = tmp_path / next(rel for rel in layout if rel.startswith("c") or rel == "p/c") / "cpu_ref"
    problem = _program_files.private_directory(str(entries))
    if refused is None:
        assert problem is None
    else:
        where = tmp_path / where
        assert problem.startswith(f"{where} {refused}, who could replace the programs every process here loads"), problem
        assert problem.endswith(f"Fix: chmod go-w {where}")


@pytest.mark.skipif(not hasattr(os, "chown") or os.geteuid() != 0, reason="making another user's directory needs root")
@pytest.mark.parametrize("owned", ["p/c", "p"])
def test_a_cache_directory_of_another_user_is_refused(tmp_path, owned):
    """Another user's directory, or one above it that is neither ours nor
    root's, is refused; the process runs on, colder, with one warning that
    names the directory, the reason and the fixes."""
    (tmp_path / "p" / "c").mkdir(parents=True)
    os.chown(tmp_path / owned, 65534, 65534)
    out = run({"PJRT_HOST_CACHE_DIR": str(tmp_path / "p" / "c"), "DEVICE": "jax"}, AT_ONCE)
    assert out["stats"]["directory"] is None and out["stats"]["disk_writes"] == 0 and out["stats"]["compiled"] > 0
    assert out["stderr"].count("compiled programs are not kept on disk") == 1, out["stderr"]
    assert (f"compiled programs are not kept on disk: {tmp_path / owned} belongs to another user (uid 65534), "
            "who could replace the programs every process here loads. Fix: use a directory of your own, "
            "or set PJRT_HOST_CACHE_DIR to another directory") in out["stderr"]
    assert not any((tmp_path / "p" / "c").rglob("pjrt_host-*"))  # nothing read or written there
    cpu = run({"DEVICE": "cpu"}, AT_ONCE)
    assert np_close(out["weights"], cpu["weights"])


def test_a_world_writable_cache_directory_warns_once_and_the_device_works(tmp_path):
    os.chmod(tmp_path, 0o777)
    out = run({"PJRT_HOST_CACHE_DIR": str(tmp_path), "DEVICE": "jax"}, AT_ONCE)
    assert out["stats"]["directory"] is None and out["stats"]["compiled"] > 0
    assert out["stderr"].count("compiled programs are not kept on disk") == 1, out["stderr"]
    assert f"Fix: chmod go-w {tmp_path}, or set PJRT_HOST_CACHE_DIR to another directory" in out["stderr"]
    assert not (tmp_path / "cpu_ref").exists() or not any((tmp_path / "cpu_ref").rglob("pjrt_host-*"))


def np_close(a, b) -> bool:
    import numpy as np

    return bool(np.allclose(_flat(a), _flat(b), rtol=1e-5, atol=1e-6))


def test_damaged_and_foreign_entries_are_compiled_again_never_loaded(tmp_path):
    """Each entry file carries a checksum of its key and contents and the
    setting it was written for: a truncated file, a flipped byte behind a
    valid-looking header, a whole entry written for another jaxlib version
    (a copy from another cache), one renamed from another key, and a file
    that is not an entry at all are each removed and their program
    compiled again -- the numbers stay CPU's, one warning says so -- and the
    process after finds them all rewritten."""
    from pjrt_host import _program_cache, _program_files

    env = {"PJRT_HOST_CACHE_DIR": str(tmp_path), "DEVICE": "jax", "PJRT_HOST_CACHE_PREFETCH": "0"}
    first = run(env, AT_ONCE)
    where = first["stats"]["directory"]
    ours = sorted(f for f in os.listdir(where) if f.startswith("pjrt_host-"))
    assert len(ours) >= 10
    (tmp_path / "elsewhere").mkdir()
    other_jaxlib = _program_cache._store(str(tmp_path / "elsewhere"), 1 << 30, "jaxlib 0.0.1 cpu_ref")
    head = len(_program_files.DiskStore._MAGIC) + 48
    for n, name in enumerate(ours):
        file = os.path.join(where, name)
        data = open(file, "rb").read()
        kind = n % 5
        if kind == 0:  # truncated (a disk that filled up, a copy cut short)
            data = data[:len(data) // 2]
        elif kind == 1:  # a valid-looking header over changed contents
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        elif kind == 2:  # a whole entry, sealed for another jaxlib
            other_jaxlib.put(name, data[head:])
            data = (tmp_path / "elsewhere" / name).read_bytes()
        elif kind == 3:  # another key's entry under this name
            data = open(os.path.join(where, ours[n - 1]), "rb").read()
        else:  # not an entry (no header): a raw pickle planted there
            data = data[head:]
        with open(file, "wb") as f:
            f.write(data)
    second = run(env, AT_ONCE)
    for key in ("eager", "loss", "weights"):
        assert _flat(second[key]) == _flat(first[key]), key
    assert second["stats"]["untraced"] == 0 and second["stats"]["compiled"] > 0
    assert second["stderr"].count("is not used:") == 1, second["stderr"]
    assert "pjrt_host: the program cache entry " + where in second["stderr"]
    assert "It is removed and its program compiled again." in second["stderr"]
    third = run(env, AT_ONCE)
    assert third["stats"]["compiled"] == 0 and "is not used" not in third["stderr"]
    assert _flat(third["weights"]) == _flat(first["weights"])


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[:30], "it is truncated"),
    (lambda d: d[:-1] + b"!", "its checksum does not match (truncated or corrupted)"),
])
def test_a_damaged_entry_is_not_returned(tmp_path, damage, reason):
    from pjrt_host import _program_cache, _program_files

    store = _program_cache._store(str(tmp_path), 1 << 20, "jaxlib 1 cpu_ref")
    store.put("pjrt_host-k", b"payload" * 10)
    assert store.get("pjrt_host-k") == b"payload" * 10
    (tmp_path / "pjrt_host-k").write_bytes(damage((tmp_path / "pjrt_host-k").read_bytes()))
    _program_files._damaged = False
    with pytest.warns(RuntimeWarning, match=reason.replace("(", r"\(").replace(")", r"\)")):
        assert store.get("pjrt_host-k") is None
    assert not (tmp_path / "pjrt_host-k").exists()
    other = _program_cache._store(str(tmp_path), 1 << 20, "jaxlib 2 cpu_ref")
    other.put("pjrt_host-k", b"x")
    _program_files._damaged = False
    with pytest.warns(RuntimeWarning, match="written for another jaxlib version, plugin, machine or entry format"):
        assert store.get("pjrt_host-k") is None
