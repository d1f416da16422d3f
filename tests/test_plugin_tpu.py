"""The TPU plugin's computations: chips counted on a fake PCI tree, the
libtpu topology of each process against fake slices, the metadata server
(a real HTTP server on loopback), overrides and errors.  The real libtpu is
exercised in test_vendor_libraries.py."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pjrt_host_tpu import TpuPlugin, TpuTopology
from pjrt_host_tpu import _env, _topology

REPO = Path(__file__).resolve().parent.parent


def pyproject() -> dict[str, Any]:
    """The ``[project]`` table of plugins/tpu/pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    return tomllib.loads((REPO / "plugins" / "tpu" / "pyproject.toml").read_text())["project"]


_ENV_VARS = (
    "TPU_LIBRARY_PATH", "TPU_NUM_DEVICES", "TPU_VISIBLE_CHIPS", "XLA_TPU_MAX_INFLIGHT_COMPUTATIONS",
    "XLA_DENSE_GATHER_FACTOR", "PJRT_HOST_TPU_BASE_PORT", "TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE",
    "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "GCE_METADATA_IP",
    "PJRT_HOST_TPU_METADATA_TIMEOUT", *_topology.TOPOLOGY_VARIABLES,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def add_pci(root: Path, address: str, vendor: str, device: str) -> None:
    folder = root / address
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")
    (folder / "class").write_text("0x120000\n")


@pytest.fixture
def pci(tmp_path: Path) -> Path:
    """A PCI tree with a gVNIC (Google's vendor id, not a TPU) and a GPU."""
    root = tmp_path / "sys" / "bus" / "pci" / "devices"
    root.mkdir(parents=True)
    add_pci(root, "0000:00:04.0", "0x1ae0", "0x0042")
    add_pci(root, "0000:00:05.0", "0x10de", "0x2335")
    return root


def add_tpus(root: Path, count: int, device: str = "0x005e") -> None:
    for i in range(count):
        add_pci(root, f"0000:{i + 0x10:02x}:00.0", "0x1ae0", device)


def v4_8() -> TpuTopology:
    return TpuTopology("v4-8", (1, 1, 1), (2, 2, 1), 0, ("t1v-n-1-w-0",))


def four_chip_plugin(pci: Path, topology: TpuTopology | None = None) -> TpuPlugin:
    add_tpus(pci, 4)
    return TpuPlugin(pci_devices=str(pci), topology=lambda: topology or v4_8())


# -- counting chips -----------------------------------------------------------------


@pytest.mark.parametrize("device", ["0x0027", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"])
def test_counts_tpu_chips_of_every_generation(pci: Path, device: str) -> None:
    add_tpus(pci, 4, device)
    assert TpuPlugin(pci_devices=str(pci)).physical_chip_count() == 4


def test_other_google_devices_are_not_chips(pci: Path) -> None:
    assert TpuPlugin(pci_devices=str(pci)).physical_chip_count() == 0


def test_no_sysfs_means_no_chip(tmp_path: Path) -> None:
    assert TpuPlugin(pci_devices=str(tmp_path / "absent")).physical_chip_count() == 0


def test_uppercase_ids_count(pci: Path) -> None:
    add_pci(pci, "0000:20:00.0", "0x1AE0", "0x005E")
    assert TpuPlugin(pci_devices=str(pci)).physical_chip_count() == 1


def test_chip_count_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_NUM_DEVICES", "8")
    assert TpuPlugin(pci_devices=str(tmp_path)).physical_chip_count() == 8


@pytest.mark.parametrize("value", ["eight", "-2"])
def test_bad_chip_count_override(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TPU_NUM_DEVICES", value)
    with pytest.raises(ValueError, match=r"TPU_NUM_DEVICES=.*whole number of TPU chips"):
        TpuPlugin().physical_chip_count()


@pytest.mark.parametrize(("visible", "expected"), [("0,1", 2), ("3", 1), ("5", 0), ("0,0", 1), ("", 4)])
def test_visible_chips(pci: Path, monkeypatch: pytest.MonkeyPatch, visible: str, expected: int) -> None:
    add_tpus(pci, 4)
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", visible)
    assert TpuPlugin(pci_devices=str(pci)).physical_chip_count() == expected


def test_bad_visible_chips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0,one")
    with pytest.raises(ValueError, match=r"TPU_VISIBLE_CHIPS='0,one': 'one' is not a chip index \(the list is comma-separated"):
        TpuPlugin().physical_chip_count()


# -- the library ------------------------------------------------------------------


def test_library_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libtpu.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(lib))
    assert TpuPlugin().library_path() == str(lib)


def test_library_override_that_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "nope.so"))
    with pytest.raises(FileNotFoundError, match=r"TPU_LIBRARY_PATH=.*nope\.so.* is not a file"):
        TpuPlugin().library_path()


def test_missing_libtpu_names_the_package_to_install() -> None:
    """In an interpreter that sees no site-packages (so no libtpu),
    library_path() says what to pip install."""
    code = (
        "from pjrt_host_tpu import TpuPlugin\n"
        "try:\n    TpuPlugin().library_path()\n"
        "except FileNotFoundError as err:\n    print(err)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins" / "tpu")])}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "libtpu is not installed" in proc.stdout
    assert "pip install 'pjrt-host-tpu[libtpu]'" in proc.stdout
    assert "TPU_LIBRARY_PATH" in proc.stdout


