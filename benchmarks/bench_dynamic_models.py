"""transformers models trained at changing lengths, as a padding collator
gives them (docs/dynamic-shapes.md, "Real models at new lengths").

Each model (random weights, 2 layers, width 64, vocabulary 1000; nothing
downloaded) runs AdamW steps on batches of 2 at the lengths given (the
default: 20, 27, 33, 41, 45, 38, 29, 44: two buckets, 32 and 48), the
second row of each batch padded by its attention mask, dropout off (so that
the losses can be compared).  torch CPU eager first, then 'jax' in the
default eager mode in a fresh process with an empty program cache.

Per model it prints the largest difference of a loss from CPU's, the
programs each step compiled, the cuts and fallbacks of the padded route
(``torch.jax.dynamic_shape_stats()``), and the ratio that matters: the
median 'jax' step at a new length of a bucket it has seen (the steps after
the third, except a first step in a new bucket) over CPU's median step.

``--compile``: each model's forward and backward under
``torch.compile(backend='jax')`` (the loss from ``labels=``, as Trainer
passes them; AdamW eager), against torch CPU eager.  dynamo makes the
length symbolic at its second size, and a symbolic graph runs one program
per bucket of its sizes.

    python benchmarks/bench_dynamic_models.py [--models gpt2 llama ...] [--lengths 20,27,...] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODELS = ("gpt2", "llama", "mistral", "qwen2", "gemma", "phi", "neox", "opt", "gptj", "falcon", "bert", "roberta",
          "distilbert", "deberta", "t5", "bart")

#: The checkout this script is in: its children (``python -c``) import pjrt_host from
#: their working directory first, so they run there, and a benchmark measures its own tree.
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import torch, transformers

name, device, lengths = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
compiled_step = sys.argv[4] == "compile" and device != "cpu"
C = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
P = dict(max_position_embeddings=256)


def make():
    transformers.set_seed(0)
    t = transformers
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=256))
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**C, **P, num_key_value_heads=2))
    if name == "mistral":
        return t.MistralForCausalLM(t.MistralConfig(**C, **P, num_key_value_heads=2))
    if name == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**C, **P, num_key_value_heads=2))
    if name == "gemma":
        return t.GemmaForCausalLM(t.GemmaConfig(**C, **P, num_key_value_heads=1, head_dim=16))
    if name == "phi":
        return t.PhiForCausalLM(t.PhiConfig(**C, **P))
    if name == "neox":
        return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**C, **P))
    if name == "opt":
        return t.OPTForCausalLM(t.OPTConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                            num_attention_heads=4, word_embed_proj_dim=64, **P))
    if name == "gptj":
        return t.GPTJForCausalLM(t.GPTJConfig(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                              n_positions=256))
    if name == "falcon":
        return t.FalconForCausalLM(t.FalconConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2))
    if name == "bert":
        return t.BertForMaskedLM(t.BertConfig(**C, **P))
    if name == "deberta":
        return t.DebertaV2ForMaskedLM(t.DebertaV2Config(**C, **P, relative_attention=True, position_buckets=16,
                                                        pos_att_type=["p2c", "c2p"]))
    if name == "roberta":
        return t.RobertaForMaskedLM(t.RobertaConfig(**C, max_position_embeddings=260))
    if name == "distilbert":
        return t.DistilBertForMaskedLM(t.DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4,
                                                          hidden_dim=128, **P))
    if name == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(decoder_start_token_id=0, pad_token_id=0, vocab_size=1000,
                                                       d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4))
    if name == "bart":
        return t.BartForConditionalGeneration(t.BartConfig(
            decoder_start_token_id=2, pad_token_id=1, vocab_size=1000, d_model=64, encoder_layers=2,
            decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, **P))
    raise SystemExit(f"unknown model {name}")


def batches():
    g = torch.Generator().manual_seed(3)
    for n in lengths:
        ids = torch.randint(3, 1000, (2, n), generator=g)
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, n - 3:] = 0
        batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        if name in ("t5", "bart"):
            batch["labels"] = torch.randint(3, 1000, (2, n // 2 + 1), generator=g)
        yield batch


model = make().to(device)
model.eval()  # dropout off: the losses are compared with CPU's
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses, times, compiled = [], [], []
done = 0


def forward_backward(batch):
    loss = model(**batch).loss
    loss.backward()
    return loss


if compiled_step:
    forward_backward = torch.compile(forward_backward, backend="jax")
for batch in batches():
    start = time.perf_counter()
    loss = forward_backward({k: v.to(device) for k, v in batch.items()})
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
    times.append(time.perf_counter() - start)
    if device == "jax":
        stats = torch.jax.program_cache_stats()
        now = stats["compiled"] + stats["disk_hits"]
        compiled.append(now - done)
        done = now
result = {"losses": losses, "times": times, "compiled": compiled}
if device == "jax":
    stats = torch.jax.dynamic_shape_stats()
    result.update(cuts=stats["cuts_by_op"], fallbacks=stats["fallbacks_by_reason"])
print(json.dumps(result))
"""


def run(name: str, device: str, lengths: list[int], compiled: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_HOST_CACHE")}
        env["PJRT_HOST_CACHE_DIR"] = cache
        proc = subprocess.run([sys.executable, "-c", CHILD, name, device, ",".join(map(str, lengths)),
                               "compile" if compiled else "eager"], cwd=TREE,
                              capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} on {device} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def seen_bucket_steps(lengths: list[int], bucket: int = 16, compiled: bool = False) -> list[int]:
    """The steps whose length falls in a bucket that an earlier step ran
    padded (buckets of ``bucket``, the default up to 128).  Eager pads a dim
    from its third size on, to the bucket strictly above it (a full bucket
    goes to the next); dynamo makes a size symbolic at its second, and a
    symbolic graph's bucket holds a full one."""
    seen: set = set()
    out = []
    for i, n in enumerate(lengths):
        b = (n - 1) // bucket if compiled else n // bucket
        if b in seen:
            out.append(i)
        if i >= (1 if compiled else 2):
            seen.add(b)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--lengths", default="20,27,33,41,45,38,29,44")
    parser.add_argument("--compile", action="store_true", help="the forward and backward under torch.compile")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    steps = seen_bucket_steps(lengths, compiled=args.compile)
    print(f"lengths {lengths}; steps at a new length of a seen bucket: {steps}")
    print(f"{'model':<11} {'max |loss - cpu|':>17} {'cpu step':>9} {'jax seen':>9} {'ratio':>6}  programs a step; "
          f"cuts, fallbacks")
    for name in args.models:
        cpu = run(name, "cpu", lengths)
        jax = run(name, "jax", lengths, args.compile)
        diff = max(abs(a - b) for a, b in zip(cpu["losses"], jax["losses"]))
        cpu_step = statistics.median(cpu["times"][1:])
        seen = statistics.median([jax["times"][i] for i in steps]) if steps else float("nan")
        print(f"{name:<11} {diff:>17.2e} {cpu_step * 1e3:>7.1f}ms {seen * 1e3:>7.1f}ms {seen / cpu_step:>6.1f}  "
              f"{jax['compiled']}; {sum(jax['cuts'].values())}, {sum(jax['fallbacks'].values())}"
              + (f" {jax['cuts']} {jax['fallbacks']}" if jax["cuts"] or jax["fallbacks"] else ""), flush=True)


if __name__ == "__main__":
    main()
