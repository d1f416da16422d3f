"""Factories on the 'jax' device: values and shapes as torch CPU's, random factories' ranges, one table of factories, the default device."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- factories


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(2, 3, dtype=torch.int64, device=d),
    lambda d: torch.full((2, 2), 7.5, device=d),
    lambda d: torch.full((3,), 4, device=d),
    lambda d: torch.arange(5, device=d),
    lambda d: torch.arange(1.0, 2.0, 0.25, device=d),
    lambda d: torch.arange(-3, 10, 3, dtype=torch.float64, device=d),
    lambda d: torch.linspace(0, 1, 7, device=d),
    lambda d: torch.linspace(-2, 5, 4, dtype=torch.float64, device=d),
    lambda d: torch.eye(3, device=d),
    lambda d: torch.eye(2, 4, dtype=torch.int32, device=d),
    lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    lambda d: torch.tensor(3.5, device=d),
    lambda d: torch.tensor([True, False], device=d),
    lambda d: torch.zeros_like(torch.ones(2, 2, device=d)),
    lambda d: torch.ones_like(torch.ones(2, 2, dtype=torch.int16, device=d)),
    lambda d: torch.full_like(torch.ones(3, device=d), 2.0),
    lambda d: torch.ones(3, device=d).new_zeros(2),
    lambda d: torch.ones(3, device=d).new_full((2,), 5),
    lambda d: torch.scalar_tensor(2.0, device=d),
    lambda d: torch.empty(4, device=d).fill_(3),
    lambda d: torch.tril_indices(3, 3, device=d),
])
def test_factory_matches_cpu(make):
    got, want = make(DEV), make("cpu")
    assert got.device.type == DEV
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(cpu(got), want)


@pytest.mark.parametrize("make", [
    lambda d: torch.hann_window(5, device=d),
    lambda d: torch.hamming_window(6, False, 0.5, 0.4, device=d),
    lambda d: torch.bartlett_window(5, periodic=False, device=d),
    lambda d: torch.blackman_window(6, dtype=torch.float64, device=d),
    lambda d: torch.kaiser_window(7, False, 8.0, device=d),
    lambda d: torch.kaiser_window(5, device=d),
    lambda d: torch.fft.fftfreq(8, device=d),
    lambda d: torch.fft.rfftfreq(9, d=0.5, device=d),
    lambda d: torch.range(0, 4, 0.5, device=d),
    lambda d: torch.stft(torch.arange(64.0, device=d), 16, window=torch.hann_window(16, device=d),
                         return_complex=True).abs(),
], ids=["hann", "hamming", "bartlett", "blackman", "kaiser-beta", "kaiser", "fftfreq", "rfftfreq", "range", "stft"])
def test_torchs_composite_factories_match_cpu(make):
    """Factories whose kernel is torch's composite for every device: the
    window functions and fftfreq grow an ``empty(0)`` through an out= op
    (they raised that a 'jax' tensor cannot grow), kaiser_window calls a
    kernel only CPU and CUDA have (torch's internal assert), range looped
    through its own out= form; so ``torch.stft`` with a window made on the
    device failed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.range is deprecated
        got, want = make(DEV), make("cpu")
    assert got.device.type == DEV
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(cpu(got), want)


def test_empty_and_like_shapes():
    e = torch.empty(2, 5, device=DEV)
    assert e.shape == (2, 5) and e.device == torch.device("jax", 0)
    assert torch.empty_like(e).shape == (2, 5)
    r = torch.rand_like(e)
    assert r.device.type == DEV and bool(((cpu(r) >= 0) & (cpu(r) < 1)).all())
    assert torch.randn_like(e).shape == (2, 5)


_STRIDED_EMPTIES = {
    "empty_strided, a permutation": lambda d: torch.empty_strided((1, 4, 3), (4, 1, 4), device=d),
    "empty_strided, with gaps": lambda d: torch.empty_strided((2, 3), (6, 2), device=d),
    "empty, channels_last": lambda d: torch.empty((2, 3, 2, 2), memory_format=torch.channels_last, device=d),
    "new_empty_strided": lambda d: torch.zeros(2, device=d).new_empty_strided((3, 4), (1, 3)),
}


@pytest.mark.parametrize("name", list(_STRIDED_EMPTIES))
def test_empty_tensors_have_the_strides_they_were_given(name):
    """``empty_strided`` and a memory format's ``empty`` made a row-major
    tensor: the strides differed from CPU's, and an ``as_strided`` of it (or
    of a copy into it) read other elements than on CPU.  They now hold their
    storage in that order."""
    seen = {}
    for dev in ("cpu", DEV):
        t = _STRIDED_EMPTIES[name](dev)
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape))
        n = t.untyped_storage().nbytes() // t.element_size()
        seen[dev] = (tuple(t.shape), t.stride(), t.is_contiguous(), cpu(t).tolist(),
                     cpu(t.as_strided((t.numel(),), (1,)) if n == t.numel() else t.as_strided((2,), (n - 1,))).tolist())
    assert seen[DEV] == seen["cpu"]


