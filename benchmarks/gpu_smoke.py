"""What the 'cuda' plugin does end to end on a machine with an NVIDIA GPU:
device tensors from a plain ``import torch``, a checkpoint loaded with
map_location='jax', a compiled model's forward and backward against the same
model on torch CUDA, GradScaler with float16 autocast, DLPack to and from
torch CUDA tensors, memory released on ``del``, a timed matmul, bfloat16
results against torch CUDA's (computed in a child without PJRT_DEVICE), the
peak memory of a compiled AdamW step (buffer donation), and a transformers
GPT-2 compiled with its default cache (when transformers is installed).

    PJRT_DEVICE=cuda python benchmarks/gpu_smoke.py

Prints one line per check with its figures; docs/plugins/gpu.md records a run.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import time

import torch

# Run in a child without PJRT_DEVICE: with pjrt_host installed, a CUDA build of
# torch keeps CUDA as its accelerator, so torch CUDA training works.
CUDA_REFERENCE = r"""
import sys, torch
assert torch.accelerator.current_accelerator().type == "cuda", torch.accelerator.current_accelerator()
state, x, out = torch.load(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                            torch.nn.Linear(512, 10)).cuda()
model.load_state_dict(state)
loss = model(x.cuda()).square().mean()
loss.backward()
torch.save((loss.item(), [p.grad.cpu() for p in model.parameters()]), out)
"""

# bfloat16 ops on torch CUDA, for the same inputs (a child without PJRT_DEVICE).
CUDA_BF16 = r"""
import sys, torch
xs = [t.cuda() for t in torch.load(sys.argv[1])]
a, b, c = xs
out = {"addcmul": torch.addcmul(a, b, c, value=0.3), "lerp": torch.lerp(a, b, 0.3), "cumsum": torch.cumsum(a, 1),
       "softmax": torch.softmax(a, -1), "layer_norm": torch.nn.functional.layer_norm(a, (a.shape[-1],)),
       "gelu": torch.nn.functional.gelu(a), "add_eps": a + 1e-3, "mm": a @ b,
       "logaddexp": torch.logaddexp(a, b), "sum": a.sum(1)}
