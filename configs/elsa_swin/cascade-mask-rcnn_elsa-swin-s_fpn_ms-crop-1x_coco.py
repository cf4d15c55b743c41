# Cascade Mask R-CNN, ELSA-Swin-S-FPN, 1x, COCO 2017 (published: 51.6 box
# AP, 44.4 mask AP): cascade_elsa_small_1x.py.
_base_ = './cascade-mask-rcnn_elsa-swin-t_fpn_ms-crop-1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_s_dense, drop_path_rate=0.2
    )
)
