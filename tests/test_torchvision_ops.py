"""torchvision's detection ops on 'jax' against CPU: ``torchvision::nms``,
``roi_align``, ``roi_pool`` and their backwards.

Where torchvision's compiled ops load, its own CPU kernels are the
reference.  Where they do not (PyPI's torchvision for this torch is a CUDA
build, whose ``_C`` library cannot load beside CPU torch), this file defines
the ops itself with torchvision's schemas (``torchvision/csrc/ops/*.cpp``)
and CPU kernels that follow torchvision's CPU kernels loop for loop, in
plain torch; the device reaches them by the same names either way.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


def _real_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # the CUDA build beside CPU torch: "operator torchvision::nms does not exist"
        return False
    return hasattr(torch.ops.torchvision, "nms")


REAL = _real_torchvision()
_LIBRARY = None  # keeps the definitions below alive


# ---------------------------------------------------------------- reference kernels (when torchvision has none)


def _nms_cpu(dets, scores, iou_threshold):
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    x1, y1, x2, y2 = (dets[:, i].contiguous() for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    order = scores.sort(dim=0, descending=True, stable=True)[1].tolist()
    suppressed = [False] * dets.shape[0]
    keep = []
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[pos + 1:]:
            if suppressed[j]:
                continue
            w = torch.clamp(torch.minimum(x2[i], x2[j]) - torch.maximum(x1[i], x1[j]), min=0)
            h = torch.clamp(torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j]), min=0)
            inter = w * h
            if (inter / (areas[i] + areas[j] - inter)).item() > iou_threshold:
                suppressed[j] = True
    return torch.tensor(keep, dtype=torch.long)


def _bilinear(plane, height, width, y, x):
    """torchvision's ``bilinear_interpolate`` on ``plane[C, H, W]`` (None: outside)."""
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return None
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return [(hy * hx, y_low, x_low), (hy * lx, y_low, x_high), (ly * hx, y_high, x_low), (ly * lx, y_high, x_high)]


def _align_samples(roi, spatial_scale, ph_n, pw_n, sampling_ratio, aligned, height, width):
    """Per bin (ph, pw): the list of (weight, row, column) of every sample
    and the bin's sample count, as torchvision's CPU kernel walks them."""
    offset = 0.5 if aligned else 0.0
    start_w, start_h = roi[1] * spatial_scale - offset, roi[2] * spatial_scale - offset
    roi_w = roi[3] * spatial_scale - offset - start_w
    roi_h = roi[4] * spatial_scale - offset - start_h
    if not aligned:
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / ph_n, roi_w / pw_n
    grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / ph_n)
    grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pw_n)
    count = max(grid_h * grid_w, 1)
    bins = {}
    for ph in range(ph_n):
        for pw in range(pw_n):
            taps = []
            for iy in range(grid_h):
                y = start_h + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                for ix in range(grid_w):
                    x = start_w + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                    found = _bilinear(None, height, width, y, x)
                    if found is not None:
                        taps.extend(found)
            bins[ph, pw] = taps
    return bins, count


def _roi_align_cpu(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    _, channels, height, width = input.shape
    out = input.new_zeros(rois.shape[0], channels, pooled_height, pooled_width)
    for k, roi in enumerate(rois.tolist()):
        bins, count = _align_samples(roi, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                                     height, width)
        plane = input[int(roi[0])]
        for (ph, pw), taps in bins.items():
            for w, r, c in taps:
                out[k, :, ph, pw] += w * plane[:, r, c]
        out[k] /= count
    return out


def _roi_align_backward_cpu(grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                            width, sampling_ratio, aligned):
    out = grad.new_zeros(batch_size, channels, height, width)
    for k, roi in enumerate(rois.tolist()):
        bins, count = _align_samples(roi, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                                     height, width)
        for (ph, pw), taps in bins.items():
            for w, r, c in taps:
                out[int(roi[0]), :, r, c] += grad[k, :, ph, pw] * w / count
    return out


def _roi_pool_cpu(input, rois, spatial_scale, pooled_height, pooled_width):
    _, channels, height, width = input.shape
    out = input.new_zeros(rois.shape[0], channels, pooled_height, pooled_width)
    argmax = torch.zeros(out.shape, dtype=torch.int32)
    lowest = -torch.finfo(torch.float32).max

    def c_round(v):
        return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))

    for k, roi in enumerate(rois.tolist()):
        scaled = (torch.tensor(roi[1:], dtype=input.dtype) * torch.tensor(spatial_scale, dtype=input.dtype)).tolist()
        start_w, start_h, end_w, end_h = (c_round(v) for v in scaled)
        roi_w, roi_h = max(end_w - start_w + 1, 1), max(end_h - start_h + 1, 1)
        # The kernel's bin arithmetic is in the input's dtype (its T).
        bin_h = torch.tensor(roi_h, dtype=input.dtype) / pooled_height
        bin_w = torch.tensor(roi_w, dtype=input.dtype) / pooled_width

        def edge(p, size, start, rounding):
            return min(max(int(rounding(torch.tensor(p, dtype=input.dtype) * size)) + start, 0), size_of[size is bin_h])

        size_of = {True: height, False: width}
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                h0, h1 = edge(ph, bin_h, start_h, torch.floor), edge(ph + 1, bin_h, start_h, torch.ceil)
                w0, w1 = edge(pw, bin_w, start_w, torch.floor), edge(pw + 1, bin_w, start_w, torch.ceil)
                empty = h1 <= h0 or w1 <= w0
                for c in range(channels):
                    best, where = (0.0 if empty else lowest), -1
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            v = input[int(roi[0]), c, h, w].item()
                            if v > best:
                                best, where = v, h * width + w
                    out[k, c, ph, pw] = best
                    argmax[k, c, ph, pw] = where
    return out, argmax


