"""Errors on the 'jax' device are torch's: mixed devices as on cuda, shape errors, the missing-lowering message and the CPU fallback opt-in, device errors inside
backward."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)
from conftest import run_python  # noqa: E402

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


# ---------------------------------------------------------------- errors


def test_mixed_devices_fail_like_cuda():
    j = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least "
                                           r"two devices, jax:0 and cpu!"):
        j + torch.ones(3)
    for cpu_first in (lambda: torch.ones(3) * j, lambda: torch.ones(3).add_(j), lambda: torch.cat([torch.ones(3), j])):
        with pytest.raises(RuntimeError, match="found at least two devices, jax:0 and cpu!"):
            cpu_first()


_OUT_ON_CPU = {
    "isin": lambda d, o: torch.isin(torch.arange(4.0, device=d), torch.tensor([1.0, 2.0], device=d), out=o(4, torch.bool)),
    "renorm": lambda d, o: torch.renorm(torch.ones(2, 3, device=d), 2, 0, 1.0, out=o((2, 3))),
    "unbind_copy": lambda d, o: torch.unbind_copy(torch.ones(2, 3, device=d), 0, out=[o(3), o(3)]),
    "split_with_sizes_copy": lambda d, o: torch.split_with_sizes_copy(torch.ones(4, device=d), [1, 3],
                                                                      out=[o(1), o(3)]),
    "linalg.lu": lambda d, o: torch.linalg.lu(torch.eye(3, device=d), out=(o((3, 3)), o((3, 3)), o((3, 3)))),
    "add": lambda d, o: torch.add(torch.ones(3, device=d), 1, out=o(3)),
    "_chunk_cat": lambda d, o: torch._chunk_cat([torch.ones(2, 4, device=d)], 1, 2, out=o((2, 2, 2))),
}


@pytest.mark.parametrize("name", sorted(_OUT_ON_CPU))
def test_an_out_tensor_on_cpu_is_refused_like_cuda(name):
    """torch refuses out= on CPU for inputs on an accelerator; ops the device
    runs through a decomposition or a handler of its own (isin, renorm, the
    *_copy ops, linalg.lu) wrote the result into the CPU tensor instead
    (found by the bad-input sweep's out:cpu cases)."""
    made = []

    def cpu_out(shape, dtype=torch.float32):
        made.append(torch.full(shape if isinstance(shape, tuple) else (shape,), 7, dtype=dtype))
        return made[-1]

    # (PyTorch's device-generic test_nonzero asks for "on the same device", as cuda's words have it)
    with pytest.raises(RuntimeError, match=r"Expected out tensor to have device jax:0, but got cpu instead.*on the "
                                           r"same device"):
        _OUT_ON_CPU[name](DEV, cpu_out)
    assert all(bool((t == torch.full_like(t, 7)).all()) for t in made), "the CPU out= tensor was written"


@pytest.mark.parametrize("op", ["index_add", "index_copy"])
def test_a_0dim_cpu_self_or_source_of_an_index_write_is_refused_like_cuda(op):
    """torch's structured meta functions of index_add / index_copy (which
    cuda's kernels share) refuse self or source on another device, a 0-dim
    CPU tensor included; the device computed them (found by the bad-input
    sweep, its reference asked of torch's meta device).  A CPU index is
    still moved to the device, as before."""
    fn = getattr(torch, op)
    index = torch.tensor([0], device=DEV)
    with pytest.raises(RuntimeError, match=rf"{op}\(\): self, index and source expected to be in the same device"):
        fn(torch.zeros(3, device=DEV), 0, index, torch.tensor(5.0))
    with pytest.raises(RuntimeError, match=rf"{op}\(\): self, index and source expected to be in the same device"):
        fn(torch.tensor(1.0), 0, index, torch.ones(1, device=DEV))
    moved = fn(torch.zeros(3, device=DEV), 0, torch.tensor([1]), torch.ones(1, device=DEV))
    assert moved.cpu().tolist() == [0.0, 1.0, 0.0]


def test_cpu_scalar_tensor_is_allowed():
    j = torch.ones(3, device=DEV)
    out = j + torch.tensor(2.0)
    assert out.device.type == DEV and cpu(out).tolist() == [3.0, 3.0, 3.0]
    assert (j * torch.tensor(2, dtype=torch.int64)).dtype == torch.float32


def test_shape_errors_are_torchs():
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        torch.ones(2, 3, device=DEV) @ torch.ones(2, 3, device=DEV)


# An op with no lowering and no decomposition in torch 2.13 (the backward of
# a fused kernel torch's own transformer fast paths call).  If it gets a
# lowering, pick another such op.
UNLOWERED = "_masked_softmax_backward"


def call_unlowered(x):
    mask = x.new_zeros(x.shape, dtype=torch.bool)
    return getattr(torch.ops.aten, UNLOWERED)(x.view(2, 3), x.view(2, 3), mask.view(2, 3))


def test_missing_lowering_message():
    """Through torch's real dispatch: the error names the op, the way on
    (cpu_fallback) and a document that exists."""
    x = torch.arange(6.0, device=DEV)
    with pytest.raises(NotImplementedError) as info:
        call_unlowered(x)
    text = str(info.value)
    assert f"aten::{UNLOWERED}" in text and "cpu_fallback=True" in text
    doc = text.split("report the gap, and how to add a lowering: ")[1].split(" ")[0]
    assert os.path.exists(os.path.join(os.path.dirname(__file__), "..", doc)), doc


_BACKWARD_ERROR = """
import torch, pjrt_host
x = torch.randn(2, 3, device="jax", requires_grad=True)
mask = torch.zeros(2, 3, dtype=torch.bool, device="jax")
y = torch.ops.aten._masked_softmax(x, mask)  # the forward runs; its backward has no lowering
for run in (lambda: y.sum().backward(retain_graph=True), lambda: torch.autograd.grad(y.sum(), x, retain_graph=True)):
    try:
        run()
        print("NO ERROR")
    except NotImplementedError as err:
        print("RAISED", str(err).split(" has no lowering")[0])
z = torch.ones(3, device="jax", requires_grad=True)
(z * 2).sum().backward()
print("AFTER", z.grad.cpu().tolist())
with pjrt_host.config(cpu_fallback=True):  # the caller's settings reach autograd's engine thread
    y.sum().backward()
print("FALLBACK", x.grad.shape == x.shape)
"""


def test_a_device_error_inside_backward_raises_at_backward():
    """A C++ autograd node whose op fails on the device (here: no lowering)
    used to end the process (torch's Python device guard calls back into
    Python while the error unwinds: 'terminate called without an active
    exception').  The error now reaches backward() and autograd.grad()
    intact, and the device keeps working; pjrt_host.config around
    backward() applies in autograd's engine thread.  In a child process: a regression
    must fail this test, not end the test run."""
    proc = run_python(["-c", _BACKWARD_ERROR])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert lines.count("RAISED pjrt_host: the ATen op aten::_masked_softmax_backward") == 2, proc.stdout
    assert "AFTER [2.0, 2.0, 2.0]" in lines and "FALLBACK True" in lines, proc.stdout


#: The end of the scripts below: run(dev) on CPU and on 'jax', compared.
_COMPARE_WITH_CPU = """
cpu, dev = run("cpu"), run("jax")
for c, d in zip(cpu, dev):
    print("SAME" if c == d else "DIFF", c, d)
print("ALL SAME", cpu == dev)
"""

_RAISING_HOOKS = """
import torch, pjrt_host

def bad(*args):
    raise ValueError("a hook refused the gradient")

def run(dev):
    seen = []
    for hook in ("tensor", "post_accumulate", "grad"):
        x = torch.ones(3, device=dev, requires_grad=True)
        y = x * 2
        try:
            if hook == "tensor":
                y.register_hook(bad)
                (y * y).sum().backward()
            elif hook == "post_accumulate":
                x.register_post_accumulate_grad_hook(bad)
                (y * y).sum().backward()
            else:
                y.register_hook(bad)
                torch.autograd.grad((y * y).sum(), x)
            seen.append("no error")
        except Exception as err:
            seen.append((type(err).__name__, str(err)))
    z = torch.ones(3, device=dev, requires_grad=True)
    (z * 3).sum().backward()  # the device goes on
    seen.append(z.grad.cpu().tolist())
    return seen
"""


def test_a_hook_that_raises_inside_backward_raises_as_on_cpu():
    """A tensor hook (or a post-accumulate-grad hook) that raises inside a
    backward over 'jax' tensors ended the process: torch's Python device
    guard called back into Python from a stream guard's destructor while
    the hook's exception was still pending ('terminate called without an
    active exception'; the fuzzer met the same through a fake kernel that
    raised while torch.compile traced a backward).  The guard now takes
    the pending exception and backward() / autograd.grad() raise it, as
    on CPU.  In a child process: a regression must fail this test, not end
    the test run."""
    proc = run_python(["-c", _RAISING_HOOKS + _COMPARE_WITH_CPU])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ALL SAME True" in proc.stdout, proc.stdout


_REFUSED_BACKWARD_FORMULA = """
import torch, pjrt_host

def run(dev):
    seen = []
    a = torch.tensor([True, False], device=dev)
    y = torch.tensor([0.5, -2.0], device=dev, requires_grad=True)
    w = torch.tensor([1.0, 2.0], device=dev, requires_grad=True)
    v = torch.tensor([1.0, 4.0], device=dev, requires_grad=True)
    (w * 3).sum().backward()  # w has a gradient before the failing backward
    for loss in (lambda: torch.atan2(a, y).sum(),
                 lambda: (v * 2).sum() + torch.atan2(a, y).sum() + (w * w).sum() + y.sum() + (v * v).sum()):
        try:
            loss().backward()
            seen.append("no error")
        except Exception as err:
            seen.append((type(err).__name__, str(err)))
        seen.append([None if t.grad is None else t.grad.cpu().tolist() for t in (y, w, v)])
    try:
        torch.autograd.grad(torch.atan2(a, y).sum(), y)
    except Exception as err:
        seen.append((type(err).__name__, str(err)))
    (y * y).sum().backward()  # the device goes on
    seen.append(y.grad.cpu().tolist())
    return seen
"""


def test_a_backward_formula_torch_refuses_raises_as_on_cpu():
    """atan2(bool, float)'s backward negates the bool tensor, which torch's
    meta and CPU kernels refuse alike: the device had no placeholder to
    give autograd's engine and the error ended the process ("terminate
    called without an active exception", or a SystemError from
    run_backward).  Now backward() and autograd.grad() raise CPU's
    RuntimeError with its text, and the leaves' ``.grad`` are CPU's: the
    sums of the nodes before the failing one (a gradient that existed is
    kept; a leaf reached only after it has none).  In a child process: a
    regression must fail this test, not end the test run (fuzz finding 1,
    docs/fuzzing.md)."""
    proc = run_python(["-c", _REFUSED_BACKWARD_FORMULA + _COMPARE_WITH_CPU])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ALL SAME True" in proc.stdout, proc.stdout
    assert "Negation, the `-` operator, on a bool tensor" in proc.stdout, proc.stdout


_FOREACH_WRITES = [
    ("_foreach_add_", lambda ts: torch._foreach_add_(ts, 1.0)),
    ("_foreach_mul_ (list)", lambda ts: torch._foreach_mul_(ts, [2.0] * len(ts))),
    ("_foreach_addcmul_", lambda ts: torch._foreach_addcmul_(ts, ts, ts, 0.5)),
    ("_foreach_lerp_", lambda ts: torch._foreach_lerp_(ts, [t * 0 + 3 for t in ts], 0.25)),
    ("_foreach_zero_", lambda ts: torch._foreach_zero_(ts)),
]


@pytest.mark.parametrize("name,write", _FOREACH_WRITES, ids=[n for n, _ in _FOREACH_WRITES])
def test_foreach_in_place_ops_count_their_writes_as_cpu_does(name, write):
    """torch's foreach kernels count each write in the target's version
    (the ops have no ADInplaceOrView kernel): a view's write counts in its
    base too; an expanded target is refused where CPU refuses it."""
    seen = {}
    for dev in ("cpu", DEV):
        plain = torch.arange(3.0, device=dev)
        base = torch.arange(6.0, device=dev).reshape(2, 3)
        write([plain, base[1]])
        try:
            write([torch.zeros(1, device=dev).expand(3)])
            refused = None
        except RuntimeError as err:
            refused = str(err)
        seen[dev] = (plain._version, base._version, refused, plain.cpu(), base.cpu())
    assert seen[DEV][:3] == seen["cpu"][:3], name
    torch.testing.assert_close(seen[DEV][3:], seen["cpu"][3:])


def test_a_saved_tensor_changed_by_a_foreach_op_is_refused_at_backward():
    # without its version counted, backward would use the new values silently
    for dev in ("cpu", DEV):
        w = torch.randn(3, device=dev, requires_grad=True)
        a = torch.randn(3, device=dev)
        loss = (a * w).sum()  # saves a
        torch._foreach_add_([a], 1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_cpu_fallback_opt_in():
    """Through torch's real dispatch: off by default, on in the scope, with a
    one-time warning naming the op, and the result back on the device."""
    x = torch.arange(6.0, device=DEV)
    with pjrt_host.config(cpu_fallback=True):
        with pytest.warns(UserWarning, match=f"aten::{UNLOWERED} has no lowering; running it on torch CPU"):
            out = call_unlowered(x)
    assert out.device.type == DEV and torch.equal(cpu(out), call_unlowered(x.cpu()))
    with pytest.raises(NotImplementedError, match=f"aten::{UNLOWERED}"):
        call_unlowered(x)


def _raised(fn):
    try:
        fn()
    except Exception as err:  # the exception itself is what is compared
        return type(err), str(err).splitlines()[0]
    return None


def test_a_batched_matmul_of_a_bool_raises_cpus_error_for_the_path_torch_takes_for_the_device():
    """Fuzz finding 12 (seed 5000315): ``matmul(bool (2, 2, 4), bfloat16
    (1, 4, 2))`` raises NotImplementedError on CPU ("bmm" has no bool
    code) and RuntimeError on the device (mm's "expected m1 and m2 to have
    the same dtype").  torch's composite matmul picks the path: it folds
    the batch into one mm for a tensor subclass, as it does on CPU when the
    folded operand needs a gradient, and the device raises what CPU raises
    on that path, type and text.  This test fails when torch picks the same
    path for both (then the device raises CPU's NotImplementedError)."""
    def call(dev, grad=False):
        x = torch.ones(2, 2, 4, dtype=torch.bool, device=dev)
        y = torch.ones(1, 4, 2, dtype=torch.bfloat16, device=dev).requires_grad_(grad)
        return _raised(lambda: torch.matmul(x, y))

    plain_cpu, folded_cpu, device = call("cpu"), call("cpu", grad=True), call(DEV)
    assert plain_cpu == (NotImplementedError, "\"bmm\" not implemented for 'Bool'")
    assert device == folded_cpu == (RuntimeError, "expected m1 and m2 to have the same dtype, but got: bool != "
                                                  "c10::BFloat16")
    assert call(DEV, grad=True) == folded_cpu
