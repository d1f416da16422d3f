"""Seeing why the device compiles: every new signature of an op that had
compiled before is logged at INFO with what changed, and an op that keeps
compiling new shapes after running warm warns once, naming the shape.  Run
in a fresh process, so that what earlier tests compiled does not count."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

from conftest import run_python  # noqa: E402

SCRIPT = r"""
import logging, sys, torch
logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
if sys.argv[1] == "info":
    logging.getLogger("pjrt_host.recompiles").setLevel("INFO")
# warm-up: many shapes at first (a model's layers) warn nothing
for n in range(2, 30):
    torch.ones(n, 3, device="jax").exp()
x = torch.ones(4, 8, device="jax")
for _ in range(70):
    x.exp()
print("warm")
# a length that changes every step, after running warm
for n in range(9, 20):
    torch.ones(4, n, device="jax").exp()
"""


# With dynamic dimensions off: every new shape compiles (dynamic dimensions
# would pad the changing length from its third size on: the test below).
PER_SHAPE = {"PJRT_HOST_DYNAMIC_SHAPES": "0"}


def test_an_op_compiling_every_step_after_warm_up_warns_once():
    proc = run_python(["-c", SCRIPT, "warn"], env=PER_SHAPE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = proc.stdout.split("warm\n")
    assert "WARNING" not in before
    warnings = [line for line in after.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, after
    assert "aten::exp keeps compiling new programs after running warm" in warnings[0]
    assert "argument 0 float32[4, 15] -> float32[4, 16]" in warnings[0]
    assert "pad or bucket" in warnings[0]


OTHER_WORK = r"""
import logging, sys, torch
logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
x = torch.ones(4, 8, device="jax")
for _ in range(70):
    x.exp()
print("warm")
# the program turns to other work (training, then generate() at batch 1):
# a burst of new signatures at new call sites, reused after -- many of one
# form (float32, rank 3: the prompt's length or 1, a layer's widths)
for _ in range(3):
    for width in (16, 24, 32, 48, 64, 96):
        for n in (1, 9):
            torch.ones(1, n, width, device="jax").exp()
    for dtype in (torch.float16, torch.bfloat16):
        for rank in (1, 4):
            for n in (5, 6):
                torch.ones(*[2] * (rank - 1), n, dtype=dtype, device="jax").exp()
print("done")
"""


def test_an_op_turning_to_other_work_after_warm_up_does_not_warn():
    # 20 new signatures after running warm, 12 of one form (dtype, rank,
    # view kind), but no size among them takes more than 6 values: a phase
    # of new work, not a length changing every step.  (Counted over all
    # signatures, or per form, this warned.)
    proc = run_python(["-c", OTHER_WORK], env=PER_SHAPE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stdout
    assert "WARNING" not in proc.stdout, proc.stdout


def test_the_recompile_log_says_what_changed():
    proc = run_python(["-c", SCRIPT, "info"], env=PER_SHAPE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "INFO aten::exp compiles a new program: argument 0 float32[2, 3] -> float32[3, 3]" in proc.stdout
    assert "INFO aten::exp compiles a new program: argument 0 float32[29, 3] -> float32[4, 8]" in proc.stdout


def test_by_default_a_changing_length_compiles_once_per_bucket():
    # dynamic dimensions (the default): the length that changes every step is
    # padded from its third size at that line, and compiles per bucket (16, 32)
    proc = run_python(["-c", SCRIPT, "info"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = proc.stdout.split("warm\n")
    assert "WARNING" not in after, after
    compiles = [line for line in after.splitlines() if "compiles a new program" in line]
    assert len(compiles) <= 5, after
    assert "(padded to buckets along dims [1])" in after


def test_a_length_crossing_many_buckets_after_warm_up_does_not_warn():
    # each new bucket compiles once: bounded, and the warning's advice (pad
    # or bucket the sizes) is what the padded route already does
    growing = SCRIPT.replace("for n in range(9, 20):", "for n in range(9, 300):")
    proc = run_python(["-c", growing, "warn"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = proc.stdout.split("warm\n")
    assert "WARNING" not in after, after


LISTS = r"""
import logging, sys, torch
logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
logging.getLogger("pjrt_host.recompiles").setLevel("INFO")
parts = [torch.ones(2, 3, device="jax") for _ in range(40)]
for n in (3, 4):  # one item of a long list changes shape
    torch.cat(parts[:-1] + [torch.ones(2, n, device="jax")], dim=1)
"""


def test_a_changed_list_is_logged_by_the_items_that_changed():
    """A list argument (cat's tensors, a foreach op's step sizes) is logged
    by how many of its items changed and the first of them, not printed
    whole twice."""
    proc = run_python(["-c", LISTS])
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if "aten::cat compiles a new program" in ln)
    assert "argument 0, 1 of its 40 items (item 39: float32[2, 3] -> float32[2, 4])" in line, line
    assert len(line) < 300, line
