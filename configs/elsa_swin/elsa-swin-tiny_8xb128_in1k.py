# ELSA-Swin-T, ImageNet-1k, 224x224, 300 epochs (published: 82.7 top-1): the
# official timm recipe (README of damo-cv/ELSA), which is mmpretrain's Swin
# recipe: 8 GPUs x 128 images, AdamW lr 1e-3, weight decay 0.05 except 1-D
# parameters, 20 warm-up epochs from 1e-6, cosine to 1e-5, gradient clip 5,
# RandAugment m9, random erasing 0.25, mixup 0.8, cutmix 1.0, label
# smoothing 0.1; drop-path 0.1, mixed precision.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='ELSASwinTransformer',
        arch='tiny',
        out_indices=(3,),
        drop_path_rate=0.1,
    )
)
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
optim_wrapper = dict(type='AmpOptimWrapper')
