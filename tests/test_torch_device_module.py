"""torch.jax as torch.cuda: the device module, synchronize, torch.accelerator."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- device module


def test_device_module_like_cuda():
    assert torch.jax.is_available()
    assert torch.jax.device_count() >= 1
    assert torch.jax.current_device() == 0
    torch.jax.set_device(0)
    torch.jax.synchronize()
    assert torch.get_device_module(DEV) is torch.jax
    with pytest.raises(RuntimeError, match="Invalid device"):
        torch.jax.set_device(torch.jax.device_count())
    assert len(pjrt_host.devices()) == torch.jax.device_count()


def test_synchronize_waits_for_work_whose_result_was_dropped():
    # A timing loop discards its outputs: synchronize must still wait for
    # them, as torch.cuda.synchronize does.  The device runs its queue in
    # order, so once synchronize returns every array queued before the
    # dropped result is ready.
    x = torch.ones(1024, 1024, device=DEV)
    torch.jax.synchronize()
    y = x @ x
    (y @ y) @ y  # queued after y; its result is dropped at once
    torch.jax.synchronize()
    assert pjrt_host.spmd.jax_array(y).is_ready(), "synchronize returned with queued work still running"


def test_accelerator_reports_device():
    assert torch.accelerator.current_accelerator().type == DEV
    assert torch.accelerator.current_stream() is not None
