# UPerNet, RedNet-50, Cityscapes, 512x1024 crops, 80k iterations (published:
# 80.6 mIoU). Recipe of the published run: 4 GPUs x 2 images, SGD lr 0.01,
# momentum 0.9, weight decay 5e-4, poly decay (power 0.9, min lr 1e-4),
# SyncBN, output stride 32, norm_eval False; UPerHead (pool scales 1,2,3,6,
# 512 channels) and an auxiliary FCNHead on stage 3 (256 channels, loss 0.4).
_base_ = 'mmseg::upernet/upernet_r50_4xb2-80k_cityscapes-512x1024.py'
custom_imports = dict(imports=['mmevo'], allow_failed_imports=False)

norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    pretrained=None,  # the base would load open-mmlab://resnet50_v1c
    backbone=dict(
        _delete_=True,  # drop the base ResNetV1c keys
        type='RedNet',
        depth=50,
        # Published segmentation stem (involution K=7); see README.
        stem_kernel_size=7,
        num_stages=4,
        strides=(1, 2, 2, 2),
        dilations=(1, 1, 1, 1),
        out_indices=(0, 1, 2, 3),
        norm_cfg=norm_cfg,
        norm_eval=False,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/rednet50_imagenet.pth',
            prefix='backbone.')),
    decode_head=dict(
        in_channels=[256, 512, 1024, 2048],
        pool_scales=(1, 2, 3, 6),
        channels=512,
        num_classes=19,
        norm_cfg=norm_cfg),
    auxiliary_head=dict(
        in_channels=1024,
        in_index=2,
        channels=256,
        num_classes=19,
        norm_cfg=norm_cfg,
        loss_decode=dict(loss_weight=0.4)))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0005),
    clip_grad=None)
param_scheduler = [
    dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, end=80000,
         by_epoch=False)
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
train_dataloader = dict(batch_size=2)
# lr 0.01 is for 4 GPUs x 2 images; `--cfg-options auto_scale_lr.enable=True`
# scales it linearly to the actual total batch size.
auto_scale_lr = dict(enable=False, base_batch_size=8)
