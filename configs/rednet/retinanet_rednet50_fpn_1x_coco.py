# RetinaNet, RedNet-50-FPN, 1x schedule, COCO 2017 (published: 38.2 box AP):
# mmdet's ResNet-50 config (FPN from C3, P6/P7 by extra convs on C5) with the
# RedNet-50 backbone, on the published recipe (../_base_/schedules/
# coco_1x.py) with lr 0.01 and a 2000-iteration warm-up.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/schedules/coco_1x.py',
    'mmdet::_base_/default_runtime.py',
    'mmdet::retinanet/retinanet_tta.py',
    '../_base_/models/rednet50.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(backbone=dict(_delete_=True, **_base_.rednet50_det))

optim_wrapper = dict(optimizer=dict(lr=0.01))
param_scheduler = [
    dict(_base_.param_scheduler[0], end=2000),
    _base_.param_scheduler[1],
]
