# RedNet-152 on ImageNet-1k (published top-1 79.12): RedNet-50's data and
# recipe, another depth.
_base_ = './rednet50_64xb32-warmup-coslr_in1k.py'

model = dict(backbone=dict(depth=152))
