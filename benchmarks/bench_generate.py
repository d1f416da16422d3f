"""Greedy generation from a fresh process: transformers GPT-2 (random
weights, 4 layers, width 128, vocabulary 1000), ``generate()`` of 32 new
tokens with its default cache (``--cache static``: transformers' static
cache, one shape for every decoding step), on 'jax' eager beside torch
CPU eager.

For each it prints the first call (everything compiles), the same prompt
again, a prompt of another length, the first prompt twice more
("steady": the second of these, every program it runs made before), and
last prompts of a third and a fourth length (21 and 19, both in the bucket
of 17): eager's places pad a dim at its third size, so the third length
compiles its bucket's programs once and the fourth compiles nothing.
Under torch.compile dynamo's symbolic graphs exist from the second length
on (automatic dynamic), so after it only a new bucket compiles.  The 'jax' runs go over one
program-cache directory: a cold process (an empty cache) and a second one
that finds the first one's programs on disk; then the same two with fused
eager.  Every run must generate CPU's tokens (the weights are the same
seeded random ones; greedy decoding).  ``--compile``: the 'jax' runs
compile ``model.forward`` with ``torch.compile(backend='jax')`` (dynamo
makes the growing cache's length symbolic at its second size, so its
graphs run in buckets), against CPU eager.

The second row is the floor of any device written in Python: CPU's own
tensors seen through a ``__torch_dispatch__`` subclass that does nothing
of its own (``dispatch_floor.py``): torch's dispatch into Python and a new
wrapper tensor per op, with CPU's kernels.  An eager figure cannot go
below it.

``--beams N``: beam search with N beams instead of greedy decoding (the
key/value cache reordered by the surviving beams at every token).

    python benchmarks/bench_generate.py [--tokens 32] [--compile] [--beams 3]

Ratios: each figure over CPU's.
"""

from __future__ import annotations

import argparse
import tempfile

from bench_cold_start import fresh_process

CHILD = r"""
import json, sys, time
import torch
import transformers

device, tokens, cache, compiled, beams = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
transformers.set_seed(0)
config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                                 bos_token_id=0, eos_token_id=0, pad_token_id=0)
model = transformers.GPT2LMHeadModel(config).eval()
if device == "floor":  # CPU tensors seen through a do-nothing Python __torch_dispatch__
    sys.path.insert(0, "benchmarks")
    from dispatch_floor import floor_module, unwrap, wrap
    floor_module(model)
    inputs, outputs = wrap, unwrap
else:
    model = model.to(device)
    inputs, outputs = (lambda ids: ids.to(device)), (lambda out: out.cpu())
if compiled:
    model.forward = torch.compile(model.forward, backend="jax")
g = torch.Generator().manual_seed(1)
prompt = torch.randint(1, 1000, (1, 12), generator=g)
other = torch.randint(1, 1000, (1, 17), generator=g)
third = torch.randint(1, 1000, (1, 21), generator=g)
fourth = torch.randint(1, 1000, (1, 19), generator=g)

def timed(ids):
    t = time.perf_counter()
    with torch.no_grad():
        extra = {} if cache == "default" else {"cache_implementation": cache}
        if beams > 1:  # beam search: the cache reordered by the surviving beams at every token
            extra.update(num_beams=beams, early_stopping=False)
        out = model.generate(inputs(ids), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **extra)
    out = outputs(out)  # the host waits for the tokens
    return time.perf_counter() - t, out[0].tolist()

first, a = timed(prompt)
again, b = timed(prompt)
new_length, c = timed(other)
timed(prompt)  # (under torch.compile its prefill's first symbolic graph: the first call's was static)
steady, d = timed(prompt)  # every program of it made before
third_length, e = timed(third)  # eager's places pad at their third size: its bucket's programs compile
fourth_length, f = timed(fourth)  # every program of its bucket (32) made before
out = {"first": first, "again": again, "new_length": new_length, "steady": steady, "third_length": third_length,
       "fourth_length": fourth_length, "tokens": [a, b, c, d, e, f]}
if device == "jax":
    out["programs"] = torch.jax.program_cache_stats()
    out["fallbacks"] = torch.jax.dynamic_shape_stats()["fallbacks"]
print(json.dumps(out))
"""


def run(device: str, tokens: int, env: dict[str, str], cache: str = "default", compiled: bool = False,
        beams: int = 1) -> dict:
    return fresh_process(CHILD, [device, str(tokens), cache, str(int(compiled)), str(beams)], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cache", default="default",
                        help="generate()'s cache_implementation ('static': one shape for every step)")
    parser.add_argument("--beams", type=int, default=1, help="beam search with this many beams (1: greedy)")
    parser.add_argument("--compile", action="store_true",
                        help="the 'jax' runs compile model.forward with torch.compile(backend='jax')")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as fused_cache:
        op = {"PJRT_HOST_CACHE_DIR": cache, "PJRT_HOST_EAGER": "op"}
        fused = {"PJRT_HOST_CACHE_DIR": fused_cache, "PJRT_HOST_EAGER": "fused"}
        b = args.beams
        cpu = run("cpu", args.tokens, {}, args.cache, beams=b)
        floor = ("cpu via a python subclass (floor)", run("floor", args.tokens, {}, args.cache, beams=b))
        if args.compile:
            rows = [("torch cpu", cpu), floor,
                    ("jax compiled, cold cache", run("jax", args.tokens, fused, args.cache, True, b)),
                    ("jax compiled, warm cache (2nd process)", run("jax", args.tokens, fused, args.cache, True, b))]
        else:
            rows = [("torch cpu", cpu), floor,
                    ("jax, cold cache", run("jax", args.tokens, op, args.cache, beams=b)),
                    ("jax, warm cache (2nd process)", run("jax", args.tokens, op, args.cache, beams=b)),
                    ("jax fused, cold cache", run("jax", args.tokens, fused, args.cache, beams=b)),
                    ("jax fused, warm cache (2nd process)", run("jax", args.tokens, fused, args.cache, beams=b))]
    keys = ("first", "again", "new_length", "steady", "third_length", "fourth_length")
    print(f"{'run':40s} {'first':>9s} {'again':>9s} {'new length':>11s} {'steady':>9s} {'3rd length':>11s}"
          f" {'4th length':>11s}   vs cpu: first / again / new / steady / 3rd / 4th length")
    for name, r in rows:
        ratios = "" if r is cpu else "   " + " ".join(f"{r[k] / cpu[k]:6.1f}x" for k in keys)
        print(f"{name:40s} {r['first']:8.3f}s {r['again']:8.3f}s {r['new_length']:10.3f}s {r['steady']:8.3f}s"
              f" {r['third_length']:10.3f}s {r['fourth_length']:10.3f}s{ratios}")
    for name, r in rows[2:]:
        print(f"{name:40s} programs: {r['programs']}; padded fallbacks: {r['fallbacks']}")
    wrong = [name for name, r in rows[1:] if r["tokens"] != cpu["tokens"]]
    print("tokens: " + (f"DIFFER from CPU's in {wrong}" if wrong else "every run generated CPU's tokens"))


if __name__ == "__main__":
    main()
