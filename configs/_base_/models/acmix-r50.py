# ACmix-ResNet-50 (ACmix in every bottleneck, Pan et al., CVPR 2022), the
# ImageNet model of the ACmix release, in the settings of the RedNet-50
# backbones (rednet50.py). Two ``model.backbone`` dicts; an experiment lists
# this file among its bases and takes one:
#   model = dict(backbone=dict(_delete_=True, **_base_.acmix_r50_det))
# The released classifier has torchvision-style keys without a prefix;
# ACmixResNet drops its fc.* head on load (no unexpected keys).

# Detection (COCO): frozen stem and stage 1, BN in eval mode.
acmix_r50_det = dict(
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
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/acmix_resnet50_imagenet.pth'
    ),
)
# Segmentation (Cityscapes): output stride 32, SyncBN, trained.
acmix_r50_seg = dict(
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
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/acmix_resnet50_imagenet.pth'
    ),
)
