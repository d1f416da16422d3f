"""The lowering table, tested without the 'jax' device.

:class:`LoweringCheck` is a TorchDispatchMode: every ATen op that torch runs
on CPU inside it is also run through its lowering (CPU tensors turned into
jax arrays, the lowering called, optionally under ``jax.jit``), and the two
results are compared: same structure, same dtype, same shape, close values.
So a CPU program run inside it (a model's forward and backward, an OpInfo
sample) tests every lowering it touches, against torch itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: E402

import torch.nn.functional as F  # noqa: E402


@pytest.fixture(autouse=True)
def _x64():
    """The lowerings run with jax's 64-bit types, as pjrt_host runs them
    (inside its own calls only: the rest of the suite keeps jax's defaults,
    so a host entry point that misses its scope shows up there)."""
    with jax.enable_x64(True):
        yield

from pjrt_host import _lowerings  # noqa: E402
from pjrt_host._lowerings import _util  # noqa: E402
from pjrt_host._lowerings._dtypes import jax_dtype, torch_dtype  # noqa: E402

# Ops the device core implements itself (memory, factories, randomness,
# host transfers): the harness neither needs nor checks a lowering for them.
NOT_LOWERED = {
    "aten::_local_scalar_dense", "aten::copy_", "aten::_to_copy", "aten::empty.memory_format",
    "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::set_.source_Storage_storage_offset", "aten::resize_", "aten::_copy_from",
    "aten::bernoulli_.float", "aten::uniform_", "aten::normal_", "aten::random_", "aten::exponential_",
    "aten::native_dropout", "aten::rand", "aten::randn", "aten::randint", "aten::randint.low",
    "aten::randperm", "aten::bernoulli", "aten::multinomial", "aten::lift_fresh_copy",
    "aten::scalar_tensor", "aten::full", "aten::zeros", "aten::ones", "aten::arange", "aten::arange.start",
    "aten::arange.start_step", "aten::full_like", "aten::zeros_like", "aten::ones_like",
    "aten::is_nonzero", "aten::_record_function_enter_new", "aten::nonzero", "aten::masked_select",
    "aten::unique2", "aten::_unique2", "aten::repeat_interleave.Tensor", "aten::set_", "aten::fill_.Scalar",
    "aten::zero_",
}


# Outputs that only the op's own backward reads: each backend fills them its
# own way (torch CPU's embedding_bag gives bag_size zeros in sum mode and a
# max_indices its meta kernel says is empty; log_alpha past an input's length
# is unspecified).  The lowerings follow torch's meta kernel, which compiled
# graphs are traced with, so only the first output is compared; their
# backward ops are checked on their own.
BACKWARD_SCRATCH = {"aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::_ctc_loss",
                    "aten::_ctc_loss.Tensor"}


def to_jax(value: Any) -> Any:
    """torch tensors in ``value`` (a pytree) as jax arrays of the same dtype."""

    def convert(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.numpy())

    return tree_map(convert, value)


def to_torch(value: Any) -> Any:
    def convert(a: Any) -> Any:
        if isinstance(a, jax.Array):
            arr = np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a)
            t = torch.from_numpy(arr.copy())
            return t.to(torch.bfloat16) if a.dtype == jnp.bfloat16 else t
        return a

    return tree_map(convert, value)


def run_lowered(op: Any, args: tuple, kwargs: dict, jit: bool = False) -> Any:
    """Run ``op`` through its lowering on CPU tensors; return CPU tensors."""
    found = _lowerings.lookup(op)
    if found is None:
        raise LookupError(f"no lowering for {op.name()}")
    ctx = _lowerings.LoweringContext()

    def fn(*a: Any, **k: Any) -> Any:
        return _lowerings.invoke(found, a, k, ctx)

    jargs, jkwargs = to_jax((args, kwargs))
    if not jit:
        return to_torch(fn(*jargs, **jkwargs))
    leaves, spec = tree_flatten((jargs, jkwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

    def call(*arrays: Any) -> Any:
        filled = list(leaves)
        for i, a in zip(where, arrays):
            filled[i] = a
        a, k = tree_unflatten(filled, spec)
        return fn(*a, **k)

    return to_torch(jax.jit(call)(*[leaves[i] for i in where]))


def assert_same(expected: Any, actual: Any, name: str, rtol: float | None = None, atol: float | None = None) -> None:
    """Same pytree structure; tensors of the same dtype and shape and close values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{name}: expected a tensor, got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype}, torch gives {expected.dtype}"
        assert tuple(actual.shape) == tuple(expected.shape), (
            f"{name}: shape {tuple(actual.shape)}, torch gives {tuple(expected.shape)}")
        if rtol is None and expected.dtype in (torch.float32, torch.complex64):
            rtol, atol = 1e-4, 1e-5
        torch.testing.assert_close(actual, expected.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{name}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{name}: expected {len(expected)} outputs, got {actual!r:.200}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{name}[{i}]", rtol, atol)
    elif isinstance(expected, (bool, int, float)):
        assert actual == expected or (isinstance(expected, float) and math.isnan(expected) and math.isnan(actual)), (
            f"{name}: {actual} != {expected}")


def functional_name(op: Any) -> str | None:
    """``aten::add_.Tensor`` -> ``aten::add.Tensor``; None if not in-place."""
    name = op.name()
    base, _, overload = name.partition(".")
    if not base.endswith("_") or base.endswith("__"):
        return None
    return base[:-1] + ("." + overload if overload else "")


@dataclasses.dataclass
class _Named:
    name_: str

    def name(self) -> str:
        return self.name_


class LoweringCheck(TorchDispatchMode):
    """Check each ATen op torch runs against its lowering (see module doc).

    ``missing`` collects ops without a lowering, ``failures`` (name, error)
    pairs for lowerings that raised or disagreed with torch."""

    def __init__(self, jit: bool = False, strict: bool = True) -> None:
        super().__init__()
        self.jit = jit
        self.strict = strict
        self.checked: set[str] = set()
        self.missing: set[str] = set()
        self.failures: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.name()
        if not name.startswith("aten::") or name in NOT_LOWERED or name.split(".")[0] in NOT_LOWERED:
            return func(*args, **kwargs)
        target = func
        inplace = functional_name(func)
        if inplace is not None:
            target = _Named(inplace)
        if "out" in kwargs or (inplace is None and func._schema.is_mutable):
            return func(*args, **kwargs)
        if _lowerings.lookup(target) is None:
            self.missing.add(target.name())
            return func(*args, **kwargs)
        snapshot = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
        result = func(*args, **kwargs)
        expected = args[0] if inplace is not None else result
        try:
            actual = run_lowered(target, *snapshot, jit=self.jit)
            if inplace is not None:
                assert isinstance(actual, torch.Tensor), "in-place op's functional form must give one tensor"
                actual = actual.to(expected.dtype) if actual.shape == expected.shape else actual
            if target.name() in BACKWARD_SCRATCH:
                expected, actual = expected[0], actual[0]
            assert_same(expected, actual, target.name())
            self.checked.add(target.name())
        except Exception as err:  # noqa: BLE001 - collected and reported
            self.failures.append((target.name(), f"{type(err).__name__}: {err}"[:400]))
            if self.strict:
                raise
        return result


def check(fn: Any, *args: Any, jit: bool = True) -> LoweringCheck:
    mode = LoweringCheck(jit=jit)
    with mode:
        fn(*args)
    return mode


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    "x, other, expected",
    [
        (torch.arange(3), 2.5, torch.float32),
        (torch.arange(3), 2, torch.int64),
        (torch.arange(3, dtype=torch.int32), 2, torch.int32),
        (torch.ones(3, dtype=torch.bool), 2, torch.int64),
        (torch.ones(3, dtype=torch.uint8), torch.tensor(3), torch.uint8),
        (torch.ones(3, dtype=torch.uint8), torch.ones(3, dtype=torch.int8), torch.int16),
        (torch.ones(3, dtype=torch.float16), torch.tensor(3.0, dtype=torch.float64), torch.float16),
        (torch.ones(3, dtype=torch.int64), torch.tensor(3.0, dtype=torch.float64), torch.float64),
        (torch.ones(3, dtype=torch.float32), 1j, torch.complex64),
        (torch.tensor(1), 2.5, torch.float32),
    ],
)
def test_result_type_is_torchs(x: Any, other: Any, expected: Any) -> None:
    j = to_jax(other) if isinstance(other, torch.Tensor) else other
    assert _util.result_type(to_jax(x), j) == expected == torch.result_type(x, other)


