"""Spike for dynamic dimensions in buckets: two ways to run one program per
bucket on a padded array whose logical size is a runtime scalar, tried on
softmax, sum, matmul, layer norm, cross-entropy (over the sequence and over
the classes) and one attention block with its loss, on jaxlib's CPU client.
The write-up and the decision: docs/dynamic-shapes.md.

A  bounded dynamism: ``stablehlo.set_dimension_size(x, n)`` marks the dim as
   ``<=bucket`` and XLA's DynamicPadder masks what reads it; outputs that keep
   the dim are made static again (padded) by ``set_dimension_size`` to the
   bound (see ``unmark``).
B  explicit masks in plain jax: ``where(iota < n, x, neutral)`` before every
   reduction over the dim, and means divided by ``n``.

Both are checked against numpy (float64) on the logical data, with NaN in the
padding so that a leak shows, and timed against the program of the exact
(unpadded) size, all in one run: compile of one program per bucket, steady
per-call time (interleaved rounds, best round of each) and whether a second
logical size in the same bucket compiles again.

    python benchmarks/spike_dynamic_dims.py [--rounds 7] [--pairs 100:128 65:128 ...]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.interpreters import mlir  # noqa: E402
from jax._src.lib.mlir.dialects import hlo  # noqa: E402
from jax.extend.core import Primitive  # noqa: E402

BATCH, HIDDEN, VOCAB, CLS_ROWS = 4, 128, 1000, 64

# --- route A: two primitives around stablehlo.set_dimension_size ----------

_mark_p = Primitive("pjrt_host_mark_dynamic")
_mark_p.def_abstract_eval(lambda x, n, *, dim: x)
mlir.register_lowering(_mark_p, lambda ctx, x, n, *, dim: [hlo.set_dimension_size(x, n, dimension=dim)])

_unmark_p = Primitive("pjrt_host_unmark_dynamic")
_unmark_p.def_abstract_eval(lambda x, n, *, dim: x)


def _unmark_lowering(ctx, x, n, *, dim):
    # set_dimension_size to the static bound removes the dynamic dimension
    # (XlaBuilder::RemoveDynamicDimension). StableHLO folds it away when its
    # operand is typed static (jax types every result static), so the operand
    # is first re-typed bounded with the runtime size.
    bound = ctx.avals_in[0].shape[dim]
    dyn = hlo.set_dimension_size(x, n, dimension=dim)
    return [hlo.set_dimension_size(dyn, mlir.ir_constant(np.int32(bound)), dimension=dim)]


mlir.register_lowering(_unmark_p, _unmark_lowering)


def mark(x, n, dim=1):
    return _mark_p.bind(x, n, dim=dim)


def unmark(x, n, dim=1):
    return _unmark_p.bind(x, n, dim=dim)


def a_softmax(x, n):
    return unmark(jax.nn.softmax(mark(x, n), axis=1), n)


def a_sum(x, n):
    return mark(x, n).sum(1)


def a_matmul(x, y, n):  # contracts over the dynamic dim
    return jnp.einsum("blh,blk->bhk", mark(x, n), mark(y, n))


def a_layer_norm(x, n):  # normalises over the dynamic dim
    xm = mark(x, n)
    nf = n.astype(x.dtype)
    mean = xm.sum(1, keepdims=True) / nf  # jnp.mean would divide by the bucket
    var = ((xm - mean) ** 2).sum(1, keepdims=True) / nf
    return unmark((xm - mean) * jax.lax.rsqrt(var + 1e-5), n)


# jax.nn.log_softmax and jnp.take_along_axis are nested jits: a bounded type
# cannot cross their func.call (MLIR verifier), so log_softmax is written out
# and the dim is unmarked before the gather and marked again after (both are
# free once the padder has run).


def _log_softmax_inline(z):
    z = z - jax.lax.stop_gradient(z.max(-1, keepdims=True))
    return z - jnp.log(jnp.exp(z).sum(-1, keepdims=True))


def a_xent_seq(logits, target, n):  # [B, L, V], L dynamic
    lp = unmark(_log_softmax_inline(mark(logits, n)), n)
    nll = -jnp.take_along_axis(lp, target[..., None], axis=-1)[..., 0]
    return mark(nll, n).sum() / (n.astype(logits.dtype) * logits.shape[0])


def a_xent_cls(logits, target, n):  # [R, C], C (classes) dynamic
    lp = unmark(_log_softmax_inline(mark(logits, n, 1)), n, 1)
    return -jnp.take_along_axis(lp, target[:, None], axis=-1).mean()


def _ln_hidden(x):  # layer norm over the hidden dim: static, padding-safe
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def a_block(x, target, wq, wk, wv, wo, n):
    """One attention block and the loss, L dynamic: the padder follows L into
    both dims of the scores and masks the softmax and the p @ v contraction."""
    h = _ln_hidden(mark(x, n))
    q, k, v = h @ wq, h @ wk, h @ wv
    p = jax.nn.softmax(jnp.einsum("bqh,bkh->bqk", q, k) / np.sqrt(HIDDEN, dtype=np.float32), axis=-1)
    lp = unmark(_log_softmax_inline(jnp.einsum("bqk,bkh->bqh", p, v) @ wo), n)
    nll = -jnp.take_along_axis(lp, target[..., None], axis=-1)[..., 0]
    return mark(nll, n).sum() / (n.astype(x.dtype) * x.shape[0])


def a_mean_naive(x, n):  # what an unchanged lowering of mean does
    return jnp.mean(mark(x, n), axis=1)


# --- route B: explicit masks ----------------------------------------------


def _valid(x, n, dim=1):
    shape = [1] * x.ndim
    shape[dim] = x.shape[dim]
    return jax.lax.broadcasted_iota(jnp.int32, shape, dim) < n


def b_softmax(x, n):
    return jax.nn.softmax(jnp.where(_valid(x, n), x, -jnp.inf), axis=1)


def b_sum(x, n):
    return jnp.where(_valid(x, n), x, 0).sum(1)


def b_matmul(x, y, n):
    # both operands: 0 * NaN is NaN, and padding holds whatever ran on it
    m = _valid(x, n)
    return jnp.einsum("blh,blk->bhk", jnp.where(m, x, 0), jnp.where(m, y, 0))


def b_layer_norm(x, n):
    m = _valid(x, n)
    nf = n.astype(x.dtype)
    mean = jnp.where(m, x, 0).sum(1, keepdims=True) / nf
    var = jnp.where(m, (x - mean) ** 2, 0).sum(1, keepdims=True) / nf
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def b_xent_seq(logits, target, n):
    m = _valid(target, n)
    lp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(lp, jnp.where(m, target, 0)[..., None], axis=-1)[..., 0]
    return jnp.where(m, nll, 0).sum() / (n.astype(logits.dtype) * logits.shape[0])


def b_xent_cls(logits, target, n):
    lp = jax.nn.log_softmax(jnp.where(_valid(logits, n), logits, -jnp.inf), axis=-1)
    return -jnp.take_along_axis(lp, target[:, None], axis=-1).mean()


def b_block(x, target, wq, wk, wv, wo, n):
    m = _valid(target, n)  # [B, L]
    h = _ln_hidden(x)
    q, k, v = h @ wq, h @ wk, jnp.where(m[..., None], h @ wv, 0)  # v: 0 * NaN is NaN
    s = jnp.einsum("bqh,bkh->bqk", q, k) / np.sqrt(HIDDEN, dtype=np.float32)
    p = jax.nn.softmax(jnp.where(m[:, None, :], s, -jnp.inf), axis=-1)
    lp = jax.nn.log_softmax(jnp.einsum("bqk,bkh->bqh", p, v) @ wo, axis=-1)
    nll = -jnp.take_along_axis(lp, jnp.where(m, target, 0)[..., None], axis=-1)[..., 0]
    return jnp.where(m, nll, 0).sum() / (n.astype(x.dtype) * x.shape[0])


# --- exact size (today: one program per size) and numpy references ---------


def e_softmax(x):
    return jax.nn.softmax(x, axis=1)


def e_sum(x):
    return x.sum(1)


def e_matmul(x, y):
    return jnp.einsum("blh,blk->bhk", x, y)


def e_layer_norm(x):
    mean = x.mean(1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(1, keepdims=True) + 1e-5)


def e_xent_seq(logits, target):
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(lp, target[..., None], axis=-1).mean()


def e_xent_cls(logits, target):
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(lp, target[:, None], axis=-1).mean()


def e_block(x, target, wq, wk, wv, wo):
    h = _ln_hidden(x)
    q, k, v = h @ wq, h @ wk, h @ wv
    p = jax.nn.softmax(jnp.einsum("bqh,bkh->bqk", q, k) / np.sqrt(HIDDEN, dtype=np.float32), axis=-1)
    lp = jax.nn.log_softmax(jnp.einsum("bqk,bkh->bqh", p, v) @ wo, axis=-1)
    return -jnp.take_along_axis(lp, target[..., None], axis=-1).mean()


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_ref(op, args):
    a = [np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for v in args]
    if op == "softmax":
        z = np.exp(a[0] - a[0].max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)
    if op == "sum":
        return a[0].sum(1)
    if op == "matmul":
        return np.einsum("blh,blk->bhk", a[0], a[1])
    if op == "layer_norm":
        mu = a[0].mean(1, keepdims=True)
        return (a[0] - mu) / np.sqrt(((a[0] - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    if op == "block":
        x, tg, wq, wk, wv, wo = a
        mu = x.mean(-1, keepdims=True)
        h = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        q, k, v = h @ wq, h @ wk, h @ wv
        sc = np.einsum("bqh,bkh->bqk", q, k) / np.sqrt(HIDDEN)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        lp = _np_log_softmax(np.einsum("bqk,bkh->bqh", pr, v) @ wo)
        return -np.take_along_axis(lp, tg[..., None], axis=-1).mean()
    lp = _np_log_softmax(a[0])
    return -np.take_along_axis(lp, a[1][..., None], axis=-1).mean()


OPS = {
    "softmax": (a_softmax, b_softmax, e_softmax),
    "sum": (a_sum, b_sum, e_sum),
    "matmul": (a_matmul, b_matmul, e_matmul),
    "layer_norm": (a_layer_norm, b_layer_norm, e_layer_norm),
    "xent_seq": (a_xent_seq, b_xent_seq, e_xent_seq),
    "xent_cls": (a_xent_cls, b_xent_cls, e_xent_cls),
    "block": (a_block, b_block, e_block),
}


def make_inputs(op, length, bucket, rng):
    """(padded args with NaN / garbage in the padding, exact args, dynamic dims
    of the output (for slicing the padded result back))."""
    if op in ("softmax", "sum", "layer_norm", "matmul"):
        xs = [rng.standard_normal((BATCH, length, HIDDEN), dtype=np.float32) for _ in range(2 if op == "matmul" else 1)]
        padded = [np.concatenate([x, np.full((BATCH, bucket - length, HIDDEN), np.nan, np.float32)], 1) for x in xs]
        return padded, xs, (op in ("softmax", "layer_norm"))
    if op == "block":
        x = rng.standard_normal((BATCH, length, HIDDEN), dtype=np.float32)
        tg = rng.integers(0, VOCAB, (BATCH, length), dtype=np.int32)
        ws = [rng.standard_normal(shape, dtype=np.float32) / np.sqrt(HIDDEN, dtype=np.float32)
              for shape in [(HIDDEN, HIDDEN)] * 3 + [(HIDDEN, VOCAB)]]
        x_p = np.concatenate([x, np.full((BATCH, bucket - length, HIDDEN), np.nan, np.float32)], 1)
        tg_p = np.concatenate([tg, np.full((BATCH, bucket - length), 2**30, np.int32)], 1)
        return [x_p, tg_p] + ws, [x, tg] + ws, False
    if op == "xent_seq":
        lg = rng.standard_normal((BATCH, length, VOCAB), dtype=np.float32)
        tg = rng.integers(0, VOCAB, (BATCH, length), dtype=np.int32)
        lg_p = np.concatenate([lg, np.full((BATCH, bucket - length, VOCAB), np.nan, np.float32)], 1)
        tg_p = np.concatenate([tg, np.full((BATCH, bucket - length), 2**30, np.int32)], 1)
        return [lg_p, tg_p], [lg, tg], False
    lg = rng.standard_normal((CLS_ROWS, length), dtype=np.float32) * 3
    tg = rng.integers(0, length, (CLS_ROWS,), dtype=np.int32)
    lg_p = np.concatenate([lg, np.full((CLS_ROWS, bucket - length), np.nan, np.float32)], 1)
    return [lg_p, tg], [lg, tg], False


def check(op, out, args_exact, length, sliced):
    ref = np_ref(op, args_exact)
    got = np.asarray(out, np.float64)
    if sliced:
        got = got[:, :length]
    err = np.max(np.abs(got - ref) / (np.abs(ref) + 1.0))
    return bool(np.isfinite(err) and err < 1e-4), float(err)


def compile_seconds(fn, args):
    """(lower s, compile s, executable) of a fresh jit of fn, best of 3."""
    best_l = best_c = float("inf")
    exe = None
    for _ in range(3):
        f = jax.jit(lambda *a: fn(*a))  # a new function: no in-process cache hit
        t = time.perf_counter()
        low = f.lower(*args)
        t1 = time.perf_counter()
        exe = low.compile()
        t2 = time.perf_counter()
        best_l, best_c = min(best_l, t1 - t), min(best_c, t2 - t1)
    return best_l, best_c, exe


def best_per_call(fns: dict, calls: int, rounds: int) -> dict:
    """Best single-call seconds of each fn, rounds interleaved: on a shared
    machine the minimum of single calls is what load disturbs least."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        for _ in range(3):
            jax.block_until_ready(fn())
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(calls):
                t = time.perf_counter()
                jax.block_until_ready(fn())
                best[k] = min(best[k], time.perf_counter() - t)
    return best


