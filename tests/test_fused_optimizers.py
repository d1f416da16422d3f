"""torch.optim's fused optimizers (``fused=True``: Adam, AdamW, SGD,
Adagrad) run on 'jax' and take the same steps as torch's own non-fused
(``foreach=False``) implementation on CPU, with every option, with a
tensor learning rate, a schedule, torch.amp.GradScaler; transformers'
Trainer, whose default optimizer is the fused AdamW, trains on 'jax' as on
CPU."""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402,F401
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from conftest import run_python  # noqa: E402

SHAPES = [(5, 3), (7,), (2, 3, 4), ()]


def _params(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype).requires_grad_() for s in SHAPES]


def _grads(step, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in SHAPES]


def _lr(kwargs, device):
    """A fresh tensor lr per optimizer (torch keeps the one it is given), on
    the CPU unless ``lr_on_device`` (a 'jax' run's lr then lives on 'jax')."""
    kwargs = dict(kwargs)
    on_device = kwargs.pop("lr_on_device", False)
    if isinstance(kwargs.get("lr"), torch.Tensor):
        kwargs["lr"] = kwargs["lr"].clone().to(device if on_device else "cpu")
    return kwargs


def run_optimizer(opt_cls, device, steps, schedule=False, dtype=torch.float32, jax_impl=None, **kwargs):
    params = _params(device, dtype)
    impl = (jax_impl or {"fused": True}) if device == "jax" else {"foreach": False}
    opt = opt_cls(params, **impl, **_lr(kwargs, device))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)) if schedule else None
    for step in range(steps):
        for p, g in zip(params, _grads(step, device, dtype)):
            p.grad = g
        opt.step()
        if sched is not None:
            sched.step()
    return opt, params


def assert_same_steps(opt_cls, steps=4, rtol=1e-5, atol=1e-6, jax_impl=None, **kwargs):
    jax_opt, jax_params = run_optimizer(opt_cls, "jax", steps, jax_impl=jax_impl, **kwargs)
    cpu_opt, cpu_params = run_optimizer(opt_cls, "cpu", steps, **kwargs)
    for k, v in (jax_impl or {"fused": True}).items():
        assert jax_opt.param_groups[0][k] is v
    for i, (a, b) in enumerate(zip(jax_params, cpu_params)):
        assert a.device.type == "jax"
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=rtol, atol=atol, msg=f"param {i}")
        assert not torch.equal(b.detach(), _params("cpu")[i].detach()), "the optimizer moved nothing"
    for i, (sa, sb) in enumerate(zip(jax_opt.state.values(), cpu_opt.state.values())):
        assert sa.keys() == sb.keys(), i
        for k in sb:
            va, vb = sa[k], sb[k]
            if isinstance(vb, torch.Tensor):
                torch.testing.assert_close(va.cpu().to(vb.dtype).reshape(vb.shape), vb, rtol=rtol, atol=atol,
                                           msg=f"state {i} {k}")


ADAM_OPTIONS = {
    "default": {},
    "weight_decay": {"weight_decay": 0.1},
    "amsgrad": {"amsgrad": True},
    "maximize": {"maximize": True},
    "all": {"amsgrad": True, "maximize": True, "weight_decay": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "lr": 0.01},
    "tensor_lr": {"lr": torch.tensor(0.01)},
    "tensor_lr_on_device": {"lr": torch.tensor(0.02), "lr_on_device": True, "amsgrad": True},
}


@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=list(ADAM_OPTIONS))
@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW], ids=["Adam", "AdamW"])
def test_adam_family_matches_cpu(opt_cls, options):
    assert_same_steps(opt_cls, **ADAM_OPTIONS[options])


