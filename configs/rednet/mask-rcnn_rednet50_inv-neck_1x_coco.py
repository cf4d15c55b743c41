# Mask R-CNN, RedNet-50 with the involution FPN neck, 1x, COCO (published:
# 40.8 box AP, 36.4 mask AP). Same recipe as the plain FPN run except a
# 2000-iteration warm-up from ratio 0.001.
_base_ = './mask-rcnn_rednet50_fpn_1x_coco.py'

# FPN whose 3x3 output convs are involution(256, 7, 1).
model = dict(neck=dict(type='InvolutionFPN'))

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=2000),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]
