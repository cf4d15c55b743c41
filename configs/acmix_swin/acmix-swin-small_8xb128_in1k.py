# ACmix-Swin-S, ImageNet-1k, 224x224, 300 epochs (published: 83.5 top-1):
# the ACmix-Swin-T recipe with drop-path 0.3.
_base_ = './acmix-swin-tiny_8xb128_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.3))
