# Mask R-CNN, RedNet-50 with the involution FPN neck, 1x, COCO (published:
# 40.8 box AP, 36.4 mask AP). Same recipe as the plain FPN run except a
# 2000-iteration warm-up from ratio 0.001.
_base_ = './mask-rcnn_rednet50_fpn_1x_coco.py'

# FPN whose 3x3 output convs are involution(256, 7, 1).
model = dict(neck=dict(type='InvolutionFPN'))

param_scheduler = [
    dict(_base_.param_scheduler[0], end=2000),
    _base_.param_scheduler[1],
]
