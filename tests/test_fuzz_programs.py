"""The differential fuzzer of op programs (tests/fuzz_programs.py): a fixed
sample of random programs agrees with torch CPU in every mode (op by op,
fused, fused replayed, sync, torch.compile with static and with symbolic
sizes), and the fuzzer itself catches a planted bug and
shrinks it to a short reproducer.

The sample is cheap on purpose: shapes come from a small set (each new
shape compiles each op once, ~20-30 ms on XLA:CPU), programs are short, and
each program runs in one mode of a schedule (compile, the dearest, in one
of 16).  ``pytest --slow`` runs a longer sample in every mode; the long run
is ``python tests/fuzz_programs.py --count 20000`` (docs/fuzzing.md)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402,F401  (the device)

import fuzz_programs  # noqa: E402
from conftest import run_python  # noqa: E402

#: Program k of the sample runs in SCHEDULE[k % 16] (``replay``: fused, the
#: third of three runs, whose segments replay through the replay lane;
#: ``compile-dynamic``: every size symbolic, through the padded graph).
SCHEDULE = ("op", "fused", "sync", "op", "replay", "sync") * 2 + ("compile-dynamic", "fused", "sync", "compile")


def _no_mismatch(stats: dict) -> None:
    assert stats["found"] == [], fuzz_programs.summary(stats)


def test_a_fixed_sample_of_programs_agrees_with_cpu_in_every_mode(tmp_path):
    started = time.monotonic()
    stats = fuzz_programs.fuzz(7000, 192, (), str(tmp_path), schedule=SCHEDULE, min_ops=5, max_ops=10,
                               shrink_budget=60, log=lambda line: None)
    _no_mismatch(stats)
    assert stats["programs"] == 192
    assert min(stats["runs"].values()) >= 5, stats["runs"]  # compile: only programs CPU runs whole
    assert stats["cpu_errors"] > 10  # refusals are compared too, not only successes
    print(f"{stats['programs']} programs, {stats['statements']} statements in {time.monotonic() - started:.1f} s")


_PADDED_SAMPLE = """
import json, sys
sys.path.insert(0, "tests")
import fuzz_programs, torch
stats = fuzz_programs.fuzz(9000, 40, (), sys.argv[1], schedule=("op", "fused"), min_ops=5, max_ops=10,
                           shrink_budget=40, log=lambda line: None)
padded = torch.jax.dynamic_shape_stats()["padded_calls"]
print(json.dumps({"programs": stats["programs"], "found": len(stats["found"]), "padded": padded,
                  "summary": fuzz_programs.summary(stats)}))
