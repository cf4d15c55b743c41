"""FCN mask head whose convolutions are involutions."""

from mmdet.models.roi_heads.mask_heads import FCNMaskHead
from torch import nn

from mmevo.layers import Involution
from mmevo.registry import MODELS


@MODELS.register_module()
class InvolutionFCNMaskHead(FCNMaskHead):
    """mmdet's FCNMaskHead with ``Involution(C, 7)`` + ReLU as its convs.

    The mask head of the published "inv neck+head" Mask R-CNN:
    ``convs[i]`` is ``Sequential(Involution(C, 7), ReLU)`` (keys
    ``convs.{i}.0.conv1.conv.weight``, as published). Upsampling, logits
    and loss are mmdet's. An involution keeps its channel count, so
    ``conv_out_channels`` must equal ``in_channels`` when ``num_convs > 0``.

    Args:
        in_channels (int): RoI feature channels. Default: 256.
        conv_out_channels (int): Must equal ``in_channels``. Default: 256.
        involution_cfg (dict | None): Extra ``Involution`` arguments.
            Default: kernel 7.
        **kwargs: mmdet ``FCNMaskHead`` arguments (num_convs, num_classes,
            upsample_cfg, loss_mask, ...).

    Raises:
        ValueError: if ``conv_out_channels != in_channels``.

    Example:
        >>> import torch
        >>> head = InvolutionFCNMaskHead(
        ...     num_convs=2, in_channels=16, conv_out_channels=16,
        ...     num_classes=3)
        >>> tuple(head(torch.rand(4, 16, 14, 14)).shape)
        (4, 3, 28, 28)
    """

    def __init__(
        self,
        in_channels=256,
        conv_out_channels=256,
        involution_cfg=None,
        **kwargs,
    ):
        if kwargs.get('num_convs', 4) > 0 and conv_out_channels != in_channels:
            raise ValueError(
                f'conv_out_channels must equal in_channels ({in_channels}): '
                f'an involution keeps the channel count, got '
                f'conv_out_channels={conv_out_channels}'
            )
        super().__init__(
            in_channels=in_channels,
            conv_out_channels=conv_out_channels,
            **kwargs,
        )
        involution_cfg = {'kernel_size': 7, **(involution_cfg or {})}
        for i in range(self.num_convs):
            self.convs[i] = nn.Sequential(
                Involution(in_channels, **involution_cfg),
                nn.ReLU(inplace=True),
            )
