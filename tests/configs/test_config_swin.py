"""The ELSA-Swin / ACmix-Swin configs: each builds under its scope, holds
the published recipe (issue 19; damo-cv/ELSA ``det/configs/elsa_swin/*``,
``seg/configs/elsa_swin/*``, the ELSA README and LeapLabTHU/ACmix's Swin
config) and is listed in its folder's ``metafile.yml`` with the published
numbers ("not published" where the paper has none)."""

import importlib

import pytest
import torch
import yaml
from mmengine.registry import DefaultScope

from configs_helpers import ROOT, load

pytestmark = pytest.mark.slow

# config -> (backbone, arch, drop-path, published result)
IMAGENET = {
    'elsa_swin/elsa-swin-tiny_8xb128_in1k': ('ELSA', 'tiny', 0.1, 82.7),
    'elsa_swin/elsa-swin-small_8xb128_in1k': ('ELSA', 'small', 0.3, 83.5),
    'elsa_swin/elsa-swin-base_8xb128_in1k': ('ELSA', 'base', 0.5, 84.0),
    'acmix_swin/acmix-swin-tiny_8xb128_in1k': ('ACmix', 'tiny', 0.2, 81.9),
    'acmix_swin/acmix-swin-small_8xb128_in1k': ('ACmix', 'small', 0.3, 83.5),
}
# (box AP, mask AP)
COCO = {
    'elsa_swin/mask-rcnn_elsa-swin-t_fpn_ms-crop-1x_coco': (
        'ELSA',
        'tiny',
        0.1,
        (45.7, 41.1),
    ),
    'elsa_swin/mask-rcnn_elsa-swin-t_fpn_ms-crop-3x_coco': (
        'ELSA',
        'tiny',
        0.2,
        (47.5, 42.7),
    ),
    'elsa_swin/mask-rcnn_elsa-swin-s_fpn_ms-crop-1x_coco': (
        'ELSA',
        'small',
        0.2,
        (48.3, 43.0),
    ),
    'elsa_swin/mask-rcnn_elsa-swin-s_fpn_ms-crop-3x_coco': (
        'ELSA',
        'small',
        0.75,
        (49.2, 43.6),
    ),
    'elsa_swin/cascade-mask-rcnn_elsa-swin-t_fpn_ms-crop-1x_coco': (
        'ELSA',
        'tiny',
        0.0,
        (49.8, 43.0),
    ),
    'elsa_swin/cascade-mask-rcnn_elsa-swin-t_fpn_ms-crop-3x_coco': (
        'ELSA',
        'tiny',
        0.2,
        (51.0, 44.2),
    ),
    'elsa_swin/cascade-mask-rcnn_elsa-swin-s_fpn_ms-crop-1x_coco': (
        'ELSA',
        'small',
        0.2,
        (51.6, 44.4),
    ),
    'elsa_swin/cascade-mask-rcnn_elsa-swin-s_fpn_ms-crop-3x_coco': (
        'ELSA',
        'small',
        0.75,
        (52.3, 45.2),
    ),
    'acmix_swin/mask-rcnn_acmix-swin-t_fpn_ms-crop-1x_coco': (
        'ACmix',
        'tiny',
        0.2,
        ('not published', 'not published'),
    ),
}
# mIoU, multi-scale + flip
ADE20K = {
    'elsa_swin/upernet_elsa-swin-t_8xb2-160k_ade20k-512x512': (
        'ELSA',
        'tiny',
        0.3,
        47.9,
    ),
    'elsa_swin/upernet_elsa-swin-s_8xb2-160k_ade20k-512x512': (
        'ELSA',
        'small',
        0.3,
        50.4,
    ),
    'acmix_swin/upernet_acmix-swin-t_8xb2-160k_ade20k-512x512': (
        'ACmix',
        'tiny',
        0.3,
        'not published',
    ),
}
ALL = {**IMAGENET, **COCO, **ADE20K}
# exact parameter counts of the official classifiers
OFFICIAL_PARAMS = {
    'elsa_swin/elsa-swin-tiny_8xb128_in1k': 29140978,
    'elsa_swin/elsa-swin-small_8xb128_in1k': 52874626,
    'elsa_swin/elsa-swin-base_8xb128_in1k': 92682464,
    'acmix_swin/acmix-swin-tiny_8xb128_in1k': 28649908,
    'acmix_swin/acmix-swin-small_8xb128_in1k': 50345080,
}
SCALES = [(s, 1333) for s in range(480, 801, 32)]


def cfg_of(name):
    return load(f'configs/{name}.py')


