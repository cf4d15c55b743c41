# Mask R-CNN, ACmix-Swin-T-FPN, multi-scale crop training, 1x, COCO 2017.
# Not published (ACmix released no detection code): the recipe of the
# ELSA-Swin-T and Swin-T Mask R-CNN 1x runs, drop-path 0.2 as Swin-T's.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/datasets/coco_instance_ms-crop.py',
    '../_base_/schedules/swin_coco_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/acmix-swin.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.acmix_swin_t_dense, drop_path_rate=0.2
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
