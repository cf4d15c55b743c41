# Semantic FPN with ACmix-ResNet-50 (ACmix in every bottleneck), Cityscapes,
# 512x1024 crops, 80k iterations.
# No published run exists for this pair: the recipe is that of the RedNet-50
# config it inherits (the published recipe, identical to the ResNet-50 one).
_base_ = '../rednet/fpn_rednet50_4xb2-80k_cityscapes-512x1024.py'

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
        strides=(1, 2, 2, 2),
        dilations=(1, 1, 1, 1),
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False,
        # The released ImageNet classifier has torchvision-style keys without
        # a prefix; ACmixResNet drops its fc.* head on load (no unexpected keys).
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/acmix_resnet50_imagenet.pth')))
