"""bfloat16 training on 'jax' against torch CPU, as users train: a tiny
transformers GPT-2 (random weights), a few AdamW steps under
``torch.autocast(device, dtype=torch.bfloat16)``.

Three runs from the same initial weights and batches (``--pure``: the
model and AdamW's state in bfloat16, no autocast, where every op's 16-bit
rounding shows):

* ``cpu``: torch CPU under ``torch.autocast('cpu', dtype=torch.bfloat16)``;
* ``cpu+noise``: the same with every initial weight scaled by
  (1 + 1e-6 * N(0, 1)) -- how far torch CPU drifts from itself when nothing
  but float32 rounding noise changes (bfloat16 magnifies it);
* ``jax``: the same as ``cpu`` on the 'jax' device under
  ``torch.autocast('jax', dtype=torch.bfloat16)``.

Prints each step's loss, and the relative distance of the final weights to
``cpu`` (||w - w_cpu|| / ||w_cpu - w_0||: 0 is identical, 1 is as far as
training moved them).  Goal: ``jax`` no farther from ``cpu`` than about the
noise run (ratio printed).

    python benchmarks/bench_autocast_tracking.py [--steps 5] [--layers 2] [--width 64] [--pure]
"""

from __future__ import annotations

import argparse
import copy

import torch


def make_model(layers: int, width: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=256, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def train(model: torch.nn.Module, device: str, batches: list, steps: int, pure: bool) -> tuple[list, torch.Tensor]:
    model = model.to(device).train()
    if pure:
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in batches[:steps]:
        ids = ids.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=not pure):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().cpu().float().flatten() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--pure", action="store_true",
                        help="weights, activations and AdamW state in bfloat16 (no autocast)")
    args = parser.parse_args()

    base = make_model(args.layers, args.width)
    start = torch.cat([p.detach().flatten() for p in base.parameters()])
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (4, 32), generator=g) for _ in range(args.steps)]

    noisy = copy.deepcopy(base)
    with torch.no_grad():
        for p in noisy.parameters():
            p.mul_(1 + 1e-6 * torch.randn(p.shape, generator=g))

    runs = {"cpu": train(copy.deepcopy(base), "cpu", batches, args.steps, args.pure),
            "cpu+noise": train(noisy, "cpu", batches, args.steps, args.pure),
            "jax": train(copy.deepcopy(base), "jax", batches, args.steps, args.pure)}
    ref_losses, ref = runs["cpu"]
    moved = (ref - start).norm().item()
    mode = "in pure bfloat16" if args.pure else "under bfloat16 autocast"
    print(f"GPT-2 {args.layers} layers x {args.width}, {args.steps} AdamW steps {mode}")
    distance = {}
    for name, (losses, w) in runs.items():
        distance[name] = (w - ref).norm().item() / moved
        print(f"  {name:10s} losses {' '.join(f'{x:.5f}' for x in losses)}   weights from cpu: {distance[name]:.3e}")
    print(f"jax / noise distance ratio: {distance['jax'] / distance['cpu+noise']:.2f} "
          f"(1 = 'jax' tracks torch CPU as closely as torch CPU tracks itself under 1e-6 weight noise)")


if __name__ == "__main__":
    main()
