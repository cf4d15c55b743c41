# UPerNet with ACmix-ResNet-50 (ACmix in every bottleneck), Cityscapes,
# 512x1024 crops, 80k iterations.
# No published run exists for this pair: the recipe is that of the RedNet-50
# config it inherits (the published recipe, identical to the ResNet-50 one).
_base_ = [
    '../rednet/upernet_rednet50_4xb2-80k_cityscapes-512x1024.py',
    '../_base_/models/acmix-r50.py',
]

model = dict(backbone=dict(_delete_=True, **_base_.acmix_r50_seg))