def test_binary_ops_promote_as_torch() -> None:
    ints = torch.arange(-3, 4)
    floats = torch.linspace(-2, 2, 7)
    bools = ints > 0

    def program() -> None:
        for a in (ints, floats, bools):
            for b in (ints, floats, bools, 2, 2.5, True, torch.tensor(3), torch.tensor(1.5, dtype=torch.float64)):
                torch.add(a, b)
                torch.mul(a, b)
                torch.div(a, b)
                torch.maximum(a, b if isinstance(b, torch.Tensor) else torch.tensor(b))
                torch.eq(a, b)
                torch.where(bools, a, b)
            if a.dtype != torch.bool:
                torch.sub(a, 3, alpha=2)
                torch.remainder(a, 3)
                torch.fmod(a, -2)
                torch.floor_divide(a, 2)
                torch.div(a, 3, rounding_mode="trunc")
                torch.div(a, -2, rounding_mode="floor")
                torch.clamp(a, min=-1, max=2)
                torch.clamp(a, min=0.5)
                a.pow(2)
                torch.abs(a)
            torch.sin(a)
            torch.sqrt(a.abs() if a.dtype != torch.bool else a)
            torch.sigmoid(a)

    mode = check(program, jit=False)
    assert not mode.missing, mode.missing


def test_lowerings_trace_under_jit() -> None:
    x = torch.randn(4, 5)
    mode = check(lambda: (torch.nn.functional.gelu(x), x.softmax(-1), x.sum(1), x.amax(0), x.argmax(1),
                          torch.cat([x, x], 1), x.t() @ x, torch.topk(x, 2, dim=1), x.sort(dim=0),
                          x.var(0), torch.cumsum(x, 0), x[torch.tensor([0, 2])]), jit=True)
    assert not mode.missing and not mode.failures


