"""The GPU plugin's computations: GPUs counted from a fake driver tree,
CUDA_VISIBLE_DEVICES, the library lookup and its errors, and every create
option.  The real CUDA library is exercised in test_vendor_libraries.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pjrt_host_gpu import CudaPlugin
from pjrt_host_gpu import _env

REPO = Path(__file__).resolve().parent.parent


def pyproject() -> dict[str, Any]:
    """The ``[project]`` table of plugins/gpu/pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    return tomllib.loads((REPO / "plugins" / "gpu" / "pyproject.toml").read_text())["project"]


_ENV_VARS = (
    "CUDA_VISIBLE_DEVICES", "GPU_NUM_DEVICES", "PJRT_HOST_CUDA_LIBRARY_PATH",
    "PJRT_ALLOCATOR", "PJRT_ALLOCATOR_CUDA_ASYNC", "PJRT_ALLOCATOR_FRACTION", "PJRT_ALLOCATOR_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR", "RANK", "WORLD_SIZE",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


class Driver:
    """A fake NVIDIA driver tree: /proc/driver/nvidia/gpus and /dev."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc" / "driver" / "nvidia" / "gpus"
        self.dev = root / "dev"
        self.proc.mkdir(parents=True)
        self.dev.mkdir()
        (self.dev / "nvidiactl").touch()
        (self.dev / "nvidia-uvm").touch()

    def add_gpus(self, count: int, *, nodes: bool = True) -> list[str]:
        uuids = []
        for i in range(count):
            uuid = f"GPU-{i:02d}a1b2c3-0000-1111-2222-333344445555"
            folder = self.proc / f"0000:{i + 1:02x}:00.0"
            folder.mkdir()
            (folder / "information").write_text(
                f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nBus Location: \t 0000:{i + 1:02x}:00.0\n")
            if nodes:
                (self.dev / f"nvidia{i}").touch()
            uuids.append(uuid)
        return uuids

    def plugin(self) -> CudaPlugin:
        return CudaPlugin(proc_gpus=str(self.proc), dev_root=str(self.dev))


@pytest.fixture
def driver(tmp_path: Path) -> Driver:
    return Driver(tmp_path)


# -- counting GPUs --------------------------------------------------------------


def test_counts_device_nodes(driver: Driver) -> None:
    driver.add_gpus(4)
    assert driver.plugin().physical_chip_count() == 4


def test_device_nodes_win_over_proc_in_a_container(driver: Driver) -> None:
    # /proc shows the whole machine; /dev only what the container was given.
    driver.add_gpus(8, nodes=False)
    (driver.dev / "nvidia3").touch()
    (driver.dev / "nvidia5").touch()
    assert driver.plugin().physical_chip_count() == 2


def test_counts_proc_folders_before_device_nodes_exist(driver: Driver) -> None:
    driver.add_gpus(2, nodes=False)
    assert driver.plugin().physical_chip_count() == 2


def test_no_driver_means_no_gpu(tmp_path: Path) -> None:
    plugin = CudaPlugin(proc_gpus=str(tmp_path / "absent"), dev_root=str(tmp_path / "absent-dev"))
    assert plugin.physical_chip_count() == 0


def test_control_nodes_are_not_gpus(driver: Driver) -> None:
    (driver.dev / "nvidia-modeset").touch()
    (driver.dev / "nvidia-caps").mkdir()
    assert driver.plugin().physical_chip_count() == 0


@pytest.mark.parametrize(("visible", "expected"), [
    ("", 0),            # empty hides every GPU
    ("0", 1),
    ("3,1", 2),
    ("0,7", 1),         # 7 does not exist: the list ends there
    ("2,2,3", 1),       # a repeat ends the list
    ("-1", 0),
    ("0,foo,1", 1),
    ("GPU-01a1b2c3", 1),  # a UUID prefix of GPU 1
    ("GPU-01a1b2c3,GPU-ffffffff", 1),
    ("GPU-ffffffff", 0),
    ("MIG-4f9bd1c0-9d3e-5b47-a5b4-000000000000", 1),
    (" 1 , 2 ", 2),
])
def test_cuda_visible_devices(driver: Driver, monkeypatch: pytest.MonkeyPatch, visible: str, expected: int) -> None:
    driver.add_gpus(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert driver.plugin().physical_chip_count() == expected


def test_cuda_visible_devices_without_any_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert CudaPlugin(proc_gpus=str(tmp_path), dev_root=str(tmp_path)).physical_chip_count() == 0


def test_gpu_num_devices_overrides_the_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_NUM_DEVICES", "3")
    assert CudaPlugin(proc_gpus=str(tmp_path), dev_root=str(tmp_path)).physical_chip_count() == 3


@pytest.mark.parametrize("value", ["three", "-1", "1.5"])
def test_bad_gpu_num_devices_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GPU_NUM_DEVICES", value)
    with pytest.raises(ValueError, match=r"GPU_NUM_DEVICES=.*whole number of GPUs"):
        CudaPlugin().physical_chip_count()


def test_counting_imports_no_runtime(driver: Driver) -> None:
    """Counting GPUs must not bring jax, torch or the CUDA driver library
    into the process."""
    driver.add_gpus(2)
    code = (
        "import sys, json; from pjrt_host_gpu import CudaPlugin\n"
        f"n = CudaPlugin(proc_gpus={str(driver.proc)!r}, dev_root={str(driver.dev)!r}).physical_chip_count()\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(json.dumps({'n': n, 'modules': sorted(m for m in ('jax', 'jaxlib', 'torch') if m in sys.modules),"
        " 'libcuda': 'libcuda' in maps}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout) == {"n": 2, "modules": [], "libcuda": False}


# -- the library ----------------------------------------------------------------


def test_library_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libmy_cuda_pjrt.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("PJRT_HOST_CUDA_LIBRARY_PATH", str(lib))
    assert CudaPlugin().library_path() == str(lib)


def test_library_override_that_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_HOST_CUDA_LIBRARY_PATH", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match=r"PJRT_HOST_CUDA_LIBRARY_PATH=.*missing\.so.* is not a file"):
        CudaPlugin().library_path()


def test_missing_wheel_names_the_package_to_install(tmp_path: Path) -> None:
    """In an interpreter that sees no site-packages (so none of jax's CUDA
    wheels), library_path() says what to pip install."""
    code = (
        "from pjrt_host_gpu import CudaPlugin\n"
        "try:\n    CudaPlugin().library_path()\n"
        "except FileNotFoundError as err:\n    print(err)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins" / "gpu")])}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA PJRT library is installed" in proc.stdout
    assert "pip install 'pjrt-host-gpu[cuda13]'" in proc.stdout
    assert "jax-cuda13-pjrt" in proc.stdout and "jax-cuda12-pjrt" in proc.stdout
    assert "PJRT_HOST_CUDA_LIBRARY_PATH" in proc.stdout


# -- create options ---------------------------------------------------------------


def test_default_options(driver: Driver) -> None:
    driver.add_gpus(2)
    assert driver.plugin().client_create_options() == {"platform_name": "cuda"}


@pytest.mark.parametrize(("env", "expected"), [
    ({"PJRT_ALLOCATOR_FRACTION": "0.5"}, {"memory_fraction": 0.5}),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".25"}, {"memory_fraction": 0.25}),
    ({"XLA_CLIENT_MEM_FRACTION": "1"}, {"memory_fraction": 1.0}),
    ({"PJRT_ALLOCATOR_FRACTION": "0.9", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1"}, {"memory_fraction": 0.9}),
    ({"PJRT_ALLOCATOR_PREALLOCATE": "false"}, {"preallocate": False}),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "1"}, {"preallocate": True}),
    ({"PJRT_ALLOCATOR_PREALLOCATE": "no", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, {"preallocate": False}),
    ({"PJRT_ALLOCATOR": "platform"}, {"allocator": "platform"}),
    ({"PJRT_ALLOCATOR": "CUDA_ASYNC"}, {"allocator": "cuda_async"}),
    ({"PJRT_ALLOCATOR_CUDA_ASYNC": "1"}, {"allocator": "cuda_async"}),
    ({"PJRT_ALLOCATOR_CUDA_ASYNC": "0", "XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}, {"allocator": "bfc"}),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"}, {"allocator": "vmm"}),
    ({"WORLD_SIZE": "8", "RANK": "5"}, {"node_id": 5, "num_nodes": 8}),
    ({"WORLD_SIZE": "1", "RANK": "0"}, {}),
])
def test_options_from_the_environment(driver: Driver, monkeypatch: pytest.MonkeyPatch,
                                      env: dict[str, str], expected: dict[str, object]) -> None:
    driver.add_gpus(1)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert driver.plugin().client_create_options() == {"platform_name": "cuda", **expected}


@pytest.mark.parametrize(("name", "value", "message"), [
    ("PJRT_ALLOCATOR_FRACTION", "1.5",
     r"PJRT_ALLOCATOR_FRACTION='1.5' must be more than 0 and at most 1 \(a fraction of GPU memory"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "half", r"XLA_PYTHON_CLIENT_MEM_FRACTION='half'"),
    ("PJRT_ALLOCATOR_FRACTION", "0", r"PJRT_ALLOCATOR_FRACTION='0'"),
    ("PJRT_ALLOCATOR_PREALLOCATE", "maybe", r"PJRT_ALLOCATOR_PREALLOCATE='maybe' is not a boolean"),
    ("PJRT_ALLOCATOR", "arena", r"PJRT_ALLOCATOR='arena' .*default, platform, bfc, cuda_async, vmm"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "x", r"XLA_PYTHON_CLIENT_ALLOCATOR='x'"),
    ("RANK", "first", r"RANK='first' is not a whole number"),
])
def test_bad_option_values_name_the_variable(driver: Driver, monkeypatch: pytest.MonkeyPatch,
                                             name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=message):
        driver.plugin().client_create_options()


def test_rank_outside_the_world(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2 is not a rank among WORLD_SIZE=2"):
        driver.plugin().client_create_options()


@pytest.mark.parametrize(("gpus", "world", "shares"), [
    (4, 4, [[0], [1], [2], [3]]),
    (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (3, 2, [[0, 1], [2]]),
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
])
def test_each_local_process_takes_its_share(driver: Driver, gpus: int, world: int, shares: list[list[int]]) -> None:
    driver.add_gpus(gpus)
    seen = []
    for rank in range(world):
        plugin = driver.plugin()
        plugin.configure_multiprocess(rank, world)
        seen.append(plugin.client_create_options()["visible_devices"])
    assert seen == shares


def test_shares_are_among_the_visible_gpus(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    driver.add_gpus(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    plugin = driver.plugin()
    plugin.configure_multiprocess(1, 2)
    # Indices count among the visible GPUs, as CUDA numbers them.
    assert plugin.client_create_options()["visible_devices"] == [1]


def test_more_processes_than_gpus(driver: Driver) -> None:
    driver.add_gpus(2)
    plugin = driver.plugin()
    plugin.configure_multiprocess(0, 4)
    with pytest.raises(ValueError, match=r"4 processes share this host but it has 2 visible GPU\(s\)"):
        plugin.client_create_options()


def test_launcher_that_binds_a_gpu_per_process(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    driver.add_gpus(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    plugin = driver.plugin()
    plugin.configure_multiprocess(2, 4)
    assert "visible_devices" not in plugin.client_create_options()


def test_no_gpu_to_share_asks_for_the_rank(driver: Driver) -> None:
    plugin = driver.plugin()
    plugin.configure_multiprocess(1, 2)
    assert plugin.client_create_options()["visible_devices"] == [1]


def test_single_process_uses_every_gpu(driver: Driver) -> None:
    driver.add_gpus(4)
    plugin = driver.plugin()
    plugin.configure_multiprocess(1, 2)
    plugin.configure_single_process()
    assert "visible_devices" not in plugin.client_create_options()


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0)])
def test_bad_local_rank(rank: int, world: int) -> None:
    with pytest.raises(ValueError, match="is not a rank among"):
        CudaPlugin().configure_multiprocess(rank, world)


def test_coordinator_for_several_processes(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = driver.plugin()
    assert plugin.requires_xla_coordinator() is False
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert plugin.requires_xla_coordinator() is True
    monkeypatch.delenv("WORLD_SIZE")
    plugin.configure_multiprocess(0, 2)
    assert plugin.requires_xla_coordinator() is True


# -- declarations -------------------------------------------------------------------


def test_cuda_tensors_are_zero_copy() -> None:
    assert CudaPlugin.zero_copy_torch_devices == ("cuda",)
    assert CudaPlugin.unsupported_dtypes == {}
    assert CudaPlugin.dense_gather_factor == 0


def test_distribution_declares_the_entry_point_and_extras() -> None:
    project = pyproject()
    assert project["name"] == "pjrt-host-gpu"
    assert project["entry-points"]["torch_xla.plugins"] == {"cuda": "pjrt_host_gpu:CudaPlugin"}
    extras = project["optional-dependencies"]
    assert extras["cuda13"] == ["jax-cuda13-pjrt==0.10.2"]
    assert extras["cuda12"] == ["jax-cuda12-pjrt==0.10.2"]


def test_extras_pin_the_installed_jax() -> None:
    """The PJRT wheels must be the jaxlib's own version: a mismatched C API
    is refused when the library loads."""
    from importlib import metadata

    version = metadata.version("jaxlib")
    project = pyproject()
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            assert requirement.endswith(f"=={version}"), (extra, requirement, version)


def test_env_functions_document_their_default() -> None:
    for name in _env.__all__:
        function = getattr(_env, name)
        if callable(function):
            assert "Default" in (function.__doc__ or "") or name == "cuda_visible_devices", name