def test_empty_strided_with_a_negative_stride_raises_cpus_error():
    """torch's meta kernel takes a negative stride; CPU's refuses it, and
    the device returned a tensor."""
    with pytest.raises(RuntimeError) as cpu_err:
        torch.empty_strided((2, 3), (-1, 2))
    with pytest.raises(RuntimeError) as dev_err:
        torch.empty_strided((2, 3), (-1, 2), device=DEV)
    assert str(dev_err.value) == str(cpu_err.value)


def test_factories_follow_the_default_dtype_and_argument_types_between_calls():
    """The meta kernels' results are kept per call (torch's meta arange is
    Python): the same call after ``torch.set_default_dtype`` changes, and
    calls whose arguments are equal but typed apart (``arange(5)`` and
    ``arange(5.0)``, ``full(..., 0.0)`` and ``full(..., -0.0)``), each get
    CPU's dtype and values."""
    calls = [lambda d: torch.ones(2, device=d), lambda d: torch.arange(5, device=d),
             lambda d: torch.arange(5.0, device=d), lambda d: torch.full((2,), -0.0, device=d),
             lambda d: torch.full((2,), 0.0, device=d), lambda d: torch.linspace(0, 1, 3, device=d)]
    before = torch.get_default_dtype()
    seen = {}
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            for dev in ("cpu", DEV):
                seen.setdefault(dev, []).extend(
                    (t.dtype, cpu(t).tolist(), [math.copysign(1, v) for v in cpu(t).flatten().tolist()])
                    for t in (c(dev) for c in calls))
    finally:
        torch.set_default_dtype(before)
    assert seen[DEV] == seen["cpu"]


def _programs() -> int:
    stats = torch.jax.program_cache_stats()
    return stats["compiled"] + stats["disk_hits"]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_full_of_a_value_that_changes_compiles_once_per_shape(eager):
    """A sampling loop's ``torch.full((b,), t)`` at every step: from the
    second value on, the value is an argument of the program, not part of
    it (a program per value before, and under fused eager the segment of
    every op after it compiled again at each step).  Every value, the
    special ones included, is CPU's, in the dtype CPU gives."""
    values = [0, 3, 7, 2 ** 40, -5, True, False, 0.5, -0.0, float("nan"), float("inf"), -1e300, 1e-45]
    with pjrt_host.config(eager=eager):
        for dtype in (None, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.float16,
                      torch.bfloat16):
            for v in values:
                if dtype is not None and (dtype.is_floating_point is False and type(v) is float
                                          or dtype in (torch.int32,) and type(v) is int and abs(v) >= 2 ** 31):
                    continue  # (torch's own conversion of those is not a value to compare)
                try:
                    want = torch.full((2, 3), v, dtype=dtype)
                except RuntimeError as err:  # it does not fit: the same error
                    with pytest.raises(RuntimeError, match="without overflow"):
                        torch.full((2, 3), v, dtype=dtype, device=DEV)
                    assert "without overflow" in str(err)
                    continue
                got = torch.full((2, 3), v, dtype=dtype, device=DEV).clone().cpu()
                assert got.dtype == want.dtype, (v, dtype)
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0, msg=f"{v!r} {dtype}")
                if want.dtype.is_floating_point:  # -0.0 keeps its sign
                    assert torch.equal(torch.signbit(got), torch.signbit(want)) or math.isnan(float(v)), (v, dtype)
        steps = []
        x = torch.ones(4, device=DEV)
        for t in range(8):  # the loop: one program for its first value, one once the value changes, then none
            before = _programs()
            y = (x * torch.full((4,), t, dtype=torch.long, device=DEV)).sin()
            assert torch.equal(y.cpu(), (torch.ones(4) * torch.full((4,), t)).sin())
            steps.append(_programs() - before)
    assert steps[2:] == [0] * 6, steps


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_a_flag_made_at_one_line_compiles_once_for_both_its_values(eager):
    """generate()'s max-length criterion, ``full((b,), cur_len >= max_len)``
    at every token: False until the last, then True.  A bool flag is a
    run-time argument from its first call: one program for both values
    (keyed by its value first, the turn to True compiled the flag, and under
    fused eager every segment holding it, again: a second generate() of the
    same prompt cost 3.5x the first one's steps)."""
    with pjrt_host.config(eager=eager):
        before = _programs()
        got = [torch.full((3,), v, dtype=torch.bool, device=DEV).cpu().tolist() for v in (False, False, True, False)]
        assert _programs() - before == 1
    assert got == [[False] * 3, [False] * 3, [True] * 3, [False] * 3]


