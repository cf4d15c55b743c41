# ACmix-ResNet-38 on ImageNet-1k (published top-1 77.4): ACmix-ResNet-50's
# data and recipe, another depth (main.py --layers).
_base_ = './acmix-resnet50_4xb32-warmup-coslr-90e_in1k.py'

model = dict(backbone=dict(depth=38))
