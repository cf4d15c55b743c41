"""The configs' backbones load the published ImageNet checkpoints.

The checkpoints are stood in for by tensors of the published keys and shapes
(``tests/models/data/*_state_dict.json``) with random values, saved the way
they were released: mmcls format (``state_dict`` with keys under
``backbone.``) for RedNet, a torchvision-style classifier for ACmix.
"""

import json
import logging

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.registry import MODELS, init_default_scope

import mmevo  # noqa: F401

from configs_helpers import ROOT, load

pytestmark = pytest.mark.slow

# Keys and shapes of the released ImageNet checkpoints.
REFERENCE = ROOT / 'tests' / 'models' / 'data'


def _fake_checkpoint(entry, path, prefix=''):
    """Save random tensors with the published keys/shapes; return them."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in entry['state_dict'].items():
        if key.endswith('num_batches_tracked'):
            state[prefix + key] = torch.tensor(7)
        else:
            state[prefix + key] = torch.rand(shape, generator=gen) + 0.5
    torch.save(dict(state_dict=state, meta=dict()), path)
    return {k[len(prefix) :]: v for k, v in state.items()}


def _init_backbone(rel_path, checkpoint):
    cfg = load(rel_path)
    cfg.model.backbone.init_cfg.checkpoint = str(checkpoint)
    init_default_scope(cfg.default_scope)
    backbone = MODELS.build(cfg.model.backbone)
    logger = MMLogger.get_current_instance()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        backbone.init_weights()
    finally:
        logger.removeHandler(handler)
    return backbone, [r.getMessage() for r in records]


def test_rednet_detection_stem_loads_imagenet_checkpoint(tmp_path):
    """Published detection stem (K=7) from the ImageNet (K=3) checkpoint:
    every tensor loads except the stem involution's conv2, skipped with a
    size-mismatch warning, as the published runs did."""
    ref = json.loads((REFERENCE / 'rednet50_state_dict.json').read_text())
    ckpt = _fake_checkpoint(
        ref['rednet50_cls'], tmp_path / 'rn50.pth', prefix='backbone.'
    )
    backbone, messages = _init_backbone(
        'configs/rednet/faster-rcnn_rednet50_fpn_1x_coco.py',
        tmp_path / 'rn50.pth',
    )
    state = backbone.state_dict()
    skipped = {'stem.1.conv2.conv.weight', 'stem.1.conv2.conv.bias'}
    assert set(state) == set(ckpt)  # same names, published layout
    for key, value in ckpt.items():
        if key in skipped:
            assert state[key].shape[0] == 7 * 7 * 2 != value.shape[0]
        else:
            assert torch.equal(state[key], value), key
    assert any(
        'size mismatch' in m and 'stem.1.conv2.conv.weight' in m
        for m in messages
    ), messages


def test_rednet_imagenet_stem_loads_everything(tmp_path):
    """The documented alternative, stem_kernel_size=3, loads every tensor."""
    ref = json.loads((REFERENCE / 'rednet50_state_dict.json').read_text())
    ckpt = _fake_checkpoint(
        ref['rednet50_cls'], tmp_path / 'rn50.pth', prefix='backbone.'
    )
    cfg_path = tmp_path / 'stem3.py'
    cfg_path.write_text(
        f"_base_ = '{ROOT}/configs/rednet/faster-rcnn_rednet50_fpn_1x_coco.py'"
        '\nmodel = dict(backbone=dict(stem_kernel_size=3))\n'
    )
    backbone, messages = _init_backbone(str(cfg_path), tmp_path / 'rn50.pth')
    state = backbone.state_dict()
    assert all(torch.equal(state[k], v) for k, v in ckpt.items())
    assert not any('size mismatch' in m for m in messages)


def test_acmix_backbone_loads_classifier_checkpoint(tmp_path):
    """torchvision-style ACmix classifier, loaded without a prefix: every
    backbone tensor loads, the fc head is left out."""
    ref_file = REFERENCE / 'acmix_resnet50_state_dict.json'
    ref = json.loads(ref_file.read_text())
    ckpt = _fake_checkpoint(ref['acmix_resnet50'], tmp_path / 'acmix.pth')
    backbone, _ = _init_backbone(
        'configs/acmix/faster-rcnn_acmix-r50_fpn_1x_coco.py',
        tmp_path / 'acmix.pth',
    )
    state = backbone.state_dict()
    body = {k: v for k, v in ckpt.items() if not k.startswith('fc.')}
    assert set(state) == set(body)  # only the classifier head is left out
    assert all(torch.equal(state[k], v) for k, v in body.items())