def _roi_pool_backward_cpu(grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size, channels,
                           height, width):
    out = grad.new_zeros(batch_size, channels, height * width)
    for k, roi in enumerate(rois.tolist()):
        for c in range(channels):
            for ph in range(pooled_height):
                for pw in range(pooled_width):
                    a = int(argmax[k, c, ph, pw])
                    if a != -1:
                        out[int(roi[0]), c, a] += grad[k, c, ph, pw]
    return out.view(batch_size, channels, height, width)


def _define_ops() -> None:
    """torchvision's schemas, CPU kernels above, fake kernels and autograd
    as torchvision registers them."""
    global _LIBRARY
    if _LIBRARY is not None or hasattr(torch.ops.torchvision, "nms"):
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")
    lib.define("_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
               "int sampling_ratio, bool aligned) -> Tensor")
    lib.define("roi_pool(Tensor input, Tensor rois, float spatial_scale, int pooled_height, int pooled_width) "
               "-> (Tensor, Tensor)")
    lib.define("_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
               "int pooled_height, int pooled_width, int batch_size, int channels, int height, int width) -> Tensor")
    for name, fn in [("nms", _nms_cpu), ("roi_align", _roi_align_cpu), ("_roi_align_backward", _roi_align_backward_cpu),
                     ("roi_pool", _roi_pool_cpu), ("_roi_pool_backward", _roi_pool_backward_cpu)]:
        lib.impl(name, fn, "CPU")

    def nms_fake(dets, scores, iou_threshold):
        return dets.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.long)

    torch.library.register_fake("torchvision::nms", nms_fake, lib=lib)
    torch.library.register_fake(
        "torchvision::roi_align",
        lambda input, rois, scale, ph, pw, ratio, aligned: input.new_empty(rois.shape[0], input.shape[1], ph, pw),
        lib=lib)
    torch.library.register_fake(
        "torchvision::_roi_align_backward",
        lambda grad, rois, scale, ph, pw, n, c, h, w, ratio, aligned: grad.new_empty(n, c, h, w), lib=lib)
    torch.library.register_fake(
        "torchvision::roi_pool",
        lambda input, rois, scale, ph, pw: (input.new_empty(rois.shape[0], input.shape[1], ph, pw),
                                            input.new_empty(rois.shape[0], input.shape[1], ph, pw, dtype=torch.int32)),
        lib=lib)
    torch.library.register_fake(
        "torchvision::_roi_pool_backward",
        lambda grad, rois, argmax, scale, ph, pw, n, c, h, w: grad.new_empty(n, c, h, w), lib=lib)

    def align_setup(ctx, inputs, output):
        input, rois, scale, ph, pw, ratio, aligned = inputs
        ctx.save_for_backward(rois)
        ctx.args = (scale, ph, pw, *input.shape, ratio, aligned)

    def align_backward(ctx, grad):
        (rois,) = ctx.saved_tensors
        return (torch.ops.torchvision._roi_align_backward(grad, rois, *ctx.args), None, None, None, None, None, None)

    torch.library.register_autograd("torchvision::roi_align", align_backward, setup_context=align_setup, lib=lib)

    def pool_setup(ctx, inputs, output):
        input, rois, scale, ph, pw = inputs
        ctx.save_for_backward(rois, output[1])
        ctx.args = (scale, ph, pw, *input.shape)
        ctx.mark_non_differentiable(output[1])

    def pool_backward(ctx, grad, _):
        rois, argmax = ctx.saved_tensors
        return torch.ops.torchvision._roi_pool_backward(grad, rois, argmax, *ctx.args), None, None, None, None

    torch.library.register_autograd("torchvision::roi_pool", pool_backward, setup_context=pool_setup, lib=lib)
    _LIBRARY = lib


