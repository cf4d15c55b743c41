"""mmevo's NMS and RoIAlign operators (``torch.ops.mmevo.nms`` /
``roi_align`` in mmevo/deploy/detection_ops.py): equal to independent
references in PyTorch, traceable by torch.export, and standard ONNX
operators under both exporters, checked in onnxruntime at sizes other
than the export's."""

import os.path as osp
import subprocess
import sys
import textwrap

import onnx
import pytest
import torch
import torch.nn.functional as F

from mmevo.deploy import OnnxModel, export_onnx, nms, roi_align

pytestmark = pytest.mark.slow


def random_boxes(n, size=64.0, generator=None):
    """``n`` boxes (x1, y1, x2, y2) of 2 to 22 pixels within ``size``."""
    xy = torch.rand(n, 2, generator=generator) * (size - 24)
    wh = 2 + torch.rand(n, 2, generator=generator) * 20
    return torch.cat([xy, xy + wh], 1)


def nms_reference(boxes, scores, iou_threshold):
    """Greedy NMS in float64: by descending score, keep a box unless it
    overlaps a kept one by more than ``iou_threshold``."""
    boxes = boxes.double()
    area = (boxes[:, 2:] - boxes[:, :2]).prod(1)
    keep = []
    for i in scores.argsort(descending=True).tolist():
        lt = torch.max(boxes[i, :2], boxes[keep, :2])
        rb = torch.min(boxes[i, 2:], boxes[keep, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        if (inter / (area[i] + area[keep] - inter) <= iou_threshold).all():
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


def roi_align_reference(
    feats, rois, output_size, spatial_scale, sampling_ratio, aligned
):
    """RoIAlign by ``grid_sample`` (RoIs inside the map, away from its
    border, where the two interpolate alike): the mean of ``sampling_ratio
    ** 2`` bilinear samples per bin."""
    h, w = output_size
    s = sampling_ratio
    out = []
    for roi in rois.double():
        x1, y1, x2, y2 = (roi[1:] * spatial_scale - 0.5 * aligned).tolist()
        # sample positions: bin + (k + 0.5) / s of a bin, in pixels
        ys = y1 + (torch.arange(h * s, dtype=torch.float64) + 0.5) * (
            (y2 - y1) / (h * s)
        )
        xs = x1 + (torch.arange(w * s, dtype=torch.float64) + 0.5) * (
            (x2 - x1) / (w * s)
        )
        gy, gx = torch.meshgrid(ys, xs, indexing='ij')
        # align_corners=True: -1 and 1 are the first and last pixel centres
        height, width = feats.shape[2:]
        grid = torch.stack([gx / (width - 1), gy / (height - 1)], -1) * 2 - 1
        sampled = F.grid_sample(
            feats[int(roi[0])][None].double(), grid[None], align_corners=True
        )
        out.append(F.avg_pool2d(sampled, s)[0])
    return torch.stack(out).to(feats.dtype)


@pytest.mark.parametrize(
    'n,iou_threshold', [(0, 0.5), (1, 0.5), (7, 0.3), (200, 0.5), (300, 0.7)]
)
def test_nms_equals_reference(n, iou_threshold):
    generator = torch.Generator().manual_seed(n)
    boxes = random_boxes(n, generator=generator)
    scores = torch.rand(n, generator=generator)
    keep = nms(boxes, scores, iou_threshold)
    assert keep.dtype == torch.long
    assert torch.equal(keep, nms_reference(boxes, scores, iou_threshold))


@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('output_size,scale', [((7, 7), 0.25), ((3, 5), 0.5)])
def test_roi_align_equals_reference(aligned, output_size, scale):
    generator = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 3, 19, 23, generator=generator)
    # within pixels 2 .. 16 of the map
    xy = 2 + torch.rand(4, 2, generator=generator) * 7
    boxes = torch.cat(
        [xy, xy + 1 + torch.rand(4, 2, generator=generator) * 7], 1
    )
    rois = torch.cat(
        [torch.tensor([[0.0], [1.0], [1.0], [0.0]]), boxes / scale], 1
    )
    out = roi_align(feats, rois, list(output_size), scale, 2, aligned)
    assert out.shape == (4, 3, *output_size)
    torch.testing.assert_close(
        out,
        roi_align_reference(feats, rois, output_size, scale, 2, aligned),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    'args,message',
    [
        ((torch.rand(5, 5), torch.rand(5), 0.5), r'boxes must be \(N, 4\)'),
        ((torch.rand(5, 4), torch.rand(4), 0.5), r'scores must be \(N, \)'),
    ],
)
def test_nms_bad_input_is_named(args, message):
    with pytest.raises(ValueError, match=message):
        nms(*args)


@pytest.mark.parametrize(
    'feats,rois,size,message',
    [
        (torch.rand(4, 6, 6), torch.zeros(1, 5), [2, 2], 'feats must be'),
        (torch.rand(1, 4, 6, 6), torch.zeros(1, 4), [2, 2], 'rois must be'),
        (
            torch.rand(1, 4, 6, 6),
            torch.zeros(1, 5),
            [2],
            'output_size must be',
        ),
    ],
)
def test_roi_align_bad_input_is_named(feats, rois, size, message):
    with pytest.raises(ValueError, match=message):
        roi_align(feats, rois, size, 1.0, 0, True)


def test_ops_pass_opcheck():
    """Schemas, fake kernels (NMS: a data-dependent length) and dispatch
    as torch.library checks them."""
    boxes = random_boxes(30, generator=torch.Generator().manual_seed(0))
    scores = torch.rand(30)
    torch.library.opcheck(torch.ops.mmevo.nms.default, (boxes, scores, 0.5))
    rois = torch.cat([torch.zeros(30, 1), boxes], 1)
    torch.library.opcheck(
        torch.ops.mmevo.roi_align.default,
        (torch.randn(1, 4, 16, 16), rois, [7, 7], 0.25, 0, True),
    )


class Detect(torch.nn.Module):
    """The boxes NMS keeps of one box per pixel of ``x`` (1, 5, H, W) and
    their RoIAlign features on ``x``: a box count that depends on the
    data and on the input size."""

    def forward(self, x):
        rows = x[0].flatten(1).t()
        xy = rows[:, :2] * 4 + 16
        boxes = torch.cat([xy, xy + 4 + rows[:, 2:4].abs() * 8], 1)
        keep = nms(boxes, rows[:, 4], 0.4)
        rois = torch.cat([torch.zeros_like(boxes[:, :1]), boxes], 1)[keep]
        return keep, roi_align(x, rois, [4, 3], 0.5, 2, True)


@pytest.mark.parametrize('dynamo', [False, True])
def test_ops_export_to_standard_onnx(dynamo, tmp_path):
    torch.manual_seed(0)
    model = Detect().eval()
    path = str(tmp_path / 'detect.onnx')
    export_onnx(model, torch.randn(1, 5, 6, 7), path, dynamo=dynamo)
    graph = onnx.load(path)
    assert [(o.domain, o.version) for o in graph.opset_import] == [('', 18)]
    assert {n.domain for n in graph.graph.node} == {''}
    types = {n.op_type for n in graph.graph.node}
    assert {'NonMaxSuppression', 'RoiAlign'} <= types
    session = OnnxModel(path)
    for hw in [(6, 7), (9, 5), (1, 1)]:
        x = torch.randn(1, 5, *hw)
        keep, feats = session(x)
        expected = model(x)
        assert len(expected[0]) > 0
        assert torch.equal(keep, expected[0]), hw
        torch.testing.assert_close(feats, expected[1], rtol=1e-5, atol=1e-5)


def test_symbolics_are_registered_by_the_export_not_the_import(tmp_path):
    """In a fresh interpreter, importing the ops registers no TorchScript
    symbolic (a plain export fails on them); ``register_onnx_symbolics``,
    which ``export_onnx`` calls, does, and a second call changes nothing."""
    script = textwrap.dedent(f"""
        import torch
        from mmevo.deploy import detection_ops as ops

        class Keep(torch.nn.Module):
            def forward(self, boxes, scores):
                return ops.nms(boxes, scores, 0.5)

        args = (torch.rand(6, 4) * 4 + torch.tensor([0., 0., 5., 5.]),
                torch.rand(6))
        path = {str(tmp_path / 'nms.onnx')!r}
        try:
            torch.onnx.export(Keep(), args, path, dynamo=False,
                              opset_version=18)
        except Exception as e:
            assert 'mmevo::nms' in str(e), e
        else:
            raise AssertionError('exported without a symbolic')
        ops.register_onnx_symbolics()
        ops.register_onnx_symbolics()
        torch.onnx.export(Keep(), args, path, dynamo=False, opset_version=18)
        print('ok')
    """)
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, '-c', script],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # (the failed export prints its graph first)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == 'ok', out.stdout
