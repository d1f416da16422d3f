"""Real jaxlib clients for the selected plugin, and the errors when there is none."""

from __future__ import annotations

import textwrap

import pytest

from conftest import run_python


def run(code: str, **kwargs):
    proc = run_python(["-c", textwrap.dedent(code)], **kwargs)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cpu_ref_runs_a_jitted_matmul_with_correct_numbers():
    out = run("""
        import numpy as np, jax, jax.numpy as jnp, pjrt_host
        (dev,) = pjrt_host.devices()
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        x = jax.device_put(a, dev)
        y = jax.jit(lambda m: m @ m.T)(x)
        assert list(y.devices()) == [dev]
        np.testing.assert_allclose(np.asarray(y), a @ a.T)
        print(pjrt_host.selected().name, pjrt_host.backend_name(), dev.platform)
    """)
    assert out.split() == ["cpu_ref", "cpu", "cpu"]


def test_plugin_configuration_reaches_the_client():
    out = run("""
        import pjrt_host
        print(len(pjrt_host.devices()))
    """, env={"PJRT_HOST_CPU_REF_DEVICES": "4"})
    assert out.strip() == "4"


def test_hooks_run_around_client_creation():
    out = run("""
        import pjrt_host

        class Watch:
            @pjrt_host.hookimpl
            def pjrt_host_before_client_create(self, name, plugin, options):
                print("before", name, type(plugin).__name__, options)

            @pjrt_host.hookimpl
            def pjrt_host_client_created(self, name, plugin, devices):
                print("created", name, len(devices))

        pjrt_host.plugin_manager().register(Watch())
        pjrt_host.devices()
    """)
    assert out.splitlines() == ["before cpu_ref CpuRefPlugin {}", "created cpu_ref 1"]


def test_device_plugin_can_hook_in_itself(site):
    site.add_plugin("hooked-pjrt", "hooked", """
        from pjrt_host import hookimpl as _h
        @_h
        def pjrt_host_client_created(self, name, plugin, devices):
            print("hooked saw", name, plugin is self)
    """)
    out = run("import pjrt_host; pjrt_host.devices()", site=site, env={"PJRT_DEVICE": "hooked"})
    assert "hooked saw hooked True" in out


@pytest.mark.parametrize("lib, cause", [
    ("null_api", "GetPjrtApi() returned NULL"),
    # jaxlib would call PJRT_Plugin_Initialize through the NULL pointer and
    # kill the process with SIGSEGV.
    ("null_functions", "has NULL where the first 11 functions"),
])
def test_a_library_without_a_usable_api_gives_a_clear_error(site, libs, lib, cause):
    site.add_plugin("nullapi-pjrt", "nullapi", f"def library_path(self):\n    return {libs[lib]!r}")
    out = run("""
        import pjrt_host
        try:
            pjrt_host.devices()
        except pjrt_host.ClientCreationError as err:
            print(err.plugin, err.distribution)
            print(err)
    """, site=site, env={"PJRT_DEVICE": "nullapi"})
    first, message = out.splitlines()[:2]
    assert first == "nullapi nullapi-pjrt"
    assert message.startswith("pjrt_host: plugin 'nullapi' (from nullapi-pjrt 1.0, library ")
    assert cause in message and "choose another plugin with PJRT_DEVICE=NAME" in message
    assert "reinstall nullapi-pjrt" in message


def test_absent_device_says_no_device_was_found(site):
    # A backend whose client cannot be created, on a machine with 0 chips.
    site.add_plugin("absent-pjrt", "absent", """
        display_name = "Acme accelerator"
        jaxlib_backend = "acme_backend_that_jaxlib_lacks"
        def physical_chip_count(self):
            return 0
    """)
    out = run("""
        import pjrt_host
        try:
            pjrt_host.devices()
        except pjrt_host.ClientCreationError as err:
            print(err)
    """, site=site, env={"PJRT_DEVICE": "absent"})
    assert "no Acme accelerator device was found on this machine" in out
    assert "check that it is visible to this process" in out


def test_configure_raising_names_the_plugin(site):
    site.add_plugin("cfg-pjrt", "cfg", """
        def configure_single_process(self):
            raise OSError("TPU_VISIBLE_CHIPS is malformed")
    """)
    out = run("""
        import pjrt_host
        try:
            pjrt_host.devices()
        except pjrt_host.ClientCreationError as err:
            print(err)
            print(repr(err.__cause__))
    """, site=site, env={"PJRT_DEVICE": "cfg"})
    assert "plugin 'cfg' (from cfg-pjrt 1.0): configure_single_process() raised on rank 0 of 1" in out
    assert "OSError: TPU_VISIBLE_CHIPS is malformed" in out


def test_a_failed_client_is_not_retried_silently(site, libs):
    site.add_plugin("nullapi-pjrt", "nullapi", f"def library_path(self):\n    return {libs['null_api']!r}")
    out = run("""
        import pjrt_host
        errors = []
        for _ in range(2):
            try:
                pjrt_host.devices()
            except pjrt_host.ClientCreationError as err:
                errors.append(err)
        print(len(errors), errors[0] is errors[1])
    """, site=site, env={"PJRT_DEVICE": "nullapi"})
    assert out.strip() == "2 True"


