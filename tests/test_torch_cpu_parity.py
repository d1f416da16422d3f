"""Results and errors as torch CPU gives them: stable sort's indices among ties,
reduced-precision rounding, errors worded as torch's (not jax's), ``out=``
resizing, and CPU index tensors and masks indexing a device tensor."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

F = torch.nn.functional

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


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


def test_resize_within_the_storage_and_from_an_empty_one_as_on_cpu():
    """resize_ to more elements than the tensor has but no more than its
    storage holds (a slice grown back over its base) sees the base's
    values, as on CPU; it raised torch's setStorage error, the tensor's
    own metadata spanning only its elements.  An empty tensor grows onto a
    new storage; one that holds elements cannot grow, and says so."""
    results = {}
    for dev in ("cpu", DEV):
        x = torch.arange(8.0, device=dev)
        grown = x[0:2].resize_(6)
        empty_view = x[4:4].resize_(2)
        empty_view.fill_(-1.0)
        e = torch.empty(0, device=dev)
        e.resize_(2, 3)
        e.fill_(2.0)
        z = torch.ones(2, 2, 2, 2, device=dev).resize_(2, 2, 2, 2, memory_format=torch.channels_last)
        results[dev] = (grown.cpu().tolist(), grown._version, x.cpu().tolist(), e.shape, e.stride(),
                        e._version, e.cpu().sum().item(), z.stride())
    assert results[DEV] == results["cpu"]
    with pytest.raises(NotImplementedError, match="growing a 'jax' tensor of 2 elements in place"):
        torch.ones(2, device=DEV).resize_(5)


def test_an_out_view_resized_within_its_storage_writes_into_it_as_on_cpu():
    """An out= view resized to a larger result that fits its storage is
    resized there, as CPU resizes it: the base (and every view of that
    storage) sees the values, the out tensor keeps its storage.  It used to
    get a storage of its own, leaving the base unchanged (found by
    tests/fuzz_programs.py).  Growing past the storage is the one case left
    (docs/fuzzing.md)."""
    import warnings

    results = {}
    for dev in ("cpu", DEV):
        for mode in ("op", "fused"):
            with pjrt_host.config(eager=mode), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x = torch.ones(3, device=dev)
                base = torch.zeros(6, device=dev)
                out = base[1:3]
                torch.add(x, x, out=out)
                storage_kept = out.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
                ints = torch.full((8,), -1, dtype=torch.long, device=dev)
                torch.nonzero(torch.tensor([1.0, 0.0, 2.0], device=dev), out=ints[:1])
                results[dev, mode] = (base.cpu().tolist(), out.shape, out.stride(), out._version, storage_kept,
                                      ints.cpu().tolist())
    expected = ([0.0, 2.0, 2.0, 2.0, 0.0, 0.0], (3,), (1,), 1, True, [0, 2, -1, -1, -1, -1, -1, -1])
    assert results == {key: expected for key in results}


@pytest.mark.parametrize("shapes", [
    ((3, 2, 4), (3, 4, 2), (3, 2, 2)),  # bmm into an out of the result's shape
    ((3, 2, 4), (3, 4, 2), (0,)),  # bmm into an empty out, resized
    ((3, 2, 4), (4, 2), (0,)),  # the batch folded into the rows of one mm
    ((3, 2, 4), (4, 2), (5,)),  # ... into an out with elements, grown (with torch's warning)
    ((2, 3, 2, 4), (4, 2), (30,)),  # ... shrunk
    ((2, 4), (2, 3, 4, 2), (0,)),
    ((3,), (2, 3, 2), (0,)),
    ((4,), (4,), (0,)),  # the ranks torch's composite runs as one out= op
    ((2, 4), (4,), (0,)),
])
def test_matmul_out_writes_once_with_cpus_values_and_version(shapes):
    """``matmul(out=)`` where an operand has 3 or more dims: torch's
    composite writes into a view of ``out`` and copies back unless the view
    ``is_alias_of(out)``, which a 'jax' view is not in C++.  It copied once
    more (``_version`` 2 or 3 where CPU has 1), and the folded form raised
    from that copy (fuzz runs H, I and M: open 11 in docs/fuzzing.md).  In
    both eager modes, with the base of a view ``out`` seeing the write."""
    import warnings

    a_shape, b_shape, out_shape = shapes
    results = {}
    for dev in ("cpu", DEV):
        for mode in ("op", "fused"):
            torch.manual_seed(0)
            a, b = torch.randn(a_shape).to(dev), torch.randn(b_shape).to(dev)
            with pjrt_host.config(eager=mode), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = torch.zeros(out_shape, device=dev)
                returned = torch.matmul(a, b, out=out)
                results[dev, mode] = (returned is out, tuple(out.shape), out.stride(), out._version,
                                      ["resized" in str(w.message) for w in caught])
                torch.testing.assert_close(out.cpu(), torch.matmul(a.cpu(), b.cpu()))
    expected = results["cpu", "op"]
    assert results == {key: expected for key in results}


def test_an_out_tensor_that_cpus_kernel_resizes_before_refusing_is_resized_so():
    """``dot_out`` resizes its out to 0-d before it finds no kernel for
    bool: CPU's out= tensor is 0-d after the refusal, and so is the
    device's (fuzz run L, seed 11001059: it kept its shape)."""
    import warnings

    results = {}
    for dev in ("cpu", DEV):
        for mode in ("op", "fused"):
            with pjrt_host.config(eager=mode), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = torch.zeros(3, dtype=torch.bool, device=dev)
                ones = torch.ones(1, dtype=torch.bool, device=dev)
                with pytest.raises(NotImplementedError) as refused:
                    torch.matmul(ones, ones, out=out)
                results[dev, mode] = (str(refused.value), tuple(out.shape), out._version)
    assert results == {key: ('"dot" not implemented for \'Bool\'', (), 0) for key in results}