def _mlp_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.GELU(), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(5, 6), torch.tensor([0, 2, 1, 1, 0])
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _cnn_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 4, 3, stride=2), torch.nn.SiLU(),
                                torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    x, y = torch.randn(2, 3, 12, 12), torch.tensor([1, 0])
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _transformer_step() -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 16)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    head = torch.nn.Linear(16, 20)
    tokens = torch.tensor([[1, 5, 7, 2], [3, 3, 9, 0]])
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    logits = head(layer(emb(tokens), src_mask=mask))
    torch.nn.functional.cross_entropy(logits.reshape(-1, 20), tokens.reshape(-1)).backward()
    q = torch.randn(2, 2, 4, 8, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    x = torch.randn(3, 8, requires_grad=True)
    torch.nn.functional.layer_norm(x, (8,)).pow(2).mean().backward()


def _segment_step() -> None:
    """embedding_bag (every mode, padding, per-sample weights), CTC (both
    target layouts, an impossible alignment under zero_infinity) and
    segment_reduce, forward and backward."""
    torch.manual_seed(0)
    weight = torch.randn(10, 4, requires_grad=True)
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4, 4])
    for mode in ("sum", "mean", "max"):
        F.embedding_bag(indices, weight, offsets, mode=mode, padding_idx=2).pow(2).sum().backward()
    psw = torch.rand(8, requires_grad=True)
    F.embedding_bag(indices, weight, torch.tensor([0, 4, 4, 8]), mode="sum", per_sample_weights=psw,
                    include_last_offset=True).sum().backward()
    logits = torch.randn(12, 3, 6, requires_grad=True)
    targets = torch.randint(1, 6, (3, 4))
    F.ctc_loss(logits.log_softmax(2), targets, [12, 10, 3], [4, 2, 4], zero_infinity=True).backward()
    flat = torch.cat([targets[0], targets[1, :2], targets[2, :3]])
    F.ctc_loss(logits.log_softmax(2), flat, torch.tensor([12, 10, 9]), torch.tensor([4, 2, 3])).backward()
    data = torch.randn(7, 3, requires_grad=True)
    for reduce in ("sum", "mean", "max", "min", "prod"):
        torch.segment_reduce(data, reduce, lengths=torch.tensor([2, 0, 4, 1]), unsafe=True).sum().backward()


