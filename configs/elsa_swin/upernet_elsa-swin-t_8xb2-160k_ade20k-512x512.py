# UPerNet, ELSA-Swin-T, ADE20K, 512x512 crops, 160k iterations (published:
# 47.9 mIoU, multi-scale + flip): seg/configs/elsa_swin/
# upernet_elsa_tiny_160k.py on mmseg 1.x, whose Swin-T UPerNet config has
# the same recipe (8 GPUs x 2 images, AdamW lr 6e-5, weight decay 0.01
# except norms and relative-position tables, 1500 warm-up iterations from
# 1e-6, poly decay of power 1 to 0).
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_'
    '8xb2-160k_ade20k-512x512.py',
    '../_base_/models/elsa-swin.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_t_dense, drop_path_rate=0.3
    )
)
