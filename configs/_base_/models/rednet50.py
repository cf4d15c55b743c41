# RedNet-50 (ResNet-50 with 7x7 involutions, Li et al., CVPR 2021) as the
# published detectors and segmentors use it. Two ``model.backbone`` dicts; an
# experiment lists this file among its bases and takes one:
#   model = dict(backbone=dict(_delete_=True, **_base_.rednet50_det))
# Both use the published dense-prediction stem, an involution with K=7. The
# ImageNet checkpoint has K=3 there: its stem.1.conv2 tensors are skipped at
# load time, see configs/rednet/README.md ("Stem kernel").

# Detection (COCO): frozen stem and stage 1, BN in eval mode.
rednet50_det = dict(
    type='RedNet',
    depth=50,
    stem_kernel_size=7,
    num_stages=4,
    out_indices=(0, 1, 2, 3),
    frozen_stages=1,
    norm_cfg=dict(type='BN', requires_grad=True),
    norm_eval=True,
    init_cfg=dict(
        type='Pretrained',
        checkpoint='checkpoints/rednet50_imagenet.pth',
        prefix='backbone.',
    ),
)
# Segmentation (Cityscapes): output stride 32, SyncBN, trained.
rednet50_seg = dict(
    type='RedNet',
    depth=50,
    stem_kernel_size=7,
    num_stages=4,
    strides=(1, 2, 2, 2),
    dilations=(1, 1, 1, 1),
    out_indices=(0, 1, 2, 3),
    norm_cfg=dict(type='SyncBN', requires_grad=True),
    norm_eval=False,
    init_cfg=dict(
        type='Pretrained',
        checkpoint='checkpoints/rednet50_imagenet.pth',
        prefix='backbone.',
    ),
)
