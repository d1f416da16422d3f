"""torch.nn modules whose fast paths torch takes on the 'jax' device (it
lists the PrivateUse1 backend beside cpu and cuda): nn.MultiheadAttention,
nn.TransformerEncoderLayer and nn.TransformerEncoder in eval without grad
(``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``,
``_masked_softmax``) and in training, with and without masks, give torch
CPU's results.  The encoder's nested-tensor path (eval with a
``src_key_padding_mask``) runs unnested on 'jax': equal to CPU at every
position that is not padding, where CPU's nested path leaves zeros."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

import pjrt_host  # noqa: E402,F401

DEV = "jax"
nn = torch.nn
D, H, FF = 16, 4, 32


@pytest.fixture(autouse=True)
def no_default_device_mode():
    """torch takes its transformer fast paths only without a torch-function
    mode; ``set_default_device("cpu")`` elsewhere leaves torch's DeviceContext
    mode on, which would change which path CPU takes here."""
    if torch._C._is_torch_function_mode_enabled():
        torch.set_default_device(None)
    yield


def _close(got, expected, where=None):
    got = got.detach().cpu()
    expected = expected.detach()
    if where is not None:
        got, expected = got[where], expected[where]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-5, equal_nan=True)


def _inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, D, generator=g)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])  # left-aligned
    return x, pad


def _grad_mode(grad):
    return contextlib.nullcontext() if grad else torch.no_grad()


def _encoder(norm_first=False, activation="relu", final_norm=False, enable_nested_tensor=True):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation=activation)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D) if final_norm else None,
                                 enable_nested_tensor=enable_nested_tensor)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
@pytest.mark.parametrize("variant", ["relu", "gelu_norm_first", "final_norm"])
def test_transformer_encoder_matches_cpu(variant, masked, training, grad):
    enc = _encoder(norm_first=variant == "gelu_norm_first",
                   activation="gelu" if variant == "gelu_norm_first" else "relu",
                   final_norm=variant == "final_norm").train(training)
    x, pad = _inputs()
    kwargs = {"src_key_padding_mask": pad} if masked else {}
    with _grad_mode(grad):
        expected = enc(x, **kwargs)
        on_device = enc.to(DEV)
        got = on_device(x.to(DEV), **{k: v.to(DEV) for k, v in kwargs.items()})
    assert got.device.type == DEV and got.shape == expected.shape
    nested_on_cpu = masked and not training and not grad and variant != "gelu_norm_first"
    # CPU's nested path defines no values at padding positions (it leaves
    # zeros, then the final norm); everywhere else all of it is compared.
    _close(got, expected, where=~pad if nested_on_cpu else None)
    assert enc.use_nested_tensor is (variant != "gelu_norm_first")  # the module is not changed


def test_encoder_without_nested_tensor_matches_cpu_everywhere():
    # enable_nested_tensor=False: CPU's layers take their own fast path with
    # the padding mask, which defines every position.
    enc = _encoder(enable_nested_tensor=False).eval()
    x, pad = _inputs()
    with torch.no_grad():
        expected = enc(x, src_key_padding_mask=pad)
        got = enc.to(DEV)(x.to(DEV), src_key_padding_mask=pad.to(DEV))
    _close(got, expected)


def test_encoder_on_cpu_keeps_torch_nested_path():
    # CPU tensors are torch's own: after a 'jax' round trip the CPU encoder
    # still packs into a nested tensor (zeros at padding positions).
    enc = _encoder().eval()
    x, pad = _inputs()
    with torch.no_grad():
        enc.to(DEV)(x.to(DEV), src_key_padding_mask=pad.to(DEV))
        out = enc.cpu()(x, src_key_padding_mask=pad)
    assert torch.equal(out[1, 3:], torch.zeros(2, D))


def test_encoder_trains_like_cpu():
    enc_cpu = _encoder().train()
    enc_dev = _encoder().train().to(DEV)
    x, pad = _inputs()
    for enc, device in ((enc_cpu, "cpu"), (enc_dev, DEV)):
        enc(x.to(device), src_key_padding_mask=pad.to(device))[~pad.to(device)].square().sum().backward()
    for (name, p), (_, q) in zip(enc_cpu.named_parameters(), enc_dev.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mask", ["none", "padding", "attn", "both", "fully_padded_row"])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)],
                         ids=["weights", "per_head_weights", "no_weights"])
def test_multihead_attention_matches_cpu(mask, training, grad, need_weights, average):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, dropout=0.0, batch_first=True).train(training)
    x, pad = _inputs()
    if mask == "fully_padded_row":
        pad = pad.clone()
        pad[0] = True  # NaN for that batch on CPU, fast path and slow path alike
    attn = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    kwargs = {"need_weights": need_weights, "average_attn_weights": average}
    if mask in ("padding", "both", "fully_padded_row"):
        kwargs["key_padding_mask"] = pad
    if mask in ("attn", "both"):
        kwargs["attn_mask"] = attn
    with _grad_mode(grad):
        out, weights = mha(x, x, x, **kwargs)
        on_device = mha.to(DEV)
        xd = x.to(DEV)
        got, got_weights = on_device(xd, xd, xd, **{k: v.to(DEV) if isinstance(v, torch.Tensor) else v
                                                    for k, v in kwargs.items()})
    _close(got, out)
    if weights is None:
        assert got_weights is None
    else:
        _close(got_weights, weights)


def test_multihead_attention_cross_attention_matches_cpu():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    x, pad = _inputs()
    memory = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out, weights = mha(x, memory, memory)
        got, got_weights = mha.to(DEV)(x.to(DEV), memory.to(DEV), memory.to(DEV))
    _close(got, out)
    _close(got_weights, weights)


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
def test_masked_softmax_matches_cpu(mask_type):
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 4, 5, 5, generator=g)
    if mask_type == 0:
        mask = torch.rand(5, 5, generator=g) > 0.6
    elif mask_type == 1:
        mask = torch.rand(2, 5, generator=g) > 0.6
        mask[1] = True  # a fully masked row: NaN, as on CPU
    else:
        mask = torch.rand(2, 4, 5, 5, generator=g) > 0.6
    expected = torch._masked_softmax(scores, mask, 3, mask_type)
    got = torch._masked_softmax(scores.to(DEV), mask.to(DEV), 3, mask_type)
    _close(got, expected)


def test_encoder_still_scripts_on_cpu():
    # The encoder's forward is torch's source to TorchScript, as without pjrt_host.
    enc = _encoder().eval()
    x, pad = _inputs()
    with torch.no_grad():
        assert torch.equal(torch.jit.script(enc)(x, src_key_padding_mask=pad), enc(x, src_key_padding_mask=pad))


def test_encoder_compiles_on_device():
    import torch._dynamo

    torch._dynamo.reset()
    enc = _encoder().eval()
    x, pad = _inputs()
    with torch.no_grad():
        expected = enc(x, src_key_padding_mask=pad)
        compiled = torch.compile(enc.to(DEV), backend="jax", fullgraph=True)
        got = compiled(x.to(DEV), src_key_padding_mask=pad.to(DEV))
    torch._dynamo.reset()
    _close(got, expected, where=~pad)


@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_sequences_through_an_lstm_match_cpu(batch_first):
    """pack_padded_sequence (sorted and not), an LSTM over the packed batch,
    pad_packed_sequence, and the gradients back through the packing: as on
    CPU.  lengths and batch_sizes stay on the CPU, as on every device."""
    rnn = torch.nn.utils.rnn
    got = {}
    for d in ("cpu", DEV):
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(5, 6, batch_first=batch_first).to(d)
        x = torch.randn((3, 4, 5) if batch_first else (4, 3, 5)).to(d).requires_grad_()
        packed = rnn.pack_padded_sequence(x, torch.tensor([4, 2, 1]), batch_first=batch_first)
        assert packed.batch_sizes.device.type == "cpu" and packed.data.device.type == d
        out, (h, _) = lstm(packed)
        padded, lengths = rnn.pad_packed_sequence(out, batch_first=batch_first)
        unsorted = rnn.pack_padded_sequence(x, torch.tensor([1, 4, 2]), batch_first=batch_first, enforce_sorted=False)
        (padded.sum() + h.sum() + unsorted.data.sum()).backward()
        got[d] = [padded, h, x.grad, lstm.weight_ih_l0.grad, unsorted.data, lengths, packed.batch_sizes]
    for c, j in zip(got["cpu"], got[DEV]):
        torch.testing.assert_close(j.detach().cpu(), c.detach(), atol=1e-5, rtol=1e-5)
    # CPU's checks of the lengths, with CPU's errors
    x = torch.zeros(3, 4, 5, device=DEV)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        rnn.pack_padded_sequence(x, torch.tensor([2, 4, 1]), batch_first=True)
    with pytest.raises(RuntimeError, match=r"Expected `len\(lengths\)` to be equal to batch_size"):
        rnn.pack_padded_sequence(x, torch.tensor([4, 2]), batch_first=True)