def test_every_config_is_in_the_tables():
    found = {
        str(p.relative_to(ROOT / 'configs'))[:-3]
        for folder in ('elsa_swin', 'acmix_swin')
        for p in (ROOT / 'configs' / folder).glob('*.py')
    }
    assert found == set(ALL)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(ALL))
def test_config_builds(name):
    cfg = cfg_of(name)
    family, arch, drop_path, _ = ALL[name]
    scope = cfg.default_scope
    assert scope == (
        'mmpretrain'
        if name in IMAGENET
        else 'mmdet'
        if name in COCO
        else 'mmseg'
    )
    assert cfg.custom_imports['imports'] == ['mmevo.models']
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with torch.device('meta'), DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model)
    backbone = model.backbone
    assert type(backbone).__name__ == f'{family}SwinTransformer'
    assert backbone.arch == arch
    rates = [
        getattr(b.drop_path, 'drop_prob', 0.0)
        for s in backbone.layers
        for b in s.blocks
    ]
    assert max(rates) == pytest.approx(drop_path)
    if name in IMAGENET:
        assert not backbone.pad_small_map
        assert backbone.out_indices == (3,)
        assert (
            sum(p.numel() for p in model.parameters()) == OFFICIAL_PARAMS[name]
        )
    else:
        # det / seg: the official det backbone (window padded, 4 outputs),
        # initialised from the official ImageNet weights as released
        assert backbone.pad_small_map
        assert backbone.out_indices == (0, 1, 2, 3)
        init = cfg.model.backbone.init_cfg
        assert init.type == 'Pretrained'
        assert (
            init.checkpoint == f'checkpoints/{family.lower()}_swin_{arch}.pth'
        )


@pytest.mark.parametrize('name', sorted(IMAGENET))
def test_imagenet_recipe(name):
    cfg = cfg_of(name)
    optim = cfg.optim_wrapper
    assert optim.type == 'AmpOptimWrapper'
    assert optim.optimizer.type == 'AdamW'
    assert optim.optimizer.lr == 1e-3
    assert optim.optimizer.weight_decay == 0.05
    assert optim.clip_grad == dict(max_norm=5.0)
    assert optim.paramwise_cfg.flat_decay_mult == 0.0
    # 8 GPUs x 128 = 1024, the batch the lr is given for
    assert cfg.train_dataloader.batch_size * 8 == 1024
    assert cfg.auto_scale_lr.base_batch_size == 1024
    assert cfg.train_cfg.max_epochs == 300
    warmup, cosine = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and warmup.end == 20
    assert warmup.by_epoch and warmup.convert_to_iter_based
    assert cosine.type == 'CosineAnnealingLR' and cosine.begin == 20
    assert cosine.eta_min == 1e-5
    assert cfg.model.train_cfg.augments == [
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0),
    ]
    assert cfg.model.head.loss.label_smooth_val == 0.1
    steps = {t.type: t for t in cfg.train_dataloader.dataset.pipeline}
    assert steps['RandomResizedCrop'].scale == 224
    assert steps['RandAugment'].magnitude_level == 9
    assert steps['RandomErasing'].erase_prob == 0.25
    if 'base' in name:  # the official ELSA-Swin-B run keeps a model EMA
        assert cfg.custom_hooks[0].type == 'EMAHook'