def test_matmul_out_into_a_view_writes_its_base_and_keeps_cpus_errors():
    results = {}
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        a, b = torch.randn(3, 2, 4).to(dev), torch.randn(3, 4, 2).to(dev)
        base = torch.zeros(4, 3, 2, 2, device=dev)
        torch.matmul(a, b, out=base[1])
        with pytest.raises(RuntimeError) as wrong_dtype:
            torch.matmul(a, b, out=torch.zeros(0, dtype=torch.float64, device=dev))
        with pytest.raises(RuntimeError) as needs_grad:
            torch.matmul(a.requires_grad_(), b, out=torch.zeros(0, device=dev))
        results[dev] = (base.cpu(), base._version, str(wrong_dtype.value), str(needs_grad.value))
    torch.testing.assert_close(results["cpu"][0], results[DEV][0])
    assert results["cpu"][1:] == results[DEV][1:]


def test_a_copy_that_would_broadcast_the_destination_raises_cpus_runtime_error():
    """copy_ broadcasts the source to the destination, never the other way:
    a source of more dimensions or elements raises torch's RuntimeError
    (it was jax's ValueError, found by tests/fuzz_programs.py)."""
    for dst, src in (((), (1,)), ((0,), (2, 0)), ((3,), (2, 3))):
        (cpu_type, cpu_text), (jax_type, jax_text) = _errors(
            lambda d: torch.zeros(dst, device=d).copy_(torch.ones(src, device=d)))
        assert jax_type is cpu_type is RuntimeError and jax_text == cpu_text


def test_a_copy_of_sizes_that_do_not_broadcast_names_the_dim_as_cpu():
    """Sizes that cannot broadcast name the last dimension where they
    differ, with both sizes, as CPU's copy_ does: the message named the
    last dims' sizes (8 and 8) and no dimension at all."""
    cases = (((3, 7), (4, 8)), ((3, 8), (4, 8)), ((2, 3, 4), (5, 4)), ((2, 0), (3, 1)))
    for dst, src in cases:
        (cpu_type, cpu_text), (jax_type, jax_text) = _errors(
            lambda d: torch.zeros(dst, device=d).copy_(torch.ones(src, device=d)))
        assert jax_type is cpu_type is RuntimeError and jax_text == cpu_text, (dst, src)
    (cpu_type, cpu_text), (jax_type, jax_text) = _errors(  # into a view, from the host
        lambda d: torch.zeros(3, 8, device=d)[:, 1:].copy_(torch.ones(4, 8)))
    assert jax_type is cpu_type is RuntimeError and jax_text == cpu_text
    assert "tensor a (7)" in cpu_text and "dimension 1" in cpu_text


def test_a_copy_of_a_tensor_into_itself_is_nothing_as_on_cpu():
    """``t.copy_(t)`` returns at once, as torch's copy_ does, even where t
    overlaps itself (an expanded tensor): it raised the overlap error
    (found by tests/fuzz_programs.py); a copy from another tensor into an
    overlapping one still raises it."""
    for dev in ("cpu", DEV):
        t = torch.tensor([3], device=dev).expand(2, 3)
        assert t.copy_(t) is t and t.cpu().tolist() == [[3, 3, 3]] * 2
    (cpu_type, _), (jax_type, _) = _errors(
        lambda d: torch.tensor([3], device=d).expand(2, 3).copy_(torch.ones(2, 3, device=d)))
    assert jax_type is cpu_type is RuntimeError


