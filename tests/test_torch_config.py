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


def test_checks_switch_index_and_value_checks_and_keep_their_first_name():
    """``checks=`` turns the index checks *and* the value checks on, off or
    to "sync"; ``check_indices=`` (its first name) is the same setting."""
    from pjrt_host._torch import _config

    assert _config.current().checks is True and _config.current().check_mode is True
    for name in ("checks", "check_indices"):
        with pjrt_host.config(**{name: False}) as c:
            assert c.checks is False and c.check_indices is False and c.check_mode is False
            # both kinds are off: an index past the end and a bad probability go unchecked
            torch.arange(3, device=DEV)[torch.tensor([5], device=DEV)]
            torch.multinomial(torch.tensor([-1.0, 1.0], device=DEV), 1)
        with pjrt_host.config(**{name: "sync"}) as c:
            assert c.check_mode == "sync"
            with pytest.raises(IndexError):
                torch.arange(3, device=DEV)[torch.tensor([5], device=DEV)]
            with pytest.raises(RuntimeError, match="probability"):
                torch.multinomial(torch.tensor([-1.0, 1.0], device=DEV), 1)
    with pytest.raises(ValueError, match="check_indices='always' is not one of"):
        with pjrt_host.config(check_indices="always"):
            pass
    with pytest.raises(ValueError, match="under its first name"):
        with pjrt_host.config(check_indices=True, checks=False):
            pass


def test_autocast():
    x = torch.randn(4, 4, device=DEV)
    lin = torch.nn.Linear(4, 4).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        y = lin(x)
        z = x + 1  # not in the lower-precision list: unchanged
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float32
    torch.testing.assert_close(y.float().cpu(), lin.cpu()(x.cpu()), rtol=2e-2, atol=2e-2)
