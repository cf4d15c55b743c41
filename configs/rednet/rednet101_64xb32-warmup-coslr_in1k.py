# RedNet-101 on ImageNet-1k (published top-1 78.92): RedNet-50's data and
# recipe, another depth.
_base_ = './rednet50_64xb32-warmup-coslr_in1k.py'

model = dict(backbone=dict(depth=101))
