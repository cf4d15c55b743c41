# Demo (``make demo-cls``): a narrow RedNet-26 classifier trained from scratch
# on the synthetic ImageNet-layout set (tools/misc/make_synthetic_data.py cls:
# 10 classes of shapes and textures, 400 train / 100 val images of 64-96 px),
# scored with mmpretrain's top-1 Accuracy. The RedNet-26 ImageNet config in
# small: Nesterov SGD, a linear warm-up from 0.25 laid over an epoch-wise
# cosine decay to 0, label smoothing 0.1, RandomResizedCrop and flips. Sized
# for a 2-core CPU: about 2 minutes (measured: 115 s train + validation,
# top-1 95.0; chance is 10).
_base_ = '../rednet/rednet26_64xb32-warmup-coslr_in1k.py'

data_root = 'data/synthetic_imagenet'
# mmevo.demo.CLS_CLASSES (the sorted folder names: folder i is class i)
classes = (
    'checker',
    'circle',
    'cross',
    'dots',
    'hstripes',
    'ring',
    'square',
    'star',
    'triangle',
    'vstripes',
)

data_preprocessor = dict(num_classes=10)
model = dict(
    backbone=dict(
        # a quarter of the published width (stem 32, base 16; published
        # 64/64), as the other demos
        stem_channels=32,
        base_channels=16,
    ),
    head=dict(
        num_classes=10, in_channels=512, loss=dict(num_classes=10), topk=(1,)
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.35, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=72, edge='short'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=32,
    num_workers=1,
    persistent_workers=True,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=50,
    num_workers=1,
    persistent_workers=True,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1,))
test_evaluator = val_evaluator

max_epochs = 30
optim_wrapper = dict(optimizer=dict(lr=0.1, weight_decay=5e-4))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=0.25,
        end_factor=1.0,
        by_epoch=False,
        begin=0,
        end=40,
    ),
    dict(
        type='CosineAnnealingLR',
        T_max=max_epochs,
        eta_min=0,
        by_epoch=True,
        begin=0,
        end=max_epochs,
    ),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=10)
auto_scale_lr = dict(base_batch_size=32)

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=13),
    checkpoint=dict(type='CheckpointHook', interval=10, max_keep_ckpts=1),
)
randomness = dict(seed=0)