@pytest.mark.parametrize('name', sorted(COCO))
def test_coco_recipe(name):
    cfg = cfg_of(name)
    optim = cfg.optim_wrapper
    assert optim.type == 'AmpOptimWrapper'
    assert optim.optimizer == dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05
    )
    assert optim.paramwise_cfg.custom_keys == {
        'absolute_pos_embed': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
    }
    three_x = '3x' in name
    warmup, steps = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and not warmup.by_epoch
    assert (warmup.start_factor, warmup.end) == (0.001, 500)
    assert steps.type == 'MultiStepLR' and steps.gamma == 0.1
    assert steps.milestones == ([27, 33] if three_x else [8, 11])
    assert steps.end == cfg.train_cfg.max_epochs == (36 if three_x else 12)
    assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs
    pipeline = cfg.train_dataloader.dataset.pipeline
    assert [t.type for t in pipeline] == [
        'LoadImageFromFile',
        'LoadAnnotations',
        'RandomFlip',
        'RandomChoice',
        'PackDetInputs',
    ]
    assert pipeline[1].with_mask and pipeline[2].prob == 0.5
    plain, crop = pipeline[3].transforms
    assert [tuple(s) for s in plain[0].scales] == SCALES
    assert [t.type for t in crop] == [
        'RandomChoiceResize',
        'RandomCrop',
        'RandomChoiceResize',
    ]
    assert crop[0].scales == [(400, 1333), (500, 1333), (600, 1333)]
    assert crop[1].crop_type == 'absolute_range'
    assert crop[1].crop_size == (384, 600)
    assert [tuple(s) for s in crop[2].scales] == SCALES
    assert cfg.model.neck.in_channels == [96, 192, 384, 768]
    roi = cfg.model.roi_head
    if 'cascade' in name:
        stds = [
            [0.1, 0.1, 0.2, 0.2],
            [0.05, 0.05, 0.1, 0.1],
            [0.033, 0.033, 0.067, 0.067],
        ]
        assert len(roi.bbox_head) == 3
        for head, std in zip(roi.bbox_head, stds, strict=True):
            assert head.type == 'ConvFCBBoxHead'
            assert (head.num_shared_convs, head.num_shared_fcs) == (4, 1)
            assert head.norm_cfg.type == 'SyncBN'
            assert head.reg_decoded_bbox
            assert head.loss_bbox == dict(type='GIoULoss', loss_weight=10.0)
            assert head.bbox_coder.target_stds == std
    else:
        assert roi.bbox_head.type == 'Shared2FCBBoxHead'
        assert roi.mask_head.type == 'FCNMaskHead'


@pytest.mark.parametrize('name', sorted(ADE20K))
def test_ade20k_recipe(name):
    cfg = cfg_of(name)
    optim = cfg.optim_wrapper
    assert optim.optimizer == dict(
        type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01
    )
    assert optim.paramwise_cfg.custom_keys == {
        'absolute_pos_embed': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'norm': dict(decay_mult=0.0),
    }
    warmup, poly = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and not warmup.by_epoch
    assert (warmup.start_factor, warmup.end) == (1e-6, 1500)
    assert poly.type == 'PolyLR' and (poly.power, poly.eta_min) == (1.0, 0.0)
    assert (poly.begin, poly.end) == (1500, 160000)
    assert cfg.train_cfg.max_iters == 160000
    assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'
    crop = [
        t
        for t in cfg.train_dataloader.dataset.pipeline
        if t.type == 'RandomCrop'
    ]
    assert crop[0].crop_size == (512, 512)
    assert cfg.model.decode_head.type == 'UPerHead'
    assert cfg.model.decode_head.in_channels == [96, 192, 384, 768]
    assert cfg.model.decode_head.num_classes == 150
    assert cfg.model.auxiliary_head.in_channels == 384


def _metafile_models():
    models = {}
    for folder in ('elsa_swin', 'acmix_swin'):
        meta = yaml.safe_load(
            (ROOT / 'configs' / folder / 'metafile.yml').read_text()
        )
        (collection,) = meta['Collections']
        for model in meta['Models']:
            assert model['In Collection'] == collection['Name']
            models[f'{folder}/{model["Name"]}'] = model
    return models


def test_metafiles_hold_the_published_numbers():
    models = _metafile_models()
    assert set(models) == set(ALL)
    for name, model in models.items():
        assert model['Config'] == f'configs/{name}.py'
        assert (ROOT / model['Config']).is_file()
        published = ALL[name][-1]
        results = {r['Task']: r for r in model['Results']}
        if name in IMAGENET:
            assert model['Metadata']['Parameters'] == OFFICIAL_PARAMS[name]
            assert model['Metadata']['Epochs'] == 300
            metrics = results['Image Classification']['Metrics']
            assert metrics == {'Top 1 Accuracy': published}
        elif name in COCO:
            assert model['Metadata']['Epochs'] == (36 if '3x' in name else 12)
            box = results['Object Detection']['Metrics']['box AP']
            mask = results['Instance Segmentation']['Metrics']['mask AP']
            assert (box, mask) == published
        else:
            metrics = results['Semantic Segmentation']['Metrics']
            assert metrics['mIoU(ms+flip)'] == published
            assert metrics['mIoU'] == 'not published'


def test_ade20k_data_root_is_checked(tmp_path, monkeypatch):
    from mmevo.datasets.checks import MissingDataError, check_data_exists

    monkeypatch.chdir(tmp_path)  # no data/ade/ here
    cfg = cfg_of(sorted(ADE20K)[0])
    with pytest.raises(MissingDataError) as info:
        check_data_exists(cfg)
    message = str(info.value)
    assert "'data/ade/ADEChallengeData2016' does not exist" in message
    assert 'docs/datasets.md' in message