torch.save({k: v.cpu() for k, v in out.items()}, sys.argv[2])
"""


def bf16_against_cuda() -> None:
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(256, 256, generator=g).bfloat16() for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.pt"), os.path.join(d, "out.pt")
        torch.save(xs, inp)
        env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
        subprocess.run([sys.executable, "-c", CUDA_BF16, inp, out], check=True, env=env)
        ref = torch.load(out)
    a, b, c = (t.to("jax") for t in xs)
    got = {"addcmul": torch.addcmul(a, b, c, value=0.3), "lerp": torch.lerp(a, b, 0.3), "cumsum": torch.cumsum(a, 1),
           "softmax": torch.softmax(a, -1), "layer_norm": torch.nn.functional.layer_norm(a, (a.shape[-1],)),
           "gelu": torch.nn.functional.gelu(a), "add_eps": a + 1e-3, "mm": a @ b,
           "logaddexp": torch.logaddexp(a, b), "sum": a.sum(1)}
    parts = [f"{k} {(got[k].cpu() != ref[k]).sum().item()}/{ref[k].numel()}" for k in ref]
    print("bfloat16 elements differing from torch CUDA:", ", ".join(parts))


def donation_peak() -> None:
    layers, width = 8, 2048  # 128 MiB of float32 parameters
    params = [torch.nn.Parameter(torch.randn(width, width, device="jax") * 0.01) for _ in range(layers)]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW(params, lr=1e-3)
    step = torch.compile(opt.step, backend="jax")
    step()
    torch.jax.synchronize()
    state = 4 * layers * width * width * 4
    base = torch.jax.memory_allocated()
    torch.jax.reset_peak_memory_stats()
    for _ in range(2):
        step()
    torch.jax.synchronize()
    peak = torch.jax.max_memory_allocated()
    print(f"compiled AdamW step over {layers * width * width * 4 / 2**20:.0f} MiB of parameters: allocated "
          f"{base / state:.2f}x and peak {peak / state:.2f}x of parameters + gradients + state "
          f"(PJRT_HOST_DONATE={os.environ.get('PJRT_HOST_DONATE', '1')})")
    del params, opt, step


def transformers_decoder() -> None:
    try:
        import transformers
    except ImportError:
        print("transformers not installed: GPT-2 compile skipped")
        return
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=1)).eval()
    ids = torch.randint(2, 256, (1, 6))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
        logits = model(input_ids=ids).logits
        model.to("jax")
        compiled = torch.compile(model, backend="jax", fullgraph=True)
        diff = (compiled(input_ids=ids.to("jax")).logits.cpu() - logits).abs().max().item()
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="jax")
        tokens = model.generate(ids.to("jax"), max_new_tokens=6, do_sample=False)
    print(f"GPT-2 (transformers {transformers.__version__}) compiled with its default cache: logits max diff "
          f"{diff:.2e}; generate() equal to CPU: {torch.equal(tokens.cpu(), expected)}")


def main() -> None:
    print("torch", torch.__version__, "| device", torch.jax.get_device_name(), "| plugin",
          torch.jax.get_device_properties().plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                                torch.nn.Linear(512, 10))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, map_location="jax")
    print("torch.load(map_location='jax'):", sorted({str(v.device) for v in state.values()}))
    on_jax = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                                 torch.nn.Linear(512, 10)).to("jax")
    on_jax.load_state_dict(state)
    x = torch.randn(64, 256)
    compiled = torch.compile(on_jax, backend="jax")
    loss_jax = compiled(x.to("jax")).square().mean()
    loss_jax.backward()
    with tempfile.TemporaryDirectory() as tmp:
        torch.save((model.state_dict(), x, os.path.join(tmp, "out.pt")), os.path.join(tmp, "in.pt"))
        env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
        subprocess.run([sys.executable, "-c", CUDA_REFERENCE, os.path.join(tmp, "in.pt")], check=True, env=env)
        loss_cuda, grads_cuda = torch.load(os.path.join(tmp, "out.pt"))
    grad_diff = max((a.grad.cpu() - b).abs().max().item() for a, b in zip(on_jax.parameters(), grads_cuda))
    print(f"compiled fwd+bwd: loss jax {loss_jax.item():.6f} vs torch cuda (a process without PJRT_DEVICE, "
          f"CUDA backward working) {loss_cuda:.6f}, max grad diff {grad_diff:.2e}")

    opt = torch.optim.SGD(on_jax.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("jax")
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("jax", dtype=torch.float16):
            out = on_jax(x.to("jax"))
            loss = torch.nn.functional.cross_entropy(out, torch.zeros(64, dtype=torch.long, device="jax"))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print(f"GradScaler + float16 autocast: 3 steps, loss {loss.item():.4f} ({loss.dtype}), "
          f"scale {scaler.get_scale()}")

    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    j = torch.utils.dlpack.from_dlpack(t) if False else t.to("jax")
    back = j.to("cuda")
    print("torch cuda -> jax -> torch cuda:", torch.equal(back, t))

    torch.jax.synchronize()
    before = torch.jax.memory_allocated()
    big = torch.ones(1 << 28, device="jax")  # 1 GiB
    held = torch.jax.memory_allocated() - before
    del big
    print(f"1 GiB tensor: allocated +{held / 2**20:.0f} MiB, after del +"
          f"{(torch.jax.memory_allocated() - before) / 2**20:.0f} MiB; torch.accelerator.memory_allocated() "
          f"{torch.accelerator.memory_allocated() / 2**20:.1f} MiB")

    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(8192, 8192, device="jax").to(dtype)
        (a @ a).sum().item()
        start, end = torch.jax.Event(enable_timing=True), torch.jax.Event(enable_timing=True)
        torch.jax.synchronize()
        start.record()
        for _ in range(10):
            c = a @ a
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / 10
        host = time.perf_counter()
        for _ in range(10):
            c = a @ a
        torch.jax.synchronize()
        host_ms = (time.perf_counter() - host) * 100
        print(f"8192^3 matmul {dtype}: {ms:.2f} ms by torch.jax.Event, {host_ms:.2f} ms by host clock, "
              f"{2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
    del c, a

    for check in (bf16_against_cuda, donation_peak, transformers_decoder):
        try:
            check()
        except Exception as err:  # one failing check must not hide the others' figures
            print(f"{check.__name__} FAILED: {type(err).__name__}: {str(err).splitlines()[0][:300]}")


if __name__ == "__main__":
    main()