# -- one process per chip -------------------------------------------------------------


@pytest.mark.parametrize(("topology", "rank", "world", "expected"), [
    pytest.param(v4_8(), 0, 4, {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "0",
        "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
        "TPU_VISIBLE_CHIPS": "0", "TPU_PROCESS_PORT": "8476", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }, id="v4-8 rank 0"),
    pytest.param(v4_8(), 3, 4, {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "3",
        "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
        "TPU_VISIBLE_CHIPS": "3", "TPU_PROCESS_PORT": "8479", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }, id="v4-8 rank 3"),
    pytest.param(TpuTopology("v4-16", (1, 1, 2), (2, 2, 1), 1, ("10.130.0.31", "10.130.0.30")), 0, 4, {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,2,2", "CLOUD_TPU_TASK_ID": "4",
        "TPU_PROCESS_ADDRESSES": ",".join(f"{ip}:{port}" for ip in ("10.130.0.31", "10.130.0.30")
                                          for port in range(8476, 8480)),
        "TPU_VISIBLE_CHIPS": "0", "TPU_PROCESS_PORT": "8476", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }, id="v4-16 worker 1"),
    pytest.param(TpuTopology("v3-8", None, None, 0, ("localhost",)), 2, 4, {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "2",
        "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
        "TPU_VISIBLE_CHIPS": "2", "TPU_PROCESS_PORT": "8478", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }, id="v3-8 from the accelerator type"),
    pytest.param(TpuTopology("v3-32", None, None, 3, ("a", "b", "c", "d")), 1, 4, {
        "TPU_PROCESS_BOUNDS": "4,4,1", "CLOUD_TPU_TASK_ID": "13", "TPU_PROCESS_PORT": "8477",
    }, id="v3-32 worker 3"),
    pytest.param(TpuTopology("v5litepod-4", (2, 2, 1), (1, 1, 1), 0, ("localhost",)), 1, 4, {
        "TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "1", "TPU_VISIBLE_CHIPS": "1",
    }, id="bounds already one chip per process"),
])
def test_multiprocess_environment(topology: TpuTopology, rank: int, world: int, expected: dict[str, str]) -> None:
    values = _topology.multiprocess_environment(topology, rank, world, base_port=8476)
    assert set(values) == set(_topology.TOPOLOGY_VARIABLES)
    assert {k: values[k] for k in expected} == expected


def test_base_port() -> None:
    values = _topology.multiprocess_environment(v4_8(), 1, 4, base_port=9000)
    assert values["TPU_PROCESS_PORT"] == "9001"
    assert values["TPU_PROCESS_ADDRESSES"].split(",")[0] == "localhost:9000"


