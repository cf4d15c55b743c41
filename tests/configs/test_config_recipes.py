"""The merged configs carry every hyper-parameter of the published runs.

The expected values are typed in from the published recipes (one table below,
the one of ``configs/rednet/README.md``); the configs are read through
mmengine's ``Config.fromfile`` with all their bases merged (``mmdet::``,
``mmseg::`` and ``configs/_base_/``), so a change in a base config that alters
a published value fails here.
"""

import pytest

from configs_helpers import all_configs, load

pytestmark = pytest.mark.slow

# Published recipes. COCO: 8 GPUs x 2 images, SGD momentum 0.9 wd 1e-4, steps
# at epochs 8 and 11 of 12, linear warm-up from ratio 0.001, 1333x800.
# Cityscapes: 4 GPUs x 2 images, SGD lr 0.01 momentum 0.9 wd 5e-4, poly decay
# power 0.9 to 1e-4 over 80k iterations, 512x1024 crops, SyncBN.
DET = dict(
    task='det',
    momentum=0.9,
    weight_decay=1e-4,
    milestones=[8, 11],
    max_epochs=12,
    warmup_ratio=0.001,
    batch=2,
    base_batch=16,
    scale=(1333, 800),
)
SEG = dict(
    task='seg',
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    max_iters=80000,
    power=0.9,
    eta_min=1e-4,
    batch=2,
    base_batch=8,
    crop=(512, 1024),
    warmup=None,
    clip=None,
)
# name: (detector/segmentor recipe, backbone, neck, rpn head, mask head)
PUBLISHED = {
    'rednet/faster-rcnn_rednet50_fpn_1x_coco': dict(
        DET, lr=0.02, warmup=500, clip=None, neck='FPN', rpn='RPNHead'
    ),
    'rednet/faster-rcnn_rednet50_inv-neck_1x_coco': dict(
        DET,
        lr=0.02,
        warmup=2000,
        clip=None,
        neck='InvolutionFPN',
        rpn='RPNHead',
    ),
    'rednet/faster-rcnn_rednet50_inv-neck-head_1x_coco': dict(
        DET,
        lr=0.02,
        warmup=2000,
        clip=5,
        neck='InvolutionFPN',
        rpn='InvolutionRPNHead',
    ),
    'rednet/mask-rcnn_rednet50_fpn_1x_coco': dict(
        DET,
        lr=0.02,
        warmup=500,
        clip=None,
        neck='FPN',
        rpn='RPNHead',
        mask='FCNMaskHead',
    ),
    'rednet/mask-rcnn_rednet50_inv-neck_1x_coco': dict(
        DET,
        lr=0.02,
        warmup=2000,
        clip=None,
        neck='InvolutionFPN',
        rpn='RPNHead',
        mask='FCNMaskHead',
    ),
    'rednet/mask-rcnn_rednet50_inv-neck-head_1x_coco': dict(
        DET,
        lr=0.02,
        warmup=2000,
        clip=5,
        neck='InvolutionFPN',
        rpn='InvolutionRPNHead',
        mask='InvolutionFCNMaskHead',
    ),
    'rednet/retinanet_rednet50_fpn_1x_coco': dict(
        DET, lr=0.01, warmup=2000, clip=None, neck='FPN', retina=True
    ),
    'rednet/retinanet_rednet50_inv-neck_1x_coco': dict(
        DET, lr=0.01, warmup=2000, clip=40, neck='InvolutionFPN', retina=True
    ),
    'rednet/fpn_rednet50_4xb2-80k_cityscapes-512x1024': dict(
        SEG, neck='FPN', head='FPNHead'
    ),
    'rednet/fpn_rednet50-inv-neck_4xb2-80k_cityscapes-512x1024': dict(
        SEG, neck='InvolutionFPN', head='FPNHead'
    ),
    'rednet/upernet_rednet50_4xb2-80k_cityscapes-512x1024': dict(
        SEG, neck=None, head='UPerHead'
    ),
}
PUBLISHED['rednet50_fpn_coco'] = PUBLISHED[
    'rednet/faster-rcnn_rednet50_fpn_1x_coco'
]
# ACmix-ResNet-50 has no published detection/segmentation run: its configs
# use the recipe of the RedNet-50 plain-FPN counterpart.
ACMIX = {
    'acmix/faster-rcnn_acmix-r50_fpn_1x_coco': (
        'rednet/faster-rcnn_rednet50_fpn_1x_coco'
    ),
    'acmix/mask-rcnn_acmix-r50_fpn_1x_coco': (
        'rednet/mask-rcnn_rednet50_fpn_1x_coco'
    ),
    'acmix/retinanet_acmix-r50_fpn_1x_coco': (
        'rednet/retinanet_rednet50_fpn_1x_coco'
    ),
    'acmix/fpn_acmix-r50_4xb2-80k_cityscapes-512x1024': (
        'rednet/fpn_rednet50_4xb2-80k_cityscapes-512x1024'
    ),
    'acmix/upernet_acmix-r50_4xb2-80k_cityscapes-512x1024': (
        'rednet/upernet_rednet50_4xb2-80k_cityscapes-512x1024'
    ),
}
EXPECTED = dict(PUBLISHED)
EXPECTED.update({k: PUBLISHED[v] for k, v in ACMIX.items()})


