"""SPMD on cpu_ref split into 8 devices: meshes, sharded tensors shard by
shard, eager and compiled results equal to unsharded ones, data-parallel and
fully-sharded training equal to one-device training, the errors.

The tests need a process whose device client has 8 devices.  Run with
``PJRT_HOST_CPU_REF_DEVICES=8`` they run in this process; otherwise (the
whole suite, where the client has one device) the single test
``test_spmd_in_a_process_with_eight_devices`` runs this file in a child
process that has them.
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402,F401
from test_torch_training import TinyTransformer  # noqa: E402

nn = torch.nn
REPO = Path(__file__).resolve().parent.parent
EIGHT = os.environ.get("PJRT_HOST_CPU_REF_DEVICES") == "8"


@pytest.fixture(autouse=True)
def _eight_devices(request):
    if request.node.name.startswith("test_spmd_in_a_process_with_eight_devices"):
        return
    if request.node.get_closest_marker("multiprocess"):
        return
    if not EIGHT:
        pytest.skip("runs in the 8-device child (test_spmd_in_a_process_with_eight_devices)")


def test_spmd_in_a_process_with_eight_devices():
    if EIGHT:
        pytest.skip("this process has the 8 devices: the tests run here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "PYTEST_"))}
    env.update({"PJRT_HOST_CPU_REF_DEVICES": "8", "PJRT_DEVICE": "cpu_ref"})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                           "-m", "not multiprocess"],
                          capture_output=True, text=True, env=env, cwd=str(REPO), timeout=900,
                          stdin=subprocess.DEVNULL)
    # a crash (a negative return code) prints its report first: keep the head of stderr too
    head = proc.stderr[:4000] if proc.returncode < 0 else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + head + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def xs():
    if not EIGHT:  # module-scoped fixtures come before the autouse skip
        pytest.skip("runs in the 8-device child (test_spmd_in_a_process_with_eight_devices)")
    import pjrt_host.spmd as xs

    return xs


@pytest.fixture(scope="module")
def mesh(xs):
    return xs.Mesh(np.arange(8), (2, 4), ("x", "y"))


@pytest.fixture(scope="module")
def mesh1d(xs):
    return xs.get_1d_mesh("data")


def sharded(xs, cpu, mesh, spec):
    t = cpu.to("jax")
    xs.mark_sharding(t, mesh, spec)
    return t


# ---------------------------------------------------------------- meshes


def test_mesh_over_all_devices(xs, mesh):
    assert xs.global_device_count() == 8 == torch.jax.device_count()
    assert mesh.size() == 8 and dict(mesh.shape()) == {"x": 2, "y": 4}
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.get_axis_name_idx("y") == 1
    assert mesh.jax_mesh.devices.shape == (2, 4)
    assert [d.id for d in mesh.jax_mesh.devices.flat] == [d.id for d in pjrt_host.devices()]
    m = xs.get_1d_mesh("data")
    assert dict(m.shape()) == {"data": 8}
    assert xs.Mesh([3, 1], (2,)).axis_names == ("axis_0",)


def test_global_mesh(xs, mesh):
    assert xs.get_global_mesh() is None
    xs.set_global_mesh(mesh)
    try:
        t = sharded(xs, torch.randn(4, 8), None, ("x", "y"))
        assert xs.get_sharding(t).mesh == mesh.jax_mesh
    finally:
        xs.set_global_mesh(None)
    with pytest.raises(xs.ShardingError, match="no global mesh"):
        xs.mark_sharding(torch.randn(4).to("jax"), None, ("x",))


def test_the_plugin_orders_devices_of_a_mesh(xs, monkeypatch):
    """create_mesh / get_1d_mesh ask DevicePlugin.mesh_device_order (the
    TPU plugin's torus order); the core has no device-specific order."""
    plugin = pjrt_host._runtime.plugin()
    seen = []

    def reverse(mesh_shape, devices):
        seen.append((tuple(mesh_shape), len(devices)))
        return list(range(len(devices)))[::-1]

    monkeypatch.setattr(plugin, "mesh_device_order", reverse)
    m = xs.create_mesh((2, 4), ("a", "b"))
    assert seen == [((2, 4), 8)]
    assert m.get_logical_mesh().tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    monkeypatch.setattr(plugin, "mesh_device_order", lambda shape, devices: None)
    assert xs.get_1d_mesh().device_ids == tuple(range(8))


# ---------------------------------------------------------------- shard by shard


@pytest.mark.parametrize("spec, pieces", [
    (("x", "y"), (2, 4)), (("y", None), (4, 1)), ((("x", "y"), None), (8, 1)), ((None, "x"), (1, 2)),
    ((0, 1), (2, 4)), (("x",), (2, 1)), ((None, None), (1, 1)), ((), (1, 1)),
])
def test_shards_hold_their_piece(xs, mesh, spec, pieces):
    a = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16)
    t = sharded(xs, a, mesh, spec)
    arr = xs.jax_array(t)
    assert len(arr.addressable_shards) == 8
    for shard in arr.addressable_shards:
        assert shard.data.shape == (8 // pieces[0], 16 // pieces[1])
        np.testing.assert_array_equal(np.asarray(shard.data), a.numpy()[shard.index])
    assert t.device == torch.device("jax:0")
    expected = tuple(tuple(mesh.axis_names[e] for e in entry) if isinstance(entry, tuple) and entry and
                     isinstance(entry[0], int) else (mesh.axis_names[entry] if isinstance(entry, int) else entry)
                     for entry in spec)
    assert xs.get_partition_spec(t) == expected + (None,) * (2 - len(expected))
    torch.testing.assert_close(t.cpu(), a)


def test_unsharded_tensor_reports_no_sharding(xs):
    t = torch.randn(4).to("jax")
    assert xs.get_sharding(t) is None and xs.get_partition_spec(t) is None


def test_clear_sharding_gathers(xs, mesh):
    a = torch.randn(8, 4)
    t = sharded(xs, a, mesh, ("x", None))
    assert xs.clear_sharding(t) is t
    assert xs.get_sharding(t) is None
    assert xs.jax_array(t).sharding.device_set == {pjrt_host.devices()[0]}
    torch.testing.assert_close((t + 1).cpu(), a + 1)


# ---------------------------------------------------------------- eager ops

OPS = {
    "add": lambda a, b: a + b,
    "mul scalar": lambda a, b: a * 2.5,
    "matmul": lambda a, b: a @ b.t(),
    "sum dim": lambda a, b: a.sum(1),
    "sum all": lambda a, b: a.sum(),
    "mean keepdim": lambda a, b: a.mean(0, keepdim=True),
    "softmax": lambda a, b: torch.softmax(a, -1),
    "transpose add": lambda a, b: a.t() + b.t(),
    "relu": lambda a, b: torch.relu(a - b),
    "cat": lambda a, b: torch.cat([a, b], 0),
    "index": lambda a, b: a[torch.tensor([3, 1, 0], device=a.device)],
    "slice": lambda a, b: a[1:7:2, 4:],
    "layer_norm": lambda a, b: nn.functional.layer_norm(a, (16,)),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "cumsum": lambda a, b: a.cumsum(1),
    "max": lambda a, b: a.max(1).values,
    "reshape": lambda a, b: a.reshape(4, 32).sum(0),
    "einsum": lambda a, b: torch.einsum("ij,kj->ik", a, b),
}


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("spec", [("x", "y"), (None, ("x", "y"))])
def test_eager_ops_equal_unsharded(xs, mesh, name, spec):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    expected = OPS[name](a, b)
    out = OPS[name](sharded(xs, a, mesh, spec), sharded(xs, b, mesh, spec))
    assert out.device.type == "jax"
    assert xs.get_sharding(out) is not None, "results of sharded operands live on the mesh"
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_results_are_sharded_as_xla_propagates(xs, mesh):
    a = sharded(xs, torch.randn(8, 16), mesh, ("x", "y"))
    assert xs.get_partition_spec(a * 2) == ("x", "y")
    assert xs.get_partition_spec(a.sum()) == ()
    w = torch.randn(16, 4).to("jax")
    assert xs.get_partition_spec(sharded(xs, torch.randn(8, 16), mesh, ("x", None)) @ w)[0] == "x"


def test_sharded_meets_unsharded(xs, mesh):
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    s, u = sharded(xs, a, mesh, ("x", "y")), b.to("jax")
    torch.testing.assert_close((s + u).cpu(), a + b)
    torch.testing.assert_close((u * s).cpu(), b * a)
    torch.testing.assert_close((s + torch.tensor(2.0)).cpu(), a + 2)  # a 0-dim CPU tensor
    torch.testing.assert_close((u @ s.t()).cpu(), b @ a.t(), rtol=1e-5, atol=1e-5)
    # In place: the written tensor keeps its placement, as torch never moves a tensor in place.
    u.add_(s)
    assert xs.get_sharding(u) is None
    torch.testing.assert_close(u.cpu(), a + b)
    s.mul_(u)
    assert xs.get_partition_spec(s) == ("x", "y")
    torch.testing.assert_close(s.cpu(), a * (a + b))
    # Two meshes over other device orders.
    other = xs.Mesh(np.arange(8)[::-1], (8,), ("r",))
    r = sharded(xs, a, other, ("r", None))
    torch.testing.assert_close((r + s).cpu(), a + a * (a + b))


def test_in_place_ops_and_views_keep_the_sharding(xs, mesh):
    a = torch.randn(8, 16)
    t = sharded(xs, a, mesh, ("x", "y"))
    view = t[2:6, 1::3]
    torch.testing.assert_close(view.cpu(), a[2:6, 1::3])
    view.mul_(0.5)
    a[2:6, 1::3] *= 0.5
    t.t()[3].add_(1.0)  # a strided view
    a.t()[3] += 1.0
    t[0].copy_(torch.arange(16.0))  # a CPU tensor written through a view
    a[0] = torch.arange(16.0)
    t[1].copy_(torch.ones(16).to("jax"))  # an unsharded 'jax' tensor written through a view
    a[1] = 1
    t.clamp_(-1, 1)
    a.clamp_(-1, 1)
    assert xs.get_partition_spec(t) == ("x", "y")
    torch.testing.assert_close(t.cpu(), a)
    c = t.clone()
    c.zero_()
    torch.testing.assert_close(t.cpu(), a)
    assert xs.get_partition_spec(c) == ("x", "y")


def test_mark_sharding_reshards_every_view(xs, mesh):
    a = torch.randn(8, 16)
    t = a.to("jax")
    v = t[:, :4]
    xs.mark_sharding(t, mesh, (None, "y"))
    xs.mark_sharding(t, mesh, ("x", None))  # again, another spec
    assert xs.get_partition_spec(t) == ("x", None)
    torch.testing.assert_close(v.cpu(), a[:, :4])
    v.fill_(3.0)
    a[:, :4] = 3.0
    torch.testing.assert_close(t.cpu(), a)


def test_autograd_equals_unsharded(xs, mesh):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (torch.tanh(xr @ wr).softmax(-1) * torch.arange(8.0)).sum().backward()
    xj = sharded(xs, x, mesh, ("x", None)).requires_grad_()
    wj = sharded(xs, w, mesh, (None, "y")).requires_grad_()
    (torch.tanh(xj @ wj).softmax(-1) * torch.arange(8.0).to("jax")).sum().backward()
    torch.testing.assert_close(xj.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wj.grad.cpu(), wr.grad, rtol=1e-5, atol=1e-5)
    assert xs.get_sharding(wj.grad) is not None


def test_random_ops_on_sharded_tensors(xs, mesh):
    t = sharded(xs, torch.ones(8, 16), mesh, ("x", "y"))
    r = torch.randn_like(t)
    assert xs.get_partition_spec(r) == ("x", "y")
    d = nn.functional.dropout(t, 0.5, training=True)
    assert set(torch.unique(d.cpu()).tolist()) <= {0.0, 2.0}
    z = torch.zeros_like(t)
    assert xs.get_partition_spec(z) == ("x", "y") and not z.cpu().any()
    e = torch.empty_like(t)
    assert xs.get_partition_spec(e) == ("x", "y")


def test_cpu_printing_numpy_and_save_gather(xs, mesh, tmp_path):
    a = torch.randn(8, 16)
    t = sharded(xs, a, mesh, ("x", "y"))
    torch.testing.assert_close(t.cpu(), a)
    np.testing.assert_array_equal(t.numpy(), a.numpy())
    assert t.tolist() == a.tolist() and t[1, 2].item() == a[1, 2].item()
    assert repr(t) == repr(a.to("jax:0"))  # the unsharded tensor's print
    buf = io.BytesIO()
    torch.save({"w": t}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["w"].device.type == "jax"
    torch.testing.assert_close(loaded["w"].cpu(), a)
    sd = nn.Linear(16, 8).to("jax")
    xs.mark_sharding(sd.weight, mesh, ("x", "y"))
    torch.save(sd.state_dict(), tmp_path / "m.pt")
    torch.testing.assert_close(torch.load(tmp_path / "m.pt", map_location="cpu")["weight"], sd.weight.detach().cpu())


def test_with_sharding_constraint_eagerly_makes_a_new_tensor(xs, mesh):
    a = torch.randn(8, 16)
    t = a.to("jax")
    c = xs.with_sharding_constraint(t, mesh, ("x", "y"))
    assert xs.get_sharding(t) is None and xs.get_partition_spec(c) == ("x", "y")
    torch.testing.assert_close(c.cpu(), a)


# ---------------------------------------------------------------- errors


def test_a_reshape_of_a_whole_storage_is_shardable(xs, mesh1d):
    """arange(...).reshape(...) and x.view(...) shard like any tensor; the
    base keeps reading and writing the same values (it shares the storage
    with the view); a reordering of a whole storage (``t()``, ``permute``)
    shards the storage so that the view is split as asked; a view of part of
    the storage, or a reshape of a storage other views share, are refused
    with the fix."""
    w = torch.arange(128.0, device="jax").reshape(8, 16)
    xs.mark_sharding(w, mesh1d, ("data", None))
    assert xs.get_sharding(w) is not None
    assert torch.equal(w.cpu(), torch.arange(128.0).reshape(8, 16))
    base = torch.arange(128.0, device="jax")
    v = base.view(8, 16)
    xs.mark_sharding(v, mesh1d, ("data", None))
    base[3] = -1.0
    v[1, 0] = -2.0
    assert v[0, 3].item() == -1.0 and base[16].item() == -2.0
    assert torch.equal((v * 2).sum().cpu(), (base * 2).sum().cpu())
    shared = torch.arange(128.0, device="jax")
    part = shared[:64]  # another view of the storage stays in use
    with pytest.raises(xs.ShardingError, match="is a view of a tensor of shape"):
        xs.mark_sharding(shared.view(16, 8), mesh1d, ("data", None))
    # a reordering of the whole storage (t(), permute) shards its storage so
    # that the view is split as asked; the base shares it, split alike
    w = torch.arange(128.0, device="jax").reshape(16, 8).clone()
    wt = w.t()
    xs.mark_sharding(wt, mesh1d, (None, "data"))
    assert xs.get_partition_spec(wt) == (None, "data") and xs.get_partition_spec(w) == ("data", None)
    wt[1, 2] = -5.0
    assert w[2, 1].item() == -5.0 and torch.equal((wt @ w).cpu(), wt.cpu() @ w.cpu())
    p = torch.arange(2 * 8 * 4.0, device="jax").reshape(2, 8, 4).clone().permute(1, 2, 0)
    xs.mark_sharding(p, mesh1d, ("data", None, None))
    assert xs.get_partition_spec(p) == ("data", None, None)
    assert torch.equal(p.cpu(), torch.arange(2 * 8 * 4.0).reshape(2, 8, 4).permute(1, 2, 0))
    with pytest.raises(xs.ShardingError, match="shard a copy"):
        xs.mark_sharding(torch.randn(32, 8, device="jax").t()[:, ::2], mesh1d, (None, "data"))
    assert part.shape == (64,)


def test_errors_name_shape_mesh_and_fix(xs, mesh):
    t = torch.randn(10, 16).to("jax")
    with pytest.raises(xs.ShardingError) as e:
        xs.mark_sharding(t, mesh, ("x", "y", None))
    assert "(10, 16)" in str(e.value) and "'x': 2, 'y': 4" in str(e.value) and "one entry per dimension" in str(e.value)
    with pytest.raises(xs.ShardingError, match=r"'z' is not an axis of the mesh; use one of 'x', 'y' or None"):
        xs.mark_sharding(t, mesh, ("z", None))
    with pytest.raises(xs.ShardingError) as e:
        xs.mark_sharding(t, mesh, (("x", "y"), None))
    msg = str(e.value)
    assert "dimension 0 (size 10) is not divisible by 8" in msg and "pad that dimension to a multiple of 8" in msg
    assert "(10, 16)" in msg and "Mesh({'x': 2, 'y': 4}" in msg
    with pytest.raises(xs.ShardingError, match="an axis may split one dimension only"):
        xs.mark_sharding(t, mesh, ("x", "x"))
    with pytest.raises(xs.ShardingError, match=r"no device with id 8: .* 8 device\(s\) in this job, ids 0 ... 7"):
        xs.Mesh(np.arange(1, 9), (8,), ("d",))
    with pytest.raises(xs.ShardingError, match="holds 8 devices but 4 device ids"):
        xs.Mesh(np.arange(4), (2, 4))
    with pytest.raises(xs.ShardingError, match="a device id repeats"):
        xs.Mesh([0, 0], (2,))
    with pytest.raises(xs.ShardingError, match="is a view of a tensor of shape"):
        xs.mark_sharding(torch.randn(8, 16).to("jax")[:4], mesh, ("x",))
    with pytest.raises(xs.ShardingError, match="move it first"):
        xs.mark_sharding(torch.randn(8, 16), mesh, ("x",))
    with pytest.raises(xs.ShardingError, match=r"move it there first \(t.to\('jax:0'\)"):
        xs.mark_sharding(torch.randn(8, 16).to("jax:3"), mesh, ("x",))
    assert xs.get_sharding(t) is None  # nothing half-done


# ---------------------------------------------------------------- training


def fsdp(xs, model, mesh, axis="data"):
    """Every parameter split along its first dimension that the axis divides."""
    n = mesh.shape()[axis]
    for p in model.parameters():
        dim = next((d for d in range(p.dim()) if p.shape[d] % n == 0), None)
        spec = [None] * p.dim()
        if dim is not None:
            spec[dim] = axis
        xs.mark_sharding(p, mesh, tuple(spec))
    return model


def replicate(xs, model, mesh):
    for p in model.parameters():
        xs.mark_sharding(p, mesh, ())
    return model


def train(model, batches, loss_fn, opt_cls, steps, prepare=None, place_batch=None, **opt_kwargs):
    model = copy.deepcopy(model).to("jax")
    if prepare is not None:
        prepare(model)
    opt = opt_cls(model.parameters(), **opt_kwargs)
    losses = []
    for step in range(steps):
        x, y = (v.to("jax") for v in batches[step % len(batches)])
        if place_batch is not None:
            x, y = place_batch(x), place_batch(y)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


def _mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g), torch.randn(32, 8, generator=g))]
    return model, batches, nn.functional.mse_loss, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01)


