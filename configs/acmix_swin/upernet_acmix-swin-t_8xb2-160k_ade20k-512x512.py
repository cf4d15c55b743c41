# UPerNet, ACmix-Swin-T, ADE20K, 512x512 crops, 160k iterations. Not
# published (ACmix released no segmentation code): mmseg's Swin-T UPerNet
# recipe, that of the ELSA-Swin-T run, drop-path 0.3.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_'
    '8xb2-160k_ade20k-512x512.py',
    '../_base_/models/acmix-swin.py',
]
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True, **_base_.acmix_swin_t_dense, drop_path_rate=0.3
    )
)
