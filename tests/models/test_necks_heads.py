"""InvolutionFPN, InvolutionRPNHead, InvolutionFCNMaskHead, and full
Faster / Mask R-CNN with a RedNet backbone: forward, loss, backward."""

import pytest
import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmdet.models.dense_heads import RPNHead
from mmdet.models.roi_heads.mask_heads import FCNMaskHead
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.structures import InstanceData

from mmevo.layers import Involution
from mmevo.models import (
    InvolutionFCNMaskHead,
    InvolutionFPN,
    InvolutionRPNHead,
    RedNet,
)
from mmevo.registry import MODELS


def test_fpn_structure_and_forward():
    neck = InvolutionFPN(
        [16, 32, 48], 32, num_outs=5, start_level=1, add_extra_convs='on_input'
    )
    assert [type(m) for m in neck.fpn_convs] == [Involution] * 2 + [
        ConvModule
    ] * 3
    assert all(
        m.kernel_size == 7 and m.stride == 1 for m in neck.fpn_convs[:2]
    )
    feats = [
        torch.rand(2, 16, 32, 40),
        torch.rand(2, 32, 16, 20),
        torch.rand(2, 48, 8, 10),
    ]
    neck.init_weights()
    with torch.no_grad():
        outs = neck(feats)
        # the top-down sum through mmdet's laterals, then each involution
        lat = [neck.lateral_convs[i](feats[i + 1]) for i in range(2)]
        lat[0] = lat[0] + F.interpolate(lat[1], size=lat[0].shape[2:])
        for i in range(2):
            torch.testing.assert_close(outs[i], neck.fpn_convs[i](lat[i]))
    assert [tuple(o.shape) for o in outs] == [
        (2, 32, 16, 20),
        (2, 32, 8, 10),
        (2, 32, 4, 5),
        (2, 32, 2, 3),
        (2, 32, 1, 2),
    ]


def test_fpn_involution_cfg_and_mmseg_registry():
    from mmseg.registry import MODELS as SEG_MODELS

    neck = SEG_MODELS.build(
        dict(
            type='InvolutionFPN',
            in_channels=[16, 32],
            out_channels=16,
            num_outs=2,
            involution_cfg=dict(kernel_size=3),
        )
    )
    assert all(m.kernel_size == 3 for m in neck.fpn_convs)
    outs = neck([torch.rand(1, 16, 9, 7), torch.rand(1, 32, 5, 4)])
    assert [tuple(o.shape) for o in outs] == [(1, 16, 9, 7), (1, 16, 5, 4)]


def test_rpn_head_involution_and_errors():
    head = InvolutionRPNHead(32, feat_channels=32)
    assert isinstance(head.rpn_conv, Involution)
    assert head.rpn_conv.channels == 32
    ref = RPNHead(32, feat_channels=32)
    x = torch.rand(2, 32, 12, 10)
    cls, reg = head.forward_single(x)
    ref_cls, ref_reg = ref.forward_single(x)
    assert cls.shape == ref_cls.shape and reg.shape == ref_reg.shape
    # forward = 1x1 convs on ReLU(involution(x))
    feat = F.relu(head.rpn_conv(x))
    torch.testing.assert_close(cls, head.rpn_cls(feat))
    two = InvolutionRPNHead(32, feat_channels=32, num_convs=2)
    assert [type(m) for m in two.rpn_conv] == [
        Involution,
        torch.nn.ReLU,
        Involution,
    ]
    with pytest.raises(ValueError, match='feat_channels must equal'):
        InvolutionRPNHead(32, feat_channels=64)
    with pytest.raises(ValueError, match='feat_channels must equal'):
        MODELS.build(
            dict(type='InvolutionRPNHead', in_channels=256, feat_channels=128)
        )


def test_rpn_head_init_keeps_involution_init():
    head = InvolutionRPNHead(32, feat_channels=32)
    head.init_weights()
    for m in (head.rpn_cls, head.rpn_reg):
        assert m.weight.std() < 0.02 and (m.bias == 0).all()
    # the kernel-generating convs keep their default (larger) init
    assert head.rpn_conv.conv1.conv.weight.std() > 0.05


def test_mask_head_involution_and_errors():
    head = InvolutionFCNMaskHead(
        num_convs=2, in_channels=32, conv_out_channels=32, num_classes=3
    )
    ref = FCNMaskHead(
        num_convs=2, in_channels=32, conv_out_channels=32, num_classes=3
    )
    assert len(head.convs) == 2
    assert all(
        isinstance(c[0], Involution) and c[0].kernel_size == 7
        for c in head.convs
    )
    assert 'convs.0.0.conv1.conv.weight' in head.state_dict()
    x = torch.rand(5, 32, 14, 14)
    out = head(x)
    assert out.shape == ref(x).shape == (5, 3, 28, 28)
    with pytest.raises(ValueError, match='conv_out_channels must equal'):
        InvolutionFCNMaskHead(in_channels=32, conv_out_channels=64)


