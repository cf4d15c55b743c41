# Faster R-CNN, RedNet-50-FPN, 1x schedule, COCO 2017 (published: 39.5 box
# AP): mmdet's ResNet-50 config with the RedNet-50 backbone, on the published
# recipe (../_base_/schedules/coco_1x.py).
_base_ = [
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/schedules/coco_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/models/rednet50.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(backbone=dict(_delete_=True, **_base_.rednet50_det))
