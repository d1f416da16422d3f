"""Dynamic dimensions against one program per shape (docs/dynamic-shapes.md).

transformers GPT-2 (4 layers, width 128, vocabulary 1000, random weights),
AdamW, batches of 4 padded to their longest as a collator pads them: 16
lengths drawn between 18 and 128.  Each row is a fresh process with an empty
program cache: torch CPU eager, then 'jax' op-by-op eager with dynamic
shapes off and on (``PJRT_HOST_DYNAMIC_SHAPES``), with the model's default
dropout and with dropout 0.  Then greedy ``generate()`` (default
DynamicCache) of 4 prompts of different lengths, 24 new tokens each, then 4
more prompts of nearby new lengths (GPT-2, then a tiny Llama: 2 layers, width
64, grouped-query attention), and the
steady-state cost of padding: a warm step at a length that just fills a
bucket (128: 100 %) and one just past it (129 in the bucket of 160: 81 %),
against the same steps with dynamic shapes off (warm too).

    python benchmarks/bench_dynamic_shapes.py [--steps 16] [--only train|generate|generate-llama|steady|compile|lengths]
                                              [--dropout 0.1 0.0]
                                              [--eager op|fused]

``--eager fused`` runs the eager 'jax' rows in fused eager (segments of
padded ops) instead of op by op.  ``--only compile``: the same training
under ``torch.compile(backend='jax')`` (forward and backward compiled,
AdamW eager; each --dropout), dynamic shapes off and on: XLA compiles per
step and the time, against torch CPU eager.

``--only steady-ops`` (not in the default run): warm steps at 129, the
time of each op with its result waited for, dynamic shapes off and on.

``--only lengths``: 9 training steps at new lengths of one bucket (33 ..
48), dynamic shapes on: the programs each step compiles (the first two
lengths compile exact programs, the third the bucket's; a later one should
compile none), losses against CPU's.

Ratios: the run's total and its last 4 steps against CPU's, dynamic on
against off; losses and tokens must equal CPU's (to float tolerance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

#: The checkout this script is in: its children (``python -c``) import pjrt_host from
#: their working directory first, so they run there, and a benchmark measures its own tree.
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import torch, transformers

device, job, steps, pdrop = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
LENGTHS = [40, 45, 35, 47, 38, 42, 44, 34, 46]
transformers.set_seed(0)
if job == "generate-llama":  # a tiny Llama (rotary positions, grouped-query attention, its own mask code)
    job = "generate"
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                      max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).to(device)
else:
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=256,
                                     resid_pdrop=pdrop, embd_pdrop=pdrop, attn_pdrop=pdrop)
    model = transformers.GPT2LMHeadModel(config).to(device)
out = {}
if job == "train":
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in torch.randint(18, 129, (steps,), generator=g)]
    times, losses, programs = [], [], []
    made = (lambda: 0) if device == "cpu" else (
        lambda: torch.jax.program_cache_stats()["compiled"] + torch.jax.program_cache_stats()["disk_hits"])
    for n in lengths:
        ids = torch.randint(0, 1000, (4, n), generator=g).to(device)
        before = made()
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item()); times.append(time.perf_counter() - t)
        programs.append(made() - before)
    out = {"total": sum(times), "last4": sum(times[-4:]), "losses": losses, "lengths": lengths, "times": times,
           "programs": programs}
elif job == "generate":
    model.eval()
    g = torch.Generator().manual_seed(1)
    tokens, times = [], []
    for group in ((9, 17, 23, 31), (11, 19, 26, 29)):  # then nearby new lengths
        t0 = time.perf_counter()
        for n in group:
            ids = torch.randint(0, 1000, (1, n), generator=g).to(device)
            with torch.no_grad():
                o = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
            tokens.append(o[0, n:].tolist())
        times.append(time.perf_counter() - t0)
    out = {"total": times[0], "again": times[1], "tokens": tokens}
elif job == "compile":
    # torch.compile(backend='jax') of the forward and backward (the loss on
    # labels shifted on the host, as a collator gives them), AdamW eager
    import torch.nn.functional as F
    xla = [0]
    if device != "cpu":
        import jax
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, d, **kw: xla.__setitem__(0, xla[0] + (event == "/jax/core/compile/backend_compile_duration")))
    def loss_fn(ids, labels):
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    step_fn = torch.compile(loss_fn, backend="jax") if device != "cpu" else loss_fn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in torch.randint(18, 129, (steps,), generator=g)]
    times, losses, compiles = [], [], []
    for n in lengths:
        ids = torch.randint(0, 1000, (4, n), generator=g)
        labels = torch.cat([ids[:, 1:], torch.full((4, 1), -100)], 1)
        before = xla[0]
        t = time.perf_counter()
        loss = step_fn(ids.to(device), labels.to(device))
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item()); times.append(time.perf_counter() - t)
        compiles.append(xla[0] - before)
    out = {"total": sum(times), "last4": sum(times[-4:]), "losses": losses, "lengths": lengths, "times": times,
           "xla_compiles": compiles}
elif job == "lengths":
    # new lengths of one bucket (33 .. 48): the programs each training step compiles
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    programs, losses = [], []
    def made():
        if device == "cpu":
            return 0
        s = torch.jax.program_cache_stats()
        return s["compiled"] + s["disk_hits"]
    for n in LENGTHS:
        ids = torch.randint(0, 1000, (4, n), generator=g).to(device)
        before = made()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item()); programs.append(made() - before)
    out = {"programs": programs, "losses": losses}
elif job == "steady_ops":
    # where a warm step at 129 spends its time, op by op: each op's result
    # waited for (the ops of the backward too, which a profiler of the main
    # thread does not see)
    import collections
    from pjrt_host._torch import _engine
    from pjrt_host._torch._tensor import JaxTensor
    spent, calls = collections.Counter(), collections.Counter()
    untimed = _engine.CompiledOp.__call__
    def timed(self, args, kwargs):
        t = time.perf_counter()
        r = untimed(self, args, kwargs)
        for x in (r if isinstance(r, (tuple, list)) else (r,)):
            if type(x) is JaxTensor and hasattr(x._storage._array, "block_until_ready"):
                x._storage._array.block_until_ready()
        spent[self.name] += time.perf_counter() - t
        calls[self.name] += 1
        return r
    _engine.CompiledOp.__call__ = timed  # (before the first forward: ops bind it at their first call)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def step(n):
        ids = torch.randint(0, 1000, (4, n)).to(device)
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(); loss.item()
        return time.perf_counter() - t
    for n in (100, 110, 120, 128, 129, 128, 129):
        step(n)
    spent.clear(); calls.clear()
    times = [step(129) for _ in range(steps)]
    out = {"step": min(times), "in_ops": sum(spent.values()) / steps,
           "ops": {k: [v / steps, calls[k] / steps] for k, v in spent.most_common(14)}}
else:  # steady: warm steps at 128 and 129 (three of each first, then the timed ones)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def step(n):
        ids = torch.randint(0, 1000, (4, n)).to(device)
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad(); loss.item()
        return time.perf_counter() - t
    for n in (100, 110, 120, 128, 129, 128, 129, 128, 129):
        step(n)
    out = {n: min(step(n) for _ in range(steps)) for n in (128, 129)}
if device != "cpu":
    s = torch.jax.dynamic_shape_stats()
    out["stats"] = {k: s[k] for k in ("padded_calls", "pads", "cuts", "fallbacks", "padding_overhead",
                                      "graph_programs")}
    out["fallbacks_by_reason"] = dict(list(s["fallbacks_by_reason"].items())[:6])
    out["cuts_by_op"] = dict(list(s["cuts_by_op"].items())[:6])
print("RESULT " + json.dumps(out))
"""