def _sampling_step() -> None:
    """3-d grid sampling (every mode, padding and corner alignment, grid
    points outside the input too), antialiased bilinear / bicubic resizing
    up and down, and fractional max pooling with explicit samples (torch's
    kernel is deterministic given them), forward and backward."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6, requires_grad=True)
    grid = (torch.rand(2, 3, 4, 5, 3) * 3 - 1.5).requires_grad_()
    # every mode with every padding, corner alignment alternating
    for i, (mode, padding) in enumerate((m, p) for m in ("bilinear", "nearest")
                                        for p in ("zeros", "border", "reflection")):
        F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=i % 2 == 1).pow(2).sum().backward()
    image = torch.randn(2, 3, 10, 13, requires_grad=True)
    for mode in ("bilinear", "bicubic"):
        for align, size in ((False, (4, 5)), (True, (17, 29)), (False, (10, 7)), (True, (4, 5))):
            F.interpolate(image, size=size, mode=mode, antialias=True, align_corners=align).pow(2).sum().backward()
        F.interpolate(image, scale_factor=(0.6, 1.7), mode=mode, antialias=True).sum().backward()
    planes = torch.randn(2, 3, 9, 11, requires_grad=True)
    out, _ = F.fractional_max_pool2d(planes, 3, output_size=(4, 5), return_indices=True,
                                     _random_samples=torch.rand(2, 3, 2))
    out.pow(2).sum().backward()
    volume = torch.randn(2, 3, 7, 8, 9, requires_grad=True)
    out, _ = F.fractional_max_pool3d(volume, (2, 3, 2), output_ratio=0.5, return_indices=True,
                                     _random_samples=torch.rand(2, 3, 3))
    out.pow(2).sum().backward()


def _weight_norm_step() -> None:
    """Weight normalisation over the first and over the last dimension (the
    fused op torch._weight_norm takes for those: wav2vec2's positional
    convolution), forward and backward."""
    torch.manual_seed(0)
    v = torch.randn(4, 3, 5, requires_grad=True)
    for dim, g in ((0, torch.rand(4, 1, 1, requires_grad=True)), (2, torch.rand(1, 1, 5, requires_grad=True))):
        (torch._weight_norm(v, g, dim) * torch.randn(4, 3, 5)).sum().backward()


def _backward_only_ops_step() -> None:
    """Backward ops torch has no decomposition for: replicate padding (1-3
    spatial dims), cdist / pdist for every p (a zero distance, batch dims
    broadcast) and masked_scatter's source gradient (fewer True elements
    than source elements)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6, requires_grad=True)
    for k in (1, 2, 3):
        planes = x[0, :, 0, 0] if k == 1 else x[:, :, 0] if k == 2 else x
        F.pad(planes, (2, 1, 1, 3, 0, 2)[:2 * k], mode="replicate").pow(2).sum().backward()
    a, b = torch.randn(1, 5, 3), torch.randn(3, 4, 3)
    a[0, 1] = b[0, 2]
    a.requires_grad_(), b.requires_grad_()
    for p in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")):
        dist = torch.cdist(a, b, p=p, compute_mode="donot_use_mm_for_euclid_dist")
        (dist * torch.randn(3, 5, 4)).sum().backward()
        rows = torch.cat([a[0], a[0, :1]])
        (F.pdist(rows, p=p) * torch.randn(15)).sum().backward()
    base, source = torch.randn(2, 4, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    mask = torch.tensor([True, False, True, True])
    (base.masked_scatter(mask, source) * torch.randn(2, 4)).sum().backward()


@pytest.mark.parametrize("program", [_mlp_step, _cnn_step, _transformer_step, _segment_step, _sampling_step,
                                     _weight_norm_step, _backward_only_ops_step],
                         ids=["mlp", "cnn", "transformer", "segments", "sampling", "weight_norm", "backward_only"])
def test_model_forward_and_backward(program: Any) -> None:
    mode = check(program, jit=False)
    # CPU-only fused kernels (oneDNN attention) never reach the 'jax' device.
    missing = {m for m in mode.missing if "for_cpu" not in m and "_transformer_encoder" not in m}
    assert not missing, f"ops without a lowering: {sorted(missing)}"
    assert mode.checked


def test_dense_gather_matches_sparse() -> None:
    """The plugin's dense_gather_factor reaches a lowering only through the
    context its caller passes to invoke, and the one-hot gather it selects
    is exact."""
    x = jnp.asarray(np.arange(24.0, dtype=np.float32).reshape(4, 6))
    index = jnp.asarray([[3, 0], [1, 1], [2, 3]])
    probe = _lowerings.Lowering(lambda: (_lowerings.current_context().dense_gather_factor,
                                         _util.take(x, index, axis=0), _util.take(x, index, axis=1)), ("probe",))
    factor, dense0, dense1 = _lowerings.invoke(probe, (), {}, _lowerings.LoweringContext(dense_gather_factor=8))
    assert factor == 8
    assert _lowerings.current_context().dense_gather_factor == 0  # restored after the call
    np.testing.assert_array_equal(np.asarray(dense0), np.asarray(_util.take(x, index, axis=0)))
    np.testing.assert_array_equal(np.asarray(dense1), np.asarray(x)[:, np.asarray(index)])


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", [
    ((2, 8, 5, 5), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 8, 9, 7), (4, 8, 3, 2), (2, 1), (0, 1), (1, 1)),
    ((1, 4, 8, 8), (4, 4, 3, 3), (1, 2), (2, 1), (2, 1)),
    ((2, 3, 16, 16), (5, 3, 7, 7), (2, 2), (3, 3), (1, 1)),
])
def test_convolution_as_matmul_equals_the_convolution(shape, kernel, stride, padding, dilation) -> None:
    """The plugin's conv_as_matmul_max_positions switches a convolution to
    patches x kernel: the same values and gradients as XLA's convolution
    for strides, paddings, dilations and rectangular kernels."""
    from pjrt_host._lowerings import ops_nn

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    w = jnp.asarray(rng.standard_normal(kernel, dtype=np.float32))
    b = jnp.asarray(rng.standard_normal(kernel[0], dtype=np.float32))
    _lowerings.load_all()

    def run(limit):
        def f(x_, w_):
            return ops_nn.convolution(x_, w_, b, list(stride), list(padding), list(dilation), False, [0], 1)

        ctx = _lowerings.LoweringContext(conv_as_matmul_max_positions=limit)
        probe = _lowerings.Lowering(lambda: (ops_nn._as_matmul(x, w, stride, padding, dilation, 1),
                                             f(x, w), jax.grad(lambda a, c: (f(a, c) ** 2).sum(), (0, 1))(x, w)),
                                    ("probe",))
        return _lowerings.invoke(probe, (), {}, ctx)

    used_xla, out_xla, grads_xla = run(0)
    used_mm, out_mm, grads_mm = run(4096)
    assert not used_xla and used_mm
    np.testing.assert_allclose(np.asarray(out_mm), np.asarray(out_xla), rtol=1e-4, atol=1e-4)
    for g_mm, g_xla in zip(grads_mm, grads_xla):
        np.testing.assert_allclose(np.asarray(g_mm), np.asarray(g_xla), rtol=1e-4, atol=1e-3)


