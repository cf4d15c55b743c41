# Demo (``make demo``): RetinaNet on a small RedNet-26, trained from scratch on
# the synthetic COCO-format shapes set (tools/misc/make_synthetic_data.py),
# scored with the real COCO metric. Sized for a 2-core CPU: about 4 minutes.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

data_root = 'data/synthetic_coco/'
classes = ('circle', 'square', 'triangle')
img_size = 128

model = dict(
    backbone=dict(
        _delete_=True,
        # RedNet-26 at a quarter of the published width (base 16, stem 32;
        # the published RedNet-26 has 64/64): 2-core CPU sized
        type='RedNet',
        depth=26,
        stem_channels=32,
        base_channels=16,
        out_indices=(1, 2, 3),
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=None,
    ),
    neck=dict(
        in_channels=[128, 256, 512],
        out_channels=64,
        start_level=0,
        add_extra_convs=False,
        num_outs=3,
    ),
    bbox_head=dict(
        num_classes=len(classes),
        in_channels=64,
        feat_channels=64,
        stacked_convs=2,
        # objects are 15-45 px: anchors 16-25 px at stride 8, up to 100 at 32
        anchor_generator=dict(
            octave_base_scale=2, ratios=[1.0], strides=[8, 16, 32]
        ),
    ),
    test_cfg=dict(nms_pre=200, max_per_img=20),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=(
            'img_id',
            'img_path',
            'ori_shape',
            'img_shape',
            'scale_factor',
        ),
    ),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type='CocoDataset',
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=4),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=8,
    num_workers=1,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CocoDataset',
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        test_mode=True,
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader

val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_val.json',
    metric='bbox',
)
test_evaluator = val_evaluator

max_epochs = 20
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=5
)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.05),
    clip_grad=dict(max_norm=10, norm_type=2),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
    ),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=5, max_keep_ckpts=1),
)
log_processor = dict(window_size=10)
randomness = dict(seed=0)