"""


def test_a_fixed_sample_of_programs_agrees_with_cpu_with_every_dim_padded(tmp_path):
    """The padded route (dynamic dimensions, docs/dynamic-shapes.md) under
    the fuzzer: every dim of every tensor dynamic, with the oracle's odd
    buckets, op by op and fused, in a process of its own (the setting is
    read at start)."""
    import json

    proc = run_python(["-c", _PADDED_SAMPLE, str(tmp_path)], env={"PJRT_HOST_DYNAMIC_SHAPES": "all"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["programs"] == 40
    assert result["padded"] > 100, result  # the programs ran padded
    assert result["found"] == 0, result["summary"]


def test_programs_padded_in_the_test_mode_leave_no_odd_bucket_to_the_next(tmp_path):
    """Run AX's seeds 28009720-28009737, each op by op and then with every
    dim padded to the test mode's odd buckets, in one process: a backward's
    zeros took the padding of the last padded read of their shape, a (4,)
    read at 7 by an earlier program's padded run, and then met a gradient
    padded to 16 (the program failed: the device raised where CPU ran)."""
    stats = fuzz_programs.fuzz(28009720, 18, ("op", "padded"), str(tmp_path), shrink_budget=20, log=lambda line: None)
    _no_mismatch(stats)


_BACKWARD_LIKE = """
import json, sys
sys.path.insert(0, "tests")
import fuzz_programs
stats = fuzz_programs.fuzz(28012012, 2, ("op", "fused"), sys.argv[1], shrink_budget=0, log=lambda line: None)
print(json.dumps({"programs": stats["programs"], "summary": fuzz_programs.summary(stats), "found": len(stats["found"])}))
"""


def test_a_backwards_zeros_like_of_a_padded_gradient_keeps_its_bucket(tmp_path):
    """Run BJ's seeds 28012012-28012013 in a fresh process, op by op and
    fused: the second's backward stacks 16 scalars where the first's
    stacked 10, so the stack's length becomes dynamic (bucket 16), and a
    ``zeros_like`` of that padded gradient made its bucket's values with
    a factory that a padded read of shape (16,) noted earlier padded again
    (to 32): the storage said 16 and held 32, and the next op that cut it
    failed (the device raised where CPU ran)."""
    import json

    proc = run_python(["-c", _BACKWARD_LIKE, str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["programs"] == 2
    assert result["found"] == 0, result["summary"]


@pytest.mark.slow
def test_a_long_sample_agrees_with_cpu_in_every_mode(tmp_path):
    stats = fuzz_programs.fuzz(8000, 600, fuzz_programs.MODES, str(tmp_path), compile_every=4,
                               shrink_budget=60, log=lambda line: None)
    _no_mismatch(stats)


def test_a_compiled_program_that_meets_aot_autograds_view_replay_is_a_known_difference():
    """Seed 5000055 (docs/fuzzing.md, open 3's run E): its compiled outputs
    share storage as in eager, so its second graph's inputs alias each
    other and AOTAutograd's ViewMeta replay fails its own shape assertion,
    as under aot_eager on CPU (tests/test_compile.py pins that): counted as
    known, not a mismatch."""
    program = fuzz_programs.generate(5000055)
    known: dict = {}
    assert fuzz_programs.check(program, ("compile",), known_seen=known) == {}
    assert known == {"compile": [f"known: {fuzz_programs.KNOWN['compile-view-replay']}"]}


def test_a_compiled_difference_torch_compile_makes_on_cpu_too_is_known_and_no_other():
    """Seed 5000111: ``v11 = full_like(...).expand(2, 4).chunk(2, 1)[0];
    v11.fill_(2)`` writes through an expanded tensor; eager CPU writes the
    shared memory, torch.compile's functionalization sums the overlapping
    writes instead, and aot_eager on CPU gives what the jax backend gives:
    counted as known (``compile-torch``).  An outcome aot_eager on CPU does
    not give is not."""
    program = fuzz_programs.generate(5000111)
    known: dict = {}
    assert fuzz_programs.check(program, ("compile",), known_seen=known) == {}
    assert len(known["compile"]) == 1 and fuzz_programs.KNOWN["compile-torch"] in known["compile"][0]
    ref = fuzz_programs.run_compiled(program, "cpu", backend="aot_eager")
    assert fuzz_programs.torch_compiles_so(program, ref)
    name = next(n for n, t in ref.tensors.items() if t.dtype.is_floating_point and t.values.numel())
    ref.tensors[name].values.add_(1)
    assert not fuzz_programs.torch_compiles_so(program, ref)


def test_two_backend_failures_agree_only_if_their_causes_do():
    """dynamo wraps every backend's error in BackendCompilerFailed, so its
    name alone made any backend failure of the device pass as torch's
    whenever aot_eager on CPU failed too.  A program AOTAutograd refuses on
    CPU (an in-place write to ``exp``'s output, which its backward needs)
    fails alike on the device and is torch's; the same failure with another
    cause is not."""
    S = fuzz_programs.Stmt
    program = fuzz_programs.Program(1, [
        S("v0 = make((3,), torch.float32, 7, DEV, requires_grad=True)", ("v0",)),
        S("v1 = v0.exp()", ("v1",), ("v0",)),
        S("v1.add_(1)", (), ("v1",)),
        S("backward(v1)", (), ("v1",), post=True)], {"v0": (True, True), "v1": (True, True)}, grads=("v0",))
    dev = fuzz_programs.run_compiled(program, "jax")
    assert dev.final_error.startswith("BackendCompilerFailed(RuntimeError): ")
    assert fuzz_programs.torch_compiles_so(program, dev)
    dev.final_error = dev.final_error.replace("(RuntimeError)", "(NotImplementedError)", 1)
    assert not fuzz_programs.torch_compiles_so(program, dev)


def test_a_compiled_difference_aot_eager_makes_too_with_other_draws_is_known():
    """Seed 13001433: after a graph break, a value written through a view
    (``masked_fill_``) comes back as another output's value (``v21``, made
    of a ``randn_like`` draw) under torch.compile with ``aot_eager`` on CPU
    as with the jax backend; the draws differ between the backends, so the
    wrong values do too.  torch's: the same tensors differ from eager CPU
    the same way, so it is counted as ``compile-torch``."""
    program = fuzz_programs.generate(13001433)
    known: dict = {}
    assert fuzz_programs.check(program, ("compile",), known_seen=known) == {}
    assert len(known["compile"]) == 1 and fuzz_programs.KNOWN["compile-torch"] in known["compile"][0]


def test_a_batched_matmul_torch_folds_for_the_device_is_a_known_difference():
    """Seed 5000315 (docs/fuzzing.md, 12): ``matmul`` of a bool and a
    bfloat16 batch, refused by CPU's bmm with NotImplementedError and by
    the mm torch folds it into for the device with RuntimeError (CPU's own
    on that path; tests/test_torch_errors.py pins it): known, not a
    mismatch."""
    program = fuzz_programs.generate(5000315)
    known: dict = {}
    assert fuzz_programs.check(program, ("op",), known_seen=known) == {}
    assert [k for k in known["op"] if fuzz_programs.KNOWN["matmul-fold"] in k]


def test_inexact_values_are_never_written_into_integers_or_bools():
    """Fuzz finding 13 (seed 5000339: ``argmax_result.copy_(nan)``): a
    write that converts an inexact float (a NaN, whose conversion C++ leaves
    undefined: x86 gives INT64_MIN, XLA 0) into an integer or bool tensor is
    never generated, as casts and integer out= of them are not."""
    written = []
    for seed in range(300):
        g = fuzz_programs.Gen(seed)
        g.add(fuzz_programs.Stmt("v0 = torch.tensor([[1, 2], [3, 4]], device=DEV)", ("v0",)))
        g.add(fuzz_programs.Stmt("v1 = torch.tensor([float('nan'), 0.5], device=DEV)", ("v1",)))
        g.add(fuzz_programs.Stmt("v2 = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=DEV)", ("v2",)))
        g.n = 3
        try:
            fuzz_programs.op_inplace(g)
        except fuzz_programs.Skip:
            continue
        written.append(g.stmts[-1].text)
    into_int = [t for t in written if t.startswith("v0") and "v1" in t and ("copy_" in t or "] = v1" in t)]
    assert into_int == []
    # the same writes of exact floats are still made
    assert any(t.startswith("v0") and "v2" in t and ("copy_" in t or "] = v2" in t) for t in written)


def test_programs_are_what_the_seed_says_and_cover_the_kinds_of_op():
    a, b = fuzz_programs.generate(11), fuzz_programs.generate(11)
    assert a.source() == b.source() and a.flags == b.flags
    text = "\n".join(fuzz_programs.generate(s).source() for s in range(60))
    for needle in ("requires_grad=True", "backward(", "out=", "_(", ".as_strided(", ".expand(", ".t()",
                   "torch.randn", "torch.bfloat16", "torch.float64", "torch.int64", "torch.bool", "make(()",
                   "make((0,)", "[", "@", "torch.cat"):
        assert needle in text, needle


PLANTED = r'''
import sys
sys.path.insert(0, "tests")
import dataclasses, jax.numpy as jnp, torch, pjrt_host
from pjrt_host import _lowerings
import fuzz_programs

# the planted bug: maximum computes the minimum (the real engine runs it)
_lowerings.load_all()
record = _lowerings._TABLE["aten::maximum"]
_lowerings._TABLE["aten::maximum"] = dataclasses.replace(record, fn=lambda x, y: jnp.minimum(x, y))
out = sys.argv[1]
for seed in range(200):
    program = fuzz_programs.generate(seed)
    if "torch.maximum(" not in program.source():
        continue
    found = fuzz_programs.check(program, ("op",))
    if found:
        kinds = {fuzz_programs._kind(d) for d in found["op"]}
        small = fuzz_programs.shrink(program, "op", kinds)
        cpu = fuzz_programs.run(small, "cpu")
        diffs = fuzz_programs.check(small, ("op",), cpu)["op"]
        path = f"{out}/repro.py"
        open(path, "w").write(fuzz_programs.reproducer(small, "op", diffs, cpu))
        print("FOUND", seed, len(program.stmts), len(small.stmts))
        print(small.source())
        break
'''


def test_the_fuzzer_catches_a_planted_bug_and_shrinks_it(tmp_path):
    """A lowering made wrong (maximum computing the minimum), in a fresh
    process with its own program cache (so no program compiled from the
    right lowering is reused): the first program that calls torch.maximum
    and sees a difference is shrunk to a few statements, and the saved
    reproducer is a script that runs on its own."""
    proc = run_python(["-c", PLANTED, str(tmp_path)], env={"JAX_PLATFORMS": "cpu",
                                                           "PJRT_HOST_CACHE_DIR": str(tmp_path / "programs")},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    found = [ln for ln in lines if ln.startswith("FOUND")]
    assert found, proc.stdout[-2000:]
    _, seed, before, after = found[0].split()
    source = "\n".join(lines[lines.index(found[0]) + 1:])
    assert "torch.maximum(" in source
    assert int(after) <= 5 < int(before), (before, after, source)
    repro = tmp_path / "repro.py"
    text = repro.read_text()
    assert "values:" in text and "torch.maximum(" in text
    # the reproducer runs on its own (on the real, unplanted lowering here)
    ran = run_python([str(repro)], env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert " jax: " in ran.stdout
