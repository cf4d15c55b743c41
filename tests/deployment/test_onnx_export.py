"""Plain ``torch.onnx.export`` of the evolution layers and the mmevo models
(dynamo and TorchScript exporters, dynamic H and W), checked in
onnxruntime against PyTorch at the export size and at other sizes."""

import itertools

import onnx
import onnxruntime  # noqa: F401  (the deploy extra: missing fails, not skips)
import pytest
import torch
import torch.nn.functional as F
from mmdet.structures import DetDataSample
from mmengine.config import Config
from mmengine.registry import init_default_scope
from torch.utils import _pytree as pytree

from mmevo.deploy import (
    OnnxModel,
    TensorOutputs,
    adaptive_avg_pool2d,
    export_onnx,
    match_rows,
)
from mmevo.deploy.mmdet import two_stage_detections, two_stage_forward
from mmevo.layers import Involution
from mmevo.models.backbones.acmix_resnet import ACmixResNet
from mmevo.models.backbones.rednet import RedNet
from mmevo.models.necks.involution_fpn import InvolutionFPN
from mmevo.registry import MODELS

# the layer cases shared with test_aoti.py (this folder is on sys.path)
from layer_cases import LAYERS

pytestmark = pytest.mark.slow


def assert_parity(model, path, inputs, match=None):
    """onnxruntime == PyTorch within 1e-4 of the output's largest value
    (onnxruntime's rows in PyTorch's order by ``match(outputs, expected)``
    where given)."""
    session = OnnxModel(str(path))
    for x in inputs:
        with torch.no_grad():
            expected = model(x)
        outputs = session(x)
        if match is not None:
            outputs = match(outputs, expected)
        assert len(outputs) == len(expected)
        for out, ref in zip(outputs, expected, strict=True):
            assert out.shape == ref.shape, tuple(x.shape)
            err = (out - ref).abs().max() / ref.abs().max().clamp(min=1e-6)
            assert err <= 1e-4, (tuple(x.shape), float(err))


def check_export(
    module, x, others, tmp_path, dynamo=False, forward=None, dynamic=True
):
    # TorchScript by default: the dynamo exporter takes 20-130 s on the
    # larger models here (the layers and RedNet-26 test it)
    torch.manual_seed(0)
    model = TensorOutputs(module.eval(), forward or (lambda m, x: m(x)))
    path = tmp_path / 'model.onnx'
    export_onnx(model, x, str(path), dynamic=dynamic, dynamo=dynamo)
    assert_parity(model, path, [x, *others])


def _layer_cases():
    # the dynamo exporter (2-4 s a layer) at stride 2 only, the faster
    # TorchScript one at both strides
    for name in LAYERS:
        for stride, dynamo in ((1, False), (2, False), (2, True)):
            yield pytest.param(
                name,
                stride,
                dynamo,
                id=f'{name}-s{stride}-{"dynamo" if dynamo else "torchscript"}',
            )


@pytest.mark.parametrize('name,stride,dynamo', list(_layer_cases()))
def test_layer_export(name, stride, dynamo, tmp_path):
    torch.manual_seed(0)
    layer = LAYERS[name](stride)
    # odd sizes; 3 x 2 is smaller than the reflect padding (repeated)
    check_export(
        layer,
        torch.randn(2, 16, 9, 11),
        [torch.randn(2, 16, 6, 13), torch.randn(2, 16, 3, 2)],
        tmp_path,
        dynamo,
    )


