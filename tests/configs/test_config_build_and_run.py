"""Every config builds its model through the registry and trains and infers.

For each config (all of ``configs/`` but the demo ones): one SGD step with
the config's own optimiser wrapper (its lr, momentum, clipping) on one small
synthetic image, then one inference, on the CPU. SyncBN becomes BN with
``mmevo.integrations.mmengine.convert_sync_bn_to_bn`` (what
``tools/train.py`` does on a machine without a GPU). Parameter counts are
checked against the published table in ``test_config_complexity.py``; this
file checks behaviour.
"""

import warnings

import numpy as np
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS, init_default_scope
from mmengine.structures import InstanceData, PixelData

import mmevo  # noqa: F401  registers mmevo's modules
from mmevo.integrations.mmengine.dist import convert_sync_bn_to_bn

from configs_helpers import all_configs, load

pytestmark = pytest.mark.slow

CONFIGS = all_configs()  # every config but configs/demo/ (tested elsewhere)
# Tiny inputs keep 16 full-size models within the CPU budget.
# (H, W), divisible by the detectors' pad of 32 and big enough for P6 to have
# 2 pixels (the involution RPN head's BN needs more than one value).
DET_SIZE = (64, 128)
SEG_SIZE = (32, 64)  # crops; two of them, as BN on UPerNet's 1x1 pool needs
SEG_BATCH = 2


def build(rel_path):
    """(cfg, model) of a config, SyncBN as BN, weights not loaded."""
    cfg = load(rel_path)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the SyncBN -> BN notice
        convert_sync_bn_to_bn(cfg)
    if cfg.model.data_preprocessor.get('size') is not None:
        # The published 512x1024 crop pads every training input to that
        # size; the synthetic crop is its own size.
        cfg.model.data_preprocessor.size = SEG_SIZE
    init_default_scope(cfg.default_scope)
    torch.manual_seed(0)
    return cfg, MODELS.build(cfg.model)


@pytest.fixture(scope='module', params=CONFIGS)
def built(request):
    # Module scope: each config is built once and its tests run together.
    return build(request.param)


def det_batch(with_mask, seed=0):
    """One synthetic COCO-style image with two boxes (and their masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks

    rng = np.random.default_rng(seed)
    h, w = DET_SIZE
    img = torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
    boxes = torch.tensor([[4.0, 6.0, 50.0, 44.0], [40.0, 20.0, 120.0, 58.0]])
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(h, w),
            ori_shape=(h, w),
            scale_factor=(1.0, 1.0),
            pad_shape=(h, w),
        )
    )
    gt = InstanceData(bboxes=boxes, labels=torch.tensor([3, 17]))
    if with_mask:
        masks = np.zeros((2, h, w), dtype=np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
            masks[i, y1:y2, x1:x2] = 1
        gt.masks = BitmapMasks(masks, h, w)
    sample.gt_instances = gt
    return dict(inputs=[img], data_samples=[sample])


def seg_batch(seed=0):
    """Two synthetic Cityscapes-style crops with 19-class labels and ignored
    (255) pixels."""
    from mmseg.structures import SegDataSample

    rng = np.random.default_rng(seed)
    h, w = SEG_SIZE
    inputs, samples = [], []
    for _ in range(SEG_BATCH):
        inputs.append(
            torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        )
        label = torch.from_numpy(rng.integers(0, 19, (1, h, w))).long()
        label[:, :4] = 255
        sample = SegDataSample(
            metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w))
        )
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def is_seg(cfg):
    return cfg.model.type == 'EncoderDecoder'


def batch_for(cfg):
    if is_seg(cfg):
        return seg_batch()
    return det_batch(with_mask=cfg.model.type == 'MaskRCNN')


def test_registry_builds_the_published_components(built):
    cfg, model = built
    assert type(model.backbone).__name__ == cfg.model.backbone.type
    for part in ('neck', 'rpn_head', 'bbox_head', 'decode_head'):
        if part in cfg.model:
            assert type(getattr(model, part)).__name__ == cfg.model[part].type
    if 'roi_head' in cfg.model and 'mask_head' in cfg.model.roi_head:
        assert (
            type(model.roi_head.mask_head).__name__
            == cfg.model.roi_head.mask_head.type
        )
    # SyncBN was turned into BN (the only norm CPU training can run).
    norms = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
    ]
    assert norms and not any(
        isinstance(m, torch.nn.SyncBatchNorm) for m in norms
    )


def test_one_training_step(built):
    cfg, model = built
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    log_vars = model.train_step(batch_for(cfg), optim_wrapper)
    assert torch.isfinite(log_vars['loss']) and log_vars['loss'] > 0
    for name in log_vars:
        assert torch.isfinite(torch.as_tensor(log_vars[name])), name
    changed = {
        n
        for n, p in model.named_parameters()
        if not torch.equal(p.detach(), before[n])
    }
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    # Frozen parameters (a detector's stem and stage 1) do not move ...
    assert changed <= trainable
    # ... while the last stage and every head did get a step.
    for prefix in (
        'backbone.layer4.',
        'neck.',
        'rpn_head.',
        'bbox_head.',
        'roi_head.bbox_head.',
        'roi_head.mask_head.',
        'decode_head.',
    ):
        names = {n for n in trainable if n.startswith(prefix)}
        if names:
            assert names & changed, f'no parameter of {prefix} was updated'
    if cfg.model.backbone.get('frozen_stages', -1) == 1:
        # frozen_stages=1: only stages 2-4 of the backbone train.
        assert {n for n in trainable if n.startswith('backbone.')} == {
            n
            for n, _ in model.named_parameters()
            if n.startswith(
                ('backbone.layer2.', 'backbone.layer3.', 'backbone.layer4.')
            )
        }


def test_one_inference(built):
    cfg, model = built
    model.eval()
    data = batch_for(cfg)
    with torch.no_grad():
        results = model.test_step(data)
    assert len(results) == len(data['inputs'])
    if is_seg(cfg):
        for result in results:
            seg = result.pred_sem_seg.data
            assert seg.shape == (1, *SEG_SIZE)
            assert seg.min() >= 0 and seg.max() < 19
        return
    (result,) = results
    pred = result.pred_instances
    h, w = DET_SIZE
    n = len(pred)
    assert pred.bboxes.shape == (n, 4) and pred.labels.shape == (n,)
    if n:
        assert ((pred.scores >= 0) & (pred.scores <= 1)).all()
        assert (pred.bboxes[:, 0::2] >= 0).all()
        assert (pred.bboxes[:, 0::2] <= w).all()
        assert (pred.bboxes[:, 1::2] <= h).all()
        assert pred.labels.max() < 80
    if cfg.model.type == 'MaskRCNN':
        assert pred.masks.shape == (n, h, w)
