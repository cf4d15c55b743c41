"""ELSA-Swin trains inside the published detection and segmentation
recipes: the Mask R-CNN 1x COCO config and the UPerNet ADE20K config, each
with a narrow ELSA-Swin (ELSA stages 1-3, shifted windows in stage 4) and
narrow heads, run by mmengine's ``Runner`` for a few iterations on the
synthetic COCO / Cityscapes sets with the recipe's own augmentations at a
small scale (so the inputs are not multiples of the window).

On the CPU the recipes' ``AmpOptimWrapper`` (mmengine: CUDA/NPU/MLU only)
becomes ``OptimWrapper`` and SyncBN becomes BN; everything else (AdamW,
parameter-wise decay, warm-up, schedule) is the config's.
"""

import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmevo.demo import make_synthetic_cityscapes, make_synthetic_coco
from mmevo.integrations.mmengine.dist import convert_sync_bn_to_bn

pytestmark = pytest.mark.slow  # about 30-60 s each on 2 cores

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
NARROW = dict(
    _delete_=True,
    type='ELSASwinTransformer',
    embed_dims=16,
    depths=(1, 1, 1, 2),
    num_heads=(1, 2, 4, 8),
    group_width=4,
    pad_small_map=True,
    drop_path_rate=0.1,
    init_cfg=None,
)
WIDTHS = [16, 32, 64, 128]
NO_EVAL = dict(
    val_dataloader=None,
    val_cfg=None,
    val_evaluator=None,
    test_dataloader=None,
    test_cfg=None,
    test_evaluator=None,
)


class Recorder(Hook):
    """Keeps the weights before the first step and every step's losses."""

    def __init__(self):
        self.before, self.losses = None, []

    def before_train(self, runner):
        self.before = {
            n: p.detach().clone() for n, p in runner.model.named_parameters()
        }

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.losses.append(
            {k: float(torch.as_tensor(v).detach()) for k, v in outputs.items()}
        )


def run(cfg, tmp_path):
    convert_sync_bn_to_bn(cfg)
    cfg.optim_wrapper.type = 'OptimWrapper'  # AMP needs a GPU in mmengine
    cfg.work_dir = str(tmp_path / 'work')
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.merge_from_dict(dict(NO_EVAL, randomness=dict(seed=0)))
    cfg.experiment_name = f'swin_train_{tmp_path.name}'
    cfg.visualizer.name = cfg.experiment_name
    torch.manual_seed(0)
    runner = Runner.from_cfg(cfg)
    recorder = Recorder()
    runner.register_hook(recorder)
    runner.train()
    return runner, recorder


def check_training(runner, recorder, steps, heads):
    assert len(recorder.losses) == steps
    for losses in recorder.losses:
        assert losses['loss'] > 0
        for name, value in losses.items():
            assert torch.isfinite(torch.tensor(value)), name
    changed = {
        n
        for n, p in runner.model.named_parameters()
        if not torch.equal(p.detach(), recorder.before[n])
    }
    # the ELSA stages, the window-attention stage and every head moved
    for prefix in (
        'backbone.layers.0.blocks.0.attn.',
        'backbone.layers.3.',
        'backbone.norm0.',
        *heads,
    ):
        assert any(n.startswith(prefix) for n in changed), prefix


def test_elsa_swin_mask_rcnn_trains_on_synthetic_coco(tmp_path):
    root = str(tmp_path / 'coco')
    make_synthetic_coco(root, num_train=6, num_val=1, img_size=64)
    scales = [(s, 160) for s in (64, 72, 80, 88, 96)]
    cfg = Config.fromfile(
        osp.join(
            REPO,
            'configs/elsa_swin/mask-rcnn_elsa-swin-t_fpn_ms-crop-1x_coco.py',
        )
    )
    # the recipe's pipeline, scaled to 64-px images (as 480-800 to COCO)
    pipeline = cfg.train_dataloader.dataset.pipeline
    plain, crop = pipeline[3].transforms
    plain[0].scales = scales
    crop[0].scales = [(48, 160), (56, 160), (64, 160)]
    crop[1].crop_size = (40, 60)
    crop[2].scales = scales
    cfg.merge_from_dict(
        dict(
            model=dict(
                backbone=NARROW,
                neck=dict(in_channels=WIDTHS, out_channels=32),
                rpn_head=dict(in_channels=32, feat_channels=32),
                roi_head=dict(
                    bbox_roi_extractor=dict(out_channels=32),
                    bbox_head=dict(
                        in_channels=32, fc_out_channels=64, num_classes=3
                    ),
                    mask_roi_extractor=dict(out_channels=32),
                    mask_head=dict(
                        in_channels=32, conv_out_channels=32, num_classes=3
                    ),
                ),
            ),
            train_dataloader=dict(
                batch_size=2,
                num_workers=0,
                persistent_workers=False,
                dataset=dict(
                    data_root=root + '/',
                    metainfo=dict(classes=('circle', 'square', 'triangle')),
                    ann_file='annotations/instances_train.json',
                    data_prefix=dict(img='train/'),
                    pipeline=pipeline,
                ),
            ),
            train_cfg=dict(max_epochs=1),
        )
    )
    assert cfg.optim_wrapper.optimizer.lr == 1e-4  # the recipe's
    runner, recorder = run(cfg, tmp_path)
    check_training(
        runner,
        recorder,
        3,
        ('neck.', 'rpn_head.', 'roi_head.bbox_head.', 'roi_head.mask_head.'),
    )
    assert {'loss_rpn_cls', 'loss_bbox', 'loss_mask'} <= set(
        recorder.losses[0]
    )


def test_elsa_swin_upernet_trains_on_synthetic_cityscapes(tmp_path):
    root = str(tmp_path / 'cityscapes')
    make_synthetic_cityscapes(root, num_train=4, num_val=1, img_size=(48, 96))
    crop_size = (44, 44)
    cfg = Config.fromfile(
        osp.join(
            REPO,
            'configs/elsa_swin/'
            'upernet_elsa-swin-t_8xb2-160k_ade20k-512x512.py',
        )
    )
    # the ADE20K recipe's pipeline at 1/8 scale, on the Cityscapes layout
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations'),
        dict(
            type='RandomResize',
            scale=(96, 48),
            ratio_range=(0.5, 2.0),
            keep_ratio=True,
        ),
        dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PhotoMetricDistortion'),
        dict(type='PackSegInputs'),
    ]
    cfg.merge_from_dict(
        dict(
            model=dict(
                data_preprocessor=dict(size=crop_size),
                backbone=NARROW,
                decode_head=dict(
                    in_channels=WIDTHS, channels=32, num_classes=19
                ),
                auxiliary_head=dict(
                    in_channels=64, channels=16, num_classes=19
                ),
            ),
            train_dataloader=dict(
                _delete_=True,
                batch_size=2,
                num_workers=0,
                sampler=dict(type='InfiniteSampler', shuffle=True),
                dataset=dict(
                    type='CityscapesDataset',
                    data_root=root,
                    data_prefix=dict(
                        img_path='leftImg8bit/train',
                        seg_map_path='gtFine/train',
                    ),
                    pipeline=pipeline,
                ),
            ),
            train_cfg=dict(max_iters=3, val_interval=1000),
        )
    )
    assert cfg.optim_wrapper.optimizer.lr == 6e-5  # the recipe's
    runner, recorder = run(cfg, tmp_path)
    check_training(runner, recorder, 3, ('decode_head.', 'auxiliary_head.'))
    assert {'decode.loss_ce', 'aux.loss_ce'} <= set(recorder.losses[0])
