"""accelerate and transformers' Trainer on the 'jax' device (docs/integrations.md),
each run in a child process as users run them: a tiny GPT-2 from its config
(random weights) on a small in-memory dataset, three steps.

The device choice: with ``ACCELERATE_TORCH_DEVICE=jax`` on any plugin, and
by itself (accelerate's 'cpu' fallback becomes 'jax') on a plugin that
declares itself an accelerator -- a test distribution here, running on
jaxlib's CPU client -- while the host-CPU plugin cpu_ref, ``cpu=True`` /
``use_cpu=True`` and an explicit ``ACCELERATE_TORCH_DEVICE`` keep what they
ask for.  What the libraries' fixed device lists refuse has a way that
works: bf16 through ``ACCELERATE_MIXED_PRECISION``, compilation through
``model.compile(backend='jax')``.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import run_python

pytest.importorskip("torch")
pytest.importorskip("accelerate")

import torch  # noqa: E402

# A plugin that says it is an accelerator (DevicePlugin.is_host_cpu's
# default), on jaxlib's CPU client; its priority beats cpu_ref's.
_ACCELERATOR = """
    display_name = "Acme accelerator (test)"
    jaxlib_backend = "cpu"
    priority = 200
"""

_DEVICE_CHOICES = textwrap.dedent("""
    import json, logging, os, sys
    import torch
    import pjrt_host

    cheap = "accelerate" not in sys.modules  # import torch did not import it
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("pjrt_host").addHandler(handler)
    logging.getLogger("pjrt_host").setLevel(logging.INFO)

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    def device(**kwargs):
        AcceleratorState._reset_state(reset_partial_state=True)
        return str(Accelerator(**kwargs).device)

    class HostCpu(pjrt_host.DevicePlugin):
        jaxlib_backend = "cpu"
        is_host_cpu = True

    pjrt_host.register_plugin("hostcpu", HostCpu)
    seen = {"cheap": cheap, "default": device(), "cpu=True": device(cpu=True)}
    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    seen["env cpu"] = device()
    os.environ["ACCELERATE_TORCH_DEVICE"] = "jax"
    seen["env jax"] = device()
    del os.environ["ACCELERATE_TORCH_DEVICE"]
    pjrt_host.select("hostcpu")
    seen["host-cpu plugin"] = device()
    pjrt_host.select(None)
    acc = Accelerator()
    seen["computes"] = (torch.arange(3.0, device=acc.device) * 2).tolist()
    seen["after use"] = device()
    seen["log"] = [r.getMessage() for r in records if "accelerate" in r.getMessage()]
    print(json.dumps(seen))
""")


def _choices(site=None, env=None) -> dict:
    proc = run_python(["-c", _DEVICE_CHOICES], site=site, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_accelerate_uses_the_device_of_an_accelerator_plugin(site):
    """With no device named, accelerate's 'cpu' fallback becomes 'jax' when
    the selected plugin is an accelerator, once, with a log line naming how
    to keep the CPU; every explicit choice stands."""
    site.add_plugin("acme-pjrt", "acme", _ACCELERATOR)
    seen = _choices(site)
    assert seen["cheap"] is True
    assert seen["default"] == "jax" and seen["after use"] == "jax"
    assert seen["cpu=True"] == "cpu" and seen["env cpu"] == "cpu" and seen["env jax"] == "jax"
    assert seen["host-cpu plugin"] == "cpu"  # is_host_cpu: accelerate keeps its own choice
    assert seen["computes"] == [0.0, 2.0, 4.0]
    assert len(seen["log"]) == 1, seen["log"]
    assert "'acme'" in seen["log"][0] and "ACCELERATE_TORCH_DEVICE=cpu" in seen["log"][0]


def test_accelerate_keeps_the_cpu_on_the_host_cpu_plugin_and_when_switched_off(site):
    """cpu_ref declares it is the host's CPU: accelerate keeps 'cpu' (and
    ``ACCELERATE_TORCH_DEVICE=jax`` still moves it); with the hook switched
    off, an accelerator plugin does not change accelerate's choice either."""
    seen = _choices()
    assert seen["default"] == "cpu" and seen["env jax"] == "jax" and seen["log"] == []
    site.add_plugin("acme-pjrt", "acme", _ACCELERATOR)
    off = _choices(site, env={"PJRT_HOST_SKIP_PATCHES": "accelerate"})
    assert off["default"] == "cpu" and off["env jax"] == "jax" and off["log"] == []


