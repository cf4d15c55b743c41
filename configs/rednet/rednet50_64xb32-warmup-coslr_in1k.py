# RedNet-50 on ImageNet-1k, the published run (top-1 78.35; d-li14/involution
# cls/configs/rednet/rednet50_b32x64_warmup_coslr_imagenet.py): mmpretrain's
# ImageNet data (RandomResizedCrop 224 + flip; test: short side 256, centre
# crop 224; 32 images per GPU) on the published recipe of 64 GPUs.
_base_ = [
    '../_base_/models/rednet50_in1k.py',
    'mmpretrain::_base_/datasets/imagenet_bs32.py',
    '../_base_/schedules/imagenet_bs2048_coslr_130e.py',
    'mmpretrain::_base_/default_runtime.py',
]
