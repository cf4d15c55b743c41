# Mask R-CNN, ELSA-Swin-S-FPN, multi-scale crop training, 3x, COCO 2017
# (published: 49.2 box AP, 43.6 mask AP): mask_elsa_small_3x.py.
_base_ = './mask-rcnn_elsa-swin-t_fpn_ms-crop-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_s_dense, drop_path_rate=0.75
    )
)