def test_a_plugin_that_cannot_dot_16bit_operands_gets_them_widened():
    """``DevicePlugin.widen_16bit_matmul_operands`` reaches the matmul
    family through the context: True, the dot takes float32 operands (what
    XLA:CPU's runtime needs inside larger programs); False, the 16-bit
    operands with a float32 accumulation.  The values are the same."""
    from pjrt_host._lowerings import ops_nn
    from pjrt_host._plugin import lowering_option_problems

    _lowerings.load_all()
    a = jnp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4) / 7, dtype=jnp.bfloat16)
    b = jnp.asarray(np.arange(8, dtype=np.float32).reshape(4, 2) / 5, dtype=jnp.bfloat16)
    results = {}
    for widen in (False, True):
        ctx = _lowerings.LoweringContext(widen_16bit_matmul_operands=widen)
        # (a fresh function per context: jax caches a function's traces by its arguments alone)
        traced = jax.make_jaxpr(lambda x, y: ops_nn._matmul(x, y))
        probe = _lowerings.Lowering(lambda: (ops_nn._matmul(a, b), traced(a, b)), ("probe",))
        results[widen] = _lowerings.invoke(probe, (), {}, ctx)
    dots = {w: [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"] for w, (_, jaxpr) in results.items()}
    assert [str(v.aval.dtype) for v in dots[False][0].invars] == ["bfloat16", "bfloat16"]
    assert str(dots[False][0].outvars[0].aval.dtype) == "float32"
    assert [str(v.aval.dtype) for v in dots[True][0].invars] == ["float32", "float32"]
    np.testing.assert_array_equal(np.asarray(results[True][0]), np.asarray(results[False][0]))

    class Wrong:
        widen_16bit_matmul_operands = 1

    assert lowering_option_problems(Wrong()) == ["widen_16bit_matmul_operands is 1, expected True or False"]


SPECIAL_FUNCTIONS = ("airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0",
                     "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1")


def _special_grid() -> torch.Tensor:
    """float32 arguments OpInfo's samples do not reach: large |x|, where
    the oscillating forms' phases must round as torch's do, both sides of
    every branch point, and the special values.  No subnormals: XLA on CPU
    flushes them to 0."""
    big = torch.logspace(3, 30, 2701)
    edges = torch.tensor([-5.0, -2.09, 2.0, 2.09, 5.0, 8.3203353, 103.892])
    return torch.cat([
        torch.linspace(-50, 50, 10001), big, -big,
        *[torch.linspace(e - 1e-3, e + 1e-3, 201) for e in edges.tolist()],
        edges, torch.nextafter(edges, torch.tensor(math.inf)), torch.nextafter(edges, torch.tensor(-math.inf)),
        torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, 1.2e-38, -1.2e-38, 3e38, -3e38]),
    ])


@pytest.mark.parametrize("name", SPECIAL_FUNCTIONS)
def test_special_functions_match_torch_on_a_wide_grid(name: str) -> None:
    op = getattr(torch.ops.aten, f"special_{name}").default
    for x in (_special_grid(), torch.arange(-60, 61), torch.tensor([True, False])):
        assert_same(op(x), run_lowered(op, (x,), {}, jit=True), f"{name}({x.dtype})")


def _grid_coordinates(size: int, align: bool) -> torch.Tensor:
    """Grid coordinates OpInfo's random grids miss, for an axis of ``size``:
    those landing on multiples of the reflection span and a float either side
    (where a rounded reciprocal flips the wrong way), half-way points
    (rounded to even by nearest), 0, NaN, infinities and 1e10 (whose
    unnormalised value a fused multiply-add rounds differently)."""
    odd = torch.arange(-7.0, 8.0, 2.0)  # each unnormalises to a multiple of the span
    below, above = torch.nextafter(odd, torch.tensor(-20.0)), torch.nextafter(odd, torch.tensor(20.0))
    j = torch.arange(-2.0, size + 2.0)
    halves = (2 * j + 1) / (size - 1) - 1 if align else (2 * j + 2) / size - 1
    special = torch.tensor([0.0, float("nan"), float("inf"), -float("inf"), 1e10, -1e10])
    return torch.cat([odd, below, above, halves, special])