def test_processes_must_be_one_per_chip() -> None:
    with pytest.raises(ValueError, match=r"2 processes share this host .* 4 chips \(2,2,1\): run 4 processes"):
        _topology.multiprocess_environment(v4_8(), 0, 2, base_port=8476)


def test_unknown_bounds_say_what_to_set() -> None:
    with pytest.raises(ValueError, match="bounds of TPU v9-64 are unknown: set TPU_HOST_BOUNDS"):
        _topology.multiprocess_environment(TpuTopology("v9-64", None, None, 0, ()), 0, 4, base_port=8476)


def test_configure_multiprocess_sets_the_environment(pci: Path) -> None:
    plugin = four_chip_plugin(pci)
    plugin.configure_multiprocess(2, 4)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "2"
    assert os.environ["TPU_PROCESS_PORT"] == "8478"
    assert os.environ["TPU_PROCESS_BOUNDS"] == "2,2,1"
    assert os.environ["CLOUD_TPU_TASK_ID"] == "2"


def test_configure_multiprocess_keeps_what_the_user_set(pci: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "4,1,1")
    monkeypatch.setenv("TPU_PROCESS_PORT", "7000")
    monkeypatch.setenv("PJRT_HOST_TPU_BASE_PORT", "9000")
    plugin = four_chip_plugin(pci)
    plugin.configure_multiprocess(1, 4)
    assert os.environ["TPU_PROCESS_BOUNDS"] == "4,1,1"
    assert os.environ["TPU_PROCESS_PORT"] == "7000"
    assert os.environ["TPU_VISIBLE_CHIPS"] == "1"
    assert os.environ["TPU_PROCESS_ADDRESSES"].startswith("localhost:9000,")


def test_fully_configured_user_needs_no_topology(pci: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = {"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1", "TPU_PROCESS_BOUNDS": "2,1,1", "CLOUD_TPU_TASK_ID": "1",
            "TPU_PROCESS_ADDRESSES": "localhost:9000,localhost:9001", "TPU_VISIBLE_CHIPS": "2,3",
            "TPU_PROCESS_PORT": "9001", "ALLOW_MULTIPLE_LIBTPU_LOAD": "0"}
    assert set(user) == set(_topology.TOPOLOGY_VARIABLES)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    add_tpus(pci, 4)

    def unreachable() -> TpuTopology:
        raise AssertionError("the topology must not be read")

    TpuPlugin(pci_devices=str(pci), topology=unreachable).configure_multiprocess(1, 2)
    assert {name: os.environ[name] for name in user} == user


def test_without_chips_nothing_is_laid_out(pci: Path) -> None:
    def unreachable() -> TpuTopology:
        raise AssertionError("the topology must not be read")

    TpuPlugin(pci_devices=str(pci), topology=unreachable).configure_multiprocess(0, 4)
    assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert "TPU_VISIBLE_CHIPS" not in os.environ


def test_single_process_owns_every_chip(pci: Path) -> None:
    before = dict(os.environ)
    four_chip_plugin(pci).configure_single_process()
    assert dict(os.environ) == before


def test_single_process_without_chips_ignores_the_lock_file(pci: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    TpuPlugin(pci_devices=str(pci)).configure_single_process()
    assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "0")
    TpuPlugin(pci_devices=str(pci)).configure_single_process()
    assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "0"


# -- topology sources -------------------------------------------------------------------


def test_topology_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-16", "TPU_HOST_BOUNDS": "1,1,2",
                        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "1",
                        "TPU_WORKER_HOSTNAMES": "host-a, host-b"}.items():
        monkeypatch.setenv(name, value)
    assert _topology.discover_topology() == TpuTopology("v4-16", (1, 1, 2), (2, 2, 1), 1, ("host-a", "host-b"))


def test_topology_from_an_empty_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "true")
    assert _topology.discover_topology() == TpuTopology(None, None, None, 0, ("localhost",))


