# RetinaNet, RedNet-50-FPN, 1x schedule, COCO 2017 (published: 38.2 box AP).
# Recipe of the published run: 8 GPUs x 2 images, SGD lr 0.01, momentum 0.9,
# weight decay 1e-4, linear warm-up 2000 iterations from ratio 0.001, steps at
# epochs 8 and 11, 12 epochs, no clipping, 1333x800 resize. The FPN starts at
# level 1 (C3) and builds P6/P7 with extra convs on the input (C5).
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmevo'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,  # drop the base ResNet keys (style, torchvision init)
        type='RedNet',
        depth=50,
        # Published detection stem (involution K=7); see README "Stem kernel".
        stem_kernel_size=7,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/rednet50_imagenet.pth',
            prefix='backbone.')),
    neck=dict(start_level=1, add_extra_convs='on_input', num_outs=5))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=2000),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
train_dataloader = dict(batch_size=2)
# lr 0.01 is for 8 GPUs x 2 images; `--cfg-options auto_scale_lr.enable=True`
# scales it linearly to the actual total batch size.
auto_scale_lr = dict(enable=False, base_batch_size=16)