SGD_OPTIONS = {
    "plain": {"lr": 0.1},
    "momentum": {"lr": 0.1, "momentum": 0.9},
    "dampening": {"lr": 0.1, "momentum": 0.9, "dampening": 0.3},
    "nesterov": {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    "maximize_weight_decay": {"lr": 0.1, "momentum": 0.5, "maximize": True, "weight_decay": 0.1},
    "tensor_lr": {"lr": torch.tensor(0.05), "momentum": 0.9},
}


@pytest.mark.parametrize("options", SGD_OPTIONS, ids=list(SGD_OPTIONS))
def test_sgd_matches_cpu(options):
    assert_same_steps(torch.optim.SGD, **SGD_OPTIONS[options])


ADAGRAD_OPTIONS = {
    "default": {},
    "lr_decay_weight_decay": {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1},
    "maximize_accumulator": {"lr": 0.1, "maximize": True, "initial_accumulator_value": 0.5, "eps": 1e-8},
    "tensor_lr": {"lr": torch.tensor(0.1), "lr_decay": 0.01},
}


@pytest.mark.parametrize("options", ADAGRAD_OPTIONS, ids=list(ADAGRAD_OPTIONS))
def test_adagrad_matches_cpu(options):
    assert_same_steps(torch.optim.Adagrad, **ADAGRAD_OPTIONS[options])


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad])
def test_learning_rate_schedule(opt_cls):
    """A new lr every step (LambdaLR) gives the steps CPU takes."""
    kwargs = {"lr": 0.1, "momentum": 0.9} if opt_cls is torch.optim.SGD else {"lr": 0.05}
    assert_same_steps(opt_cls, steps=6, schedule=True, **kwargs)


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam,
                                     torch.optim.Adamax, torch.optim.ASGD],
                         ids=lambda c: c.__name__)
def test_capturable_foreach_optimizers(opt_cls):
    """capturable=True keeps the step count on the device and raises the
    betas to it there (``_foreach_pow(beta, steps)``)."""
    assert_same_steps(opt_cls, jax_impl={"foreach": True, "capturable": True}, lr=0.01)


