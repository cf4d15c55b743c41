"""FPN whose 3x3 output convolutions are involutions."""

from mmdet.models.necks import FPN

from mmevo.layers import Involution
from mmevo.registry import MODELS


@MODELS.register_module()
class InvolutionFPN(FPN):
    """mmdet's FPN with ``Involution(out_channels, 7)`` as the output convs.

    The "inv neck" of the published RedNet detectors and segmentors: the
    3x3 conv on every backbone level (``fpn_convs[i]``) becomes an
    involution; lateral 1x1 convs and extra levels (``add_extra_convs``)
    stay mmdet's ConvModules. Registered in the root registry, so mmdet and
    mmseg configs both build it with ``type='InvolutionFPN'``.

    Args:
        in_channels (list[int]): Channels of each backbone level.
        out_channels (int): Output channels (a multiple of the involution's
            ``group_channels``, 16 by default).
        num_outs (int): Number of output levels.
        involution_cfg (dict | None): Extra ``Involution`` arguments, e.g.
            ``dict(kernel_size=7, reduction_ratio=4)``. Default: kernel 7.
        **kwargs: mmdet ``FPN`` arguments (start_level, add_extra_convs,
            norm_cfg, init_cfg, ...).

    Example:
        >>> import torch
        >>> neck = InvolutionFPN([16, 32], 16, num_outs=3)
        >>> outs = neck([torch.rand(1, 16, 8, 8), torch.rand(1, 32, 4, 4)])
        >>> [tuple(o.shape) for o in outs]
        [(1, 16, 8, 8), (1, 16, 4, 4), (1, 16, 2, 2)]
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        num_outs,
        involution_cfg=None,
        **kwargs,
    ):
        super().__init__(in_channels, out_channels, num_outs, **kwargs)
        involution_cfg = {'kernel_size': 7, **(involution_cfg or {})}
        # fpn_convs holds the backbone levels first, then the extra levels.
        for i in range(self.backbone_end_level - self.start_level):
            self.fpn_convs[i] = Involution(out_channels, **involution_cfg)
