"""Several devices of one plugin, and what a plugin's options change: a second
device in its own process, ops that only overwrite a tensor keep it on its
device, a plugin's dtype substitutions and a bad lowering option."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)


def cpu(t):
    return t.detach().cpu()


def test_second_device_in_subprocess():
    code = textwrap.dedent("""
        import torch
        assert torch.jax.device_count() == 2, torch.jax.device_count()
        a = torch.ones(3).to('jax:1')
        assert str(a.device) == 'jax:1'
        b = (a * 2).to('jax:0')
        assert str(b.device) == 'jax:0' and b.cpu().tolist() == [2.0, 2.0, 2.0]
        try:
            a + b
        except RuntimeError as e:
            assert 'jax:1 and jax:0' in str(e), e
        else:
            raise AssertionError('no error')
        with torch.jax.device(1):
            assert torch.zeros(1, device='jax').device.index == 1
        print('ok')
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    env["PJRT_HOST_CPU_REF_DEVICES"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_ops_that_only_overwrite_a_tensor_keep_it_on_its_device(eager):
    """An op whose program reads nothing of the tensor it writes (a random
    fill, fill_, zero_, nn.init) was placed by its other inputs, host
    values, on jax's default device: a layer made on jax:1 held its
    weights on device 0 while reporting jax:1.  So was a fused segment
    of factories alone (it reads no array): uncommitted, on device 0."""
    code = textwrap.dedent("""
        import jax, torch
        layer = torch.nn.Linear(4, 3, device='jax:1')
        one = jax.devices()[1]  # the client exists now, with its two devices
        made = [layer.weight, layer.bias, torch.empty(5, device='jax:1').uniform_(-1, 1),
                torch.empty(5, device='jax:1').normal_(), torch.empty(5, device='jax:1').fill_(2.0),
                torch.ones(5, device='jax:1').zero_(), torch.empty(5, device='jax:1').bernoulli_(0.5),
                torch.rand(5, device='jax:1'), layer(torch.ones(2, 4, device='jax:1'))]
        torch.nn.init.trunc_normal_(made[2])
        for make in (lambda: torch.ones(3, device='jax:1'), lambda: torch.arange(4, device='jax:1'),
                     lambda: torch.full((2,), 7.0, device='jax:1')):
            made.append(make())
            torch.jax.synchronize()  # (fused: a segment of the factory alone, which reads no array)
        for t in made:
            assert t.device == torch.device('jax:1'), t.device
            array = t._storage.array
            assert array.devices() == {one} and array.committed, (t.shape, array.devices(), array.committed)
        print('ok')
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_") or k == "PJRT_HOST_CACHE_DIR"}
    env.update(PJRT_HOST_CPU_REF_DEVICES="2", PJRT_HOST_EAGER=eager)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_plugin_dtype_mapping_warns_once_in_subprocess():
    # A plugin that cannot hold float64: such tensors become float32 on the
    # device, with one warning, and ops keep working.
    code = textwrap.dedent("""
        import warnings
        import torch
        import pjrt_host

        class NoDouble(pjrt_host.DevicePlugin):
            jaxlib_backend = "cpu"
            unsupported_dtypes = {"float64": "float32"}

        pjrt_host.register_plugin("nodouble", NoDouble)
        pjrt_host.select("nodouble")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = torch.ones(3, dtype=torch.float64, device='jax')
            b = torch.tensor([1.5], dtype=torch.float64).to('jax')
            c = a.sum() + b
        assert a.dtype == torch.float32 and b.dtype == torch.float32 and c.dtype == torch.float32, (a.dtype, c.dtype)
        assert c.cpu().tolist() == [4.5]
        mapped = [w for w in caught if "does not support torch.float64" in str(w.message)]
        assert len(mapped) == 1, [str(w.message) for w in caught]
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_plugin_with_a_bad_lowering_option_is_refused_by_name():
    """A plugin whose conv_as_matmul_max_positions is not an int is refused
    at its first op with an error naming the plugin, the member and the
    value (it once failed with Python's bare ValueError from int())."""
    code = textwrap.dedent("""
        import torch
        import pjrt_host

        class Loose(pjrt_host.DevicePlugin):
            jaxlib_backend = "cpu"
            conv_as_matmul_max_positions = "64"

        pjrt_host.register_plugin("loose", Loose)
        pjrt_host.select("loose")
        try:
            torch.ones(3, device='jax') + 1
        except pjrt_host.PluginLoadError as err:
            print("refused:", err)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused:" in out.stdout and "'loose'" in out.stdout, out.stdout
    assert "conv_as_matmul_max_positions is '64', expected an int >= 0" in out.stdout, out.stdout