@pytest.mark.parametrize("bounds", ["2,2", "2,0,1", "a,b,c"])
def test_bad_bounds_name_the_variable(monkeypatch: pytest.MonkeyPatch, bounds: str) -> None:
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    monkeypatch.setenv("TPU_HOST_BOUNDS", bounds)
    with pytest.raises(ValueError, match=f"TPU_HOST_BOUNDS='{bounds}' is not a TPU mesh shape"):
        _topology.discover_topology()


class Metadata(http.server.BaseHTTPRequestHandler):
    """A GCE metadata server: answers only with the Metadata-Flavor header."""

    attributes: dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        prefix = "/computeMetadata/v1/instance/attributes/"
        key = self.path[len(prefix):] if self.path.startswith(prefix) else None
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_response(403)
            self.end_headers()
            return
        if key not in self.attributes:
            self.send_response(404)
            self.end_headers()
            return
        body = self.attributes[key].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Metadata]]:
    handler = type("Handler", (Metadata,), {"attributes": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # must be bypassed
    yield handler
    server.shutdown()
    server.server_close()


_V4_16_TPU_ENV = """ACCELERATOR_TYPE: 'v4-16'
CHIPS_PER_HOST_BOUNDS: '2,2,1'
HOST_BOUNDS: '1,1,2'
TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'
TPU_PROCESS_BOUNDS: '1,1,2'
ZONE: 'us-central2-b'
WORKER_ID: '1'
"""


def test_topology_from_the_metadata_server(metadata_server: type[Metadata]) -> None:
    metadata_server.attributes.update({
        "tpu-env": _V4_16_TPU_ENV,
        "worker-network-endpoints": "t1v-n-0f-w-0:12345:10.130.0.26,t1v-n-0f-w-1:12346:10.130.0.27",
    })
    topology = _topology.discover_topology()
    assert topology == TpuTopology("v4-16", (1, 1, 2), (2, 2, 1), 1, ("10.130.0.26", "10.130.0.27"))
    values = _topology.multiprocess_environment(topology, 3, 4, base_port=8476)
    assert values["TPU_PROCESS_BOUNDS"] == "2,2,2"
    assert values["CLOUD_TPU_TASK_ID"] == "7"


def test_metadata_with_hostnames_only(metadata_server: type[Metadata]) -> None:
    metadata_server.attributes.update({"tpu-env": "ACCELERATOR_TYPE: 'v3-8'\nWORKER_ID: '0'\n",
                                       "worker-network-endpoints": "w-0"})
    assert _topology.discover_topology() == TpuTopology("v3-8", None, None, 0, ("w-0",))


def test_unreachable_metadata_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: connection refused
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{port}")
    monkeypatch.setenv("PJRT_HOST_TPU_METADATA_TIMEOUT", "2")
    with pytest.raises(RuntimeError, match=r"metadata server at 127\.0\.0\.1:\d+ .*set TPU_SKIP_MDS_QUERY=1"):
        _topology.discover_topology()


def test_metadata_without_tpu_env_is_an_error(metadata_server: type[Metadata]) -> None:
    with pytest.raises(RuntimeError, match="HTTP Error 404"):
        _topology.discover_topology()


@pytest.mark.parametrize(("text", "expected"), [
    ("w-0:1:10.0.0.1,w-1:2:10.0.0.2", ("10.0.0.1", "10.0.0.2")),
    ("host-a,host-b,", ("host-a", "host-b")),
    ("", ()),
])
def test_worker_endpoints(text: str, expected: tuple[str, ...]) -> None:
    assert _topology.parse_worker_endpoints(text) == expected


def test_bad_worker_endpoint() -> None:
    with pytest.raises(ValueError, match="unexpected worker-network-endpoints entry 'a:b'"):
        _topology.parse_worker_endpoints("a:b")


# -- host index ---------------------------------------------------------------------------


def test_host_index_from_the_worker_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_WORKER_ID", "3")
    assert TpuPlugin().host_index() == 3


def test_host_index_from_the_topology(pci: Path) -> None:
    plugin = four_chip_plugin(pci, TpuTopology("v4-32", (1, 2, 2), (2, 2, 1), 2, ("a", "b", "c", "d")))
    assert plugin.host_index() == 2


def test_no_host_index_without_chips(pci: Path) -> None:
    def unreachable() -> TpuTopology:
        raise AssertionError("no TPU here: nothing to ask")

    assert TpuPlugin(pci_devices=str(pci), topology=unreachable).host_index() is None


def test_no_host_index_when_the_topology_is_unknown(pci: Path) -> None:
    add_tpus(pci, 4)

    def failing() -> TpuTopology:
        raise RuntimeError("no metadata server")

    assert TpuPlugin(pci_devices=str(pci), topology=failing).host_index() is None


def test_no_host_index_when_told_not_to_ask(pci: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert four_chip_plugin(pci).host_index() is None


# -- options and declarations ---------------------------------------------------------------


def test_create_options() -> None:
    from importlib import metadata

    assert TpuPlugin().client_create_options() == {
        "max_inflight_computations": 32,
        "ml_framework_name": "PyTorch/pjrt_host",
        "ml_framework_version": metadata.version("pjrt-host"),
    }


def test_max_inflight_computations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", "4")
    assert TpuPlugin().client_create_options()["max_inflight_computations"] == 4
    monkeypatch.setenv("XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", "0")
    with pytest.raises(ValueError, match="XLA_TPU_MAX_INFLIGHT_COMPUTATIONS='0' must be at least 1"):
        TpuPlugin().client_create_options()


def test_float64_is_mapped_and_gathers_are_dense() -> None:
    assert TpuPlugin.unsupported_dtypes == {"float64": "float32"}
    assert TpuPlugin.dense_gather_factor == 8192
    assert TpuPlugin.zero_copy_torch_devices == ()


def test_dense_gather_factor_override() -> None:
    code = "from pjrt_host_tpu import TpuPlugin; print(TpuPlugin.dense_gather_factor)"
    env = {**os.environ, "XLA_DENSE_GATHER_FACTOR": "16"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert proc.stdout.strip() == "16"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("PJRT_HOST_TPU_BASE_PORT", "70000", r"must be from 1 to 65535 \(a TCP port number\)"),
    ("PJRT_HOST_TPU_METADATA_TIMEOUT", "-1", "must be more than 0"),
    ("XLA_DENSE_GATHER_FACTOR", "-1", "must be at least 0 .*0 turns dense gathers off"),
    ("TPU_WORKER_ID", "w1", "not a whole number"),
])
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    function = {"PJRT_HOST_TPU_BASE_PORT": _env.base_port, "PJRT_HOST_TPU_METADATA_TIMEOUT": _env.metadata_timeout,
                "XLA_DENSE_GATHER_FACTOR": _env.dense_gather_factor, "TPU_WORKER_ID": _env.worker_id}[name]
    with pytest.raises(ValueError, match=f"{name}='{value}' .*{message}"):
        function()


def test_distribution_declares_the_entry_point_and_extra() -> None:
    project = pyproject()
    assert project["name"] == "pjrt-host-tpu"
    assert project["entry-points"]["torch_xla.plugins"] == {"tpu": "pjrt_host_tpu:TpuPlugin"}


def test_libtpu_extra_is_the_one_jax_pins() -> None:
    """jax refuses a libtpu it was not built with: the extra must match
    what the installed jax's own 'tpu' extra asks for."""
    from importlib import metadata

    jax_pins = [r.split(";")[0].replace(" ", "") for r in metadata.requires("jax") or []
                if r.replace(" ", "").startswith("libtpu") and 'extra=="tpu"' in r.replace(" ", "")]
    project = pyproject()
    assert jax_pins and project["optional-dependencies"]["libtpu"] == jax_pins


def test_env_functions_document_their_default() -> None:
    for name in _env.__all__:
        assert "Default" in (getattr(_env, name).__doc__ or ""), name
