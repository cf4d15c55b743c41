# Mask R-CNN, RedNet-50, involution in the FPN neck, the RPN head and the four
# convs of the FCN mask head, 1x, COCO (published: 39.6 box AP, 35.1 mask AP).
# Recipe of the inv-neck run plus gradient clipping at max_norm 5.
_base_ = './mask-rcnn_rednet50_inv-neck_1x_coco.py'

model = dict(
    # The RPN involution keeps its channels, so feat_channels == in_channels.
    rpn_head=dict(
        type='InvolutionRPNHead', in_channels=256, feat_channels=256
    ),
    roi_head=dict(mask_head=dict(type='InvolutionFCNMaskHead')),
)

optim_wrapper = dict(clip_grad=dict(_delete_=True, max_norm=5, norm_type=2))
