# ACmix-ResNet-50 ImageNet classifier (Pan et al., CVPR 2022) as published in
# LeapLabTHU/ACmix (ResNet/ResNet_ImageNet.py, run by ResNet/main.py with
# --k_att 7 --head 4 --k_conv 3): torchvision's ResNet-50 stem and stages
# with ACmix as every middle layer, average pooling and a linear layer. The
# other depths set model.backbone.depth (main.py --layers).
custom_imports = dict(imports=['mmevo.models'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='ACmixResNet',
        depth=50,
        kernel_att=7,
        head=4,
        kernel_conv=3,
        num_stages=4,
        out_indices=(3,),
        norm_cfg=dict(type='BN', requires_grad=True),
        # published: no zero-init of the residual norms (backbone docstring)
        zero_init_residual=False,
    ),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=2048,
        # main.py's smooth_loss gives the target 1 - 0.1 and every other
        # class 0.1 / 999; mmpretrain's 'original' mode gives the target
        # 1 - s + s / 1000 and the others s / 1000: the same for
        # s = 0.1 * 1000 / 999.
        loss=dict(
            type='LabelSmoothLoss',
            label_smooth_val=0.1 * 1000 / 999,
            num_classes=1000,
            mode='original',
            loss_weight=1.0,
        ),
        topk=(1, 5),
        # the published fc keeps PyTorch's default nn.Linear init
        init_cfg=None,
    ),
)