def _name(rel_path):
    return rel_path[len('configs/') : -len('.py')]


NON_DEMO = all_configs()  # every config but configs/demo/ (tested elsewhere)


def test_table_covers_every_config():
    # A new config must get its published recipe in the table above.
    assert sorted(_name(p) for p in NON_DEMO) == sorted(EXPECTED)


def _find(pipeline, type_name):
    steps = [t for t in pipeline if t['type'] == type_name]
    assert len(steps) == 1, f'{type_name} not in the pipeline'
    return steps[0]


@pytest.mark.slow
@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_optimiser_and_schedule(rel_path):
    cfg, exp = load(rel_path), EXPECTED[_name(rel_path)]
    optim = cfg.optim_wrapper
    assert optim.type == 'OptimWrapper'
    assert optim.optimizer.type == 'SGD'
    assert optim.optimizer.lr == exp['lr']
    assert optim.optimizer.momentum == exp['momentum']
    assert optim.optimizer.weight_decay == exp['weight_decay']
    if exp['clip'] is None:
        assert optim.get('clip_grad') is None
    else:
        assert optim.clip_grad.max_norm == exp['clip']
        assert optim.clip_grad.norm_type == 2
    scheds = cfg.param_scheduler
    if exp['task'] == 'det':
        warm, step = scheds
        assert (warm.type, warm.by_epoch, warm.begin) == ('LinearLR', False, 0)
        assert warm.end == exp['warmup']
        assert warm.start_factor == exp['warmup_ratio']
        assert (step.type, step.by_epoch) == ('MultiStepLR', True)
        assert list(step.milestones) == exp['milestones']
        assert step.gamma == 0.1
        assert cfg.train_cfg.type == 'EpochBasedTrainLoop'
        assert cfg.train_cfg.max_epochs == exp['max_epochs'] == step.end
    else:
        (poly,) = scheds
        assert (poly.type, poly.by_epoch, poly.begin) == ('PolyLR', False, 0)
        assert poly.power == exp['power']
        assert poly.eta_min == exp['eta_min']
        assert poly.end == exp['max_iters']
        assert cfg.train_cfg.type == 'IterBasedTrainLoop'
        assert cfg.train_cfg.max_iters == exp['max_iters']


@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_batch_and_lr_scaling(rel_path):
    cfg, exp = load(rel_path), EXPECTED[_name(rel_path)]
    assert cfg.train_dataloader.batch_size == exp['batch']
    # base_batch_size = published GPUs x images per GPU; enabling it rescales
    # lr for other GPU counts.
    assert cfg.auto_scale_lr.base_batch_size == exp['base_batch']
    assert cfg.auto_scale_lr.enable is False


@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_data_geometry(rel_path):
    cfg, exp = load(rel_path), EXPECTED[_name(rel_path)]
    train = cfg.train_dataloader.dataset.pipeline
    test = cfg.test_dataloader.dataset.pipeline
    if exp['task'] == 'det':
        assert cfg.train_dataloader.dataset.data_root == 'data/coco/'
        for pipeline in (train, test):
            resize = _find(pipeline, 'Resize')
            assert tuple(resize.scale) == exp['scale']
            assert resize.keep_ratio is True
    else:
        assert cfg.train_dataloader.dataset.data_root == 'data/cityscapes/'
        assert tuple(_find(train, 'RandomCrop').crop_size) == exp['crop']
        assert tuple(cfg.model.data_preprocessor.size) == exp['crop']
        assert tuple(_find(test, 'Resize').scale) == (2048, 1024)


