# Mask R-CNN, RedNet-50-FPN, 1x schedule, COCO 2017 (published: 39.9 box AP,
# 35.7 mask AP). Recipe of the published run: 8 GPUs x 2 images, SGD lr 0.02,
# momentum 0.9, weight decay 1e-4, linear warm-up 500 iterations from ratio
# 0.001, steps at epochs 8 and 11, 12 epochs, no clipping, 1333x800 resize.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
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
            prefix='backbone.')))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
train_dataloader = dict(batch_size=2)
# lr 0.02 is for 8 GPUs x 2 images; `--cfg-options auto_scale_lr.enable=True`
# scales it linearly to the actual total batch size.
auto_scale_lr = dict(enable=False, base_batch_size=16)
