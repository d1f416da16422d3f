"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re

from conftest import REPO, run_python


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```\n(python3 -m venv[^`]*)```", text)]


def test_readme_has_a_main_job_and_a_test_command():
    main, test = readme_commands()
    assert "python -m pjrt_host list" in main and "-c constraints.txt" in main
    assert "-c constraints.txt" in test
    # the whole suite, one worker per core, each file in one worker
    assert test.endswith("python -m pytest -n auto --dist loadfile")


def test_ci_runs_exactly_the_readme_test_command():
    _, test = readme_commands()
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines


def test_constraints_pin_the_versions_tested_together():
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert pins["torch"] == "2.13.0"
    assert pins["jax"] == pins["jaxlib"] == "0.10.2"


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_readme_python_examples_run_as_written():
    """The README's Python blocks, in order, as one session (each block
    continues the previous one, as a reader types them)."""
    blocks = readme_python_blocks()
    assert len(blocks) >= 3
    result = run_python(["-c", "\n".join(blocks)], env={"PJRT_DEVICE": "cpu_ref"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
