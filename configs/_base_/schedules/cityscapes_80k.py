# Cityscapes 80k, the published recipe of the RedNet-50 segmentors: 4 GPUs x
# 2 images, SGD lr 0.01, momentum 0.9, weight decay 5e-4, poly decay (power
# 0.9) to 1e-4 over 80k iterations, no warm-up, no gradient clipping,
# validation every 8000 iterations.
_base_ = 'mmseg::_base_/schedules/schedule_80k.py'

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0005),
    clip_grad=None,
)
param_scheduler = [
    dict(
        type='PolyLR',
        eta_min=1e-4,
        power=0.9,
        begin=0,
        end=80000,
        by_epoch=False,
    )
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
# lr is for the published total batch of 8; `--cfg-options
# auto_scale_lr.enable=True` scales it linearly to the actual one.
auto_scale_lr = dict(enable=False, base_batch_size=8)
