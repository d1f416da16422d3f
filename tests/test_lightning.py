"""Lightning's Trainer and Fabric on the 'jax' device (pjrt_host.lightning,
docs/integrations.md): ``accelerator='jax'`` registered by ``import
lightning`` alone, one device with ``bf16-mixed`` / ``16-mixed`` training as
on the CPU, several devices as one process each over the ``pjrt``
torch.distributed backend.  A tiny MLP, a few SGD steps, CPU as the control.

Skipped where Lightning is not installed (``pip install pjrt-host[lightning]``).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_python

pytest.importorskip("torch")
pytest.importorskip("lightning")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import lightning as L  # noqa: E402
import pjrt_host.lightning as pl_jax  # noqa: E402
from pjrt_host.lightning import _common, fabric as fabric_jax  # noqa: E402

_QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class _Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.losses: list[float] = []
        self.seen: set[str] = set()  # (parameter device, matmul output dtype) during training

    def training_step(self, batch, index):
        x, y = batch
        hidden = self.net[0](x)
        self.seen.add(f"{next(self.parameters()).device} {hidden.dtype}")
        loss = nn.functional.mse_loss(self.net[2](self.net[1](hidden)).float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(accelerator: str, precision: str | None, steps: int = 4, plugins=None) -> tuple[_Module, L.Trainer]:
    module = _Module()
    trainer = L.Trainer(accelerator=accelerator, devices=1, precision=precision, plugins=plugins, max_steps=steps,
                        **_QUIET)
    trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data()), batch_size=8))
    return module, trainer


def test_trainer_bf16_mixed_trains_on_the_device_as_on_the_cpu():
    """``Trainer(accelerator='jax', devices=1, precision='bf16-mixed')``:
    parameters on 'jax:0', matmuls in bfloat16 under autocast('jax'), and
    CPU's bf16-mixed losses and parameters."""
    on_jax, trainer = _fit("jax", "bf16-mixed")
    on_cpu, _ = _fit("cpu", "bf16-mixed")
    assert type(trainer.accelerator) is pl_jax.JaxAccelerator
    assert type(trainer.strategy) is pl_jax.SingleDeviceJaxStrategy
    assert trainer.strategy.root_device == torch.device("jax", 0)
    assert type(trainer.precision_plugin) is pl_jax.JaxMixedPrecision and trainer.precision_plugin.device == "jax"
    assert on_jax.seen == {"jax:0 torch.bfloat16"} and on_cpu.seen == {"cpu torch.bfloat16"}
    held = torch.ones(1024, device="jax:0")
    stats = trainer.accelerator.get_device_stats(held.device)  # what DeviceStatsMonitor logs: numbers only
    assert stats["allocated_bytes.all.current"] >= 4096 and all(isinstance(v, (int, float)) for v in stats.values())
    assert len(on_jax.losses) == 4 and on_jax.losses[-1] < on_jax.losses[0] * 2
    torch.testing.assert_close(on_jax.losses, on_cpu.losses, rtol=2e-2, atol=2e-2)
    for a, b in zip(on_jax.parameters(), on_cpu.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=2e-2, atol=2e-2)


