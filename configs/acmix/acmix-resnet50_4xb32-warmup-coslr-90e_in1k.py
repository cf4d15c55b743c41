# ACmix-ResNet-50 on ImageNet-1k, the published run (top-1 77.8): the
# official recipe (../_base_/schedules/imagenet_bs128_coslr_90e.py, total
# batch 128, here 4 GPUs x 32) on mmpretrain's ImageNet data, which is
# main.py's: RandomResizedCrop 224 + flip; test: short side 256, centre
# crop 224; ImageNet mean and std.
_base_ = [
    '../_base_/models/acmix-resnet50_in1k.py',
    'mmpretrain::_base_/datasets/imagenet_bs32.py',
    '../_base_/schedules/imagenet_bs128_coslr_90e.py',
    'mmpretrain::_base_/default_runtime.py',
]