_define_ops()
ops = torch.ops.torchvision


# ---------------------------------------------------------------- inputs


def _boxes(n, size, generator, dtype=torch.float32, batch=None):
    xy = torch.rand(n, 2, generator=generator, dtype=dtype) * size
    wh = torch.rand(n, 2, generator=generator, dtype=dtype) * size / 2
    boxes = torch.cat([xy, xy + wh], 1)
    if batch is None:
        return boxes
    image = torch.randint(0, batch, (n, 1), generator=generator).to(dtype)
    return torch.cat([image, boxes], 1)


def _jax(t):
    return t.to("jax")


# ---------------------------------------------------------------- nms


@pytest.mark.parametrize("threshold", [0.0, 0.4, 0.9])
def test_nms_keeps_cpus_boxes_in_cpus_order(threshold):
    g = torch.Generator().manual_seed(0)
    boxes = _boxes(60, 20.0, g)
    scores = torch.rand(60, generator=g)
    want = ops.nms(boxes, scores, threshold)
    got = ops.nms(_jax(boxes), _jax(scores), threshold)
    assert got.device.type == "jax" and got.dtype == torch.int64
    assert got.cpu().tolist() == want.tolist()
    assert len(want) < 60 or threshold == 0.9


def test_nms_ties_and_edge_cases_match_cpu():
    # Equal scores: the kernel's descending sort keeps them in index order.
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [20, 20, 30, 30], [5, 5, 5, 9.]],
                         dtype=torch.float64)
    scores = torch.tensor([0.5, 0.9, 0.9, 0.5, 0.7], dtype=torch.float64)
    for threshold in (0.5, 0.68, 1.0):
        want = ops.nms(boxes, scores, threshold).tolist()
        assert ops.nms(_jax(boxes), _jax(scores), threshold).cpu().tolist() == want
    empty = ops.nms(_jax(torch.zeros(0, 4)), _jax(torch.zeros(0)), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64
    # The IoU is compared as a double: an IoU just above a threshold that
    # float32 would round onto it still suppresses.
    a = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0.7]], dtype=torch.float32)
    s = torch.tensor([1.0, 0.5])
    iou = float((0.7 * 1) / 1.0)
    for threshold in (iou - 1e-9, iou, iou + 1e-9):
        assert ops.nms(_jax(a), _jax(s), threshold).cpu().tolist() == ops.nms(a, s, threshold).tolist()


# ---------------------------------------------------------------- roi_align


@pytest.mark.parametrize("aligned, sampling_ratio, spatial_scale", [
    (False, 2, 1.0), (True, 2, 0.5), (False, 0, 0.5), (True, -1, 1.0), (True, 1, 0.5)])
def test_roi_align_matches_cpu(aligned, sampling_ratio, spatial_scale):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 9, 11, generator=g, dtype=torch.float64)
    rois = _boxes(6, 18.0, g, torch.float64, batch=2)
    rois[0, 1:] = torch.tensor([-4.0, -3.0, 25.0, 30.0], dtype=torch.float64)  # beyond the map on every side
    rois[1, 1:] = torch.tensor([3.0, 3.0, 3.2, 3.1], dtype=torch.float64)  # smaller than a pixel
    # Far taller than the map: an adaptive grid of hundreds of samples per bin, few of them on it.
    rois[2, 1:] = torch.tensor([2.0, -300.0, 8.0, 700.0], dtype=torch.float64)
    args = (spatial_scale, 3, 4, sampling_ratio, aligned)
    want = ops.roi_align(x, rois, *args)
    got = ops.roi_align(_jax(x), _jax(rois), *args)
    assert got.device.type == "jax" and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_gradient_matches_cpu(aligned):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 2, 7, 8, generator=g)
    rois = _boxes(5, 12.0, g, batch=2)
    grads = []
    for device in ("cpu", "jax"):
        xd = x.detach().to(device).requires_grad_()
        out = ops.roi_align(xd, rois.to(device), 0.75, 2, 3, -1, aligned)
        (out * torch.arange(out.numel(), device=device).view(out.shape).float()).sum().backward()
        grads.append(xd.grad)
    assert grads[1].device.type == "jax"
    torch.testing.assert_close(grads[1].cpu(), grads[0], rtol=1e-5, atol=1e-4)