def test_grid_sampler_3d_matches_torch_where_rounding_decides() -> None:
    torch.manual_seed(0)
    op = torch.ops.aten.grid_sampler_3d.default
    for width, align in itertools.product((3, 41), (False, True)):
        x = torch.randn(1, 2, 3, 4, width)
        w = _grid_coordinates(width, align)
        grid = torch.stack([w, w.roll(3).clamp(-1.5, 1.5), w.roll(7).clamp(-1.5, 1.5)], -1).reshape(1, 1, 1, -1, 3)
        for mode, padding in itertools.product((0, 1), (0, 1, 2)):
            expected, actual = op(x, grid, mode, padding, align), run_lowered(op, (x, grid, mode, padding, align), {},
                                                                              jit=True)
            name = f"grid_sampler_3d(width={width}, mode={mode}, padding={padding}, align_corners={align})"
            if mode == 1:  # nearest picks values: exactly torch's
                assert torch.equal(actual.nan_to_num(7.0), expected.nan_to_num(7.0)), name
            else:
                assert_same(expected, actual, name)


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_picks_torchs_index_among_ties_and_nans(n: int) -> None:
    """Windows full of equal values (torch keeps the first), NaNs (any
    wins, a later one replaces it), all -inf, and samples at 0 and just
    below 1; values and indices exactly torch's."""
    torch.manual_seed(0)
    op = getattr(torch.ops.aten, f"fractional_max_pool{n}d").default
    shape, kernel, out = ((2, 3, 9, 11), [3, 2], [4, 6]) if n == 2 else ((2, 3, 7, 6, 8), [2, 3, 2], [4, 3, 5])
    x = torch.randint(0, 3, shape).float()
    x[0, 0] = float("nan")
    x[0, 1][x[0, 1] > 1] = float("nan")
    x[1, 0] = -float("inf")
    samples = torch.rand(2, 3, n)
    samples[0, :, 0], samples[1, :, -1] = 0.0, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    expected = op(x, kernel, out, samples)
    actual = run_lowered(op, (x, kernel, out, samples), {}, jit=True)
    assert torch.equal(actual[1], expected[1])
    assert torch.equal(actual[0].nan_to_num(7.0), expected[0].nan_to_num(7.0))


# Registered names this torch (2.13) has no op for: generated by a family
# builder (view ops register a `_copy` twin, bitwise ops a Scalar_Tensor form)
# or kept for overloads other torch releases have.  Exact: a torch upgrade
# that adds or drops one of them fails here, so the list is looked at again.
TOLERATED_UNKNOWN = {
    "aten::__and__.Scalar_Tensor", "aten::__or__.Scalar_Tensor", "aten::__xor__.Scalar_Tensor",
    "aten::_adaptive_avg_pool1d", "aten::_adaptive_avg_pool1d_backward", "aten::_foreach_clamp_max.Tensor",
    "aten::_foreach_clamp_min.Tensor", "aten::_foreach_exp2", "aten::_foreach_maximum.Tensor",
    "aten::_foreach_minimum.Tensor", "aten::_foreach_pow.Tensor", "aten::_foreach_sub.Tensor",
    "aten::_unsafe_view_copy", "aten::adaptive_max_pool1d_backward", "aten::avg_pool1d_backward",
    "aten::max_pool1d_with_indices_backward", "aten::norm.names_ScalarOpt_dim", "aten::reshape_copy",
    "aten::unsafe_split_copy.Tensor", "aten::unsafe_split_with_sizes_copy",
}


def test_every_registered_name_is_an_aten_op_or_listed() -> None:
    """A name that matches no op of this torch is dead weight unless listed
    above (lookup never fails over one, so only this test notices)."""
    unknown = set()
    for name in _lowerings.registered_names():
        if not name.startswith("aten::"):  # another library's op (torchvision::nms): tested with that library
            continue
        packet, _, overload = name.removeprefix("aten::").partition(".")
        op = getattr(torch.ops.aten, packet, None)
        if op is None or (overload and overload not in op.overloads()):
            unknown.add(name)
    assert unknown == TOLERATED_UNKNOWN, (f"new unknown: {sorted(unknown - TOLERATED_UNKNOWN)}; "
                                          f"now known (drop from the list): {sorted(TOLERATED_UNKNOWN - unknown)}")


def test_a_name_registered_twice_is_refused() -> None:
    def first(x):
        return x

    def second(x):
        return -x

    _lowerings.lowering("aten::pjrt_host_test_only")(first)
    try:
        with pytest.raises(_lowerings.DuplicateLoweringError, match=r"two lowerings, .*first and .*second"):
            _lowerings.lowering("aten::pjrt_host_test_only")(second)
    finally:
        _lowerings._TABLE.pop("aten::pjrt_host_test_only", None)


