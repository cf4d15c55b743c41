# Cascade Mask R-CNN, ELSA-Swin-T-FPN, 4conv1fc box heads with SyncBN and
# GIoU, multi-scale crop training, 1x, COCO 2017 (published: 49.8 box AP,
# 43.0 mask AP): det/configs/elsa_swin/cascade_elsa_tiny_1x.py on mmdet 3.x.
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    '../_base_/datasets/coco_instance_ms-crop.py',
    '../_base_/schedules/swin_coco_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/elsa-swin.py',
    '../_base_/models/cascade-heads_4conv1fc-giou.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_t_dense, drop_path_rate=0.0
    ),
    neck=dict(in_channels=[96, 192, 384, 768]),
    roi_head=dict(bbox_head=_base_.cascade_4conv1fc_giou),
)
