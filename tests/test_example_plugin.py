"""The vendor example in docs/, pip-installed for real, used with no change
to pjrt_host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, Site, list_json, run_python

EXAMPLE = REPO / "docs" / "example_plugin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Site:
    target = tmp_path_factory.mktemp("example-install")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(EXAMPLE)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(target.glob("acme_pjrt_plugin-1.0.0.dist-info")), sorted(p.name for p in target.iterdir())
    return Site(Path(target))


def test_pip_installed_example_is_listed_and_selected_by_priority(installed):
    data = list_json(installed)
    (row,) = data["by_name"]["acme"]
    assert row["distribution"] == "acme-pjrt-plugin" and row["version"] == "1.0.0"
    assert row["status"] == "ok" and row["display_name"] == "Acme accelerator"
    assert data["selected"] == "acme"  # priority 200 beats cpu_ref's 0


def test_example_runs_a_computation_when_selected(installed):
    code = (
        "import numpy as np, jax, pjrt_host\n"
        "dev = pjrt_host.devices()[0]\n"
        "x = jax.device_put(np.arange(6.0, dtype=np.float32).reshape(2, 3), dev)\n"
        "print(pjrt_host.selected().name, np.asarray(jax.jit(lambda a: (a * 2).sum())(x)))\n"
    )
    proc = run_python(["-c", code], site=installed, env={"PJRT_DEVICE": "ACME"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["acme", "30.0"]


def test_example_library_override_is_checked(installed, libs):
    data = list_json(installed, env={"ACME_PJRT_LIBRARY": libs["no_symbol"]})
    (row,) = data["by_name"]["acme"]
    assert row["status"] == "bad library" and "does not export GetPjrtApi" in row["reason"]


def test_example_kernel_runs_in_place_of_the_lowering(installed):
    code = (
        "import torch, pjrt_host\n"
        "x = torch.linspace(-30, 30, 101)\n"
        "got = torch.nn.functional.silu(x.to('jax')).cpu()\n"
        "print(torch.allclose(got, torch.nn.functional.silu(x), rtol=1.3e-6, atol=1e-5),\n"
        "      {k: v['traced'] for k, v in pjrt_host.plugin_kernel_stats().items()})\n"
    )
    # op by op: one trace, the op's program (fused eager traces it for the
    # segment's program too)
    proc = run_python(["-c", code], site=installed, env={"PJRT_DEVICE": "ACME", "PJRT_HOST_EAGER": "op"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True {'aten::silu acme_pjrt_plugin.kernels:silu': 1}", proc.stdout