@pytest.mark.parametrize(
    'backbone,depth,dynamo,sizes',
    [
        pytest.param(RedNet, 26, True, [(96, 80)], id='RedNet26-dynamo'),
        pytest.param(RedNet, 26, False, [(96, 80)], id='RedNet26-torchscript'),
        pytest.param(RedNet, 50, False, [], id='RedNet50-torchscript'),
        pytest.param(
            ACmixResNet, 26, False, [(96, 80)], id='ACmixResNet26-torchscript'
        ),
        pytest.param(
            ACmixResNet, 50, False, [], id='ACmixResNet50-torchscript'
        ),
    ],
)
def test_backbone_export(backbone, depth, dynamo, sizes, tmp_path):
    torch.manual_seed(0)
    check_export(
        backbone(depth=depth),
        torch.randn(1, 3, 64, 64),
        [torch.randn(1, 3, *hw) for hw in sizes],
        tmp_path,
        dynamo,
    )


def test_involution_fpn_export(tmp_path):
    torch.manual_seed(0)
    neck = InvolutionFPN([16, 32], 16, num_outs=3)

    def forward(neck, x):  # two levels from one input
        return neck(
            [x, torch.nn.functional.avg_pool2d(x, 2).repeat(1, 2, 1, 1)]
        )

    check_export(
        neck,
        torch.randn(1, 16, 16, 16),
        [torch.randn(1, 16, 12, 20)],
        tmp_path,
        forward=forward,
    )


DEMO_DET = (
    'configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py'
)
DEMO_SEG = (
    'configs/demo/'
    'fpn_rednet26-tiny_1xb8-500iter_synthetic-cityscapes-128x256.py'
)
NARROW = dict(
    depth=26,
    stem_channels=32,
    base_channels=16,
    init_cfg=None,
    norm_cfg=dict(type='BN', requires_grad=True),
)


def build(path, **options):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    return MODELS.build(cfg.model)


def test_demo_retinanet_export(tmp_path):
    """The tensor outputs (per-level scores and boxes) of the demo."""
    model = build(DEMO_DET)
    check_export(
        model,
        torch.randn(1, 3, 64, 64),
        [torch.randn(1, 3, 96, 64)],
        tmp_path,
        forward=lambda m, x: m(x, mode='tensor'),
    )


def _rows(t):
    # masks (N, classes, 28, 28) by their per-class sums: the sort is slow
    t = t.flatten(2).sum(2) if t.dim() > 2 else t
    return sorted(map(tuple, t.tolist()))


FASTER_RCNN = 'configs/rednet/faster-rcnn_rednet50_inv-neck-head_1x_coco.py'
MASK_RCNN = 'configs/rednet/mask-rcnn_rednet50_inv-neck-head_1x_coco.py'


