# Mask R-CNN with ACmix-ResNet-50 (ACmix in every bottleneck), COCO 2017, 1x
# schedule.
# No published run exists for this pair: the recipe is that of the RedNet-50
# config it inherits (the published recipe, identical to the ResNet-50 one).
_base_ = [
    '../rednet/mask-rcnn_rednet50_fpn_1x_coco.py',
    '../_base_/models/acmix-r50.py',
]

model = dict(backbone=dict(_delete_=True, **_base_.acmix_r50_det))
