# COCO 1x, the published recipe of the RedNet-50 detectors: 8 GPUs x 2
# images, SGD lr 0.02, momentum 0.9, weight decay 1e-4, linear warm-up of 500
# iterations from ratio 0.001, lr x0.1 after epochs 8 and 11, 12 epochs, no
# gradient clipping. Published variants, set by the experiments: a 2000-
# iteration warm-up (inv-neck runs, RetinaNet), clipping at max_norm 5 (inv
# neck+head) or 40 (RetinaNet inv neck), lr 0.01 (RetinaNet).
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001),
    clip_grad=None,
)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500
    ),
    dict(
        type='MultiStepLR',
        begin=0,
        end=12,
        by_epoch=True,
        milestones=[8, 11],
        gamma=0.1,
    ),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
# lr is for the published total batch of 16; `--cfg-options
# auto_scale_lr.enable=True` scales it linearly to the actual one.
auto_scale_lr = dict(enable=False, base_batch_size=16)