_TRAINER = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    opts, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    dtypes = set()  # what a matmul of the first block computes in
    model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype)))
    if opts.get("compile"):
        model.compile(backend=opts["compile"])  # in place: Trainer still sees the GPT2LMHeadModel
    ids = torch.randint(0, 64, (24, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_steps=1, disable_tqdm=True, **opts.get("args", {}))
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    from torch._dynamo.utils import counters
    print(json.dumps({"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                      "device": str(next(model.parameters()).device), "dtypes": sorted(dtypes),
                      "mixed_precision": str(trainer.accelerator.mixed_precision),
                      "optim": str(args.optim), "fused": trainer.optimizer.param_groups[0].get("fused"),
                      "graphs": counters["stats"]["unique_graphs"]}))
""")


def _train(tmp_path, name: str, opts: dict | None = None, site=None, env=None) -> dict:
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(_TRAINER)
    out = tmp_path / name
    out.mkdir()
    proc = run_python([str(script), json.dumps(opts or {}), str(out)], site=site, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _same_losses(got: dict, want: dict, rtol: float = 1e-4) -> None:
    assert len(got["losses"]) == len(want["losses"]) == 3
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=rtol, atol=1e-5)


def test_trainer_that_names_no_device_trains_on_an_accelerator_plugin(tmp_path, site):
    """Default TrainingArguments on a machine whose plugin is an
    accelerator: Trainer trains on 'jax' with the losses of the same run on
    CPU; use_cpu=True on that machine still trains on the CPU."""
    site.add_plugin("acme-pjrt", "acme", _ACCELERATOR)
    on_device = _train(tmp_path, "device", site=site)
    on_cpu = _train(tmp_path, "cpu", {"args": {"use_cpu": True}}, site=site)
    assert on_device["device"] == "jax:0" and on_cpu["device"] == "cpu"
    # Trainer's default optimizer is torch's fused AdamW, on the device too
    assert "fused" in on_device["optim"].lower() and on_device["fused"] is True
    _same_losses(on_device, on_cpu)


def test_trainer_in_bf16_through_accelerate_mixed_precision(tmp_path):
    """TrainingArguments(bf16=True) is refused off transformers' device list;
    ACCELERATE_MIXED_PRECISION=bf16 gives Trainer accelerate's bf16
    autocast on 'jax': the matmuls run in bfloat16, the losses are CPU's bf16
    run's (to bfloat16's precision)."""
    on_device = _train(tmp_path, "device", site=None,
                       env={"ACCELERATE_TORCH_DEVICE": "jax", "ACCELERATE_MIXED_PRECISION": "bf16"})
    on_cpu = _train(tmp_path, "cpu", {"args": {"use_cpu": True, "bf16": True}})
    assert on_device["device"] == "jax:0" and on_device["mixed_precision"] == "bf16"
    assert on_device["dtypes"] == on_cpu["dtypes"] == ["torch.bfloat16"]
    _same_losses(on_device, on_cpu, rtol=2e-3)


@pytest.mark.slow  # ~35 s: Trainer over torch.compile; the backend's GPT-2 graphs are tested in test_compile
def test_trainer_with_a_model_compiled_for_the_device(tmp_path):
    """torch_compile_backend='jax' is refused (accelerate's DynamoBackend
    enum); model.compile(backend='jax') before Trainer compiles the model's
    forward and backward for the device, with eager CPU's losses."""
    env = {"ACCELERATE_TORCH_DEVICE": "jax"}
    compiled = _train(tmp_path, "compiled", {"compile": "jax"}, env=env)
    on_cpu = _train(tmp_path, "cpu", {"args": {"use_cpu": True}})
    assert compiled["device"] == "jax:0" and compiled["graphs"] >= 1 and on_cpu["graphs"] == 0
    _same_losses(compiled, on_cpu)
