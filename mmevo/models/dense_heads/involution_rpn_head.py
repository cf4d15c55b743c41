"""RPN head whose shared convolution is an involution."""

from mmdet.models.dense_heads import RPNHead
from torch import nn

from mmevo.layers import Involution
from mmevo.registry import MODELS


@MODELS.register_module()
class InvolutionRPNHead(RPNHead):
    """mmdet's RPNHead with ``Involution(in_channels, 7)`` as ``rpn_conv``.

    The "inv head" of the published RedNet detectors. An involution keeps
    its channel count, so ``feat_channels`` must equal ``in_channels``.
    The default init draws ``rpn_cls`` / ``rpn_reg`` from N(0, 0.01) as
    mmdet does and leaves the involution's own initialisation alone (the
    published code's ``normal_init`` did not touch it either).

    Args:
        in_channels (int): Input (= feature) channels.
        feat_channels (int): Must equal ``in_channels``. Default: 256.
        involution_cfg (dict | None): Extra ``Involution`` arguments.
            Default: kernel 7.
        init_cfg (dict | list[dict]): Initialisation config.
        **kwargs: mmdet ``RPNHead`` / ``AnchorHead`` arguments (num_convs,
            anchor_generator, bbox_coder, losses, train_cfg, test_cfg).

    Raises:
        ValueError: if ``feat_channels != in_channels``.

    Example:
        >>> import torch
        >>> head = InvolutionRPNHead(16, feat_channels=16)
        >>> cls, reg = head.forward_single(torch.rand(1, 16, 8, 8))
        >>> tuple(cls.shape), tuple(reg.shape)
        ((1, 9, 8, 8), (1, 36, 8, 8))
    """

    def __init__(
        self,
        in_channels,
        feat_channels=256,
        involution_cfg=None,
        init_cfg=dict(
            type='Normal',
            std=0.01,
            override=[dict(name='rpn_cls'), dict(name='rpn_reg')],
        ),
        **kwargs,
    ):
        if feat_channels != in_channels:
            raise ValueError(
                f'feat_channels must equal in_channels ({in_channels}): the '
                f'involution rpn_conv keeps the channel count, got '
                f'feat_channels={feat_channels}'
            )
        self.involution_cfg = {'kernel_size': 7, **(involution_cfg or {})}
        super().__init__(
            in_channels,
            feat_channels=feat_channels,
            init_cfg=init_cfg,
            **kwargs,
        )

    def _init_layers(self):
        """Build mmdet's layers, then swap ``rpn_conv`` for involutions."""
        super()._init_layers()
        layers = []
        for _ in range(self.num_convs):
            layers += [
                Involution(self.in_channels, **self.involution_cfg),
                nn.ReLU(inplace=True),
            ]
        # forward_single applies the last ReLU itself.
        layers = layers[:-1]
        self.rpn_conv = (
            layers[0] if len(layers) == 1 else nn.Sequential(*layers)
        )
