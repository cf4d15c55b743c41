# ACmix-ResNet-26 on ImageNet-1k (published top-1 76.1): ACmix-ResNet-50's
# data and recipe, another depth (main.py --layers).
_base_ = './acmix-resnet50_4xb32-warmup-coslr-90e_in1k.py'

model = dict(backbone=dict(depth=26))
