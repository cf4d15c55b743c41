# The ACmix-ResNet ImageNet recipe (LeapLabTHU/ACmix ResNet/main.py with its
# defaults and the README's --batch-size 128, one process over the node's
# GPUs): total batch 128, SGD lr 0.1, momentum 0.9, weight decay 1e-4 (no
# Nesterov); 90 epochs, the first 5 a linear warm-up from 0.25 x lr, then a
# cosine decay to 0 over the other 85, both updated every iteration
# (adjust_learning_rate_iter_warmup with --lr_scheduler cosine).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4),
)
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=0.25,
        end_factor=1.0,
        by_epoch=True,
        begin=0,
        end=5,
        convert_to_iter_based=True,
    ),
    dict(
        type='CosineAnnealingLR',
        T_max=85,
        eta_min=0,
        by_epoch=True,
        begin=5,
        end=90,
        convert_to_iter_based=True,
    ),
]
train_cfg = dict(by_epoch=True, max_epochs=90, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# lr is for the published total batch of 128 (`--auto-scale-lr` scales it
# linearly to GPUs x train_dataloader.batch_size).
auto_scale_lr = dict(enable=False, base_batch_size=128)