def test_a_mask_times_floats_gives_ieee_zeros_and_nans_as_cpu():
    """bool * float is 0 * y where the mask is False: -0.0 for a negative
    y, NaN for inf and NaN (XLA's rewrite of convert(mask) * y into a
    select gave +0.0 and 0; found by tests/fuzz_programs.py)."""
    mask = torch.tensor([True, False, False, False, False])
    y = torch.tensor([-1.0, -2.0, float("inf"), float("nan"), 3.0])
    for mode in ("op", "fused"):
        with pjrt_host.config(eager=mode):
            for a, b in ((mask, y), (y, mask), (mask, y.to(torch.bfloat16)), (mask, torch.tensor(-4.0))):
                want = a * b
                got = (a.to(DEV) * b.to(DEV)).cpu()
                assert torch.equal(got.isnan(), want.isnan()), (mode, a, b)
                assert torch.equal(got.nan_to_num().view(-1).signbit(), want.nan_to_num().view(-1).signbit())
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_a_mask_cast_to_floats_then_divided_or_multiplied_gives_ieee_values_as_cpu():
    """A mask cast to a float dtype and then divided or multiplied in the
    same program: 0 / 0 is NaN, 0 * inf NaN, 0 * -y -0.0, as on CPU.
    XLA rewrote the cast and the arithmetic into a select wherever they met
    (a division of a bool by a float, a mask's .float() then a division
    in one fused segment: 0 where CPU has NaN; fuzz seed 9000360)."""
    mask = torch.tensor([[True, False], [False, False]])
    zero = torch.tensor([0.0])
    y = torch.tensor([float("inf"), float("nan"), -1.0, 2.0])
    flags = torch.tensor([False, False, False, True])
    cases = [
        lambda d: torch.div(mask.to(d), zero.to(d)),
        lambda d: mask.to(d).float() / zero.to(d),
        lambda d: mask.to(d).float() / 0.0,
        lambda d: flags.to(d).float() * y.to(d),
        lambda d: flags.to(d).to(torch.float64) * y.to(d).double(),
        lambda d: flags.to(d).to(torch.bfloat16) * y.to(d).to(torch.bfloat16),
        lambda d: flags.to(d).float() * y.to(d)[0],
        # a draw is a mask's cast too (fuzz seed 12000501); p of 0 draws zeros on every device
        lambda d: torch.bernoulli(torch.zeros(4, device=d)) / zero.to(d),
        lambda d: torch.zeros(4, device=d).bernoulli_(0.0) / zero.to(d),
        lambda d: torch.zeros(4, device=d).bernoulli_(torch.zeros(4, device=d)) * y.to(d),
    ]
    for mode in ("op", "fused", "sync"):
        with pjrt_host.config(eager=mode):
            for i, case in enumerate(cases):
                want, got = case("cpu"), case(DEV).cpu()
                assert torch.equal(got.isnan(), want.isnan()), (mode, i, got, want)
                assert torch.equal(got.nan_to_num().view(-1).signbit(), want.nan_to_num().view(-1).signbit()), (mode, i)
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_softmax_of_a_0dim_tensor_as_cpu_computes_it():
    """softmax / log_softmax of one element: 1 / 0, or NaN for NaN and
    +-inf as CPU's exp(x - x) gives; its backward runs (the sum over the
    0-dim input raised "axis 0 is out of bounds"; both found by
    tests/fuzz_programs.py)."""
    for value in (0.5, float("nan"), float("inf"), -float("inf")):
        for fn in (torch.softmax, torch.log_softmax):
            want = fn(torch.tensor(value), 0)
            got = fn(torch.tensor(value, device=DEV), -1).cpu()
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    for fn in (torch.softmax, torch.log_softmax):
        grads = []
        for dev in ("cpu", DEV):
            x = torch.tensor(2.0, device=dev, requires_grad=True)
            (fn(x, 0) * 3).sum().backward()
            grads.append(x.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0])


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_sign_of_nan_and_negative_zero_is_cpus(dtype):
    """Fuzz seed 7000708: torch's sign is ``(0 < x) - (x < 0)``, 0 for NaN
    and +0 for -0; jnp.sign keeps both, and ``y / sign(-0.0 * x)`` gave
    -inf where CPU gives inf."""
    x = torch.tensor([-0.0, 0.0, float("nan"), -2.0, 3.0, float("inf"), -float("inf")], dtype=dtype)
    for fn in (torch.sign, torch.sgn):
        want, got = fn(x), cpu(fn(x.to(DEV)))
        assert got.tolist()[3:] == want.tolist()[3:]
        assert torch.equal(got[:3], want[:3]) and torch.signbit(got).tolist() == torch.signbit(want).tolist()
    assert cpu(1.0 / torch.sign(x.to(DEV)[:1])).tolist() == [float("inf")]


