"""Backbones, neck and heads take an empty batch, forward and backward."""

import pytest
import torch
from mmdet.models.roi_heads.mask_heads import FCNMaskHead

from mmevo.layers import set_cpu_fastpath
from mmevo.models import (
    ACmixResNet,
    InvolutionFCNMaskHead,
    InvolutionFPN,
    InvolutionRPNHead,
    RedNet,
)

TINY = {
    RedNet: dict(stem_channels=32, base_channels=16),
    ACmixResNet: dict(stem_channels=16, base_channels=16),
}


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('cls', [RedNet, ACmixResNet])
def test_backbone_empty_batch(cls, mode, fast):
    model = set_cpu_fastpath(cls(26, **TINY[cls]), fast)
    model.train(mode == 'train')
    x = torch.rand(0, 3, 64, 48, requires_grad=True)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [
        (0, 64, 16, 12),
        (0, 128, 8, 6),
        (0, 256, 4, 3),
        (0, 512, 2, 2),
    ]
    sum(o.sum() for o in outs).backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize('fast', [True, False])
def test_neck_and_rpn_head_empty_batch(fast):
    neck = set_cpu_fastpath(InvolutionFPN([16, 32], 16, num_outs=3), fast)
    head = set_cpu_fastpath(InvolutionRPNHead(16, feat_channels=16), fast)
    feats = [
        torch.rand(0, 16, 8, 6, requires_grad=True),
        torch.rand(0, 32, 4, 3, requires_grad=True),
    ]
    outs = neck(feats)
    cls, reg = head.forward_single(outs[0])
    assert [tuple(o.shape) for o in outs] == [
        (0, 16, 8, 6),
        (0, 16, 4, 3),
        (0, 16, 2, 2),
    ]
    assert tuple(cls.shape) == (0, 9, 8, 6)  # 9 anchors, sigmoid
    assert tuple(reg.shape) == (0, 36, 8, 6)
    (sum(o.sum() for o in outs) + cls.sum() + reg.sum()).backward()
    assert all(f.grad.shape == f.shape for f in feats)


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_mask_head_no_rois(mode, fast):
    """0 RoIs give (0, num_classes, 28, 28), as mmdet's FCNMaskHead."""
    cfg = dict(
        num_convs=2, in_channels=16, conv_out_channels=16, num_classes=3
    )
    head = set_cpu_fastpath(InvolutionFCNMaskHead(**cfg), fast)
    rois = torch.rand(0, 16, 14, 14, requires_grad=True)
    out = head.train(mode == 'train')(rois)
    assert out.shape == FCNMaskHead(**cfg)(rois).shape == (0, 3, 28, 28)
    out.sum().backward()
    assert rois.grad.shape == rois.shape