def _transformer_case():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, 32, (16, 8), generator=g)]
    batches = [(t, t.roll(-1, dims=1)) for t in tokens]

    def loss_fn(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return TinyTransformer(vocab=32, dim=32, heads=4), batches, loss_fn, torch.optim.SGD, dict(lr=0.1, momentum=0.9)


CASES = {"mlp": _mlp_case, "transformer": _transformer_case}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["dp", "fsdp", "fsdp+dp"])
def test_training_equals_one_device(xs, mesh1d, case, mode):
    model, batches, loss_fn, opt_cls, kw = CASES[case]()
    steps = 3
    ref_model, _, ref_losses = train(model, batches, loss_fn, opt_cls, steps, **kw)

    def batch(t):
        return sharded_batch(xs, t, mesh1d)

    prepare = {"dp": lambda m: replicate(xs, m, mesh1d), "fsdp": lambda m: fsdp(xs, m, mesh1d),
               "fsdp+dp": lambda m: fsdp(xs, m, mesh1d)}[mode]
    place = None if mode == "fsdp" else batch
    m, opt, losses = train(model, batches, loss_fn, opt_cls, steps, prepare=prepare, place_batch=place, **kw)
    assert ref_losses[-1] < ref_losses[0]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(m.named_parameters(), ref_model.named_parameters()):
        # atol 1e-4: Adam turns a near-zero gradient's rounding (sums over
        # shards add in another order) into up to ~1e-2 of one lr=1e-2 step.
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-4, msg=name)
        assert xs.get_sharding(p) is not None, f"{name} left its mesh"
        if mode != "dp" and p.shape[0] % 8 == 0:
            assert xs.get_partition_spec(p)[0] == "data", f"{name} lost its sharding"
            for state in opt.state[p].values():
                if isinstance(state, torch.Tensor) and state.shape == p.shape:
                    assert xs.get_partition_spec(state) == xs.get_partition_spec(p), f"{name}'s optimizer state"


