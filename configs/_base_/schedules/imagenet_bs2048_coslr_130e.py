# The RedNet ImageNet recipe (d-li14/involution
# cls/configs/_base_/schedules/imagenet_bs2048_coslr_130e.py): 64 GPUs x 32
# images = 2048, SGD lr 0.8, momentum 0.9, weight decay 1e-4, Nesterov; 130
# epochs of cosine decay to 0, epoch by epoch, its first 3130 iterations
# scaled by a linear warm-up from 0.25. The published run (mmcv 1.x,
# CosineAnnealing with warmup='linear') laid the warm-up over the cosine
# rather than before it: both schedulers start at 0 here, and their factors
# multiply (eta_min=0), which is the same schedule. mmengine's LinearLR
# reaches its end factor at iteration end - 1: end=3131 gives mmcv's factor
# 0.25 + 0.75 * t / 3130, full lr from iteration 3130 on.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(
        type='SGD', lr=0.8, momentum=0.9, weight_decay=1e-4, nesterov=True
    ),
)
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=0.25,
        end_factor=1.0,
        by_epoch=False,
        begin=0,
        end=3131,
    ),
    dict(
        type='CosineAnnealingLR',
        T_max=130,
        eta_min=0,
        by_epoch=True,
        begin=0,
        end=130,
    ),
]
train_cfg = dict(by_epoch=True, max_epochs=130, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# lr is for the published total batch of 2048 (`--auto-scale-lr` scales it
# linearly to GPUs x train_dataloader.batch_size; the 3130 warm-up
# iterations stay 3130).
auto_scale_lr = dict(enable=False, base_batch_size=2048)