def test_trainer_16_mixed_scales_the_loss_on_the_device():
    """``'16-mixed'``: float16 autocast with ``GradScaler('jax')``, which
    skips the steps whose gradients overflow and backs off as CPU's float16
    autocast with ``GradScaler('cpu')`` does (Lightning turns the CPU's
    ``'16-mixed'`` into bf16, so the control names its plugin)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    on_jax, trainer = _fit("jax", "16-mixed")
    on_cpu, control = _fit("cpu", None, plugins=[MixedPrecision("16-mixed", "cpu")])
    scaler = trainer.precision_plugin.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "jax"
    assert on_jax.seen == {"jax:0 torch.float16"} and on_cpu.seen == {"cpu torch.float16"}
    assert scaler.get_scale() == control.precision_plugin.scaler.get_scale() < 65536.0  # a step was skipped
    torch.testing.assert_close(on_jax.losses, on_cpu.losses, rtol=5e-3, atol=5e-3)
    for a, b in zip(on_jax.parameters(), on_cpu.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=5e-3, atol=5e-3)


def test_fabric_bf16_mixed_trains_on_the_device_as_on_the_cpu():
    losses = {}
    for accelerator in ("jax", "cpu"):
        fab = L.Fabric(accelerator=accelerator, devices=1, precision="bf16-mixed")
        model = _net()
        seen, losses[accelerator] = set(), []  # Fabric hands the output back in float32: look inside
        model[0].register_forward_hook(lambda m, i, out: seen.add(f"{m.weight.device} {out.dtype}"))
        model, opt = fab.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        x, y = fab.to_device(_data())
        for i in range(0, 32, 8):
            out = model(x[i:i + 8])
            loss = nn.functional.mse_loss(out.float(), y[i:i + 8])
            fab.backward(loss)
            opt.step()
            opt.zero_grad()
            losses[accelerator].append(loss.item())
        if accelerator == "jax":
            assert type(fab.strategy) is fabric_jax.SingleDeviceJaxStrategy and fab.device == torch.device("jax", 0)
            assert type(fab._precision) is fabric_jax.JaxMixedPrecision
            assert seen == {"jax:0 torch.bfloat16"}
    torch.testing.assert_close(losses["jax"], losses["cpu"], rtol=2e-2, atol=2e-2)


def test_several_devices_choose_ddp_over_the_pjrt_backend(monkeypatch):
    """``devices=2`` (cpu_ref split in two) is one process per device with
    DDP over 'pjrt'; a DDP strategy *name* keeps its parameters; a count the
    machine lacks is refused naming what it has.  (Nothing is launched.)"""
    monkeypatch.setenv("PJRT_HOST_CPU_REF_DEVICES", "2")
    trainer = L.Trainer(accelerator="jax", devices=2, **_QUIET)
    strategy = trainer.strategy
    assert type(strategy) is pl_jax.JaxDDPStrategy and strategy.process_group_backend == "pjrt"
    assert strategy.parallel_devices == [torch.device("jax", 0), torch.device("jax", 1)]
    named = L.Trainer(accelerator="jax", devices=2, strategy="ddp_find_unused_parameters_true", **_QUIET).strategy
    assert type(named) is pl_jax.JaxDDPStrategy and named._ddp_kwargs == {"find_unused_parameters": True}
    fab = L.Fabric(accelerator="jax", devices="0,1")
    assert type(fab.strategy) is fabric_jax.JaxDDPStrategy and fab.strategy.process_group_backend == "pjrt"
    from lightning.pytorch.strategies import DDPStrategy

    with pytest.raises(ValueError, match=r"strategy=DDPStrategy\(...\) runs on cuda or the CPU.*"
                                         r"pjrt_host\.lightning\.JaxDDPStrategy\(...\)"):
        L.Trainer(accelerator="jax", devices=2, strategy=DDPStrategy(), **_QUIET)
    with pytest.raises(ValueError, match=r"devices=3: this machine has 2 'jax' device\(s\).*python -m pjrt_host info"):
        L.Trainer(accelerator="jax", devices=3, **_QUIET)
    assert L.Trainer(accelerator="cpu", devices=2, **_QUIET).strategy.process_group_backend is None  # CPU: Lightning's


def test_a_process_that_already_uses_the_device_cannot_become_a_rank():
    torch.ones(1, device="jax")  # this process's client: one process alone
    with pytest.raises(RuntimeError, match=r"rank 0 of 1 .* rank 1 of 2.*"
                                           r"python -m pjrt_host launch --nproc-per-node 2"):
        _common.become_rank(1, 2, 1, 2, 0, 1, "127.0.0.1", 29500)


_AUTO = textwrap.dedent("""
    import json, logging, sys
    import torch
    cheap = "lightning" not in sys.modules  # import torch did not import it
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("pjrt_host").addHandler(handler)
    logging.getLogger("pjrt_host").setLevel(logging.INFO)

    import lightning as L  # registers accelerator='jax': nothing of pjrt_host is imported by hand
    import pjrt_host

    def chosen(**kwargs):
        t = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)
        return [type(t.accelerator).__name__, str(t.strategy.root_device)]

    seen = {"cheap": cheap, "registered": "pjrt_host.lightning" in sys.modules,
            "named": chosen(accelerator="jax", devices=1), "auto": chosen(),
            "fabric": str(L.Fabric(accelerator="jax", devices=1).device)}

    class HostCpu(pjrt_host.DevicePlugin):
        jaxlib_backend = "cpu"
        is_host_cpu = True

    pjrt_host.register_plugin("hostcpu", HostCpu)
    pjrt_host.select("hostcpu")
    seen["auto on the host's cpu"] = chosen()
    seen["log"] = [r.getMessage() for r in records if "Lightning" in r.getMessage()]
    print(json.dumps(seen))
