"""The detection and segmentation configs start from an ImageNet classifier:
an official mmcls RedNet-50 checkpoint (``backbone.*`` and ``head.fc.*``),
and one that mmevo's own ImageNet config wrote (a runner checkpoint: also
``meta``, ``message_hub``, ``optimizer``, ``param_schedulers``).

Their ``Pretrained`` init (prefix ``backbone.``) takes the backbone tensors
of either and leaves the classifier head out; the published detection stem
(K=7) skips the two stem tensors of the ImageNet stem (K=3) with mmengine's
size-mismatch warning, as ``test_config_pretrained.py`` states for the bare
published layout.

The runner checkpoint's ``message_hub`` holds mmengine ``HistoryBuffer``s,
which torch >= 2.6's ``weights_only`` ``torch.load`` (mmengine 0.10.7 calls
it so) refuses unless mmevo's allowlist is installed: the checkpoints are
loaded here as mmevo's ``tools/train.py`` loads them, after
``mmevo.register_all_modules(install_fixes=True)``.
"""

import json
import logging

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

import mmevo
from mmevo.demo import CLS_CLASSES, make_synthetic_imagenet

from configs_helpers import ROOT, load

pytestmark = pytest.mark.slow

# Modules and fixes (the allowlist of mmengine's checkpoint types), as
# tools/train.py has them.
mmevo.register_all_modules(install_fixes=True)

REFERENCE = ROOT / 'tests' / 'models' / 'data'
IN1K = 'configs/rednet/rednet50_64xb32-warmup-coslr_in1k.py'
STEM = {'stem.1.conv2.conv.weight', 'stem.1.conv2.conv.bias'}
DENSE = [
    'configs/rednet/faster-rcnn_rednet50_fpn_1x_coco.py',
    'configs/rednet/upernet_rednet50_4xb2-80k_cityscapes-512x1024.py',
]


def _official(path):
    """Seeded tensors of the published keys and shapes, and a 1000-class
    head, in the mmcls release format."""
    ref = json.loads((REFERENCE / 'rednet50_state_dict.json').read_text())
    shapes = {
        f'backbone.{k}': v
        for k, v in ref['rednet50_cls']['state_dict'].items()
    }
    shapes.update({'head.fc.weight': [1000, 2048], 'head.fc.bias': [1000]})
    gen = torch.Generator().manual_seed(0)
    state = {
        k: torch.tensor(5)
        if k.endswith('num_batches_tracked')
        else torch.rand(s, generator=gen) + 0.5
        for k, s in shapes.items()
    }
    torch.save(dict(meta=dict(mmcls_version='0.12.0'), state_dict=state), path)
    return state


def _trained(tmp_path):
    """Two training iterations of the RedNet-50 ImageNet config on 4 tiny
    synthetic images, saved by the runner's CheckpointHook."""
    root = str(tmp_path / 'synthetic_imagenet')
    make_synthetic_imagenet(root, num_train=4, num_val=0)
    cfg = load(IN1K)
    cfg.train_dataloader.update(batch_size=2, num_workers=0)
    cfg.train_dataloader.dataset.update(
        data_root=root, metainfo=dict(classes=CLS_CLASSES)
    )
    cfg.train_dataloader.dataset.pipeline[1].scale = 64
    cfg.train_cfg.max_epochs = 1
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.test_dataloader = cfg.test_cfg = cfg.test_evaluator = None
    cfg.work_dir = str(tmp_path / 'work')
    cfg.experiment_name = cfg.visualizer.name = 'pretrained_cls'
    Runner.from_cfg(cfg).train()
    ckpt = torch.load(
        tmp_path / 'work' / 'epoch_1.pth',
        map_location='cpu',
        weights_only=False,
    )
    assert {'meta', 'state_dict', 'message_hub', 'optimizer'} <= set(ckpt)
    return ckpt['state_dict']


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('cls_ckpts')
    return {
        'official': (tmp / 'official.pth', _official(tmp / 'official.pth')),
        'mmevo': (tmp / 'work' / 'epoch_1.pth', _trained(tmp)),
    }


def _init_backbone(rel_path, checkpoint):
    cfg = load(rel_path)
    cfg.model.backbone.init_cfg.checkpoint = str(checkpoint)
    init_default_scope(cfg.default_scope)
    backbone = MODELS.build(cfg.model.backbone)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        backbone.init_weights()
    finally:
        logger.removeHandler(handler)
    return backbone, [r.getMessage() for r in records]


@pytest.mark.parametrize('kind', ['official', 'mmevo'])
@pytest.mark.parametrize('rel_path', DENSE)
def test_dense_config_starts_from_the_classifier(checkpoints, kind, rel_path):
    path, state = checkpoints[kind]
    backbone, messages = _init_backbone(rel_path, path)
    ours = backbone.state_dict()
    body = {
        k[len('backbone.') :]: v
        for k, v in state.items()
        if k.startswith('backbone.')
    }
    assert {k for k in state if not k.startswith('backbone.')} == {
        'head.fc.weight',
        'head.fc.bias',
    }
    assert set(ours) == set(body)
    for key, value in body.items():
        if key in STEM:
            assert ours[key].shape[0] == 2 * 7 * 7 != value.shape[0]
        else:
            assert torch.equal(ours[key], value), key
    mismatched = [m for m in messages if 'size mismatch' in m]
    assert mismatched and all('stem.1.conv2.conv' in m for m in mismatched), (
        messages
    )
    # nothing else is reported: the head is outside the prefix
    assert not any('unexpected key' in m and 'head' in m for m in messages)
