"""ResNet scaffolding shared by the backbones whose middle layer is dynamic.

RedNet and ACmix-ResNet are mmdet's ResNet (v1.5, "pytorch" style) with the
3x3 convolution of every bottleneck replaced by another layer. Subclassing
mmdet's ``ResNet`` keeps everything else identical to it: stem freezing,
``frozen_stages``, ``norm_eval``, ``with_cp``, ``out_indices``, the key names
of the published checkpoints (``layer{i}.{j}.conv1/bn1/conv2/bn2/conv3/bn3``,
``downsample.0/1``) and the default initialisation.
"""
from mmdet.models.backbones.resnet import Bottleneck, ResNet
from mmdet.models.layers import ResLayer
from mmengine.model import Sequential

from mmevo.ops import cpu_fastpath

# Blocks per stage of the bottleneck ResNets (and of RedNet / ACmix-ResNet).
STAGE_BLOCKS = {
    26: (1, 2, 4, 1),
    38: (2, 3, 5, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


class MiddleLayerBottleneck(Bottleneck):
    """mmdet's Bottleneck whose 3x3 ``conv2`` is built by ``middle_layer``.

    The 3x3 convolution mmdet builds is swapped in place, so the key order,
    the forward (norm2, ReLU, plugins, checkpointing) and the freezing stay
    mmdet's; only the CPU fast path (:mod:`mmevo.ops.cpu_fastpath`) runs
    the same block differently.

    Args:
        inplanes (int): Input channels.
        planes (int): Middle channels (output channels / 4).
        middle_layer (callable): ``middle_layer(planes, stride, dilation)``
            returns the module used as ``conv2``; it keeps the channel count.
        **kwargs: The other arguments of mmdet's ``Bottleneck``.
    """

    def __init__(self, inplanes, planes, middle_layer, **kwargs):
        if kwargs.get('dcn') is not None:
            raise ValueError(f'dcn must be None for a dynamic middle layer, '
                             f'got {kwargs["dcn"]}')
        super().__init__(inplanes, planes, **kwargs)
        self.conv2 = middle_layer(planes, self.conv2_stride, self.dilation)

    def forward(self, x):
        """mmdet's forward; on CPU, without plugins or checkpointing, the
        same block with its 1x1 convs sped up
        (:func:`mmevo.ops.cpu_fastpath.bottleneck_forward`)."""
        if (cpu_fastpath.enabled(x) and not self.with_plugins
                and not (self.with_cp and x.requires_grad)):
            return cpu_fastpath.bottleneck_forward(self, x)
        return super().forward(x)


class DynamicResNet(ResNet):
    """mmdet ResNet whose bottleneck middle layers come from a factory.

    Subclasses implement ``build_middle_layer(planes, stride, dilation)``
    (it runs inside ``__init__``: set what it reads before calling
    ``super().__init__``). On top of mmdet's ResNet this adds mmseg's
    ``contract_dilation`` (the first block of a dilated stage uses half the
    dilation, as mmseg's ResNetV1c configs for output stride 8 do), keeps
    ``zero_init_residual`` working for the subclassed block, and makes
    ``train()`` return ``self``.

    Args:
        depth (int): 26, 38, 50, 101 or 152.
        contract_dilation (bool): Halve the dilation of the first block of
            every stage whose dilation is > 1. Default: False.
        zero_init_residual (bool): Zero-init the last norm of every block
            when no ``init_cfg`` is given. Default: True.
        init_cfg (dict | list[dict] | None): Initialisation config; None
            gives mmdet's ResNet default (Kaiming convs, unit norms).
        **kwargs: mmdet ``ResNet`` arguments.
    """

    arch_settings = {
        depth: (MiddleLayerBottleneck, blocks)
        for depth, blocks in STAGE_BLOCKS.items()
    }

    def __init__(self,
                 depth,
                 contract_dilation=False,
                 zero_init_residual=True,
                 init_cfg=None,
                 **kwargs):
        if depth not in self.arch_settings:
            raise ValueError(f'depth must be one of '
                             f'{sorted(self.arch_settings)}, got {depth}')
        # make_res_layer runs inside ResNet.__init__: set its inputs first.
        self.contract_dilation = contract_dilation
        # mmdet only zero-inits blocks that *are* its Bottleneck class, and
        # only with the default init (a Pretrained init_cfg overwrites all).
        self._block_init_cfg = None
        if zero_init_residual and init_cfg is None:
            self._block_init_cfg = dict(
                type='Constant', val=0, override=dict(name='norm3'))
        super().__init__(
            depth,
            zero_init_residual=zero_init_residual,
            init_cfg=init_cfg,
            **kwargs)

    def forward(self, x):
        """mmdet's ResNet forward; on CPU with the stem in channels_last
        (:func:`mmevo.ops.cpu_fastpath.resnet_forward`).

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            tuple[Tensor]: the outputs of the stages in ``out_indices``.
        """
        if cpu_fastpath.enabled(x):
            return cpu_fastpath.resnet_forward(self, x)
        return super().forward(x)

    def train(self, mode=True):
        """mmdet's ``train`` (freezing, norm_eval), returning ``self``."""
        super().train(mode)  # mmdet's returns None, breaking .eval() chains
        return self

    def build_middle_layer(self, planes, stride, dilation):
        """Return the layer replacing a bottleneck's 3x3 conv (subclasses)."""
        raise NotImplementedError

    def make_res_layer(self, **kwargs):
        """mmdet's ``ResLayer`` of middle-layer bottlenecks.

        mmdet's ``ResLayer`` gives every block the stage's dilation; for
        ``contract_dilation`` (an mmseg ``ResLayer`` option) the first block
        is built as a stage of its own with half of it. Construction order,
        and so the keys and the random stream, are ResLayer's either way.

        Returns:
            Sequential: the stage (``layer{i}``).
        """
        kwargs.update(middle_layer=self.build_middle_layer,
                      init_cfg=self._block_init_cfg)
        dilation, num_blocks = kwargs['dilation'], kwargs['num_blocks']
        if not (self.contract_dilation and dilation > 1):
            return ResLayer(**kwargs)
        blocks = list(ResLayer(**{**kwargs, 'num_blocks': 1,
                                  'dilation': dilation // 2}))
        if num_blocks > 1:
            width = kwargs['planes'] * kwargs['block'].expansion
            blocks += ResLayer(**{**kwargs, 'num_blocks': num_blocks - 1,
                                  'inplanes': width, 'stride': 1})
        return Sequential(*blocks)
