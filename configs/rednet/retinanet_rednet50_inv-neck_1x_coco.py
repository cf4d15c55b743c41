# RetinaNet, RedNet-50 with the involution FPN neck, 1x, COCO (published:
# 38.2 box AP). Recipe of the plain FPN run plus gradient clipping at
# max_norm 40.
_base_ = './retinanet_rednet50_fpn_1x_coco.py'

# Involution replaces the 3x3 output convs of C3-C5; P6/P7 stay stride-2
# convs on C5 (start_level 1 and add_extra_convs='on_input' are inherited).
model = dict(neck=dict(type='InvolutionFPN'))

optim_wrapper = dict(clip_grad=dict(_delete_=True, max_norm=40, norm_type=2))
