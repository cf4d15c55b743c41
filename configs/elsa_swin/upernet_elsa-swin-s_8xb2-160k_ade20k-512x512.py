# UPerNet, ELSA-Swin-S, ADE20K, 512x512 crops, 160k iterations (published:
# 50.4 mIoU, multi-scale + flip): upernet_elsa_small_160k.py.
_base_ = './upernet_elsa-swin-t_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        _delete_=True, **_base_.elsa_swin_s_dense, drop_path_rate=0.3
    )
)
