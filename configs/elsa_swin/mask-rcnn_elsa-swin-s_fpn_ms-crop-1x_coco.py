# Mask R-CNN, ELSA-Swin-S-FPN, multi-scale crop training, 1x, COCO 2017
# (published: 48.3 box AP, 43.0 mask AP): mask_elsa_small_1x.py.
_base_ = './mask-rcnn_elsa-swin-t_fpn_ms-crop-1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_s_dense, drop_path_rate=0.2
    )
)
