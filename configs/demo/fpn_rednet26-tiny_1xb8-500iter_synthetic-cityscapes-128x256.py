# Demo (``make demo-seg``): Semantic FPN on a small RedNet-26, trained from
# scratch on the synthetic Cityscapes-layout street scenes
# (tools/misc/make_synthetic_data.py), scored with mmseg's mIoU. Sized for a
# 2-core CPU: about 4 minutes.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/cityscapes.py',
    'mmseg::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

data_root = 'data/synthetic_cityscapes/'
crop_size = (128, 256)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        # RedNet-26 at a quarter of the published width (base 16, stem 32;
        # the published RedNet-26 has 64/64): 2-core CPU sized
        type='RedNet',
        depth=26,
        stem_channels=32,
        base_channels=16,
        out_indices=(0, 1, 2, 3),
        norm_cfg=norm_cfg,
        norm_eval=False,
        init_cfg=None,
    ),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=64, num_outs=4),
    decode_head=dict(
        in_channels=[64, 64, 64, 64], channels=64, norm_cfg=norm_cfg
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(data_root=data_root, pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=8,
    num_workers=1,
    dataset=dict(data_root=data_root, pipeline=test_pipeline),
)
test_dataloader = val_dataloader

max_iters = 500
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=250
)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.01),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(
        type='PolyLR',
        eta_min=1e-5,
        power=0.9,
        begin=50,
        end=max_iters,
        by_epoch=False,
    ),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=250, max_keep_ckpts=1
    ),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'),
)
log_processor = dict(by_epoch=False, window_size=20)
randomness = dict(seed=0)
