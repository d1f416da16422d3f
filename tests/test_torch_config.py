"""pjrt_host.config on the device: the settings stack, autocast (the CPU fallback
opt-in is in test_torch_errors, beside the missing-lowering error)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- configuration


def test_config_stack():
    from pjrt_host._torch import _config

    assert _config.current().matmul_precision == "highest"
    with pjrt_host.config(matmul_precision="default") as c:
        assert c.matmul_precision == "default"
        with pjrt_host.config(cpu_fallback=True):
            assert _config.current().matmul_precision == "default"
            assert _config.current().cpu_fallback
        assert not _config.current().cpu_fallback
        y = torch.ones(4, 4, device=DEV) @ torch.ones(4, 4, device=DEV)
        assert cpu(y)[0, 0] == 4
    assert _config.current().matmul_precision == "highest"
    with pytest.raises(ValueError, match="unknown setting"):
        with pjrt_host.config(nonsense=1):
            pass
    with pytest.raises(ValueError, match="highest"):
        with pjrt_host.config(matmul_precision="fast"):
            pass


def test_autocast():
    x = torch.randn(4, 4, device=DEV)
    lin = torch.nn.Linear(4, 4).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        y = lin(x)
        z = x + 1  # not in the lower-precision list: unchanged
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float32
    torch.testing.assert_close(y.float().cpu(), lin.cpu()(x.cpu()), rtol=2e-2, atol=2e-2)
