# RedNet-50 ImageNet classifier (Li et al., CVPR 2021) as published in
# d-li14/involution (cls/configs/_base_/models/rednet50.py): the ImageNet
# stem (its involution has K=3), the last stage's output, global average
# pooling and a linear head trained with label smoothing 0.1. The keys are
# those of the released mmcls checkpoints (backbone.*, head.fc.*), so they
# load strictly. The other depths set model.backbone.depth.
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='RedNet',
        depth=50,
        stem_kernel_size=3,
        num_stages=4,
        out_indices=(3,),
        norm_cfg=dict(type='BN', requires_grad=True),
        zero_init_residual=True,
    ),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=2048,
        loss=dict(
            type='LabelSmoothLoss',
            label_smooth_val=0.1,
            num_classes=1000,
            mode='original',
            loss_weight=1.0,
        ),
        topk=(1, 5),
    ),
)