def sharded_batch(xs, t, mesh):
    xs.mark_sharding(t, mesh, ("data",))
    return t


def per_device_bytes(xs, tensors):
    """Bytes each device holds of ``tensors``."""
    held: dict[int, int] = {}
    for t in tensors:
        for shard in xs.jax_array(t).addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held


def test_fully_sharded_model_takes_an_eighth_per_device(xs, mesh1d):
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]).to("jax")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    fsdp(xs, model, mesh1d)
    held = per_device_bytes(xs, [p.detach() for p in model.parameters()])
    assert sorted(held) == list(range(8))
    assert all(v == total // 8 for v in held.values()), (held, total)
    replicate(xs, model, mesh1d)
    assert all(v == total for v in per_device_bytes(xs, [p.detach() for p in model.parameters()]).values())


# ---------------------------------------------------------------- torch.compile


def test_compile_keeps_input_and_output_shardings(xs, mesh):
    a, w = torch.randn(8, 16), torch.randn(16, 4)

    @torch.compile(backend="jax")
    def f(x, w):
        return torch.relu(x @ w) * 2, x + 1

    out, same = f(sharded(xs, a, mesh, ("x", None)), w.to("jax"))
    torch.testing.assert_close(out.cpu(), torch.relu(a @ w) * 2, rtol=1e-5, atol=1e-5)
    assert xs.get_partition_spec(out)[0] == "x"
    assert xs.get_partition_spec(same) == ("x", None)
    torch.testing.assert_close(same.cpu(), a + 1)
    # the same function on unsharded tensors still runs on one device
    out1, _ = f(a.to("jax"), w.to("jax"))
    assert xs.get_sharding(out1) is None


def test_mark_sharding_in_a_compiled_function_constrains(xs, mesh):
    a = torch.randn(8, 16)

    @torch.compile(backend="jax")
    def g(x):
        y = xs.mark_sharding(x * 3, mesh, (None, "y"))
        return y + 1

    for t in (a.to("jax"), sharded(xs, a, mesh, ("x", None))):
        r = g(t)
        assert xs.get_partition_spec(r) == (None, "y")
        torch.testing.assert_close(r.cpu(), a * 3 + 1)


def test_compiled_training_keeps_parameters_sharded(xs, mesh1d):
    model, batches, loss_fn, opt_cls, kw = _mlp_case()
    ref_model, _, ref_losses = train(model, batches, loss_fn, opt_cls, 3, **kw)
    m = copy.deepcopy(model).to("jax")
    fsdp(xs, m, mesh1d)
    cm = torch.compile(m, backend="jax")
    opt = opt_cls(m.parameters(), **kw)
    losses = []
    for step in range(3):
        x, y = batches[step % len(batches)]
        x = sharded_batch(xs, x.to("jax"), mesh1d)
        opt.zero_grad()
        loss = loss_fn(cm(x), y.to("jax"))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-4, msg=name)
        if p.shape[0] % 8 == 0:
            assert xs.get_partition_spec(p)[0] == "data", name