""")


def test_import_lightning_registers_the_device_and_auto_picks_an_accelerator_plugin(site):
    """``import lightning`` alone registers 'jax' (the hook installed at
    ``import torch``, which itself imports no Lightning); ``accelerator='auto'``
    is 'jax' on a plugin that is an accelerator, with a log line, and stays
    'cpu' on one that is the host's CPU (cpu_ref)."""
    site.add_plugin("acme-pjrt", "acme", """
        display_name = "Acme accelerator (test)"
        jaxlib_backend = "cpu"
        priority = 200
    """)
    proc = run_python(["-c", _AUTO], site=site, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["cheap"] is True and seen["registered"] is True
    assert seen["named"] == ["JaxAccelerator", "jax:0"] and seen["fabric"] == "jax:0"
    assert seen["auto"] == ["JaxAccelerator", "jax:0"]
    assert seen["auto on the host's cpu"] == ["CPUAccelerator", "cpu"]
    assert len(seen["log"]) >= 1 and "accelerator='cpu' keeps the CPU" in seen["log"][0], seen["log"]


_DDP = textwrap.dedent("""
    import json, sys
    import torch
    import lightning as L
    from torch import nn

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            self.losses = []
        def training_step(self, batch, i):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.losses.append(loss.item())
            return loss
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if __name__ == "__main__":
        g = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
        m = M()
        t = L.Trainer(accelerator=sys.argv[1], devices=2, max_steps=3, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
        t.fit(m, torch.utils.data.DataLoader(data, batch_size=4))
        # one file per rank: the ranks share stdout, where their lines can interleave
        with open(f"{sys.argv[2]}.{t.global_rank}.json", "w") as f:
            json.dump({"rank": t.global_rank, "device": str(t.strategy.root_device),
                       "backend": torch.distributed.get_backend(), "losses": m.losses,
                       "params": [p.detach().cpu().flatten().tolist() for p in m.parameters()]}, f)
""")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_as_cpu_ddp(tmp_path):
    """``Trainer(accelerator='jax', devices=2)``: Lightning starts the second
    process itself (its script launcher), both join one pjrt_host job and
    DDP all-reduces over 'pjrt'; losses and parameters are CPU DDP's (gloo).
    About 90 s here, hence slow."""
    script = tmp_path / "train_ddp.py"
    script.write_text(_DDP)
    runs = {}
    for accelerator in ("jax", "cpu"):
        out = tmp_path / accelerator
        proc = run_python([str(script), accelerator, str(out)], env={"PJRT_HOST_CPU_REF_DEVICES": "2"}, timeout=400)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results = [json.loads(f.read_text()) for f in sorted(tmp_path.glob(f"{accelerator}.*.json"))]
        runs[accelerator] = {r["rank"]: r for r in results}
        assert sorted(runs[accelerator]) == [0, 1], proc.stdout[-2000:]
    for rank in (0, 1):
        jax_run, cpu_run = runs["jax"][rank], runs["cpu"][rank]
        assert jax_run["device"] == "jax:0" and jax_run["backend"] == "pjrt" and cpu_run["backend"] == "gloo"
        torch.testing.assert_close(jax_run["losses"], cpu_run["losses"], rtol=1e-5, atol=1e-6)
        for a, b in zip(jax_run["params"], cpu_run["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert runs["jax"][0]["params"] == runs["jax"][1]["params"]  # the ranks stay in step
