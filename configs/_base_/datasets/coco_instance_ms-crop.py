# COCO 2017 instances with the multi-scale training of the Swin / ELSA-Swin
# detectors (from DETR / Sparse R-CNN, det/configs/elsa_swin/*): flip, then
# either a shorter side of 480..800 (step 32, longer <= 1333), or a shorter
# side of 400/500/600, an absolute-range crop of 384..600 and the 480..800
# resize. Test: 1333x800, as mmdet's base.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'

scales = [
    (480, 1333),
    (512, 1333),
    (544, 1333),
    (576, 1333),
    (608, 1333),
    (640, 1333),
    (672, 1333),
    (704, 1333),
    (736, 1333),
    (768, 1333),
    (800, 1333),
]
plain_resize = [
    dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)
]
crop_then_resize = [
    dict(
        type='RandomChoiceResize',
        scales=[(400, 1333), (500, 1333), (600, 1333)],
        keep_ratio=True,
    ),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=(384, 600),
        allow_negative_crop=True,
    ),
    dict(type='RandomChoiceResize', scales=scales, keep_ratio=True),
]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[plain_resize, crop_then_resize]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