def test_dtype_map_round_trips() -> None:
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64):
        assert torch_dtype(jax_dtype(dtype)) == dtype


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_fused_rnn_cell_backward_is_the_forwards_gradient(cell: str) -> None:
    """The fused LSTM / GRU cells (what nn.LSTM / nn.GRU run off CPU): the
    forward matches nn.LSTMCell / GRUCell math, the backward is its VJP."""
    from pjrt_host._lowerings import ops_nn

    torch.manual_seed(0)
    batch, hidden = 3, 4
    n_gates = 4 if cell == "lstm" else 3
    ig, hg = torch.randn(batch, n_gates * hidden), torch.randn(batch, n_gates * hidden)
    h0 = torch.randn(batch, hidden)
    bi, bh = torch.randn(n_gates * hidden), torch.randn(n_gates * hidden)
    j = [jnp.asarray(t.numpy()) for t in (ig, hg, h0, bi, bh)]
    if cell == "lstm":
        hy, cy, workspace = ops_nn.lstm_cell(*j)
        i, f, g, o = (ig + hg + bi + bh).chunk(4, 1)
        c_ref = i.sigmoid() * g.tanh() + f.sigmoid() * h0
        torch.testing.assert_close(to_torch(cy), c_ref)
        torch.testing.assert_close(to_torch(hy), o.sigmoid() * c_ref.tanh())
        grad_hy, grad_cy = jnp.ones_like(hy) * 0.3, jnp.ones_like(cy) * -0.7
        _, pullback = jax.vjp(lambda a, c: ops_nn.lstm_cell(a, jnp.zeros_like(a), c)[:2], j[0] + j[1] + j[3] + j[4],
                              j[2])
        want_gates, want_cx = pullback((grad_hy, grad_cy))
        got = ops_nn.lstm_cell_backward(grad_hy, grad_cy, j[2], cy, workspace, True)
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want_gates), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want_cx), rtol=1e-5, atol=1e-6)
    else:
        hy, workspace = ops_nn.gru_cell(*j)
        ir, iz, in_ = (ig + bi).chunk(3, 1)
        hr, hz, hn = (hg + bh).chunk(3, 1)
        r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
        torch.testing.assert_close(to_torch(hy), (1 - z) * (in_ + r * hn).tanh() + z * h0)
        grad_hy = jnp.ones_like(hy) * 0.5
        _, pullback = jax.vjp(lambda a, b, h: ops_nn.gru_cell(a, b, h)[0], j[0] + j[3], j[1] + j[4], j[2])
        want = pullback(grad_hy)
        got = ops_nn.gru_cell_backward(grad_hy, workspace, True)
        for g_, w_ in zip(got[:3], want):
            np.testing.assert_allclose(np.asarray(g_), np.asarray(w_), rtol=1e-5, atol=1e-6)


def test_every_lowering_module_imports_cleanly() -> None:
    """load_all() logs and skips a module that fails to import, so that one
    broken family cannot take the device down; here such a failure must
    fail loudly instead (a module that dies half-way loses every lowering
    after the error)."""
    import importlib
    import pkgutil

    names = [m.name for m in pkgutil.iter_modules(_lowerings.__path__) if m.name.startswith("ops_")]
    assert names
    for name in names:
        importlib.import_module(f"pjrt_host._lowerings.{name}")


def _random_calls() -> dict[str, tuple]:
    """A call of every random lowering on tensors of several dimensions:
    {name: (args, kwargs, result shape and dtype for a factory)}."""
    x = jnp.zeros((3, 4, 5), jnp.float32)
    p = jnp.linspace(0.0, 1.0, 60).reshape(3, 4, 5)
    ones = jnp.ones((3, 4, 5), jnp.float32)
    q, k, v = (jnp.linspace(-1.0, 1.0, 2 * 3 * 4 * 8).reshape(2, 3, 4, 8) * s for s in (1.0, 0.5, 2.0))
    return {
        "aten::normal_": ((x, 1.0, 2.0), {}, None), "aten::uniform_": ((x, -1.0, 3.0), {}, None),
        "aten::exponential_": ((x,), {}, None), "aten::log_normal_": ((x,), {}, None),
        "aten::cauchy_": ((x,), {}, None), "aten::geometric_": ((x, 0.3), {}, None),
        "aten::bernoulli_.float": ((x, 0.3), {}, None), "aten::bernoulli_.Tensor": ((x, p), {}, None),
        "aten::bernoulli": ((p,), {}, None), "aten::bernoulli.p": ((x, 0.7), {}, None),
        "aten::random_.from": ((x.astype(jnp.int64), -5, 9), {}, None),
        "aten::random_.to": ((x.astype(jnp.int32), 9), {}, None), "aten::random_": ((x,), {}, None),
        "aten::native_dropout": ((ones, 0.4, True), {}, None),
        "aten::normal.Tensor_float": ((x, 2.0), {}, None), "aten::normal.float_Tensor": ((1.0, ones), {}, None),
        "aten::normal.Tensor_Tensor": ((x, ones), {}, None),
        "aten::multinomial": ((ones.reshape(12, 5), 3), {}, None),
        "aten::randint_like": ((x, 3, 9), {}, None),
        "aten::rrelu_with_noise_functional": ((p - 0.5, ones, 0.1, 0.3, True), {}, None),
        "aten::rrelu_with_noise": ((p - 0.5, ones, 0.1, 0.3, True), {}, None),
        "aten::rand": ((), {}, ((3, 4, 5), jnp.float32)), "aten::rand.complex": ((), {}, ((3, 4), jnp.complex64)),
        "aten::randn": ((), {}, ((3, 4, 5), jnp.bfloat16)),
        "aten::randint": ((9, (3, 4, 5)), {}, ((3, 4, 5), jnp.int64)),
        "aten::randint.low": ((-2, 9, (3, 4, 5)), {}, ((3, 4, 5), jnp.int64)),
        "aten::scaled_dot_product_attention": ((q, k, v, None, 0.3), {}, None),
        "pjrt_host::attention_keep": ((q, k, 0.3), {}, None),
        # torch.distributions' samplers: drawn shaped everywhere (nothing to flatten)
        "aten::poisson": ((ones * 3,), {}, None), "aten::binomial": ((ones * 5, p), {}, None),
        "aten::_standard_gamma": ((ones * 2,), {}, None), "aten::_sample_dirichlet": ((ones,), {}, None),
    }