@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_model_structure(rel_path):
    cfg, exp = load(rel_path), EXPECTED[_name(rel_path)]
    model, bb = cfg.model, cfg.model.backbone
    assert bb.depth == 50
    assert tuple(bb.out_indices) == (0, 1, 2, 3)
    assert bb.type == ('ACmixResNet' if 'acmix' in rel_path else 'RedNet')
    if bb.type == 'RedNet':
        # The published detection/segmentation stem.
        assert bb.stem_kernel_size == 7
    if exp['task'] == 'det':
        assert bb.frozen_stages == 1
        assert bb.norm_eval is True
        assert bb.norm_cfg.type == 'BN'
        assert model.neck.type == exp['neck']
        if exp.get('retina'):
            assert model.type == 'RetinaNet'
            assert model.neck.start_level == 1
            assert model.neck.add_extra_convs == 'on_input'
            assert model.neck.num_outs == 5
        else:
            assert model.rpn_head.type == exp['rpn']
            # The RPN involution keeps its channels.
            assert model.rpn_head.feat_channels == model.rpn_head.in_channels
            assert model.rpn_head.in_channels == model.neck.out_channels == 256
            has_mask = 'mask' in exp
            assert model.type == ('MaskRCNN' if has_mask else 'FasterRCNN')
            if has_mask:
                assert model.roi_head.mask_head.type == exp['mask']
                assert model.roi_head.mask_head.num_convs == 4
    else:
        assert model.type == 'EncoderDecoder'
        assert model.get('pretrained') is None
        assert bb.norm_cfg.type == 'SyncBN'
        assert bb.norm_eval is False
        assert tuple(bb.strides) == (1, 2, 2, 2)
        assert tuple(bb.dilations) == (1, 1, 1, 1)  # output stride 32
        head = model.decode_head
        assert head.type == exp['head']
        assert head.num_classes == 19 and head.norm_cfg.type == 'SyncBN'
        if exp['head'] == 'FPNHead':
            assert model.neck.type == exp['neck']
            assert model.neck.out_channels == 256
            assert model.neck.num_outs == 4
            assert (head.channels, head.dropout_ratio) == (128, 0.1)
        else:
            assert 'neck' not in model
            assert tuple(head.pool_scales) == (1, 2, 3, 6)
            assert head.channels == 512
            aux = model.auxiliary_head
            assert aux.type == 'FCNHead'
            assert (aux.in_index, aux.in_channels) == (2, 1024)
            assert aux.channels == 256
            assert aux.loss_decode.loss_weight == 0.4


@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_backbone_initialisation_is_local(rel_path):
    cfg = load(rel_path)
    init = cfg.model.backbone.init_cfg
    assert init.type == 'Pretrained'
    assert init.checkpoint.startswith('checkpoints/')
    # RedNet checkpoints are mmcls ones (keys under 'backbone.'); the ACmix
    # classifier is torchvision-style (no prefix).
    expected_prefix = None if 'acmix' in rel_path else 'backbone.'
    assert init.get('prefix') == expected_prefix
    # No base-config download (torchvision://, open-mmlab://, http...) left.
    assert '://' not in cfg.pretty_text


@pytest.mark.parametrize('rel_path', NON_DEMO)
def test_mmevo_is_imported_and_scopes_are_set(rel_path):
    # Built by a plain mmengine Runner (no `import mmevo` of its own), the
    # config must import mmevo to find RedNet / ACmixResNet / InvolutionFPN.
    cfg = load(rel_path)
    assert cfg.custom_imports == dict(
        imports=['mmevo.models'], allow_failed_imports=False
    )
    task = EXPECTED[_name(rel_path)]['task']
    assert cfg.default_scope == ('mmdet' if task == 'det' else 'mmseg')
    # Validation during training, as published.
    assert cfg.train_cfg.val_interval == (1 if task == 'det' else 8000)
    metric = cfg.val_evaluator.type
    assert metric == ('CocoMetric' if task == 'det' else 'IoUMetric')


def test_checkpoint_path_is_overridable():
    cfg = load('configs/rednet50_fpn_coco.py')
    cfg.merge_from_dict(
        {'model.backbone.init_cfg.checkpoint': '/elsewhere/rednet50.pth'}
    )
    assert cfg.model.backbone.init_cfg.checkpoint == '/elsewhere/rednet50.pth'
    assert cfg.model.backbone.init_cfg.prefix == 'backbone.'


@pytest.mark.slow
def test_headline_config_inherits_without_copy():
    # configs/rednet50_fpn_coco.py only names its base: same merged config.
    text = load('configs/rednet50_fpn_coco.py').pretty_text
    base = load('configs/rednet/faster-rcnn_rednet50_fpn_1x_coco.py')
    assert text == base.pretty_text
