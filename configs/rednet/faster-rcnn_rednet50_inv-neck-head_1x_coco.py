# Faster R-CNN, RedNet-50, involution in the FPN neck and the RPN head
# ("inv neck+head"), 1x, COCO (published: 39.2 box AP). Recipe of the
# inv-neck run plus gradient clipping at max_norm 5.
_base_ = './faster-rcnn_rednet50_inv-neck_1x_coco.py'

# The RPN involution keeps its channels, so feat_channels == in_channels.
model = dict(
    rpn_head=dict(type='InvolutionRPNHead', in_channels=256, feat_channels=256)
)

optim_wrapper = dict(clip_grad=dict(_delete_=True, max_norm=5, norm_type=2))