def host_scalar_cost(calls: int, rounds: int) -> None:
    """What the logical size costs per call when it goes in as a host scalar
    (a transfer each call) rather than as a device array kept per value."""
    x = jax.device_put(np.ones((BATCH, 128, HIDDEN), np.float32))
    exe = jax.jit(b_sum).lower(x, np.int32(100)).compile()
    n_h, n_d = np.int32(100), jax.device_put(np.int32(100))
    best = best_per_call({"host": lambda: exe(x, n_h), "device": lambda: exe(x, n_d)}, calls, rounds)
    print(f"size as a host scalar: {best['host'] * 1e6:.1f} us per call, as a device scalar: "
          f"{best['device'] * 1e6:.1f} us (B sum, 100 of 128)")


def bucket_of(n: int) -> int:
    """The proposed buckets: multiples of 16 up to 128, then ~1.25x apart
    (rounded up to a multiple of 16)."""
    if n <= 128:
        return max(16, -(-n // 16) * 16)
    b = 128
    while b < n:
        b = -(-int(b * 1.25) // 16) * 16
    return b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=["128:128", "100:128", "65:128", "113:128", "65:80"],
                        help="logical:bucket pairs")
    parser.add_argument("--ops", nargs="+", default=list(OPS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    pairs = [tuple(int(v) for v in p.split(":")) for p in args.pairs]
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, {jax.devices()[0].platform}, "
          f"{os.cpu_count()} cpus; activations [{BATCH}, L, {HIDDEN}], xent_seq [{BATCH}, L, {VOCAB}], "
          f"xent_cls [{CLS_ROWS}, C]; buckets as bucket_of: 65->{bucket_of(65)}, 100->{bucket_of(100)}, "
          f"200->{bucket_of(200)}, 300->{bucket_of(300)}")

    # mean through an unchanged lowering: the padder masks the sum, jax divides by the bucket
    x = rng.standard_normal((BATCH, 100, HIDDEN), dtype=np.float32)
    xp = np.concatenate([x, np.full((BATCH, 28, HIDDEN), np.nan, np.float32)], 1)
    naive = np.asarray(jax.jit(a_mean_naive)(xp, np.int32(100)))
    print(f"A, jnp.mean over the dynamic dim unchanged: max |got/ref - 1| = "
          f"{np.max(np.abs(naive / x.astype(np.float64).mean(1) - 1)):.3f} (100 of 128: 0.219 if divided by 128)")
    print()

    host_scalar_cost(args.calls, args.rounds)
    print()

    head = (f"{'op':11}{'L/bkt':>8}{'route':>6}{'ok':>4}{'max err':>9}{'lower ms':>9}{'compile ms':>11}"
            f"{'2nd L':>6}{'run us':>9}{'exact us':>9}{'ratio':>7}")
    print(head)
    print("-" * len(head))
    for op in args.ops:
        fa, fb, fe = OPS[op]
        for length, bucket in pairs:
            padded, exact, sliced = make_inputs(op, length, bucket, rng)
            n = np.int32(length)
            el, ec, exe_e = compile_seconds(fe, exact)
            rows = {}
            exes = {}
            for route, fn in (("A", fa), ("B", fb)):
                try:
                    lo, co, exe = compile_seconds(fn, padded + [n])
                    ok, err = check(op, exe(*padded, n), exact, length, sliced)
                    # a second logical size in the same bucket: one jit, two sizes, count its cache
                    j = jax.jit(lambda *a, fn=fn: fn(*a))  # its own cache
                    j(*padded, n)
                    size = j._cache_size()
                    j(*padded, np.int32(max(1, length - 7)))
                    recompiled = j._cache_size() > size
                    exes[route] = exe
                    rows[route] = (ok, err, lo, co, recompiled)
                except Exception as e:  # noqa: BLE001  (a route that fails is a result)
                    rows[route] = (False, float("nan"), float("nan"), float("nan"), None)
                    print(f"{op:11}{f'{length}/{bucket}':>8}{route:>6}  failed: {type(e).__name__}: {str(e)[:90]}")
            # data stays on the device, as in the engine, the size too (see host_scalar_cost)
            exact_d = [jax.device_put(v) for v in exact]
            padded_d = [jax.device_put(v) for v in padded]
            n_d = jax.device_put(n)
            fns = {"E": lambda: exe_e(*exact_d)}
            for route, exe in exes.items():
                fns[route] = (lambda exe=exe: exe(*padded_d, n_d))
            best = best_per_call(fns, args.calls, args.rounds)
            for route in ("A", "B"):
                if route not in exes:
                    continue
                ok, err, lo, co, rec = rows[route]
                print(f"{op:11}{f'{length}/{bucket}':>8}{route:>6}{'y' if ok else 'NO':>4}{err:9.1e}"
                      f"{lo * 1e3:9.1f}{co * 1e3:11.1f}{'rec' if rec else 'no':>6}"
                      f"{best[route] * 1e6:9.1f}{best['E'] * 1e6:9.1f}{best[route] / best['E']:7.2f}")
            print(f"{op:11}{f'{length}/{bucket}':>8}{'E':>6}{'':>4}{'':>9}{el * 1e3:9.1f}{ec * 1e3:11.1f}")
    print()
    print("ok: matches numpy (float64) on the logical data, NaN in the padding; 2nd L: 'no' = a second logical "
          "size in the bucket reused the executable; ratio: run us / exact us (the exact-size program, E).")


if __name__ == "__main__":
    main()
