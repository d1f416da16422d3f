"""The GPU and TPU plugins with the real vendor libraries: jax-cuda13-pjrt's
CUDA PJRT library and libtpu.  Both load on a machine without their hardware,
so these run everywhere the libraries are installed (CI installs them):

* the plugin finds its library and the library passes the host's ELF check;
* the library loads, initialises, and accepts every create option the
  plugin computes (option names and types are checked before devices are
  looked for, so a bad option fails even without hardware);
* ``python -m pjrt_host list --probe`` shows why there is no device;
* ``PJRT_DEVICE=cuda`` / ``tpu`` fails with a ClientCreationError that says
  no device was found: no crash, no traceback from jax.

Everything runs in child processes, as users run it.  A test is skipped only
when a distribution it needs is not installed, and says what to install.
"""

from __future__ import annotations

import json
import textwrap
from importlib import metadata
from typing import Any

import pytest

from conftest import run_cli, run_python


def require(distribution: str, install: str) -> None:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed (`{install}`)")


@pytest.fixture
def cuda() -> None:
    require("pjrt-host-gpu", "pip install -e plugins/gpu")
    require("jax-cuda13-pjrt", "pip install 'jax-cuda13-pjrt==0.10.2'")


@pytest.fixture
def tpu() -> None:
    require("pjrt-host-tpu", "pip install -e plugins/tpu")
    require("libtpu", "pip install 'libtpu==0.0.42.*'")