def test_jax_used_before_the_client_still_works():
    out = run("""
        import jax.numpy as jnp, pjrt_host
        print(float(jnp.ones(3).sum()))        # jax's backends start here
        print(len(pjrt_host.devices()), pjrt_host.selected().name)
    """)
    assert out.split() == ["3.0", "1", "cpu_ref"]


def test_device_count_that_can_no_longer_take_effect_is_explained():
    proc = run_python(["-c", "import jax.numpy as jnp, pjrt_host\njnp.ones(1).block_until_ready()\npjrt_host.devices()"],
                      env={"PJRT_HOST_CPU_REF_DEVICES": "2"})
    assert proc.returncode != 0
    assert "jax's CPU backend already exists with 1 device(s), so PJRT_HOST_CPU_REF_DEVICES=2 cannot take effect" in proc.stderr


_DUMPED_PROGRAMS = """
    import os, sys
    import pjrt_host_cpu_ref
    pjrt_host_cpu_ref.CpuRefPlugin.compile_options = {"xla_dump_to": sys.argv[1]}
    import torch, pjrt_host
    a = torch.arange(6., device="jax").reshape(2, 3)
    with pjrt_host.config(eager="op"):
        (a * 3).cpu()
    with pjrt_host.config(eager="fused"):
        (a + 1).exp().sum(0).cpu()
    torch.compile(lambda x: (x.sin() * 2).sum(), backend="jax")(a).cpu()
    print(sorted({n.split(".")[1] for n in os.listdir(sys.argv[2]) if n.startswith("module_")}))
"""


def test_a_plugins_compile_options_reach_every_program_it_compiles(tmp_path):
    """``xla_dump_to`` as a plugin's compile option: XLA writes each program
    it compiles there, so the directory lists the programs the option
    reached -- an eager op's, a fused segment's and a torch.compile
    graph's (a fresh program cache: nothing loads from disk)."""
    dump = tmp_path / "dump"
    proc = run_python(["-c", textwrap.dedent(_DUMPED_PROGRAMS), str(dump), str(dump)],
                      env={"PJRT_HOST_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    names = set(eval(proc.stdout.strip().splitlines()[-1]))
    assert {"jit_aten", "jit_segment", "jit_fn"} <= names, names


def test_the_users_xla_flags_win_over_the_plugins_compile_options(tmp_path):
    theirs, plugins = tmp_path / "theirs", tmp_path / "plugins"
    proc = run_python(["-c", textwrap.dedent(_DUMPED_PROGRAMS), str(plugins), str(theirs)],
                      env={"PJRT_HOST_CACHE_DIR": str(tmp_path / "cache"), "XLA_FLAGS": f"--xla_dump_to={theirs}"})
    assert proc.returncode == 0, proc.stderr
    assert {"jit_aten", "jit_segment", "jit_fn"} <= set(eval(proc.stdout.strip().splitlines()[-1]))
    assert not plugins.exists()


def test_a_program_with_compile_options_runs_inside_another_trace_too(tmp_path):
    """jax refuses compile options on a jit that another trace calls; the
    host's programs with a plugin's options run both ways (nested, the
    outer program carries the options).  This also pins jax's refusal
    message, which the host reads."""
    out = run(f"""
        import pjrt_host_cpu_ref
        pjrt_host_cpu_ref.CpuRefPlugin.compile_options = {{"xla_dump_to": {str(tmp_path)!r}}}
        import jax, jax.numpy as jnp, pjrt_host
        from pjrt_host import _program_cache
        pjrt_host.devices()
        double = _program_cache.jit(lambda x: x * 2)
        x = jnp.arange(3.0)
        print(double(x).tolist(), jax.jit(lambda x: double(x) + 1)(x).tolist(),
              jax.grad(lambda x: double(x).sum())(x).tolist(), double.lower(x).compile()(x).tolist())
        try:
            jax.jit(lambda x: jax.jit(lambda y: y, compiler_options={{"xla_dump_to": "x"}})(x))(x)
        except ValueError as err:
            print(_program_cache._NESTED in str(err))
    """)
    assert out.splitlines()[-2:] == ["[0.0, 2.0, 4.0] [1.0, 3.0, 5.0] [2.0, 2.0, 2.0] [0.0, 2.0, 4.0]", "True"], out


def test_compile_options_the_compiler_refuses_fail_at_the_client_naming_the_plugin():
    out = run("""
        import pjrt_host, pjrt_host_cpu_ref
        pjrt_host_cpu_ref.CpuRefPlugin.compile_options = {"xla_no_such_option": 1}
        try:
            pjrt_host.devices()
        except pjrt_host.ClientCreationError as err:
            print(err)
    """)
    assert "plugin 'cpu_ref'" in out
    assert "its compile_options {'xla_no_such_option': 1} are refused by the compiler" in out
    assert "No such compile option: 'xla_no_such_option'" in out
