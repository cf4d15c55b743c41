# ELSA-Swin backbones (damo-cv/ELSA) for detection and segmentation, in the
# settings of the official det/seg code: the window of the last stage padded
# (pad_small_map=True), initialised from the official ImageNet checkpoint
# as released (a ``model`` dict of official keys, loaded unconverted). An
# experiment lists this file among its bases and takes one, adding its
# drop-path rate:
#   model = dict(backbone=dict(_delete_=True, **_base_.elsa_swin_t_dense,
#                              drop_path_rate=0.1))
elsa_swin_t_dense = dict(
    type='ELSASwinTransformer',
    arch='tiny',  # group width 4
    out_indices=(0, 1, 2, 3),
    pad_small_map=True,
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/elsa_swin_tiny.pth'
    ),
)
elsa_swin_s_dense = dict(
    type='ELSASwinTransformer',
    arch='small',  # group width 8
    out_indices=(0, 1, 2, 3),
    pad_small_map=True,
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/elsa_swin_small.pth'
    ),
)
