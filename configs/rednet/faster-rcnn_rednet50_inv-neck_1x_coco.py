# Faster R-CNN, RedNet-50 with the involution FPN neck ("inv neck"), 1x, COCO
# (published: 40.2 box AP). Same recipe as the plain FPN run except a longer
# warm-up: 2000 iterations from ratio 0.001.
_base_ = './faster-rcnn_rednet50_fpn_1x_coco.py'

# FPN whose 3x3 output convs are involution(256, 7, 1).
model = dict(neck=dict(type='InvolutionFPN'))

param_scheduler = [
    dict(_base_.param_scheduler[0], end=2000),
    _base_.param_scheduler[1],
]
