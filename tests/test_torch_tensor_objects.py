"""'jax' tensors as Python and torch objects: deepcopy and pickle, ``.data``
assignment, inference mode and functorch, DLPack moves where the plugin
allows them, strides and complex parts, sparse gradients that come back
dense."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import pjrt_host  # noqa: E402  (registers the device if autoload is off)

DEV = "jax"


def cpu(t):
    return t.detach().cpu()


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
    """Reading a 'jax' tensor into torch CPU goes through DLPack where the
    plugin allows it; a CPU tensor moved to the device always goes by host
    memory (one copy either way, and no torch deleter left for a runtime
    thread to call: test_transfers' exit test)."""
    import jax

    from pjrt_host._torch import _conversion

    torch.zeros(1, device=DEV)  # the client exists
    monkeypatch.setattr(_conversion, "_zero_copy", zero_copy)
    imports, exports = [], []
    real_import, real_export = jax.dlpack.from_dlpack, torch.from_dlpack
    monkeypatch.setattr(jax.dlpack, "from_dlpack", lambda x, *a, **k: imports.append(1) or real_import(x, *a, **k))
    monkeypatch.setattr(torch, "from_dlpack", lambda x, *a, **k: exports.append(1) or real_export(x, *a, **k))
    c = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous source
    j = c.to(DEV)
    assert not imports
    assert torch.equal(j.cpu(), c)
    assert bool(exports) == bool(zero_copy)
    c.zero_()  # the source is not aliased
    assert j.cpu().sum().item() == 66.0
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert torch.equal(b.to(DEV).cpu(), b)


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


def test_the_exit_wait_for_dlpack_imports_leaves_no_program_running():
    """The exit hook a DLPack import registers (a CUDA tensor moved to a GPU
    plugin; test_transfers has the abort it prevents) waits for every
    program of the device's client."""
    from pjrt_host._torch._conversion import _wait_for_device_work
    from pjrt_host._torch._tensor import read

    x = torch.randn(384, 384, device=DEV)
    results = [read(x @ x @ x + k) for k in range(4)]
    _wait_for_device_work()
    assert all(r.is_ready() for r in results)
