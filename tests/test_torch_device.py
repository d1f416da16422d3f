"""The torch 'jax' device beyond one feature file: several devices, the plugin's
dtype mapping and lowering options, what compiles when, donation, pickling,
inference mode, DLPack moves, rounding as torch rounds, sparse gradients,
CPU indices and masks, errors as torch CPU words them.

One file per feature beside it: test_torch_factories, _moves,
_device_module, _errors, _dtypes, _config, _random."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- several devices


def test_second_device_in_subprocess():
    code = textwrap.dedent("""
        import torch
        assert torch.jax.device_count() == 2, torch.jax.device_count()
        a = torch.ones(3).to('jax:1')
        assert str(a.device) == 'jax:1'
        b = (a * 2).to('jax:0')
        assert str(b.device) == 'jax:0' and b.cpu().tolist() == [2.0, 2.0, 2.0]
        try:
            a + b
        except RuntimeError as e:
            assert 'jax:1 and jax:0' in str(e), e
        else:
            raise AssertionError('no error')
        with torch.jax.device(1):
            assert torch.zeros(1, device='jax').device.index == 1
        print('ok')
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    env["PJRT_HOST_CPU_REF_DEVICES"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_ops_that_only_overwrite_a_tensor_keep_it_on_its_device(eager):
    """An op whose program reads nothing of the tensor it writes (a random
    fill, fill_, zero_, nn.init) was placed by its other inputs, host
    values, on jax's default device: a layer made on jax:1 held its
    weights on device 0 while reporting jax:1."""
    code = textwrap.dedent("""
        import jax, torch
        layer = torch.nn.Linear(4, 3, device='jax:1')
        one = jax.devices()[1]  # the client exists now, with its two devices
        made = [layer.weight, layer.bias, torch.empty(5, device='jax:1').uniform_(-1, 1),
                torch.empty(5, device='jax:1').normal_(), torch.empty(5, device='jax:1').fill_(2.0),
                torch.ones(5, device='jax:1').zero_(), torch.empty(5, device='jax:1').bernoulli_(0.5),
                torch.rand(5, device='jax:1'), layer(torch.ones(2, 4, device='jax:1'))]
        torch.nn.init.trunc_normal_(made[2])
        for t in made:
            assert t.device == torch.device('jax:1'), t.device
            assert t._storage.array.devices() == {one}, (t.shape, t._storage.array.devices())
        print('ok')
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_") or k == "PJRT_HOST_CACHE_DIR"}
    env.update(PJRT_HOST_CPU_REF_DEVICES="2", PJRT_HOST_EAGER=eager)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_plugin_dtype_mapping_warns_once_in_subprocess():
    # A plugin that cannot hold float64: such tensors become float32 on the
    # device, with one warning, and ops keep working.
    code = textwrap.dedent("""
        import warnings
        import torch
        import pjrt_host

        class NoDouble(pjrt_host.DevicePlugin):
            jaxlib_backend = "cpu"
            unsupported_dtypes = {"float64": "float32"}

        pjrt_host.register_plugin("nodouble", NoDouble)
        pjrt_host.select("nodouble")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = torch.ones(3, dtype=torch.float64, device='jax')
            b = torch.tensor([1.5], dtype=torch.float64).to('jax')
            c = a.sum() + b
        assert a.dtype == torch.float32 and b.dtype == torch.float32 and c.dtype == torch.float32, (a.dtype, c.dtype)
        assert c.cpu().tolist() == [4.5]
        mapped = [w for w in caught if "does not support torch.float64" in str(w.message)]
        assert len(mapped) == 1, [str(w.message) for w in caught]
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_plugin_with_a_bad_lowering_option_is_refused_by_name():
    """A plugin whose conv_as_matmul_max_positions is not an int is refused
    at its first op with an error naming the plugin, the member and the
    value (it once failed with Python's bare ValueError from int())."""
    code = textwrap.dedent("""
        import torch
        import pjrt_host

        class Loose(pjrt_host.DevicePlugin):
            jaxlib_backend = "cpu"
            conv_as_matmul_max_positions = "64"

        pjrt_host.register_plugin("loose", Loose)
        pjrt_host.select("loose")
        try:
            torch.ones(3, device='jax') + 1
        except pjrt_host.PluginLoadError as err:
            print("refused:", err)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused:" in out.stdout and "'loose'" in out.stdout, out.stdout
    assert "conv_as_matmul_max_positions is '64', expected an int >= 0" in out.stdout, out.stdout


def test_changing_scalars_do_not_recompile_forever():
    """An optimizer passes a new step size every step: after a few values the
    op traces its scalars instead of compiling once per value (counted as
    XLA compilations, through jax's public monitoring events)."""
    import jax

    compiles = []

    def listener(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        x = torch.rand(8, device=DEV)
        y = torch.rand(8, device=DEV) + 1
        late = 0
        for i in range(12):
            if i == 8:
                late = len(compiles)
            out = torch.addcdiv(x, x, y, value=0.1 * (i + 1))
            z = x / (1.0 + i)
            torch.testing.assert_close(out.cpu(), torch.addcdiv(x.cpu(), x.cpu(), y.cpu(), value=0.1 * (i + 1)))
            torch.testing.assert_close(z.cpu(), x.cpu() / (1.0 + i))
        assert compiles, "the listener saw no compilation at all: the event name changed"
        assert len(compiles) == late, f"{len(compiles) - late} compilations in the last 4 steps"
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_small_random_tensors_of_new_shapes_do_not_compile_each_shape():
    """rand / randn / randint of at most 64k elements draw in power-of-two
    buckets: shapes of one bucket compile the random program once (XLA:CPU
    takes ~0.4 s per random program; cutting the draw to its shape compiles
    per shape, cheaply), and the draws stay reproducible.  Programs are
    counted by the torch op jax names them after, never by their seconds."""
    import jax

    compiles = []

    def listener(event: str, duration: float, fun_name: str = "", **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(fun_name)

    def random_programs(op: str) -> int:
        return sum(1 for name in compiles if name == f"jit(aten.{op})")

    torch.rand(7, 3, device=DEV)  # bucket 32, and the cut to (7, 3)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for shape in ((5, 5), (2, 13), (29,)):  # the same bucket of 32, new shapes
            torch.rand(*shape, device=DEV)
        assert random_programs("rand") == 0, f"the random program compiled again for new shapes: {compiles}"
        # in-place draws too, with new bounds per call, as nn.init gives each layer
        for n, bound in ((300, 0.5), (301, 0.25)):
            torch.empty(n, device=DEV).uniform_(-bound, bound)  # the trial of traced bounds happens here
        compiles.clear()
        for n, bound in ((302, 0.125), (333, 0.1), (400, 0.3)):
            w = torch.empty(n, device=DEV).uniform_(-bound, bound)
            assert float(w.abs().max()) <= bound
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert any(compiles), "the listener saw no compilation at all: the event changed"
    assert random_programs("uniform_") <= 1, f"3 draws of one bucket with new bounds compiled: {compiles}"
    torch.manual_seed(3)
    a = torch.randn(3, 4, device=DEV)
    torch.manual_seed(3)
    b = torch.randn(3, 4, device=DEV)
    torch.manual_seed(3)
    c = torch.randn(10, device=DEV)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu().reshape(-1)[:10], c.cpu())
    assert torch.randint(3, 9, (40,), device=DEV).cpu().min() >= 3 and a.shape == (3, 4)


def test_an_op_whose_lowering_branches_on_a_scalar_stays_compiled():
    """dropout's lowering branches on p: tracing p fails, and the op goes on
    compiling p as a constant (it once fell back to running op by op for the
    rest of the process)."""
    from pjrt_host._torch import _dispatch

    x = torch.ones(64, device=DEV)
    for p in (0.1, 0.2, 0.3, 0.0, 0.5, 1.0, 0.25):
        y = torch.nn.functional.dropout(x, p)
        kept = y.cpu()[y.cpu() != 0]
        assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p))) if p < 1 else not kept.numel()
    op = _dispatch._handlers[torch.ops.aten.native_dropout.default].__self__
    assert op.dynamic is False and op.eager is False


def test_in_place_writes_donate_only_arrays_nothing_else_holds():
    """An in-place op or a write through a view gives the storage's old
    buffer to the computation when nothing else holds its array (XLA then
    writes the result into that same buffer); a clone sharing the array, an
    array lent out, or the array passed twice, keep their values."""
    def buffer(t):
        return t._storage.array.unsafe_buffer_pointer()

    def program(t):
        t.add_(1)
        t[2:4].mul_(10)
        t[5:6].copy_(torch.tensor([-1.0], device=DEV))

    program(torch.arange(8.0, device=DEV))  # compiled (an op trying traced scalars runs twice, undonated)
    x = torch.arange(8.0, device=DEV)
    before = buffer(x)
    program(x)
    assert x.cpu().tolist() == [1.0, 2.0, 30.0, 40.0, 5.0, -1.0, 7.0, 8.0]
    assert buffer(x) == before  # updated in place, three times
    y = torch.arange(8.0, device=DEV)
    kept = y._storage.array  # lent out: must survive
    z = y.clone()  # shares the array until one of the two is written
    y.add_(1)
    y[0:2].mul_(3)
    assert not kept.is_deleted() and kept.tolist() == list(range(8))
    assert z.cpu().tolist() == [float(i) for i in range(8)] and y.cpu().tolist()[:3] == [3.0, 6.0, 3.0]
    w = torch.ones(4, device=DEV)
    w.add_(w)  # the same array as input and target
    assert w.cpu().tolist() == [2.0] * 4


def test_deepcopy_and_pickle():
    import copy
    import pickle

    m = torch.nn.Linear(3, 2).to(DEV)
    m2 = copy.deepcopy(m)
    assert m2.weight.device.type == DEV and torch.equal(m2.weight.cpu(), m.weight.cpu())
    with torch.no_grad():
        m2.weight.add_(1)
    assert not torch.equal(m2.weight.cpu(), m.weight.cpu())
    x = torch.arange(6.0, device=DEV).view(2, 3)
    y, w = copy.deepcopy((x, x[0]))  # a view and its base stay one storage
    w.mul_(10)
    assert y.cpu()[0].tolist() == [0.0, 10.0, 20.0] and x.cpu()[0].tolist() == [0.0, 1.0, 2.0]
    z = pickle.loads(pickle.dumps(x))
    assert z.device.type == DEV and torch.equal(z.cpu(), x.cpu())


def test_data_assignment_and_module_dtype_change():
    m = torch.nn.Linear(3, 2).to(DEV)
    w_cpu = m.weight.detach().cpu()
    m.double()  # nn.Module swaps parameter data in place
    assert m.weight.dtype == torch.float64
    torch.testing.assert_close(m.weight.detach().cpu(), w_cpu.double())
    out = m(torch.ones(1, 3, dtype=torch.float64, device=DEV))
    assert out.dtype == torch.float64
    p = torch.ones(2, device=DEV)
    p.data = torch.zeros(3, device=DEV)
    assert p.shape == (3,) and p.cpu().tolist() == [0.0, 0.0, 0.0]


def test_inference_mode_and_functorch():
    m = torch.nn.Linear(3, 2).to(DEV)
    with torch.inference_mode():
        y = m(torch.ones(2, 3, device=DEV))
        total = y.sum().item()  # aten::item arrives undecomposed here
    torch.testing.assert_close(total, m.cpu()(torch.ones(2, 3)).sum().item(), rtol=1e-5, atol=1e-5)
    g = torch.func.grad(lambda t: (t**2).sum())(torch.ones(3, device=DEV))
    assert g.device.type == DEV and g.cpu().tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("zero_copy", [("cpu",), ()])
def test_moves_use_dlpack_only_where_the_plugin_allows(monkeypatch, zero_copy):
    import jax

    from pjrt_host._torch import _conversion

    torch.zeros(1, device=DEV)  # the client exists
    monkeypatch.setattr(_conversion, "_zero_copy", zero_copy)
    calls = []
    real = jax.dlpack.from_dlpack
    monkeypatch.setattr(jax.dlpack, "from_dlpack", lambda x, *a, **k: calls.append(1) or real(x, *a, **k))
    c = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous source
    j = c.to(DEV)
    assert bool(calls) == bool(zero_copy)
    assert torch.equal(j.cpu(), c)
    c.zero_()  # the source is not aliased
    assert j.cpu().sum().item() == 66.0
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert torch.equal(b.to(DEV).cpu(), b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_stable_sort_gives_torch_cpus_indices_among_ties(dtype):
    """16-bit data holds many equal values: stable=True must give exactly
    torch CPU's order (its default sort is not stable, so only values are
    comparable there: the OpInfo test checks those)."""
    x = (torch.randint(0, 7, (3, 500)).to(dtype) / 3).to(dtype)
    for descending in (False, True):
        expected = torch.sort(x, dim=-1, descending=descending, stable=True)
        got = torch.sort(x.to(DEV), dim=-1, descending=descending, stable=True)
        assert torch.equal(got.values.cpu(), expected.values)
        assert torch.equal(got.indices.cpu(), expected.indices)
        assert torch.equal(torch.argsort(x.to(DEV), dim=0, descending=descending, stable=True).cpu(),
                           torch.argsort(x, dim=0, descending=descending, stable=True))


def test_reduced_precision_arithmetic_rounds_once_as_torch_does():
    """bfloat16 / float16 ops compute in float32 and round once (torch's
    opmath): fused formulas equal torch CPU exactly, where rounding after
    each step would be off by an ulp on some elements."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        a, b, c = (torch.randn(64, 64, generator=g).to(dtype) for _ in range(3))
        # Rounding after each step makes 500-2700 of the 4096 elements
        # differ for each of these; gelu's float32 erf differs from ATen's
        # in the last float32 bit, which moves a rare 16-bit rounding,
        # torch CPU's float16 matrix kernel sums in its own order, and
        # XLA:GPU fuses a multiply-add into one FMA (2 of 4096 on an H100;
        # exact on cpu_ref).
        for name, fn, allowed in (
                ("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.3), 4),
                ("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1, value=0.7), 4),
                ("lerp", lambda a, b, c: torch.lerp(a, b, 0.3), 0),
                ("cumsum", lambda a, b, c: torch.cumsum(a, dim=1), 0),
                ("logaddexp2", lambda a, b, c: torch.logaddexp2(a, b), 0),
                ("addmm", lambda a, b, c: torch.addmm(a, b, c, beta=0.5, alpha=0.25), 8),
                ("softmax", lambda a, b, c: torch.softmax(a, dim=-1), 0),
                ("gelu", lambda a, b, c: torch.nn.functional.gelu(a), 4)):
            expected = fn(a, b, c)
            got = fn(a.to(DEV), b.to(DEV), c.to(DEV)).cpu()
            assert got.dtype == dtype
            mismatched = (got != expected).sum().item()
            assert mismatched <= allowed, f"{name} {dtype}: {mismatched} of {got.numel()} elements differ from torch CPU"


def test_reduced_precision_numbers_are_rounded_where_torch_rounds_them():
    """A Python number beside a 16-bit tensor: torch casts it to the
    tensor's dtype for most ops (``x + 1e-3`` adds bfloat16(1e-3), so do a
    0-dim float32 tensor, add's ``alpha`` and hardshrink's ``lambd``), but
    keeps its float32 value in mul, division and Scalar arguments (slopes,
    lerp's weight, addcmul's value).  Each form equals torch CPU (the other
    rule makes 100-1500 of the 4096 elements differ), division within a few
    elements: XLA turns division by a broadcast number into multiplication
    by its reciprocal, an ulp off in float32 now and then."""
    s = 1.5071  # between two bfloat16 and two float16 values
    ops = {
        "add": lambda a: a + s, "sub": lambda a: a - s, "rsub": lambda a: s - a,
        "add_alpha": lambda a: torch.add(a, a, alpha=s), "add_0dim": lambda a: a + torch.tensor(s),
        "eq": lambda a: a == s, "pow": lambda a: a.abs() ** s, "rpow": lambda a: s ** a,
        "fmod": lambda a: torch.fmod(a, s), "remainder": lambda a: torch.remainder(a, s),
        "atan2_0dim": lambda a: torch.atan2(a, torch.tensor(s)),
        "hardshrink": lambda a: torch.nn.functional.hardshrink(a, s),
        "mul": lambda a: a * s, "div": lambda a: a / s, "div_floor": lambda a: torch.div(a, s, rounding_mode="floor"),
        "leaky_relu": lambda a: torch.nn.functional.leaky_relu(a, s / 10),
        "elu": lambda a: torch.nn.functional.elu(a, s), "lerp": lambda a: torch.lerp(a, 2 * a, s / 3),
        "addcmul": lambda a: torch.addcmul(a, a, a, value=s), "softplus": lambda a: torch.nn.functional.softplus(a, s),
        "rrelu_eval": lambda a: torch.nn.functional.rrelu(a, s / 10, s / 5),
        "nan_to_num": lambda a: torch.cat([a, a.new_tensor([float("inf"), -float("inf"), float("nan")])]).nan_to_num(),
        "nextafter": lambda a: torch.nextafter(a, a.new_tensor(100.0)),
    }
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(4096, generator=g) * 4).to(dtype)
        for name, fn in ops.items():
            expected = fn(x)
            got = fn(x.to(DEV)).cpu()
            assert got.dtype == expected.dtype, name
            differ = ((got != expected) & ~(got.isnan() & expected.isnan())).sum().item()
            allowed = 8 if name.startswith("div") else 0
            assert differ <= allowed, f"{name} {dtype}: {differ} of {got.numel()} elements differ from torch CPU"


def test_sparse_gradients_come_back_dense():
    """gather(sparse_grad=True) and nn.Embedding(sparse=True) ask autograd
    for a sparse gradient; the device has no sparse layout, and torch's
    sparse constructors in autograd's device thread ended the process.  The
    gradient is the dense one, with CPU's values (empty indices too), and
    double backward and an optimizer step work."""
    for op in ("aten::_gather_sparse_backward", "aten::embedding_backward"):  # else the backward below aborts
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutogradPrivateUse1"), \
            f"{op}: no dense-gradient kernel (did torch rename it?)"
    for n in (0, 2):
        x = torch.randn(3, 4, requires_grad=True)
        xj = x.detach().to(DEV).requires_grad_()
        idx = torch.tensor([[0, 3], [1, 1], [2, 0]])[:, :n]
        torch.gather(x, 1, idx, sparse_grad=True).pow(2).sum().backward()
        torch.gather(xj, 1, idx.to(DEV), sparse_grad=True).pow(2).sum().backward()
        assert xj.grad.layout == torch.strided
        torch.testing.assert_close(xj.grad.cpu(), x.grad.to_dense())
    grad, = torch.autograd.grad(torch.gather(xj, 1, idx.to(DEV), sparse_grad=True).pow(3).sum(), xj,
                                create_graph=True)
    second, = torch.autograd.grad(grad.sum(), xj)
    expected, = torch.autograd.grad(torch.autograd.grad(
        torch.gather(x, 1, idx).pow(3).sum(), x, create_graph=True)[0].sum(), x)
    torch.testing.assert_close(second.cpu(), expected)

    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb_j = copy.deepcopy(emb).to(DEV)
    ids = torch.tensor([[1, 2, 2], [5, 1, 9]])
    emb(ids).pow(2).sum().backward()
    emb_j(ids.to(DEV)).pow(2).sum().backward()
    torch.testing.assert_close(emb_j.weight.grad.cpu(), emb.weight.grad.to_dense())
    torch.optim.SGD(emb.parameters(), lr=0.1).step()
    torch.optim.SGD(emb_j.parameters(), lr=0.1).step()
    torch.testing.assert_close(emb_j.weight.detach().cpu(), emb.weight.detach())


def _torch_error(fn):
    """(type, message) of the error fn raises, or None."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the point is to compare them
        return type(err), str(err).splitlines()[0]
    return None


@pytest.mark.parametrize("case", [
    "take_empty_axis", "index_put_shape", "mask_assign_shape", "index_fill_complex"])
def test_errors_are_torchs_not_jaxs(case):
    """Bad inputs raise torch's exception type and message (not jax's
    'non-empty jnp.take() from an empty axis' or 'Incompatible types for
    broadcasting')."""
    fns = {
        "take_empty_axis": lambda d: torch.empty(0, 3, device=d)[torch.tensor([0], device=d)],
        "index_put_shape": lambda d: torch.ones(4, 3, device=d).index_put_(
            (torch.tensor([0, 1], device=d),), torch.ones(3, 3, device=d)),
        "mask_assign_shape": lambda d: torch.ones(4, device=d).__setitem__(
            torch.tensor([True, False, True, False], device=d), torch.ones(3, device=d)),
        "index_fill_complex": lambda d: torch.ones(3, device=d).index_fill(0, torch.tensor([0], device=d), 1j),
    }
    expected = _torch_error(lambda: fns[case]("cpu"))
    got = _torch_error(lambda: fns[case](DEV))
    assert expected is not None and got is not None
    assert got[0] is expected[0] or issubclass(got[0], expected[0]), (got, expected)
    assert got[1].split(":")[0] == expected[1].split(":")[0] or got[1] == expected[1], (got, expected)


def test_out_tensors_are_resized_as_torch_resizes_them():
    """out= of another shape is resized to the result (torch's warning when
    it held elements); resize_as_ within the storage works."""
    for dev in ("cpu", DEV):
        out = torch.empty(0, dtype=torch.long, device=dev)
        assert torch.nonzero(torch.tensor([1, 0, 2], device=dev), out=out) is out
        assert out.cpu().flatten().tolist() == [0, 2] and out.shape == (2, 1)
        values, indices = torch.empty(1, device=dev), torch.empty(1, dtype=torch.long, device=dev)
        with pytest.warns(UserWarning, match="resized"):
            torch.sort(torch.tensor([3.0, 1.0, 2.0], device=dev), out=(values, indices))
        assert values.cpu().tolist() == [1.0, 2.0, 3.0] and indices.cpu().tolist() == [1, 2, 0]
        x = torch.arange(6.0, device=dev).reshape(2, 3)
        assert x.resize_as_(torch.ones(1, 3, device=dev)).cpu().tolist() == [[0.0, 1.0, 2.0]]


def test_uint8_index_is_a_mask_as_on_cpu():
    x = torch.arange(12.0).reshape(3, 4)
    mask = torch.tensor([1, 0, 1], dtype=torch.uint8)
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        got = x.to(DEV)[mask.to(DEV)]
    with pytest.warns(UserWarning):
        expected = x[mask]
    assert torch.equal(got.cpu(), expected)


def test_cpu_indices_and_masks_index_a_device_tensor_as_on_cuda():
    # torch's accelerators take index tensors and masks left on the CPU
    # (PyTorch's test_indexing: test_cpu_indices); found by running its
    # device-generic tests on 'jax'.
    import warnings

    x = torch.arange(6.0)
    d = x.to(DEV)
    idx, mask = torch.tensor([0, 2]), x > 2
    assert torch.equal(d[idx].cpu(), x[idx]) and torch.equal(d[mask].cpu(), x[mask])
    d2, x2 = d.clone(), x.clone()
    d2[mask], x2[mask] = 0.0, 0.0
    assert torch.equal(d2.cpu(), x2)
    acc = d.clone().index_put_((idx,), torch.ones(2, device=DEV), accumulate=True)
    assert torch.equal(acc.cpu(), x.clone().index_put_((idx,), torch.ones(2), accumulate=True))
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        d[torch.tensor([0, 9])].cpu()  # checked like a device index
    # each uint8 mask warns, as on CPU
    m = torch.arange(6.0).reshape(2, 3)
    masks = (torch.tensor([1, 0], dtype=torch.uint8), torch.tensor([1, 0, 1], dtype=torch.uint8))
    for t in (m, m.to(DEV)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = t[masks[0].to(t.device), masks[1].to(t.device)]
        assert len([w for w in seen if "uint8" in str(w.message)]) == 2
        assert got.cpu().tolist() == [0.0, 2.0]


def test_index_fill_gather_scatter_take_a_cpu_index():
    x = torch.arange(6.0)
    d = x.to(DEV)
    idx = torch.tensor([0, 2])
    assert torch.equal(d.index_fill(0, idx, -1.0).cpu(), x.index_fill(0, idx, -1.0))
    assert torch.equal(d.index_fill(0, index=idx, value=-1.0).cpu(), x.index_fill(0, idx, -1.0))
    assert torch.equal(d.gather(0, idx).cpu(), x.gather(0, idx))
    assert torch.equal(d.index_select(0, idx).cpu(), x.index_select(0, idx))
    assert torch.equal(d.scatter(0, idx, torch.ones(2, device=DEV)).cpu(), x.scatter(0, idx, torch.ones(2)))
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        d.index_fill(0, torch.tensor([9]), 1.0).cpu()


def _errors(program):
    out = []
    for dev in ("cpu", DEV):
        with pytest.raises(Exception) as info:
            program(dev)
        out.append((type(info.value), str(info.value).split(" (raised by")[0]))
    return out


@pytest.mark.parametrize("program", [
    lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]],
    lambda d: torch.zeros(5, 5, device=d).__setitem__(([0, 1], [0, 1, 2]), 0),
    lambda d: torch.zeros(3, device=d)[torch.tensor([], device=d)],
    lambda d: torch.ones(5, 4, 3, device=d)[torch.tensor([True], device=d)],
    lambda d: torch.ones(5, 4, 3, device=d)[:, torch.zeros(4, 4, dtype=torch.bool, device=d)],
    lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...],
    lambda d: torch.ops.aten.index.Tensor(torch.ones(1, device=d), []),
    lambda d: torch.rand([], device=d).index_put([], torch.tensor([1.0], device=d), True),
    lambda d: torch.randn(3, device=d).clamp(),
    lambda d: torch.nonzero(torch.tensor([0, 1], device=d), out=torch.empty(0, device=d)),
], ids=["broadcast", "broadcast-put", "float-index", "mask-shape", "mask-shape-dim1", "bool-scalar", "no-index",
        "put-no-index", "clamp", "nonzero-out"])
