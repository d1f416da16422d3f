"""The program tests/test_torch_distributed.py runs in every rank (not a
test module).

    python tests/torch_distributed_worker.py MODE OUTDIR

MODE: ``all`` (collectives, DDP, DTensor, FSDP2, DCP), ``collectives``,
``mismatch`` (rank 1 all-reduces another shape), ``order`` (the ranks call
two collectives in another order), ``killed`` (rank 1 exits
while rank 0 is inside an all_reduce), ``stuck`` (rank 1 never joins rank
0's all_reduce) or ``cpu`` (a CPU-only program: init_process_group() with no
backend, gloo collectives, jax never imported).  Each rank writes
OUTDIR/rank<R>.json (``killed``: rank 0 only).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time


def collectives(dist, torch) -> dict:
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    c = torch.tensor([1.0 + r])
    dist.all_reduce(c)
    out["cpu_sum"] = c.tolist()
    x = torch.arange(4.0, device="jax") + 10 * r
    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        y = x.clone()
        dist.all_reduce(y, op=getattr(dist.ReduceOp, op))
        out[op] = y.tolist()
    i = torch.tensor([r + 1, 3], device="jax")
    dist.all_reduce(i, op=dist.ReduceOp.BXOR)
    out["bxor"] = i.tolist()
    g = [torch.empty(4, device="jax") for _ in range(n)]
    dist.all_gather(g, x)
    out["gather"] = [t.tolist() for t in g]
    gt = torch.empty(n * 4, device="jax")
    dist.all_gather_into_tensor(gt, x)
    out["gather_tensor"] = gt.tolist()
    rs = torch.empty(2, device="jax")
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n, device="jax") * (r + 1))
    out["reduce_scatter"] = rs.tolist()
    b = x.clone()
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b.tolist()
    a2a = torch.empty(2 * n, device="jax")
    dist.all_to_all_single(a2a, torch.arange(2.0 * n, device="jax") + 100 * r)
    out["all_to_all"] = a2a.tolist()
    v = torch.zeros(3, 4, device="jax")
    v[1].fill_(r + 1.0)
    dist.all_reduce(v[1])  # a view: only its elements change
    out["view"] = v.tolist()
    work = dist.all_reduce(x.clone(), async_op=True)
    work.wait()
    # Issued from two threads in turn, as DDP's bucket all_reduce (from
    # autograd's device thread) and then the loss's (from the main thread):
    # every rank's device runs them in the order they were issued.
    big, small = torch.full((4096,), 1.0 + r, device="jax"), torch.full((1,), 1.0 + r, device="jax")
    for _ in range(20):
        thread = threading.Thread(target=dist.all_reduce, args=(big,), kwargs={"async_op": True})
        thread.start()
        thread.join()
        dist.all_reduce(small, async_op=True)
    out["two_threads"] = [big[0].item(), big[-1].item(), small.item()]
    # uneven all_to_all_single: rank r sends s + 1 rows to rank s
    rows = torch.cat([torch.full((s + 1, 2), 100.0 * r + s, device="jax") for s in range(n)])
    uneven = torch.empty((r + 1) * n, 2, device="jax")
    dist.all_to_all_single(uneven, rows, [r + 1] * n, [s + 1 for s in range(n)])
    out["all_to_all_uneven"] = uneven[:, 0].tolist()
    # send/recv: blocking, then a ring of batch_isend_irecv in which every
    # rank sends first (queued, run in an order every rank derives alike)
    if r == 0:
        dist.send(torch.arange(3.0, device="jax") * 5, dst=n - 1)
    elif r == n - 1:
        got = torch.empty(3, device="jax")
        dist.recv(got, src=0)
        out["recv"] = got.tolist()
    mine, theirs = torch.full((2,), float(r), device="jax"), torch.empty(2, device="jax")
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, (r + 1) % n),
                                       dist.P2POp(dist.irecv, theirs, (r - 1) % n)]):
        req.wait()
    out["ring"] = theirs.tolist()
    sub = dist.new_group([0, 1])
    s = torch.ones(2, device="jax") * (r + 1)
    dist.all_reduce(s, group=sub)
    out["subgroup"] = s.tolist()
    dist.barrier()
    out["device"] = str(x.device)
    return out


def _net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4))


def _reference(torch, X, Y, n, steps, make_opt):
    ref = _net(torch)
    opt = make_opt(ref.parameters())
    full_x = torch.cat([X[i::n] for i in range(n)])
    full_y = torch.cat([Y[i::n] for i in range(n)])
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(full_x), full_y).backward()
        opt.step()
    return [p.detach() for p in ref.parameters()]


def training(dist, torch) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    X, Y = torch.randn(8, 16), torch.randn(8, 4)
    out = {}

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1)

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-2)

    # DDP, several gradient buckets: equal to one process on the full batch.
    ddp = DDP(_net(torch).to("jax"), bucket_cap_mb=0.001)
    opt = sgd(ddp.parameters())
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(X[r::n].to("jax")), Y[r::n].to("jax")).backward()
        opt.step()
    ref = _reference(torch, X, Y, n, 3, sgd)
    out["ddp_diff"] = max((a.detach().cpu() - b).abs().max().item() for a, b in zip(ddp.module.parameters(), ref))

    # DTensor on a 'jax' device mesh.
    mesh = init_device_mesh("jax", (n,))
    full = torch.randn(8, 4)
    d = distribute_tensor(full.to("jax"), mesh, [Shard(0)])
    out["dtensor_local"] = [list(d.to_local().shape), str(d.to_local().device)]
    out["dtensor_sum"] = [(d * 2).sum().full_tensor().item(), (full * 2).sum().item()]
    m = d @ distribute_tensor(torch.ones(4, 3).to("jax"), mesh, [Replicate()])
    out["dtensor_matmul_diff"] = (m.full_tensor().cpu() - full @ torch.ones(4, 3)).abs().max().item()

    # FSDP2: per-layer and root fully_shard, AdamW; equal to one process.
    model = _net(torch).to("jax")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = adamw(model.parameters())
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[r::n].to("jax")), Y[r::n].to("jax")).backward()
        opt.step()
    ref = _reference(torch, X, Y, n, 3, adamw)
    out["fsdp_diff"] = max((a.full_tensor().cpu() - b).abs().max().item() for a, b in zip(model.parameters(), ref))
    out["fsdp_local_numel"] = sum(p.to_local().numel() for p in model.parameters())
    out["total_numel"] = sum(p.numel() for p in ref)

    # FSDP2 on a transformers GPT-2 (per block and root), as its users shard
    # it; dropout off so both sides compute the same function.
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)

    def gpt2():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)

    lm = gpt2().to("jax")
    for block in lm.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(lm, mesh=mesh)
    lm_opt = sgd(lm.parameters())
    torch.manual_seed(2)
    ids = torch.randint(0, 64, (2 * n, 16))
    for _ in range(2):
        lm_opt.zero_grad()
        mine = ids[r::n].to("jax")
        lm(mine, labels=mine).loss.backward()
        lm_opt.step()
    ref_lm = gpt2()
    ref_opt = sgd(ref_lm.parameters())
    for _ in range(2):
        ref_opt.zero_grad()
        sum(ref_lm(ids[i::n], labels=ids[i::n]).loss for i in range(n)).div(n).backward()
        ref_opt.step()
    out["fsdp_gpt2_diff"] = max((a.full_tensor().cpu() - b.detach()).abs().max().item()
                                for a, b in zip(lm.parameters(), ref_lm.parameters()))

    # FSDP2 mixed precision: bfloat16 compute, float32 sharded parameters
    # and gradient reduction.
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp_model = _net(torch).to("jax")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(mp_model, mesh=mesh, mp_policy=policy)
    mp_out = mp_model(X[r::n].to("jax"))
    mp_out.float().square().mean().backward()
    out["fsdp_mixed_precision"] = [str(mp_out.dtype), str(mp_model[0].weight.dtype),
                                   str(mp_model[0].weight.grad.dtype)]

    # Distributed checkpoint of the FSDP2 model and optimizer: saved by both
    # ranks, loaded back into a fresh FSDP2 model; the test reshards it into
    # one process (dcp_to_torch_save).
    import torch.distributed.checkpoint as dcp

    ckpt = os.path.join(os.environ["PJRT_HOST_TEST_OUTDIR"], "dcp")
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=ckpt)
    fresh = _net(torch).to("jax")
    fully_shard(fresh, mesh=mesh)
    fresh_opt = adamw(fresh.parameters())
    fresh(X[:2].to("jax")).sum().backward()
    fresh_opt.step()  # optimizer state exists, with other values
    state = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["optim"])
    out["dcp_diff"] = max((a.full_tensor() - b.full_tensor()).abs().max().item()
                          for a, b in zip(model.parameters(), fresh.parameters()))
    full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    if r == 0:
        torch.save(full, os.path.join(os.environ["PJRT_HOST_TEST_OUTDIR"], "full.pt"))
    return out


#: The process group's timeout in the ``killed`` and ``stuck`` modes.
FAULT_TIMEOUT = datetime.timedelta(seconds=20)


def fault(dist, torch, mode: str, outdir: str) -> dict:
    """Rank 1 leaves rank 0 alone inside an all_reduce of a signature both
    have run once (so rank 0 goes straight into the device's collective):
    it exits (``killed``) or waits for rank 0's result file (``stuck``)."""
    r = dist.get_rank()
    x = torch.ones(1024, device="jax")
    dist.all_reduce(x)
    if r == 1:
        if mode == "killed":
            # rank 0 says when it goes into its all_reduce (a fixed sleep
            # raced it on a loaded machine); then give it a moment inside
            while not os.path.exists(os.path.join(outdir, "rank0_entering")):
                time.sleep(0.05)
            time.sleep(1.0)
            os._exit(3)
        while not os.path.exists(os.path.join(outdir, "rank0.json")):
            time.sleep(0.2)
        return {}
    open(os.path.join(outdir, "rank0_entering"), "w").close()
    start = time.monotonic()
    try:
        dist.all_reduce(x)
        error = None
    except RuntimeError as err:
        error = str(err)
    return {"error": error, "seconds": time.monotonic() - start}


def main(mode: str, outdir: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["PJRT_HOST_TEST_OUTDIR"] = outdir
    if os.environ.get("PJRT_HOST_TEST_SET_DEVICE"):
        torch.jax.set_device(int(os.environ["LOCAL_RANK"]))  # as a torchrun recipe does
    if mode in ("killed", "stuck"):
        dist.init_process_group(timeout=FAULT_TIMEOUT)
    else:
        dist.init_process_group()
    result = {"rank": dist.get_rank(), "backend_name": dist.get_backend_config()}
    if mode in ("killed", "stuck"):
        result.update(fault(dist, torch, mode, outdir))
        if dist.get_rank() == 0:
            with open(os.path.join(outdir, "rank0.json"), "w") as f:
                json.dump(result, f)
        # What the program does after such an error is its own: here it
        # stops, as a training script would.
        raise SystemExit(0 if dist.get_rank() == 1 else 1)
    if mode == "mismatch":
        x = torch.ones(4 + dist.get_rank(), device="jax")  # rank 1 passes another shape
        try:
            dist.all_reduce(x)
            result["error"] = None
        except RuntimeError as err:
            result["error"] = str(err)
    elif mode == "order":
        # both signatures agreed already; then the ranks call them in
        # another order (run under TORCH_DISTRIBUTED_DEBUG=DETAIL)
        a, b = torch.ones(4, device="jax"), torch.ones(6, device="jax")
        dist.all_reduce(a)
        dist.all_reduce(b)
        try:
            for t in ((a, b) if dist.get_rank() == 0 else (b, a)):
                dist.all_reduce(t)
            result["error"] = None
        except RuntimeError as err:
            result["error"] = str(err)
    elif mode == "cpu":
        t = torch.tensor([1.0 + dist.get_rank()])
        dist.all_reduce(t)
        result["cpu_sum"] = t.tolist()
        dist.barrier()
        result["jax_imported"] = "jax" in sys.modules
    else:
        result.update(collectives(dist, torch))
        if mode == "all":
            result.update(training(dist, torch))
    with open(os.path.join(outdir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