def _tiny_detector(with_mask, tmp_path):
    """mmdet's R-50 Faster/Mask R-CNN base config, shrunk, involution parts."""
    base = 'mask-rcnn_r50_fpn.py' if with_mask else 'faster-rcnn_r50_fpn.py'
    cfg_file = tmp_path / 'tiny_rcnn.py'
    cfg_file.write_text(f"_base_ = 'mmdet::_base_/models/{base}'\n")
    cfg = Config.fromfile(str(cfg_file))
    model = cfg.model
    model.backbone = dict(
        type='RedNet',
        depth=26,
        stem_channels=32,
        base_channels=16,
        frozen_stages=1,
        norm_eval=True,
    )
    model.neck = dict(
        type='InvolutionFPN',
        in_channels=[64, 128, 256, 512],
        out_channels=32,
        num_outs=5,
    )
    model.rpn_head.type = 'InvolutionRPNHead'
    model.rpn_head.in_channels = model.rpn_head.feat_channels = 32
    model.roi_head.bbox_roi_extractor.out_channels = 32
    model.roi_head.bbox_head.update(
        in_channels=32, fc_out_channels=64, num_classes=2
    )
    model.train_cfg.rpn_proposal.nms_pre = 200
    model.train_cfg.rcnn.sampler.num = 64
    if with_mask:
        model.roi_head.mask_roi_extractor.out_channels = 32
        model.roi_head.mask_head = dict(
            model.roi_head.mask_head,
            type='InvolutionFCNMaskHead',
            num_convs=2,
            in_channels=32,
            conv_out_channels=32,
            num_classes=2,
        )
    # as a config with default_scope='mmdet' is built by the runner
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(model)


def _batch(with_mask, h=64, w=96):
    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    boxes = [
        torch.tensor([[8.0, 6.0, 50.0, 40.0], [40.0, 20.0, 90.0, 60.0]]),
        torch.tensor([[20.0, 10.0, 70.0, 55.0]]),
    ]
    for b in boxes:
        inputs.append(
            torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8)
        )
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(h, w),
                ori_shape=(h, w),
                pad_shape=(h, w),
                scale_factor=(1.0, 1.0),
                batch_input_shape=(h, w),
            )
        )
        gt = InstanceData(bboxes=b, labels=torch.tensor([0, 1][: len(b)]))
        if with_mask:
            masks = torch.zeros(len(b), h, w, dtype=torch.uint8)
            for j, (x1, y1, x2, y2) in enumerate(b.long().tolist()):
                masks[j, y1:y2, x1:x2] = 1
            gt.masks = BitmapMasks(masks.numpy(), h, w)
        sample.gt_instances = gt
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


@pytest.mark.parametrize('with_mask', [False, True])
def test_rcnn_with_involution_neck_and_heads(with_mask, tmp_path):
    torch.manual_seed(0)
    model = _tiny_detector(with_mask, tmp_path)
    model.init_weights()
    model.train()
    data = model.data_preprocessor(_batch(with_mask), True)
    losses = model(**data, mode='loss')
    expected = {'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox'}
    if with_mask:
        expected.add('loss_mask')
    assert expected <= set(losses)
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    # gradients reach every involution of the neck, heads and backbone
    involutions = {
        n: m for n, m in model.named_modules() if isinstance(m, Involution)
    }
    assert any(n.startswith('neck.') for n in involutions)
    assert any(n.startswith('rpn_head.') for n in involutions)
    if with_mask:
        assert any(n.startswith('roi_head.mask_head') for n in involutions)
    for name, m in involutions.items():
        if name.startswith(('backbone.stem', 'backbone.layer1')):
            assert m.conv2.conv.weight.grad is None, name  # frozen_stages=1
            continue
        assert m.conv2.conv.weight.grad is not None, name
        if not name.startswith('backbone.'):
            # backbone involutions sit behind the zero-initialised bn3
            assert m.conv2.conv.weight.grad.abs().sum() > 0, name
    assert model.backbone.layer2[0].bn3.weight.grad.abs().sum() > 0
    assert isinstance(model.backbone, RedNet)
    assert not model.backbone.layer1[0].conv1.weight.requires_grad

    model.eval()
    with torch.no_grad():
        results = model(
            **model.data_preprocessor(_batch(with_mask), False), mode='predict'
        )
    assert len(results) == 2
    assert results[0].pred_instances.bboxes.shape[-1] == 4


def _build_semantic_fpn():
    return MODELS.build(
        dict(
            type='EncoderDecoder',
            data_preprocessor=dict(type='SegDataPreProcessor', size=(64, 64)),
            backbone=dict(
                type='RedNet', depth=26, stem_channels=32, base_channels=16
            ),
            neck=dict(
                type='InvolutionFPN',
                in_channels=[64, 128, 256, 512],
                out_channels=32,
                num_outs=4,
            ),
            decode_head=dict(
                type='FPNHead',
                in_channels=[32] * 4,
                in_index=[0, 1, 2, 3],
                feature_strides=[4, 8, 16, 32],
                channels=16,
                num_classes=3,
                loss_decode=dict(type='CrossEntropyLoss'),
            ),
            train_cfg=dict(),
            test_cfg=dict(mode='whole'),
        )
    )


def test_semantic_fpn_in_mmseg():
    """RedNet + InvolutionFPN inside an mmseg segmentor: loss, backward."""
    import mmseg.models  # noqa: F401 (registers mmseg's modules)
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    with DefaultScope.overwrite_default_scope('mmseg'):
        model = _build_semantic_fpn()
    model.init_weights()
    samples = []
    for _ in range(2):
        s = SegDataSample(
            metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64))
        )
        s.gt_sem_seg = PixelData(
            data=torch.randint(0, 3, (1, 64, 64), dtype=torch.long)
        )
        samples.append(s)
    data = model.data_preprocessor(
        dict(
            inputs=[
                torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
                for _ in range(2)
            ],
            data_samples=samples,
        ),
        True,
    )
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    loss.backward()
    assert torch.isfinite(loss)
    assert isinstance(model.neck.fpn_convs[0], Involution)
    assert model.neck.fpn_convs[0].conv2.conv.weight.grad.abs().sum() > 0