@pytest.mark.parametrize(
    'config,graph,dynamo',
    [
        (FASTER_RCNN, two_stage_forward, False),
        (MASK_RCNN, two_stage_detections, False),
        # the dynamo exporter: 40-55 s on the 2-core CPU (Mask R-CNN about
        # 70 s, left to the TorchScript case)
        (FASTER_RCNN, two_stage_detections, True),
    ],
    ids=[
        'faster-rcnn-torchscript',
        'mask-rcnn-torchscript',
        'faster-rcnn-dynamo',
    ],
)
def test_two_stage_export(config, graph, dynamo, tmp_path):
    """The whole detector (RPN proposals with NMS, RoIAlign, box and mask
    heads[, the box head's post-processing]) in one graph: in PyTorch equal
    to mmdet's ``mode='tensor'`` and ``predict``, in onnxruntime to PyTorch
    at the export size and other ones (odd, another aspect). Boxes of equal
    score leave NMS in either order: compared as sets of rows."""
    torch.manual_seed(0)
    model = build(
        config,
        **{
            'model.backbone': NARROW,
            'model.neck.in_channels': [64, 128, 256, 512],
            # fewer RoIs for the heads (the mask head is the slow part)
            'model.test_cfg.rpn.max_per_img': 60,
            # a random box head scores about 1 / 81: keep its boxes
            'model.test_cfg.rcnn.score_thr': 0.0,
        },
    )
    # mmdet's initialisation: small box deltas, so that no NMS decision
    # hangs on a float rounding (random deltas of 10+ make borderline IoUs)
    model.init_weights()
    model.eval()
    # 320 x 256: level 1 has more anchors than nms_pre, unlike the example
    sizes = [(128, 128), (160, 128), (97, 131), (320, 256)]
    inputs = [torch.randn(1, 3, *hw) for hw in sizes]
    for x in inputs:
        sample = DetDataSample(
            metainfo=dict(
                img_shape=tuple(x.shape[2:]),
                ori_shape=tuple(x.shape[2:]),
                scale_factor=(1.0, 1.0),
            )
        )
        with torch.no_grad():
            ours = two_stage_forward(model, x)
            ref = pytree.tree_leaves(model(x, [sample], mode='tensor'))
            dets = two_stage_detections(model, x)
            pred = model.predict(x, [sample], rescale=False)[0].pred_instances
        assert len(ours) == len(ref) + 1 and len(ours[0]) == 60
        assert ours[0][:, 1:].min() >= 0
        for out, expected in zip(ours[1:], ref, strict=False):
            assert _rows(out) == _rows(expected)
        assert len(pred) == len(dets[0]) > 0
        assert _rows(
            torch.cat([dets[0][:, 1:], dets[1][:, None]], 1)
        ) == _rows(torch.cat([pred.bboxes, pred.scores[:, None]], 1))
        assert sorted(dets[2].tolist()) == sorted(pred.labels.tolist())
    wrapped = TensorOutputs(model, graph)
    path = tmp_path / 'model.onnx'
    export_onnx(wrapped, inputs[0], str(path), dynamo=dynamo)
    graph = onnx.load(str(path))
    # standard operators only: no custom domain, no local functions
    assert [(o.domain, o.version) for o in graph.opset_import] == [('', 18)]
    assert {n.domain for n in graph.graph.node} == {''}
    assert len(graph.functions) == 0
    assert_parity(wrapped, path, inputs, match_rows)


@pytest.mark.parametrize(
    'option,value,message',
    [
        (
            'model.test_cfg.rpn.nms',
            dict(type='soft_nms', iou_threshold=0.7),
            "the NMS must be plain nms .*'soft_nms'",
        ),
        (
            'model.roi_head.bbox_roi_extractor.roi_layer.pool_mode',
            'max',
            "pool_mode must be 'avg' to export .*'max'",
        ),
    ],
)
def test_two_stage_unsupported_settings_are_named(option, value, message):
    model = build(
        FASTER_RCNN,
        **{
            'model.backbone': NARROW,
            'model.neck.in_channels': [64, 128, 256, 512],
            option: value,
        },
    )
    with pytest.raises(ValueError, match=message), torch.no_grad():
        two_stage_forward(model.eval(), torch.randn(1, 3, 64, 64))


UPERNET = 'configs/rednet/upernet_rednet50_4xb2-80k_cityscapes-512x1024.py'
BN = dict(type='BN', requires_grad=True)
NARROW_UPERNET = {
    'norm_cfg': BN,
    'model.backbone': NARROW,
    'model.decode_head.in_channels': [64, 128, 256, 512],
    'model.decode_head.channels': 32,
    'model.decode_head.norm_cfg': BN,
    'model.auxiliary_head.norm_cfg': BN,
}
# odd sizes, another aspect; the smallest pyramid level (3 x 4) is smaller
# than the pyramid pooling's 6 bins
UPERNET_SIZES = [(96, 160), (72, 136), (65, 97)]


