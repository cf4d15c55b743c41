# RedNet-38 on ImageNet-1k (published top-1 77.48): RedNet-50's data and
# recipe, another depth.
_base_ = './rednet50_64xb32-warmup-coslr_in1k.py'

model = dict(backbone=dict(depth=38))
