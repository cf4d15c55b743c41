# ACmix-Swin backbone (LeapLabTHU/ACmix) for detection and segmentation:
# the window of the last stage padded (pad_small_map=True), initialised
# from the released ImageNet checkpoint as it is (``model`` dict, official
# keys). Taken by an experiment as in elsa-swin.py.
acmix_swin_t_dense = dict(
    type='ACmixSwinTransformer',
    arch='tiny',
    out_indices=(0, 1, 2, 3),
    pad_small_map=True,
    init_cfg=dict(
        type='Pretrained', checkpoint='checkpoints/acmix_swin_tiny.pth'
    ),
)