EAGER = "op"


def run(device: str, job: str, steps: int, pdrop: float, dynamic: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PJRT_HOST_CACHE_DIR=cache, PJRT_HOST_DYNAMIC_SHAPES=dynamic,
                   PJRT_HOST_EAGER=EAGER, TRANSFORMERS_VERBOSITY="error")
        proc = subprocess.run([sys.executable, "-c", CHILD, device, job, str(steps), str(pdrop)], cwd=TREE,
                              capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{device} {job} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--only", choices=("train", "generate", "generate-llama", "steady", "compile", "lengths",
                                           "steady-ops"))
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument("--eager", choices=("op", "fused"), default="op")
    args = parser.parse_args()
    global EAGER
    EAGER = args.eager
    print(f"'jax' rows in eager={EAGER}")
    if args.only in (None, "train"):
        for pdrop in args.dropout:
            cpu = run("cpu", "train", args.steps, pdrop, "0")
            print(f"train, dropout {pdrop}: cpu total {cpu['total']:.2f} s, last 4 {cpu['last4']:.3f} s")
            rows = {}
            for dynamic in ("0", "1"):
                r = rows[dynamic] = run("jax", "train", args.steps, pdrop, dynamic)
                worst = max(abs(a - b) for a, b in zip(r["losses"], cpu["losses"]))
                print(f"  jax dynamic={dynamic}: total {r['total']:.2f} s ({r['total'] / cpu['total']:.1f}x cpu), "
                      f"last 4 {r['last4']:.3f} s ({r['last4'] / cpu['last4']:.1f}x cpu), losses within {worst:.1e} "
                      f"of cpu; {r['stats']}; cuts {r['cuts_by_op']}")
                print(f"    per step (length: s, programs): "
                      f"{[f'{n}: {t:.2f}, {p}' for n, t, p in zip(r['lengths'], r['times'], r['programs'])]}")
            print(f"    cpu per step (s): {[round(t, 3) for t in cpu['times']]}")
            print(f"  dynamic on / off: total {rows['1']['total'] / rows['0']['total']:.2f}, "
                  f"last 4 {rows['1']['last4'] / rows['0']['last4']:.2f}")
    if args.only in (None, "compile"):
        for pdrop in args.dropout:
            cpu = run("cpu", "compile", args.steps, pdrop, "0")
            print(f"torch.compile(backend='jax') of the forward and backward, AdamW eager, dropout {pdrop}, lengths "
                  f"{cpu['lengths']}: cpu eager total {cpu['total']:.2f} s, last 4 {cpu['last4']:.3f} s")
            rows = {}
            for dynamic in ("0", "1"):
                r = rows[dynamic] = run("jax", "compile", args.steps, pdrop, dynamic)
                worst = max(abs(a - b) for a, b in zip(r["losses"], cpu["losses"]))
                print(f"  jax dynamic={dynamic}: total {r['total']:.2f} s ({r['total'] / cpu['total']:.1f}x cpu), "
                      f"last 4 {r['last4']:.3f} s ({r['last4'] / cpu['last4']:.1f}x cpu), XLA compiles "
                      f"{sum(r['xla_compiles'])} (per step {r['xla_compiles']}), losses within {worst:.1e} of cpu; "
                      f"{r['stats']}; "
                      f"fallbacks {r['fallbacks_by_reason']}")
                print(f"    step times (s): {[round(t, 3) for t in r['times']]}")
            print(f"  dynamic on / off: total {rows['1']['total'] / rows['0']['total']:.2f}, "
                  f"last 4 {rows['1']['last4'] / rows['0']['last4']:.2f}")
    for job, model in (("generate", "GPT-2"), ("generate-llama", "a tiny Llama")):
        if args.only not in (None, job):
            continue
        cpu = run("cpu", job, 0, 0.0, "0")
        print(f"generate ({model}), 4 prompts x 24 tokens: cpu {cpu['total']:.2f} s, 4 more of nearby lengths "
              f"{cpu['again']:.2f} s")
        for dynamic in ("0", "1"):
            r = run("jax", job, 0, 0.0, dynamic)
            print(f"  jax dynamic={dynamic}: {r['total']:.2f} s ({r['total'] / cpu['total']:.0f}x cpu), 4 more "
                  f"{r['again']:.2f} s ({r['again'] / cpu['again']:.0f}x cpu), same tokens: "
                  f"{r['tokens'] == cpu['tokens']}; {r['stats']}; cuts {r['cuts_by_op']}")
    if args.only in (None, "lengths"):
        for pdrop in args.dropout:
            cpu = run("cpu", "lengths", 0, pdrop, "0")
            r = run("jax", "lengths", 0, pdrop, "1")
            worst = max(abs(a - b) for a, b in zip(r["losses"], cpu["losses"]))
            print(f"new lengths of the bucket 48, dropout {pdrop}: programs per training step {r['programs']}, "
                  f"losses within {worst:.1e} of cpu; {r['stats']}; cuts {r['cuts_by_op']}; "
                  f"fallbacks {r['fallbacks_by_reason']}")
    if args.only == "steady-ops":
        rows = {d: run("jax", "steady_ops", 5, 0.1, d) for d in ("0", "1")}
        print(f"warm steps at 129, op by op, each result waited for (best step: off {rows['0']['step'] * 1e3:.1f} ms, "
              f"on {rows['1']['step'] * 1e3:.1f} ms; in ops: off {rows['0']['in_ops'] * 1e3:.1f} ms, "
              f"on {rows['1']['in_ops'] * 1e3:.1f} ms)")
        names = list(dict.fromkeys([*rows["1"]["ops"], *rows["0"]["ops"]]))
        for name in names:
            off, on = rows["0"]["ops"].get(name, [0, 0]), rows["1"]["ops"].get(name, [0, 0])
            ratio = f"{on[0] / off[0]:.2f}" if off[0] else "-"
            print(f"  {name:40s} off {off[0] * 1e3:7.2f} ms ({off[1]:.0f} calls)  on {on[0] * 1e3:7.2f} ms "
                  f"({on[1]:.0f} calls)  {ratio}")
    if args.only in (None, "steady"):
        rows = {d: run("jax", "steady", 5, 0.0, d) for d in ("0", "1")}
        for n, fill in (("128", "100 %"), ("129", "81 %")):
            print(f"steady step at length {n} (bucket fill {fill}): dynamic off {rows['0'][n] * 1e3:.1f} ms, "
                  f"on {rows['1'][n] * 1e3:.1f} ms, ratio {rows['1'][n] / rows['0'][n]:.2f}")


if __name__ == "__main__":
    main()
