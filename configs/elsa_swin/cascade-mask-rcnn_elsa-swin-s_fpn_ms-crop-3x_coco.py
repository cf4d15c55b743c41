# Cascade Mask R-CNN, ELSA-Swin-S-FPN, 3x, COCO 2017 (published: 52.3 box
# AP, 45.2 mask AP): cascade_elsa_small_3x.py.
_base_ = './cascade-mask-rcnn_elsa-swin-t_fpn_ms-crop-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_s_dense, drop_path_rate=0.75
    )
)