def test_compiled_optimizer_step_writes_back_sharded(xs, mesh1d):
    p = torch.randn(64, 8)
    w = sharded(xs, p.clone(), mesh1d, ("data", None))
    g = sharded(xs, torch.ones(64, 8), mesh1d, (None, None))

    @torch.compile(backend="jax")
    def step(w, g):
        w.sub_(0.1 * g)

    step(w, g)
    assert xs.get_partition_spec(w) == ("data", None)
    torch.testing.assert_close(w.cpu(), p - 0.1)


# ---------------------------------------------------------------- several processes


@pytest.mark.multiprocess
def test_two_processes_of_four_devices_make_one_mesh(tmp_path):
    """python -m pjrt_host launch, 2 processes x 4 cpu_ref devices on
    loopback: one mesh of 8 devices, a global tensor from each process's
    rows, results and training identical in both processes."""
    worker = REPO / "tests" / "spmd_worker.py"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PJRT_", "PYTEST_", "TORCHELASTIC_")) and k not in
           ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"PJRT_DEVICE": "cpu_ref", "PJRT_HOST_CPU_REF_DEVICES": "4", "PJRT_HOST_COORDINATOR_TIMEOUT": "60",
                "PYTHONUNBUFFERED": "1"})
    proc = subprocess.run([sys.executable, "-m", "pjrt_host", "launch", "--nproc-per-node", "2", str(worker),
                           str(tmp_path)], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=300,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    results = [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert results[0] == results[1], results
    assert results[0][0] == "8"


# ---------------------------------------------------------------- assume_pure, call_jax and jax_view


def test_assume_pure_and_call_jax_keep_shardings_and_gradients(xs, mesh1d):
    import jax.numpy as jnp

    from pjrt_host import interop

    w_cpu = torch.randn(16, 8)
    x_cpu = torch.randn(32, 16)
    w = w_cpu.to("jax").requires_grad_()
    x = xs.mark_sharding(x_cpu.to("jax"), mesh1d, ("data", None))
    assert interop.jax_view(x).sharding == xs.get_sharding(x)

    @pjrt_host.assume_pure
    def f(x, w):
        return interop.call_jax(jnp.tanh, x @ w)

    y = f(x, w)
    assert xs.get_partition_spec(y)[0] == "data"  # the batch stays split over the mesh
    y.square().sum().backward()
    wc = w_cpu.clone().requires_grad_()
    torch.tanh(x_cpu @ wc).square().sum().backward()
    torch.testing.assert_close(y.detach().cpu(), torch.tanh(x_cpu @ w_cpu), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-4)


def test_mark_sharding_inside_assume_pure_constrains_the_value(xs, mesh1d):
    @pjrt_host.assume_pure
    def f(x):
        return xs.mark_sharding(x * 2, mesh1d, ("data",))

    x = torch.arange(16.0, device="jax")
    y = f(x)
    assert xs.get_partition_spec(y)[0] == "data"
    torch.testing.assert_close(y.cpu(), torch.arange(16.0) * 2)
