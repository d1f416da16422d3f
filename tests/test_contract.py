"""The DevicePlugin contract's defaults, and the core's promise to hold no
device names."""

from __future__ import annotations

import ast
import io
import tokenize

import pytest

from conftest import REPO
from pjrt_host import DevicePlugin

DEVICE_NAMES = {"tpu", "cuda", "gpu", "rocm", "neuron", "xpu", "nvidia", "libtpu"}


def test_defaults_are_those_of_the_simplest_device():
    plugin = DevicePlugin()
    assert plugin.library_path() is None and plugin.jaxlib_backend == "cpu"
    assert plugin.physical_chip_count() == 1
    assert dict(plugin.client_create_options()) == {}
    assert plugin.requires_xla_coordinator() is False
    assert plugin.configure_single_process() is None
    assert plugin.configure_multiprocess(0, 2) is None
    assert plugin.host_index() is None
    assert plugin.dense_gather_factor == 0 and plugin.conv_as_matmul_max_positions == 0
    assert plugin.widen_16bit_matmul_operands is False
    assert dict(plugin.unsupported_dtypes) == {} and plugin.zero_copy_torch_devices == ()
    assert plugin.is_host_cpu is False
    assert plugin.priority == 100 and plugin.describe() == "DevicePlugin"


def test_every_public_member_is_documented():
    for name, member in vars(DevicePlugin).items():
        if name.startswith("_") or name == "describe":
            continue
        if callable(member):
            assert member.__doc__, f"DevicePlugin.{name} has no docstring"
    source = (REPO / "pjrt_host" / "_plugin.py").read_text()
    for attr in ("display_name", "priority", "jaxlib_backend", "dense_gather_factor",
                 "conv_as_matmul_max_positions", "widen_16bit_matmul_operands", "unsupported_dtypes", "zero_copy_torch_devices", "is_host_cpu"):
        assert f"#: " in source.split(f"    {attr}:")[0].rsplit("\n\n", 1)[-1], f"{attr} has no doc comment"


def core_string_literals():
    for path in sorted((REPO / "pjrt_host").rglob("*.py")):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        for tok in tokens:
            if tok.type == tokenize.STRING:
                try:
                    value = ast.literal_eval(tok.string)
                except (ValueError, SyntaxError):
                    continue  # f-strings
                if isinstance(value, str):
                    yield path.relative_to(REPO), tok.start[0], value


def test_core_holds_no_device_names():
    offenders = [f"{path}:{line}: {value!r}" for path, line, value in core_string_literals()
                 if value.strip().lower() in DEVICE_NAMES]
    assert offenders == [], "device names in the core; make them plugin properties:\n" + "\n".join(offenders)


@pytest.mark.parametrize("module", ["_plugin", "_discovery", "_registry", "_runtime", "_cli", "_hookspecs", "env",
                                    "_internals"])
def test_core_modules_declare_all(module):
    import importlib

    mod = importlib.import_module(f"pjrt_host.{module}")
    assert isinstance(getattr(mod, "__all__", None), list)