def test_roi_align_backward_op_matches_cpu():
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(4, 3, 2, 2, generator=g, dtype=torch.float64)
    rois = _boxes(4, 10.0, g, torch.float64, batch=3)
    args = (0.5, 2, 2, 3, 3, 6, 5, 2, True)
    want = ops._roi_align_backward(grad, rois, *args)
    got = ops._roi_align_backward(_jax(grad), _jax(rois), *args)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- roi_pool


@pytest.mark.parametrize("spatial_scale", [1.0, 0.25])
def test_roi_pool_matches_cpu_values_and_argmax(spatial_scale):
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-3, 4, (2, 2, 8, 9), generator=g).float()  # many ties: the first maximum wins
    x[0, 0, 2, 3] = float("nan")
    rois = _boxes(7, 16.0, g, batch=2)
    rois[0, 1:] = torch.tensor([10.0, 10.0, 5.0, 4.0])  # malformed: one pixel
    rois[1, 1:] = torch.tensor([40.0, 40.0, 50.0, 50.0])  # off the map: empty bins
    rois[2, 1:] = torch.tensor([2.5, 1.5, 7.5, 6.5])  # halves round away from zero
    want, want_arg = ops.roi_pool(x, rois, spatial_scale, 3, 2)
    got, got_arg = ops.roi_pool(_jax(x), _jax(rois), spatial_scale, 3, 2)
    assert got_arg.dtype == torch.int32
    assert got_arg.cpu().tolist() == want_arg.tolist()
    torch.testing.assert_close(got.cpu(), want)


def test_roi_pool_gradient_matches_cpu():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 7, generator=g)
    rois = _boxes(6, 8.0, g, batch=2)
    grads = []
    for device in ("cpu", "jax"):
        xd = x.detach().to(device).requires_grad_()
        out, _ = ops.roi_pool(xd, rois.to(device), 1.0, 2, 2)
        (out * torch.arange(out.numel(), device=device).view(out.shape).float()).sum().backward()
        grads.append(xd.grad)
    torch.testing.assert_close(grads[1].cpu(), grads[0])


# ---------------------------------------------------------------- compiled and messages


def test_roi_align_and_nms_under_torch_compile():
    """roi_align traces into the graph's one program; nms, whose result
    size is a value, runs eagerly where the graph holds it."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 4, 10, 10, generator=g)
    rois = _boxes(8, 10.0, g, batch=1)
    scores = torch.rand(8, generator=g)

    def pool(x, rois):
        return ops.roi_align(x, rois, 1.0, 2, 2, -1, True).mean((1, 2, 3)) * 2

    def keep(rois, scores):
        return ops.nms(rois[:, 1:], scores, 0.3)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph run op by op would warn
        got = torch.compile(pool, backend="jax")(_jax(x), _jax(rois))
    torch.testing.assert_close(got.cpu(), pool(x, rois), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = torch.compile(keep, backend="jax")(_jax(rois), _jax(scores))
    assert kept.cpu().tolist() == keep(rois, scores).tolist()


def test_a_missing_op_outside_aten_is_named_by_its_namespace():
    lib = torch.library.Library("pjrt_host_vision_test", "FRAGMENT")
    lib.define("shift(Tensor x) -> Tensor")
    lib.impl("shift", lambda x: x + 1, "CPU")
    with pytest.raises(NotImplementedError) as info:
        torch.ops.pjrt_host_vision_test.shift(torch.ones(2, device="jax"))
    text = str(info.value)
    assert "pjrt_host_vision_test::shift" in text and "ATen op" not in text
    assert "of the pjrt_host_vision_test library" in text and "cpu_fallback=True" in text


@pytest.mark.skipif(not REAL, reason="torchvision's compiled ops do not load here (a CUDA build beside CPU torch)")
def test_fasterrcnn_detects_as_on_cpu():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
    images = [torch.rand(3, 240, 320)]
    with torch.no_grad():
        want = model(images)[0]
        got = model.to("jax")([images[0].to("jax")])[0]
    assert got["boxes"].device.type == "jax"
    torch.testing.assert_close(got["boxes"].cpu(), want["boxes"], rtol=1e-3, atol=1e-2)
    assert got["labels"].cpu().tolist() == want["labels"].tolist()
