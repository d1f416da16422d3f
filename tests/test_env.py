"""pjrt_host.env: the settings parsers the host and device plugins read
their environment variables with.  Every bad value raises
EnvironmentSettingError naming the variable, the value and what is accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pjrt_host
from pjrt_host import EnvironmentSettingError, env

NAME = "PJRT_HOST_TEST_SETTING"


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)


def test_the_error_is_public_and_a_value_error() -> None:
    assert pjrt_host.EnvironmentSettingError is env.EnvironmentSettingError
    assert issubclass(EnvironmentSettingError, ValueError)
    assert issubclass(EnvironmentSettingError, pjrt_host.PjrtHostError)
    assert "env" in pjrt_host.__all__ and "EnvironmentSettingError" in pjrt_host.__all__
    assert env.__all__ == sorted(env.__all__)
    for name in env.__all__:
        assert getattr(env, name).__doc__, f"pjrt_host.env.{name} has no docstring"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_blank_is_the_default(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is not None:
        monkeypatch.setenv(NAME, value)
    assert env.text(NAME) is None and env.text(NAME, "d") == "d"
    assert env.flag(NAME, True) is True and env.flag(NAME, None) is None
    assert env.integer(NAME) is None and env.integer(NAME, 7, minimum=100) == 7
    assert env.number(NAME, 0.5) == 0.5 and env.seconds(NAME, 3.0) == 3.0
    assert env.choice(NAME, ("a", "b"), "a") == "a"
    assert env.items(NAME) is None and env.integers(NAME) is None


def test_values_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, "  42 ")
    assert env.text(NAME) == "42" and env.integer(NAME, minimum=0, maximum=42) == 42
    assert env.number(NAME) == 42.0 and env.seconds(NAME, 1.0) == 42.0
    for spelling, expected in [("1", True), ("TRUE", True), ("yes", True), ("On", True),
                               ("0", False), ("false", False), ("NO", False), ("off", False)]:
        monkeypatch.setenv(NAME, spelling)
        assert env.flag(NAME, not expected) is expected, spelling
    monkeypatch.setenv(NAME, "BFC")
    assert env.choice(NAME, ("default", "bfc")) == "bfc"  # spelled as the choices spell it
    monkeypatch.setenv(NAME, " a, ,b ,")
    assert env.items(NAME) == ["a", "b"]
    monkeypatch.setenv(NAME, "3, 1,")
    assert env.integers(NAME, minimum=0) == [3, 1]


def test_another_mapping_is_read_instead_of_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, "from-the-process")
    mapping = {NAME: "8"}
    assert env.text(NAME, environ=mapping) == "8" and env.integer(NAME, environ=mapping) == 8
    assert env.text(NAME, environ={}) is None


@pytest.mark.parametrize(("call", "value", "message"), [
    (lambda: env.flag(NAME, False), "maybe",
     f"{NAME}='maybe' is not a boolean; expected 1/0, true/false, yes/no or on/off"),
    (lambda: env.integer(NAME), "three", f"{NAME}='three' is not a whole number"),
    (lambda: env.integer(NAME), "1.5", f"{NAME}='1.5' is not a whole number"),
    (lambda: env.integer(NAME, minimum=0, expected="a whole number of chips"), "x",
     f"{NAME}='x' is not a whole number of chips (at least 0)"),
    (lambda: env.integer(NAME, minimum=0, expected="a whole number of chips"), "-1",
     f"{NAME}='-1' must be at least 0 (a whole number of chips)"),
    (lambda: env.integer(NAME, minimum=1, maximum=65535, expected="a TCP port number"), "70000",
     f"{NAME}='70000' must be from 1 to 65535 (a TCP port number)"),
    (lambda: env.integer(NAME, maximum=9), "10", f"{NAME}='10' must be at most 9 (a whole number)"),
    (lambda: env.number(NAME, above=0, maximum=1, expected="a fraction"), "half",
     f"{NAME}='half' is not a fraction (more than 0 and at most 1)"),
    (lambda: env.number(NAME, above=0, maximum=1, expected="a fraction"), "0",
     f"{NAME}='0' must be more than 0 and at most 1 (a fraction)"),
    (lambda: env.number(NAME), "nan", f"{NAME}='nan' is not a number"),
    (lambda: env.number(NAME, minimum=0.5), "0.25", f"{NAME}='0.25' must be at least 0.5 (a number)"),
    (lambda: env.seconds(NAME, 1.0), "soon", f"{NAME}='soon' is not a number of seconds (more than 0)"),
    (lambda: env.seconds(NAME, 1.0), "-2", f"{NAME}='-2' must be more than 0 (a number of seconds)"),
    (lambda: env.choice(NAME, ("op", "fused"), expected="an eager mode"), "lazy",
     f"{NAME}='lazy' is not an eager mode; expected one of op, fused"),
    (lambda: env.choice(NAME, ("op", "fused")), "lazy", f"{NAME}='lazy': expected one of op, fused"),
    (lambda: env.integers(NAME, expected="a chip index"), "0,one,2", f"{NAME}='0,one,2': 'one' is not a chip index"),
    (lambda: env.integers(NAME, minimum=0, expected="a chip index"), "0,-1",
     f"{NAME}='0,-1': '-1' must be at least 0 (a chip index)"),
])
def test_a_bad_value_names_the_variable_the_value_and_what_is_accepted(
        monkeypatch: pytest.MonkeyPatch, call, value: str, message: str) -> None:
    monkeypatch.setenv(NAME, value)
    with pytest.raises(EnvironmentSettingError) as caught:
        call()
    assert str(caught.value) == message


def test_the_plugins_here_read_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three plugins' settings raise the host's error, not copies of it."""
    from pjrt_host_cpu_ref import _device_count
    from pjrt_host_gpu import _env as gpu_env
    from pjrt_host_tpu import _env as tpu_env

    for read, name in [(_device_count, "PJRT_HOST_CPU_REF_DEVICES"),
                       (gpu_env.device_count_override, "GPU_NUM_DEVICES"),
                       (tpu_env.chip_count_override, "TPU_NUM_DEVICES")]:
        monkeypatch.setenv(name, "many")
        with pytest.raises(EnvironmentSettingError, match=f"{name}='many' is not a whole number"):
            read()
        monkeypatch.delenv(name)
    for module in (gpu_env, tpu_env):
        assert not any(hasattr(module, copy) for copy in ("_get", "_int", "_bool")), module.__name__


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_plugin_setting_reaches_the_user_not_no_usable_plugin(value: str) -> None:
    """A plugin whose device count reads a bad setting is not "no usable
    plugin" (the choice among plugins swallowed it): the user sees the
    setting's own error at the first device use."""
    from conftest import run_python

    proc = run_python(["-c", "import torch; torch.ones(2, device='jax')"],
                      env={"PJRT_HOST_CPU_REF_DEVICES": value})
    assert proc.returncode != 0
    assert f"EnvironmentSettingError: PJRT_HOST_CPU_REF_DEVICES={value!r}" in proc.stderr
    assert "no usable device plugin" not in proc.stderr


def test_importing_it_imports_neither_torch_nor_jax() -> None:
    code = "import sys, pjrt_host.env; print(sorted(m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("name", "read", "bad"), [
    ("PJRT_HOST_DONATE", lambda: pjrt_host._env.donate_buffers(), "maybe"),
    ("PJRT_HOST_CHECK_TIMEOUT", lambda: pjrt_host._env.check_timeout(60.0), "soon"),
])
def test_the_cores_own_settings_refuse_a_typo(monkeypatch: pytest.MonkeyPatch, name: str, read, bad: str) -> None:
    """Every core setting is read in _env: a typo is an error naming it, not
    silently the default (PJRT_HOST_DONATE=false used to mean on)."""
    import pjrt_host._env

    monkeypatch.setenv(name, bad)
    with pytest.raises(EnvironmentSettingError, match=name):
        read()
    monkeypatch.setenv(name, "0" if name == "PJRT_HOST_DONATE" else "15")
    assert read() in (False, 15.0)
