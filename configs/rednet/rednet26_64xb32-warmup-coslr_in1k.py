# RedNet-26 on ImageNet-1k (published top-1 75.96): RedNet-50's data and
# recipe, another depth.
_base_ = './rednet50_64xb32-warmup-coslr_in1k.py'

model = dict(backbone=dict(depth=26))
