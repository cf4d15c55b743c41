# The three box heads of the official ELSA-Swin Cascade Mask R-CNN
# (det/configs/elsa_swin/cascade_elsa_*.py): 4 shared convs + 1 fc, SyncBN,
# decoded boxes with a GIoU loss of weight 10, the cascade's target stds.
# An experiment on mmdet's cascade-mask-rcnn_r50_fpn.py takes them as
#   model = dict(roi_head=dict(bbox_head=_base_.cascade_4conv1fc_giou))
cascade_4conv1fc_giou = [
    dict(
        type='ConvFCBBoxHead',
        num_shared_convs=4,
        num_shared_fcs=1,
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(
            type='DeltaXYWHBBoxCoder',
            target_means=[0.0, 0.0, 0.0, 0.0],
            target_stds=stds,
        ),
        reg_class_agnostic=False,
        reg_decoded_bbox=True,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        loss_cls=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0
        ),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0),
    )
    for stds in (
        [0.1, 0.1, 0.2, 0.2],
        [0.05, 0.05, 0.1, 0.1],
        [0.033, 0.033, 0.067, 0.067],
    )
]