def test_bad_arguments_raise_cpus_error_type_and_text(program):
    """torch's meta kernels raise RuntimeError (or ValueError) where its CPU
    and cuda kernels raise IndexError; users and PyTorch's own tests catch
    the latter."""
    (cpu_type, cpu_text), (jax_type, jax_text) = _errors(program)
    assert jax_type is cpu_type and jax_text.replace(" ", "") == cpu_text.replace(" ", "")


def test_strided_tensors_report_sparse_and_dense_dims_and_draw_complex_uniforms():
    for shape in ((), (2,), (2, 3)):
        x = torch.rand(shape, dtype=torch.complex128, device=DEV)
        assert (x.sparse_dim(), x.dense_dim()) == (0, len(shape))
    z = torch.rand(4000, dtype=torch.complex64, device=DEV).cpu()
    for part in (z.real, z.imag):
        assert 0 <= part.min() and part.max() < 1 and abs(part.mean() - 0.5) < 0.05


def test_assigning_real_and_imag_writes_the_complex_tensor():
    """``z.real = v`` / ``z.imag = v`` change z as on CPU (the real view the
    device computes as a new tensor would lose the assignment)."""
    for dev in ("cpu", DEV):
        z = torch.tensor([1 + 2j, 3 + 4j, 5 + 6j], dtype=torch.complex64, device=dev)
        z.real = torch.tensor([10.0, 20.0, 30.0], device=dev)
        z.imag = torch.tensor(7.0, device=dev)
        assert z.cpu().tolist() == [10 + 7j, 20 + 7j, 30 + 7j], dev
        assert z.real.cpu().tolist() == [10.0, 20.0, 30.0]
        with pytest.raises(RuntimeError, match="non-complex"):
            torch.ones(3, device=dev).imag = torch.zeros(3, device=dev)