@pytest.mark.parametrize("eager", ["op", "fused"])
def test_arange_from_a_start_that_changes_compiles_once_per_length(eager):
    """A decoding loop's position ids, ``arange(past, past + n)``: from the
    second start on (integers, of one length and step), the start is an
    argument of the program.  Values and dtypes are CPU's, for starts and
    steps of either sign and a start past int32."""
    calls = [(s, n, st) for s in (0, 5, -7, 2 ** 40, 13) for n, st in ((1, 1), (3, 1), (6, 2), (5, -1))]
    with pjrt_host.config(eager=eager):
        for start, n, step in calls:
            end = start + n * step if step > 0 else start - n
            for dtype in (None, torch.int64, torch.float32):
                want = torch.arange(start, end, step, dtype=dtype)
                got = torch.arange(start, end, step, dtype=dtype, device=DEV).clone().cpu()
                assert got.dtype == want.dtype and torch.equal(got, want), (start, end, step, dtype)
        steps = []
        for past in range(8):
            before = _programs()
            pos = torch.arange(past, past + 1, device=DEV) * 2
            assert pos.tolist() == [2 * past]
            steps.append(_programs() - before)
    assert steps[2:] == [0] * 6, steps


def test_random_factories_have_torch_shapes_and_ranges():
    assert torch.randn(3, 4, device=DEV).shape == (3, 4)
    u = cpu(torch.rand(1000, device=DEV))
    assert 0 <= u.min() and u.max() < 1 and 0.4 < u.mean() < 0.6
    i = cpu(torch.randint(3, 7, (500,), device=DEV))
    assert i.dtype == torch.int64 and i.min() >= 3 and i.max() <= 6
    p = cpu(torch.randperm(10, device=DEV))
    assert sorted(p.tolist()) == list(range(10))


def test_one_table_says_which_ops_are_factories():
    """The overloads that get a device kernel at ``import torch``
    (``_kernels.FACTORY_OPS``, which cannot import jax) are exactly the
    factory lowerings of ops without a tensor argument, each registered
    under its own name; ``empty_permuted`` alone reaches the device's
    fallback (computed on the CPU for its strides, then moved)."""
    from pjrt_host import _lowerings
    from pjrt_host._torch._boot import _kernels

    _lowerings.load_all()
    tables = {name: record for name, record in _lowerings._TABLE.items() if record.factory}
    made_from_nothing = set()
    for name in tables:
        packet, _, overload = name.removeprefix("aten::").partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        if not any(isinstance(a.type, torch.TensorType) for a in op._schema.arguments):
            made_from_nothing.add(name)
    listed = {"aten::" + name.removesuffix(".default") for name in _kernels.FACTORY_OPS}
    assert made_from_nothing - {"aten::empty_permuted"} == listed
    random = {name for name in listed if tables[name].needs_rng}
    assert random == {n for n in listed if n.split("::")[1].split(".")[0] in ("rand", "randn", "randint", "randperm")}


def test_ops_with_a_cpu_autograd_kernel_reach_the_device_as_themselves():
    """No lowered op takes torch's composite (math) kernel on the device's
    autograd key where CPU has an autograd kernel of its own
    (``_kernels.AUTOGRAD_KERNEL_OPS`` gives each such op a device kernel):
    torch's dispatch tables are read, so a torch release that adds one
    fails here.  SiLU's and Mish's bfloat16 gradients then equal CPU's (the
    composite rounded each of its steps: a SiLU gradient one bfloat16 step
    off, found by the differential fuzzer), and their double backward works."""
    import torch.nn.functional as F

    from pjrt_host import _lowerings
    from pjrt_host._torch._boot import _kernels

    _lowerings.load_all()

    def entry(name: str, key: str) -> str:
        return next((line for line in torch._C._dispatch_dump_table(name).splitlines()
                     if line.startswith(key + ":")), "")

    composite = [name for name in _lowerings._TABLE if name.startswith("aten::")
                 and "[autograd kernel]" in entry(name, "AutogradCPU")
                 and "[math kernel]" in entry(name, "AutogradPrivateUse1")]
    assert composite == []
    for name in _kernels.AUTOGRAD_KERNEL_OPS:  # each still needs its kernel
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "CompositeImplicitAutograd"), name
        assert "aten::" + name in _lowerings._TABLE, name
    x = torch.randn(4, 9, dtype=torch.float64) * 3
    for fn in (F.silu, F.mish):
        for dtype in (torch.bfloat16, torch.float16):
            got = {}
            for dev in ("cpu", DEV):
                t = x.to(dtype).to(dev).requires_grad_()
                fn(t).backward(torch.full_like(t, 3.0))
                got[dev] = t.grad.cpu()
            assert torch.equal(got["cpu"], got[DEV]), (fn.__name__, dtype)
        got = {}
        for dev in ("cpu", DEV):
            t = x.clone().to(dev).requires_grad_()
            (g,) = torch.autograd.grad(fn(t).sum(), t, create_graph=True)
            got[dev] = torch.autograd.grad((g * g).sum(), t)[0].cpu()
        torch.testing.assert_close(got[DEV], got["cpu"])


def test_default_device():
    torch.set_default_device(DEV)
    try:
        x = torch.zeros(2)
        y = torch.randn(3)
    finally:
        torch.set_default_device(None)  # ("cpu" would leave torch's DeviceContext mode on for later tests)
    assert x.device.type == DEV and y.device.type == DEV
    assert torch.zeros(1).device.type == "cpu"
