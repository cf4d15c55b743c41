# Semantic FPN, RedNet-50 with the involution FPN neck, Cityscapes, 512x1024
# crops, 80k iterations (published: 79.1 mIoU). Same recipe as the plain FPN.
_base_ = './fpn_rednet50_4xb2-80k_cityscapes-512x1024.py'

# FPN whose 3x3 output convs are involution(256, 7, 1).
model = dict(neck=dict(type='InvolutionFPN'))