@pytest.mark.parametrize(
    'config,options,dynamo,sizes',
    [
        pytest.param(DEMO_SEG, {}, False, [(96, 160)], id='SemanticFPN'),
        pytest.param(
            UPERNET,
            NARROW_UPERNET,
            False,
            UPERNET_SIZES,
            id='UPerNet-RedNet-torchscript',
        ),
        # the dynamo exporter with a small ResNet: with dynamic sizes it takes
        # RedNet-26 20 s alone (test_backbone_export)
        pytest.param(
            UPERNET,
            {
                **NARROW_UPERNET,
                'model.backbone': dict(
                    _delete_=True,
                    type='mmseg.ResNetV1c',
                    depth=18,
                    stem_channels=16,
                    base_channels=8,
                    norm_cfg=BN,
                    init_cfg=None,
                ),
                'model.decode_head.in_channels': [8, 16, 32, 64],
            },
            True,
            UPERNET_SIZES,
            id='UPerNet-ResNet-dynamo',
        ),
    ],
)
def test_segmentor_export(config, options, dynamo, sizes, tmp_path):
    """Segmentors with dynamic H and W, checked at other sizes: Semantic
    FPN (mmseg's Upsample by a scale factor) and UPerNet (its pyramid
    pooling's adaptive average pooling, the resizes of its top-down
    path)."""
    model = build(config, **options)
    check_export(
        model,
        torch.randn(1, 3, 64, 128),
        [torch.randn(1, 3, *hw) for hw in sizes],
        tmp_path,
        dynamo,
        forward=lambda m, x: m(x, mode='tensor'),
    )


# PyTorch's bins overlap (13 rows into 6), share rows (2 into 6) or tile
# them (12 into 6); None keeps the input's size
POOL_SIZES = [*itertools.product((1, 2, 3, 6), repeat=2), (None, 3), (6, None)]


def test_adaptive_avg_pool2d_equals_pytorch():
    torch.manual_seed(0)
    for h, w in itertools.product(range(1, 14), repeat=2):
        x = torch.randn(2, 3, h, w, dtype=torch.float64)
        for size in POOL_SIZES:
            torch.testing.assert_close(
                adaptive_avg_pool2d(x, size),
                F.adaptive_avg_pool2d(x, size),
                msg=lambda m, h=h, w=w, size=size: f'{(h, w)} -> {size}: {m}',
            )
    x = torch.randn(3, 7, 5, dtype=torch.float64)  # no batch dim
    torch.testing.assert_close(
        adaptive_avg_pool2d(x, 3), F.adaptive_avg_pool2d(x, 3)
    )


@pytest.mark.parametrize('size', [0, (2, -1), 2.5])
def test_adaptive_avg_pool2d_refuses_bad_sizes(size):
    with pytest.raises(ValueError, match='output_size must be'):
        adaptive_avg_pool2d(torch.randn(1, 2, 4, 4), size)


@pytest.mark.parametrize(
    'dynamo', [False, True], ids=['torchscript', 'dynamo']
)
def test_adaptive_pooling_export(dynamo, tmp_path):
    """``nn.AdaptiveAvgPool2d`` exports with dynamic H and W: checked at
    sizes whose bins differ from the example's, smaller than the output
    among them."""
    pools = torch.nn.ModuleList(
        torch.nn.AdaptiveAvgPool2d(s) for s in (1, 2, 3, 6, (3, 6), (None, 2))
    )
    check_export(
        pools,
        torch.randn(1, 4, 13, 9),
        [torch.randn(1, 4, *hw) for hw in [(12, 12), (2, 5), (1, 1)]],
        tmp_path,
        dynamo,
        forward=lambda m, x: [pool(x) for pool in m],
    )


@pytest.mark.parametrize('dynamo', [False, True])
def test_export_error_names_the_layer(dynamo, tmp_path):

    class Broken(Involution):
        def generate(self, x):  # a kernel one row short reaches the op
            x, kernel = super().generate(x)
            return x, kernel[..., :-1, :]

    model = torch.nn.Sequential()
    model.add_module('inv', Broken(16, 3))
    with pytest.raises(
        RuntimeError, match=r"layer 'inv' \(Broken: kernel_size=3, stride=1"
    ):
        export_onnx(
            model.eval(),
            torch.randn(1, 16, 8, 8),
            str(tmp_path / 'broken.onnx'),
            dynamo=dynamo,
        )
