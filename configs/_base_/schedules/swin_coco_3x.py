# COCO 3x of the Swin / ELSA-Swin detectors: swin_coco_1x.py for 36 epochs,
# lr x0.1 after epochs 27 and 33.
_base_ = './swin_coco_1x.py'

param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500
    ),
    dict(
        type='MultiStepLR',
        begin=0,
        end=36,
        by_epoch=True,
        milestones=[27, 33],
        gamma=0.1,
    ),
]
train_cfg = dict(max_epochs=36)