#: Random lowerings whose draw has no shape of several dimensions to flatten.
_NOT_SHAPED = {"aten::randperm", "aten::randperm.generator"}
_RANDOM_CALLS = (
    "aten::normal_", "aten::uniform_", "aten::exponential_", "aten::log_normal_", "aten::cauchy_",
    "aten::geometric_", "aten::bernoulli_.float", "aten::bernoulli_.Tensor", "aten::bernoulli", "aten::bernoulli.p",
    "aten::random_.from", "aten::random_.to", "aten::random_", "aten::native_dropout", "aten::normal.Tensor_float",
    "aten::normal.float_Tensor", "aten::normal.Tensor_Tensor", "aten::multinomial", "aten::randint_like",
    "aten::rrelu_with_noise_functional", "aten::rrelu_with_noise", "aten::rand", "aten::rand.complex",
    "aten::randn", "aten::randint", "aten::randint.low", "aten::scaled_dot_product_attention",
    "pjrt_host::attention_keep",
    "aten::poisson", "aten::binomial", "aten::_standard_gamma", "aten::_sample_dirichlet",
)


@pytest.mark.parametrize("name", _RANDOM_CALLS)
def test_a_random_draw_is_the_same_on_one_device_and_partitioned(name: str) -> None:
    """On one device a draw of several dimensions is made over a flat
    counter and reshaped (``LoweringContext.one_device``: XLA:CPU compiles
    it 2-5x faster); a program partitioned over a mesh draws the shape
    itself.  Both must give every element the same value, or a seed would
    draw other numbers on a mesh than on one device (and eager than a
    compiled graph on a mesh)."""
    from pjrt_host._lowerings import LoweringContext, invoke

    args, kwargs, result = _random_calls()[name]
    _lowerings.load_all()
    lowering = _lowerings._TABLE[name.replace(".complex", "")]
    key = jax.random.fold_in(jax.random.key(11, impl="threefry2x32"), 5)

    def run(one_device: bool) -> list:
        ctx = LoweringContext(rng_key=key, one_device=one_device)
        shape, dtype = result if result is not None else (None, None)
        where = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]  # scalars stay constants

        def call(*arrays: Any) -> Any:
            full = list(args)
            for i, a in zip(where, arrays):
                full[i] = a
            return invoke(lowering, full, kwargs, ctx, dtype, shape)

        out = jax.jit(call)(*(args[i] for i in where))
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]

    flat, shaped = run(True), run(False)
    assert [a.shape for a in flat] == [a.shape for a in shaped] and any(a.ndim > 1 for a in flat)
    for a, b in zip(flat, shaped):
        np.testing.assert_array_equal(a, b)
    if name == "aten::native_dropout":
        assert 0 < flat[1].sum() < flat[1].size  # a real draw, not a constant mask


def test_every_random_lowering_is_checked_on_one_device_and_partitioned() -> None:
    _lowerings.load_all()
    random = {n for n, lw in _lowerings._TABLE.items() if lw.needs_rng}
    assert set(_random_calls()) == set(_RANDOM_CALLS)
    checked = {_lowerings._TABLE[n.replace(".complex", "")].fn for n in _RANDOM_CALLS}
    missing = {n for n in random if _lowerings._TABLE[n].fn not in checked} - _NOT_SHAPED
    assert not missing, f"random lowerings with no flat-against-shaped check: {sorted(missing)}"
