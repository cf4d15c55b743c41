# Mask R-CNN, ELSA-Swin-T-FPN, multi-scale crop training, 1x, COCO 2017
# (published: 45.7 box AP, 41.1 mask AP): det/configs/elsa_swin/
# mask_elsa_tiny_1x.py on mmdet 3.x.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/datasets/coco_instance_ms-crop.py',
    '../_base_/schedules/swin_coco_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/elsa-swin.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_t_dense, drop_path_rate=0.1
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
)
