# RetinaNet with ACmix-ResNet-50 (ACmix in every bottleneck), COCO 2017, 1x
# schedule.
# No published run exists for this pair: the recipe is that of the RedNet-50
# config it inherits (the published recipe, identical to the ResNet-50 one).
_base_ = '../rednet/retinanet_rednet50_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,  # replace the whole RedNet backbone
        type='ACmixResNet',
        depth=50,
        kernel_att=7,
        head=4,
        kernel_conv=3,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=True,
        # The released ImageNet classifier has torchvision-style keys without
        # a prefix; ACmixResNet drops its fc.* head on load (no unexpected keys).
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/acmix_resnet50_imagenet.pth')))