def test_the_traced_scalar_trial_compares_results_as_documented():
    """An op that traces its scalars keeps doing so only where the traced
    program's results equal the per-value program's: equal values, floats
    within 1e-6 relative, NaN where both have NaN; dtype or shape differences
    never pass (the comparison runs on the host, _scalar_trials._same)."""
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from pjrt_host._torch._scalar_trials import _same

    nan = float("nan")
    assert _same(jnp.array([1.0, nan, -0.0]), jnp.array([1.0, nan, 0.0]))
    assert _same(jnp.array([1.0]), jnp.array([1.0 + 1e-7]))
    assert not _same(jnp.array([1.0]), jnp.array([1.001]))
    assert not _same(jnp.array([nan]), jnp.array([1.0]))
    assert not _same(jnp.array([1.0, 2.0]), jnp.array([1.0]))
    assert not _same(jnp.array([1], jnp.int32), jnp.array([1.0]))
    assert _same(jnp.array([3, 4]), jnp.array([3, 4])) and not _same(jnp.array([3, 4]), jnp.array([3, 5]))
    half = np.array([1.5, 2.0], ml_dtypes.bfloat16)
    assert _same(jnp.asarray(half), jnp.asarray(half)) and not _same(jnp.asarray(half), jnp.asarray(half * 2))
    assert _same(jnp.array([1 + 2j]), jnp.array([1 + 2j])) and not _same(jnp.array([1 + 2j]), jnp.array([1 - 2j]))
    assert _same(jnp.array([True, False]), jnp.array([True, False]))
