# Mask R-CNN, ELSA-Swin-T-FPN, multi-scale crop training, 3x, COCO 2017
# (published: 47.5 box AP, 42.7 mask AP): det/configs/elsa_swin/
# mask_elsa_tiny_3x.py on mmdet 3.x.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/datasets/coco_instance_ms-crop.py',
    '../_base_/schedules/swin_coco_3x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/elsa-swin.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_t_dense, drop_path_rate=0.2
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