def child_json(code: str, env: dict[str, str] | None = None, timeout: float = 180) -> dict[str, Any]:
    """Run ``code`` in a child interpreter; it prints one JSON line last."""
    proc = run_python(["-c", textwrap.dedent(code)], env=env, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def chip_count(plugin: str) -> int:
    module, cls = {"cuda": ("pjrt_host_gpu", "CudaPlugin"), "tpu": ("pjrt_host_tpu", "TpuPlugin")}[plugin]
    return child_json(f"import json; from {module} import {cls}; print(json.dumps({{'n': {cls}().physical_chip_count()}}))")["n"]


@pytest.fixture
def no_gpu(cuda: None) -> None:
    if chip_count("cuda"):
        pytest.skip("this machine has an NVIDIA GPU: the no-device checks do not apply")


@pytest.fixture
def no_tpu(tpu: None) -> None:
    if chip_count("tpu"):
        pytest.skip("this machine has TPU chips: the no-device checks do not apply")


# -- the library is found and passes the ELF check ---------------------------


def test_cuda_library_is_found(cuda: None) -> None:
    rows = {(r["name"], r["source"]): r for r in json.loads(run_cli("list", "--json").stdout)["plugins"]}
    ours = rows[("cuda", "torch_xla entry point")]
    assert ours["status"] == "ok", ours
    assert ours["distribution"] == "pjrt-host-gpu"
    assert ours["library"].endswith("/jax_plugins/xla_cuda13/xla_cuda_plugin.so")
    # jax-cuda13-pjrt's own jax_plugins entry point is listed beside it,
    # under its own name: no conflict.
    theirs = rows[("xla_cuda13", "jax plugin")]
    assert theirs["distribution"] == "jax-cuda13-pjrt" and theirs["library"] == ours["library"]


def test_libtpu_is_found(tpu: None) -> None:
    rows = {r["name"]: r for r in json.loads(run_cli("list", "--json").stdout)["plugins"]}
    assert rows["tpu"]["status"] == "ok", rows["tpu"]
    assert rows["tpu"]["distribution"] == "pjrt-host-tpu"
    assert rows["tpu"]["library"].endswith("/libtpu/libtpu.so")


def test_elf_check_accepts_both_libraries(cuda: None, tpu: None) -> None:
    result = child_json("""
        import json, os
        os.environ.pop("TPU_LIBRARY_PATH", None)  # whatever an earlier test left
        from pjrt_host._library import library_problem
        from pjrt_host_gpu import CudaPlugin
        from pjrt_host_tpu import TpuPlugin
        paths = [CudaPlugin().library_path(), TpuPlugin().library_path()]
        print(json.dumps({"problems": [library_problem(p) for p in paths],
                          "leaked": "TPU_LIBRARY_PATH" in os.environ}))
    """)
    assert result["problems"] == [None, None]
    # Importing libtpu sets TPU_LIBRARY_PATH; the plugin must undo that.
    assert result["leaked"] is False


# -- the library loads, initialises, and accepts the plugin's options --------

_CREATE_CLIENTS = """
    import json, os
    from jax._src.lib import xla_client
    from {module} import {cls}
    plugin = {cls}()
    xla_client.load_pjrt_plugin_dynamically("probe", plugin.library_path())
    xla_client.initialize_pjrt_plugin("probe")
    results = []
    for env in {envs!r}:
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            options = dict(plugin.client_create_options())
        finally:
            os.environ.clear(); os.environ.update(saved)
        options.update(env.get("EXTRA_OPTIONS") and json.loads(env["EXTRA_OPTIONS"]) or {{}})
        try:
            xla_client.make_c_api_client("probe", options, None)
            results.append("created")
        except Exception as err:
            results.append(str(err))
    print(json.dumps({{"results": results}}))
"""


def test_cuda_library_accepts_every_option_the_plugin_makes(no_gpu: None) -> None:
    envs = [
        {},
        {"PJRT_ALLOCATOR_FRACTION": "0.5", "PJRT_ALLOCATOR_PREALLOCATE": "false", "PJRT_ALLOCATOR": "platform"},
        {"PJRT_ALLOCATOR_CUDA_ASYNC": "1", "WORLD_SIZE": "4", "RANK": "3"},
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"},
        {"PJRT_ALLOCATOR": "bfc", "EXTRA_OPTIONS": '{"visible_devices": [0, 1]}'},
        # Controls: the library does check names and types without a GPU.
        {"EXTRA_OPTIONS": '{"not_an_option": 1}'},
        {"EXTRA_OPTIONS": '{"memory_fraction": "half"}'},
    ]
    code = _CREATE_CLIENTS.format(module="pjrt_host_gpu", cls="CudaPlugin", envs=envs)
    results = child_json(code)["results"]
    for env, result in zip(envs[:-2], results[:-2]):
        assert "No visible GPU devices" in result, (env, result)
    assert "Unexpected option name passed to PJRT_Client_Create: not_an_option" in results[-2]
    assert "name memory_fraction has type" in results[-1]


def test_libtpu_accepts_every_option_the_plugin_makes(no_tpu: None) -> None:
    envs = [
        {},
        {"XLA_TPU_MAX_INFLIGHT_COMPUTATIONS": "4"},
        {"EXTRA_OPTIONS": '{"not_an_option": 1}'},
        {"EXTRA_OPTIONS": '{"max_inflight_computations": "many"}'},
    ]
    code = _CREATE_CLIENTS.format(module="pjrt_host_tpu", cls="TpuPlugin", envs=envs)
    # Another process may hold libtpu's lock file; there is no chip to guard.
    results = child_json(code, env={"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"})["results"]
    for env, result in zip(envs[:2], results[:2]):
        assert "TPU initialization failed: No jellyfish device found" in result, (env, result)
    assert "Unexpected option name passed to PJRT_Client_Create: not_an_option" in results[2]
    assert "name max_inflight_computations has type" in results[3]


# -- what users see ---------------------------------------------------------------


def test_list_probe_says_why_there_is_no_device(no_gpu: None, no_tpu: None) -> None:
    proc = run_cli("list", "--probe", "--json", env={"PJRT_HOST_PLUGINS": "cuda,tpu,xla_cuda13"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    probes = {r["name"]: r["probe"] for r in json.loads(proc.stdout)["plugins"]}
    assert probes["cuda"]["devices"] is None
    assert "no NVIDIA GPU (CUDA) device was found on this machine" in probes["cuda"]["error"]
    assert "FAILED_PRECONDITION: No visible GPU devices" in probes["cuda"]["error"]
    assert probes["tpu"]["devices"] is None
    assert "no Google Cloud TPU device was found on this machine" in probes["tpu"]["error"]
    assert "TPU initialization failed: No jellyfish device found" in probes["tpu"]["error"]
    assert "No visible GPU devices" in probes["xla_cuda13"]["error"]

    text = run_cli("list", "--probe", env={"PJRT_HOST_PLUGINS": "cuda,tpu"}, timeout=300).stdout
    rows = {line.split()[0]: line for line in text.splitlines()[1:] if line.strip()}
    assert "ok; no devices: no NVIDIA GPU (CUDA) device was found" in rows["cuda"]
    assert "ok; no devices: no Google Cloud TPU device was found" in rows["tpu"]


_SELECT_AND_FAIL = """
    import json, pjrt_host
    try:
        pjrt_host.devices()
        result = {"error": None}
    except Exception as err:
        result = {"type": type(err).__name__, "clean": isinstance(err, pjrt_host.ClientCreationError),
                  "plugin": getattr(err, "plugin", None), "error": str(err)}
    print(json.dumps(result))
"""


@pytest.mark.parametrize(("device", "says"), [
    ("cuda", ["no NVIDIA GPU (CUDA) device was found on this machine", "No visible GPU devices"]),
    ("tpu", ["no Google Cloud TPU device was found on this machine", "No jellyfish device found"]),
])
def test_pjrt_device_without_the_device_fails_cleanly(request: pytest.FixtureRequest, device: str,
                                                      says: list[str]) -> None:
    request.getfixturevalue("no_gpu" if device == "cuda" else "no_tpu")
    result = child_json(_SELECT_AND_FAIL, env={"PJRT_DEVICE": device})
    assert result["clean"] is True, result
    assert result["plugin"] == device
    assert result["error"].startswith(f"pjrt_host: plugin '{device}' (from pjrt-host-")
    for text in says:
        assert text in result["error"]
    assert "PJRT_DEVICE=NAME" in result["error"]
    # No Python traceback on stderr (e.g. from jax importing other plugins).
    assert "Traceback" not in result["stderr"], result["stderr"]


def test_the_failure_is_remembered(no_tpu: None) -> None:
    """A second attempt in the same process gets the same error quickly,
    without loading libtpu again."""
    result = child_json("""
        import json, time, pjrt_host
        errors = []
        for _ in range(2):
            start = time.monotonic()
            try:
                pjrt_host.devices()
            except pjrt_host.ClientCreationError as err:
                errors.append((str(err), time.monotonic() - start))
        print(json.dumps({"same": errors[0][0] == errors[1][0], "count": len(errors)}))
    """, env={"PJRT_DEVICE": "tpu"})
    assert result == {"same": True, "count": 2, "stderr": result["stderr"]}


@pytest.mark.parametrize(("device", "env", "says"), [
    # jax registers its own 'cuda' backend from jax-cuda13-pjrt (the version
    # check needs jax-cuda13-plugin, absent here): the host's client is then
    # registered beside it under another name, from the same library.
    ("cuda", {"JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}, "No visible GPU devices"),
    # jax starts its own 'tpu' backend from libtpu (and fails quietly).
    ("tpu", {}, "No jellyfish device found"),
])
def test_jax_used_before_the_host(request: pytest.FixtureRequest, device: str, env: dict[str, str],
                                  says: str) -> None:
    """jax's backends exist before the host creates its client: the failure
    is still a ClientCreationError, not jaxlib's own exception."""
    request.getfixturevalue("no_gpu" if device == "cuda" else "no_tpu")
    code = "import jax\njax.devices()\n" + textwrap.dedent(_SELECT_AND_FAIL)
    result = child_json(code, env={"PJRT_DEVICE": device, **env})
    assert result["clean"] is True, result
    assert "device was found on this machine" in result["error"] and says in result["error"]


_HANDLERS = """
    import json, logging, pjrt_host
    logging.basicConfig(level=logging.INFO)
    try:
        pjrt_host.devices()
    except pjrt_host.ClientCreationError:
        pass
    from jaxlib import xla_client
    print(json.dumps({"handlers": sorted(xla_client._custom_callback_handler),
                      "types": sorted(xla_client._custom_type_id_handler)}))
"""


def test_cuda_custom_calls_are_registered_with_the_extension(no_gpu: None) -> None:
    """library_loaded() registers jax's CUDA custom calls and FFI types
    against the library the host loaded, as jax's own CUDA plugin does."""
    require("jax-cuda13-plugin", "pip install --no-deps 'jax-cuda13-plugin==0.10.2'")
    result = child_json(_HANDLERS, env={"PJRT_DEVICE": "cuda"})
    assert "CUDA" in result["handlers"] and "CUDA" in result["types"], result


def test_without_the_extension_cuda_custom_calls_are_explained(no_gpu: None) -> None:
    try:
        metadata.distribution("jax-cuda13-plugin")
        pytest.skip("jax-cuda13-plugin is installed")
    except metadata.PackageNotFoundError:
        pass
    result = child_json(_HANDLERS, env={"PJRT_DEVICE": "cuda"})
    assert "CUDA" not in result["handlers"]
    assert "pip install 'pjrt-host-gpu[cuda13-with-cuda]'" in result["stderr"]