_CLAMPS = {
    "relu": torch.relu, "relu_": lambda t: t.clone().relu_(), "relu6": F.relu6,
    "hardtanh": lambda t: F.hardtanh(t, 0.0, 1.0), "clamp_min": lambda t: torch.clamp_min(t, 0),
    "clamp": lambda t: torch.clamp(t, 0, 1), "clamp_max at -0": lambda t: torch.clamp_max(t, -0.0),
    "clamp_": lambda t: t.clone().clamp_(min=0), "clamp at a NaN bound": lambda t: torch.clamp(t, min=float("nan")),
    "clamp with min above max": lambda t: torch.clamp(t, 1.0, 0.0), "clamp(0, -0)": lambda t: torch.clamp(t, 0.0, -0.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(_CLAMPS))
def test_clamps_by_scalars_keep_the_sign_of_zero_as_cpu_does(name, dtype):
    """Fuzz seed 19000110: ``relu_`` of -0.0 stays -0.0 on CPU (its clamp
    keeps x unless x is below the bound); XLA's max gave +0.0, and
    ``atan2(v, v)`` then gave 0 where CPU gives -pi."""
    x = torch.tensor([-0.0, 0.0, float("nan"), -1.0, 2.0, 0.5] * 4, dtype=dtype)
    want, got = _CLAMPS[name](x), cpu(_CLAMPS[name](x.to(DEV)))
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(got[keep], want[keep])
    assert torch.signbit(got[keep]).tolist() == torch.signbit(want[keep]).tolist()


@pytest.mark.parametrize("fn", [F.hardshrink, F.softshrink, torch.digamma, torch.special.entr,
                                torch.special.spherical_bessel_j0],
                         ids=["hardshrink", "softshrink", "digamma", "entr", "spherical_bessel_j0"])
def test_nan_infinities_and_signed_zeros_give_cpus_values(fn):
    """A sweep of torch's unary ufuncs over -0, NaN and the infinities found
    these: hardshrink and softshrink turned NaN into 0, spherical_bessel_j0
    was NaN at +-inf (torch: 0), digamma(-0.0) was -inf (torch: +inf),
    entr(0) and softshrink's band gave the other zero."""
    x = torch.tensor([-0.0, 0.0, float("nan"), float("inf"), -float("inf"), -0.3, 0.3, -2.5, 2.5])
    want, got = fn(x), cpu(fn(x.to(DEV)))
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    torch.testing.assert_close(got[keep], want[keep])
    assert torch.signbit(got[keep]).tolist() == torch.signbit(want[keep]).tolist()


def _warnings_of(fn, device):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(device)
    # (torch's C++ warnings end in where they were raised: not the device's concern)
    return [(w.category, w.filename, w.lineno, str(w.message).split(" (Triggered internally at")[0]) for w in caught]


def test_torchs_warnings_name_the_users_line_as_on_cpu():
    """The warnings the device gives in torch's words (a uint8 mask, an out=
    tensor resized by the engine or by an autograd kernel) name the user's
    line, as torch's C++ warnings do for a CPU tensor: a filter by module
    or ``-W error::UserWarning:mymodule`` treats both devices alike.  They
    named pjrt_host's own files, each a different one."""
    import random

    # sizes no earlier run has met: the first call of a signature probes
    # CPU's kernel (found once, then kept on disk), whose own resize warning
    # torch's C++ held until the user's call returned: a second copy
    n = random.randrange(3, 10**6)

    def uint8_mask(d):
        x = torch.ones(3, device=d)
        x[torch.tensor([1, 0, 1], dtype=torch.uint8)]

    def sum_out(d):
        torch.sum(torch.ones(2, n % 97 + 2, device=d), dim=0, out=torch.empty(1, device=d))

    def mm_out(d):
        torch.mm(torch.ones(2, n % 89 + 2, device=d), torch.ones(n % 89 + 2, 2, device=d), out=torch.empty(3, device=d))

    def matmul_out(d):
        torch.matmul(torch.ones(2, 2, n % 83 + 2, device=d), torch.ones(n % 83 + 2, 2, device=d),
                     out=torch.empty(3, device=d))

    for fn in (uint8_mask, sum_out, mm_out, matmul_out):
        expected = _warnings_of(fn, "cpu")
        assert expected, fn.__name__
        assert _warnings_of(fn, DEV) == expected, fn.__name__
