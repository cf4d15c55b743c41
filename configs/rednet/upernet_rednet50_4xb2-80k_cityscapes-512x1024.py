# UPerNet, RedNet-50, Cityscapes, 512x1024 crops, 80k iterations (published:
# 80.6 mIoU): mmseg's ResNet-50 config (UPerHead with pool scales 1, 2, 3, 6
# and 512 channels, an auxiliary FCNHead on stage 3 with 256 channels and
# loss weight 0.4) with the RedNet-50 backbone, on the published recipe
# (../_base_/schedules/cityscapes_80k.py).
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
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