def test_foreach_ops_optimizers_and_clipping_use():
    """The foreach forms of pow(scalar, tensors), max, clone and a few
    unary functions, against torch CPU."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.rand(s, generator=g) * 0.9 + 0.05 for s in [(3, 4), (5,), ()]]
    on_jax = [x.to("jax") for x in xs]
    checks = {
        "pow(scalar, tensors)": lambda ts: torch._foreach_pow(0.9, ts),
        "max": torch._foreach_max,
        "clone": torch._foreach_clone,
        **{name: getattr(torch, f"_foreach_{name}")
           for name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "erfc", "lgamma")},
    }
    for name, fn in checks.items():
        for a, b in zip(fn(on_jax), fn(xs)):
            assert a.device.type == "jax", name
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=name)
    clones = torch._foreach_clone(on_jax)
    torch._foreach_add_(clones, 1.0)
    torch.testing.assert_close(on_jax[0].cpu(), xs[0])  # a clone is its own tensor
    steps = [torch.tensor(float(i + 1), device="jax") for i in range(3)]
    torch._foreach_pow_(steps, 2.0)
    assert [float(s) for s in steps] == [1.0, 4.0, 9.0]


def test_fused_step_under_torch_compile():
    """``torch.compile(opt.step, backend='jax')`` of a fused AdamW: the
    graph holds the functional ``_fused_adamw``, lowered by the same table."""
    params = _params("jax")
    opt = torch.optim.AdamW(params, fused=True, lr=0.01, weight_decay=0.1, amsgrad=True)
    step = torch.compile(opt.step, backend="jax")
    for i in range(3):
        for p, g in zip(params, _grads(i, "jax")):
            p.grad = g
        step()
    _, cpu_params = run_optimizer(torch.optim.AdamW, "cpu", 3, lr=0.01, weight_decay=0.1, amsgrad=True)
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def test_a_step_is_one_device_op_and_a_schedule_stops_compiling():
    """The fused step reaches the device as one op over all parameters (the
    optimizer's step count aside), and a learning rate that changes every
    step stops costing a compile once its first few steps are seen."""
    params = [torch.randn(8, 4, device="jax", requires_grad=True) for _ in range(6)]
    opt = torch.optim.AdamW(params, fused=True, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    compiled = []
    for step in range(10):
        for p in params:
            p.grad = torch.ones_like(p) * (step + 1)
        before = torch.jax.program_cache_stats()["programs"]
        if step == 9:
            with _OpLog() as log:
                opt.step()
        else:
            opt.step()
        torch.jax.synchronize()
        compiled.append(torch.jax.program_cache_stats()["programs"] - before)
        sched.step()
    assert compiled[6:] == [0, 0, 0, 0], compiled
    device_ops = [n for n in log.ops if n.startswith("aten::")]
    assert device_ops == ["aten::_foreach_add_.Scalar", "aten::_fused_adamw_"], device_ops


def test_the_default_step_is_foreach_and_a_schedule_stops_compiling():
    """torch.optim's default step on 'jax' parameters is its foreach step
    (one op over all parameters per update, as on cuda), as is
    clip_grad_norm_'s: torch picks it by the tensor type, which pjrt_host
    adds to torch's lists as DTensor does.  Its bias corrections and
    step sizes, Python floats that change every step, are traced: a
    schedule stops compiling after the first steps; the steps are CPU's.
    (Under fused eager the whole step is one segment; at the third step
    the thread's ops repeat the step before, the segment ends at the
    step's last op, and its program returns one more list the optimizer
    still holds there: one program more, once.)"""
    params = _params("jax")
    opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    compiled = []
    for step in range(6):
        for p, g in zip(params, _grads(step, "jax")):
            p.grad = g
        before = torch.jax.program_cache_stats()["programs"]
        with _OpLog() as log:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        torch.jax.synchronize()
        compiled.append(torch.jax.program_cache_stats()["programs"] - before)
        sched.step()
    assert compiled[3:] == [0, 0, 0], compiled
    single_tensor_step = {"aten::lerp_.Scalar", "aten::addcmul_", "aten::addcdiv_", "aten::sqrt"}
    assert not single_tensor_step & set(log.ops), log.ops
    assert {"aten::_foreach_addcdiv_.ScalarList", "aten::_foreach_norm.Scalar"} <= set(log.ops), log.ops
    cpu = [p.detach().clone().requires_grad_() for p in _params("cpu")]
    cpu_opt = torch.optim.AdamW(cpu, lr=0.05, weight_decay=0.1, foreach=False)
    cpu_sched = torch.optim.lr_scheduler.LambdaLR(cpu_opt, lambda s: 1.0 / (1 + s))
    for step in range(6):
        for p, g in zip(cpu, _grads(step, "cpu")):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(cpu, 1.0, foreach=False)
        cpu_opt.step()
        cpu_sched.step()
    for a, b in zip(params, cpu):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)


_LARGE_SCHEDULE_SCRIPT = textwrap.dedent("""
    import json
    import torch
    import pjrt_host  # noqa: F401

    params = [torch.zeros(1024, 1024, device="jax", requires_grad=True) for _ in range(2)]
    opt = torch.optim.AdamW(params, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    compiled = []
    for step in range(8):
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        before = torch.jax.program_cache_stats()["programs"]
        opt.step()
        torch.jax.synchronize()
        compiled.append(torch.jax.program_cache_stats()["programs"] - before)
        sched.step()
    print(json.dumps(compiled))
""")


def test_a_schedule_stops_compiling_for_a_large_model(tmp_path):
    """In a fresh process: an op whose floats were found traceable on a
    small call earlier in the process stays traced for larger ones."""
    script = tmp_path / "large.py"
    script.write_text(_LARGE_SCHEDULE_SCRIPT)
    proc = run_python([str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert compiled[5:] == [0, 0, 0], compiled


def _op_lists(device, n_states):
    g = torch.Generator().manual_seed(3)
    make = [lambda s: torch.randn(s, generator=g), lambda s: torch.randn(s, generator=g) * 100,
            lambda s: torch.randn(s, generator=g), lambda s: torch.rand(s, generator=g),
            lambda s: torch.rand(s, generator=g)]
    return [[make[k](s).to(device) for s in SHAPES] for k in range(n_states)]


@pytest.mark.parametrize("found", [0.0, 1.0], ids=["finite", "found_inf"])
@pytest.mark.parametrize("op", ["adam", "adamw"])
def test_adam_op_grad_scale_and_found_inf_as_torch_cpu_kernel(op, found):
    """The op itself, against torch's CPU fused kernel: gradients divided by
    grad_scale and written back; with found_inf set nothing changes."""
    fn = getattr(torch, f"_fused_{op}_")
    results = {}
    for device in ("cpu", "jax"):
        params, grads, exp_avgs, exp_avg_sqs, max_sqs = _op_lists(device, 5)
        steps = [torch.tensor(3.0, device=device) for _ in SHAPES]
        fn(params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps, lr=0.01, beta1=0.9, beta2=0.99,
           weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=True,
           grad_scale=torch.tensor(64.0, device=device), found_inf=torch.tensor(found, device=device))
        results[device] = [params, grads, exp_avgs, exp_avg_sqs, max_sqs]
    before = _op_lists("cpu", 5)
    for k, (a_list, b_list) in enumerate(zip(results["jax"], results["cpu"])):
        for a, b, original in zip(a_list, b_list, before[k]):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)
            if found:
                assert torch.equal(a.cpu(), original)
    if not found:
        assert not torch.equal(results["jax"][1][0].cpu(), before[1][0])  # grads unscaled in place


@pytest.mark.parametrize("found", [0.0, 1.0], ids=["finite", "found_inf"])
def test_sgd_and_adagrad_ops_grad_scale_and_found_inf_as_torch_cpu_kernel(found):
    results = {}
    for device in ("cpu", "jax"):
        scale = dict(grad_scale=torch.tensor(8.0, device=device), found_inf=torch.tensor(found, device=device))
        params, grads, bufs = _op_lists(device, 3)
        torch._fused_sgd_(params, grads, bufs, weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.2,
                          nesterov=True, maximize=False, is_first_step=False, **scale)
        a_params, a_grads, sums = _op_lists(device, 3)
        sums = [s.abs() for s in sums]
        steps = [torch.tensor(2.0, device=device) for _ in SHAPES]
        torch._fused_adagrad_(a_params, a_grads, sums, steps, lr=0.1, lr_decay=0.1, weight_decay=0.1, eps=1e-10,
                              maximize=True, **scale)
        results[device] = [params, grads, bufs, a_params, a_grads, sums, steps]
    for a_list, b_list in zip(results["jax"], results["cpu"]):
        for a, b in zip(a_list, b_list):
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_params_as_torch_cpu_fused(dtype):
    """16-bit parameters and states compute in float32 and round once, as
    torch's fused kernels do: the steps equal torch CPU's fused ones."""
    results = {}
    for device in ("cpu", "jax"):
        params = _params(device, dtype)
        opt = torch.optim.AdamW(params, fused=True, lr=0.01, weight_decay=0.1, amsgrad=True)
        for step in range(3):
            for p, g in zip(params, _grads(step, device, dtype)):
                p.grad = g
            opt.step()
        results[device] = params
    for a, b in zip(results["jax"], results["cpu"]):
        assert a.dtype == dtype
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-2, atol=1e-3)


def _train_with_scaler(opt_cls, device, inf_steps, clip=False, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    impl = {"fused": True} if device == "jax" else {"foreach": False}
    opt = opt_cls(model.parameters(), **impl, **kwargs)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 12, growth_interval=2)
    scales = []
    for step in range(6):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(5, 8, generator=g)
        if step in inf_steps:
            x[0, 0] = float("inf")
        loss = model(x.to(device)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        if clip:  # unscaled before the step: the step then gets found_inf alone
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales, opt


@pytest.mark.parametrize("opt_cls, kwargs", [
    (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "amsgrad": True}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    (torch.optim.Adagrad, {"lr": 0.05}),
], ids=["Adam", "AdamW", "SGD", "Adagrad"])
@pytest.mark.parametrize("clip", [False, True], ids=["", "unscale_clip"])
def test_grad_scaler(opt_cls, kwargs, clip):
    """torch.amp.GradScaler('jax') hands the fused step grad_scale and
    found_inf: a step with inf gradients is skipped (the scale backs off),
    the others equal CPU's non-fused steps after GradScaler.unscale_.
    ``clip``: unscale_ and clip_grad_norm_ before the step (Trainer's
    order), so the fused step gets found_inf without grad_scale."""
    inf_steps = {2, 3}  # after the first step: an SGD buffer is then created by a step that ran
    jax_model, jax_scales, jax_opt = _train_with_scaler(opt_cls, "jax", inf_steps, clip, **kwargs)
    cpu_model, cpu_scales, cpu_opt = _train_with_scaler(opt_cls, "cpu", inf_steps, clip, **kwargs)
    assert jax_scales == cpu_scales
    assert jax_scales[2] < jax_scales[1]  # backed off: the inf was seen
    for (name, a), (_, b) in zip(jax_model.named_parameters(), cpu_model.named_parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6, msg=name)
    for sa, sb in zip(jax_opt.state.values(), cpu_opt.state.values()):
        if "step" in sb:
            assert float(sa["step"]) == float(sb["step"]) == 4.0  # two of six steps skipped


_TRAINER_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import pjrt_host  # noqa: F401
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    device, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 64, (24, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_steps=1, use_cpu=device == "cpu",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    torch.save({"initial": initial,
                "final": {k: v.detach().cpu() for k, v in model.state_dict().items()}}, out + "/params.pt")
    print(json.dumps({"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                      "optim": str(args.optim), "fused": trainer.optimizer.param_groups[0].get("fused"),
                      "device": str(next(model.parameters()).device)}))
""")


@pytest.mark.slow  # ~20 s; the default run's test_integrations trains with Trainer's fused default and checks it
def test_transformers_trainer_default_optimizer(tmp_path):
    """Trainer with default TrainingArguments (optim adamw_torch_fused)
    trains a tiny GPT-2 on 'jax' (ACCELERATE_TORCH_DEVICE=jax) with the
    losses and weights of the same run on CPU."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    script = tmp_path / "train.py"
    script.write_text(_TRAINER_SCRIPT)
    runs = {}
    for device, env in (("jax", {"ACCELERATE_TORCH_DEVICE": "jax"}), ("cpu", {})):
        out = tmp_path / device
        out.mkdir()
        proc = run_python([str(script), device, str(out)], env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[device] = json.loads(proc.stdout.strip().splitlines()[-1])
        runs[device]["params"] = torch.load(out / "params.pt")
    jax_run, cpu_run = runs["jax"], runs["cpu"]
    assert jax_run["device"] == "jax:0" and cpu_run["device"] == "cpu"
    assert "fused" in jax_run["optim"].lower() and jax_run["fused"] is True
    assert len(jax_run["losses"]) == 3
    torch.testing.assert_close(torch.tensor(jax_run["losses"]), torch.tensor(cpu_run["losses"]), rtol=1e-4, atol=1e-5)
    final_jax, final_cpu = jax_run["params"]["final"], cpu_run["params"]["final"]
    moved = 0
    for name, b in final_cpu.items():
        torch.testing.assert_close(final_jax[name], b, rtol=1e-4, atol=1e-6, msg=name)
        moved += not torch.equal(b, cpu_run["params"]["initial"][name])
    assert moved > len(final_cpu) // 2  # the optimizer stepped
