# ACmix-Swin-T, ImageNet-1k, 224x224, 300 epochs (published: 81.9 top-1):
# the Swin recipe of LeapLabTHU/ACmix (Swin-Transformer/config.py, scaled
# to its total batch of 1024 as its main.py does), which is mmpretrain's:
# AdamW lr 1e-3, weight decay 0.05 except 1-D parameters, 20 warm-up
# epochs, cosine to 1e-5, clip 5, RandAugment m9, random erasing 0.25,
# mixup 0.8, cutmix 1.0, label smoothing 0.1; drop-path 0.2, mixed
# precision (apex O1 there).
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='ACmixSwinTransformer',
        arch='tiny',
        out_indices=(3,),
        drop_path_rate=0.2,
    )
)
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
optim_wrapper = dict(type='AmpOptimWrapper')
