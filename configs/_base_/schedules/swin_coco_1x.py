# COCO 1x of the Swin / ELSA-Swin detectors (det/configs/elsa_swin/*): 8 GPUs
# x 2 images, AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05 except
# norms and relative-position tables, mixed precision (the official apex
# fp16), linear warm-up of 500 iterations from 0.001 (mmdet 2's
# schedule_1x), lr x0.1 after epochs 8 and 11 of 12.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    optimizer=dict(
        type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05
    ),
    paramwise_cfg=dict(
        custom_keys={
            'absolute_pos_embed': dict(decay_mult=0.0),
            'relative_position_bias_table': dict(decay_mult=0.0),
            'norm': dict(decay_mult=0.0),
        }
    ),
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
auto_scale_lr = dict(enable=False, base_batch_size=16)
