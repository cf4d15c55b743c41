# Semantic FPN, RedNet-50, Cityscapes, 512x1024 crops, 80k iterations
# (published: 78.0 mIoU): mmseg's ResNet-50 config (FPN(256, 4 outputs),
# FPNHead(128 channels, dropout 0.1)) with the RedNet-50 backbone, on the
# published recipe (../_base_/schedules/cityscapes_80k.py).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/cityscapes.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/schedules/cityscapes_80k.py',
    '../_base_/models/rednet50.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

crop_size = (512, 1024)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,  # the base would load open-mmlab://resnet50_v1c
    backbone=dict(_delete_=True, **_base_.rednet50_seg),
)
