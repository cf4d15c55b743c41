"""RedNet: the ResNet whose every 3x3 convolution is an involution."""

from mmcv.cnn import ConvModule, build_norm_layer
from torch import nn

from mmevo.layers import Involution
from mmevo.ops import check_int
from mmevo.registry import MODELS

from .dynamic_resnet import DynamicResNet


@MODELS.register_module()
class RedNet(DynamicResNet):
    """RedNet backbone (Li et al., "Involution", CVPR 2021).

    mmdet's ResNet-50-style bottleneck network with ``Involution(mid, 7,
    stride, dilation)`` as every middle layer and the RedNet stem: 3x3 conv
    stride 2 (-> stem_channels / 2) + BN + ReLU, involution (kernel
    ``stem_kernel_size``), BN, ReLU, 3x3 conv (-> stem_channels) + BN + ReLU,
    3x3 max-pool stride 2. Key names are those of the published mmcls
    checkpoints (``stem.0.conv``, ``stem.1.conv1.conv``,
    ``layer1.0.conv2.conv1.conv``), so
    ``init_cfg=dict(type='Pretrained', checkpoint=PATH, prefix='backbone.')``
    loads them unchanged. An ImageNet checkpoint (stem kernel 3) loads into
    the stem-7 model as the published detectors did: all but the stem
    involution's ``stem.1.conv2`` tensors, with mmengine's size-mismatch
    warning. ``frozen_stages >= 0`` freezes the whole stem, as
    mmdet's ResNet does for its deep stem.

    Args:
        depth (int): 26, 38, 50, 101 or 152.
        in_channels (int): Input image channels. Default: 3.
        stem_channels (int): Stem output channels, a multiple of 32: the
            stem involution runs on half of them. Default: 64.
        base_channels (int): Middle channels of the first stage (a multiple
            of 16); stage i has ``base_channels * 2**i``. Default: 64.
        stem_kernel_size (int): Kernel of the stem involution: 7 in the
            published detection/segmentation code, 3 in the ImageNet
            checkpoints. Default: 7.
        num_stages (int): 1 to 4. Default: 4.
        strides (Sequence[int]): Stride of the first block of each stage.
            Default: (1, 2, 2, 2).
        dilations (Sequence[int]): Dilation of the involutions of each
            stage; (1, 1, 2, 4) with strides (1, 2, 1, 1) gives output stride
            8. Default: (1, 1, 1, 1).
        contract_dilation (bool): First block of a dilated stage uses half
            the dilation (mmseg's ResNetV1c option). Default: False.
        out_indices (Sequence[int]): Stages whose outputs are returned.
            Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the stem (0) and stages 1..n (n); -1
            freezes nothing. Default: -1.
        norm_cfg (dict): Norm layers, also inside the involutions.
            Default: ``dict(type='BN', requires_grad=True)``.
        norm_eval (bool): Keep norm layers in eval mode while training.
            Default: False.
        with_cp (bool): Gradient checkpointing of every block. Default: False.
        zero_init_residual (bool): Zero-init the last BN of every block
            (default init only). Default: True.
        init_cfg (dict | list[dict] | None): Initialisation config.

    Example:
        >>> import torch
        >>> from mmevo.models import RedNet
        >>> model = RedNet(depth=26, stem_channels=32, base_channels=16)
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 64))]
        [(1, 64, 16, 16), (1, 128, 8, 8), (1, 256, 4, 4), (1, 512, 2, 2)]
    """

    def __init__(
        self,
        depth,
        in_channels=3,
        stem_channels=64,
        base_channels=64,
        stem_kernel_size=7,
        num_stages=4,
        strides=(1, 2, 2, 2),
        dilations=(1, 1, 1, 1),
        contract_dilation=False,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        with_cp=False,
        zero_init_residual=True,
        init_cfg=None,
    ):
        for name, value, multiple, runs_on in (
            ('stem_channels', stem_channels, 32, 'stem_channels // 2'),
            ('base_channels', base_channels, 16, 'base_channels * 2**i'),
        ):
            check_int(name, value)
            if value % multiple:
                raise ValueError(
                    f'{name} must be a multiple of {multiple} (an involution '
                    f'runs on {runs_on} channels, in groups of 16), got '
                    f'{value}'
                )
        self.stem_kernel_size = stem_kernel_size
        super().__init__(
            depth,
            in_channels=in_channels,
            stem_channels=stem_channels,
            base_channels=base_channels,
            num_stages=num_stages,
            strides=strides,
            dilations=dilations,
            contract_dilation=contract_dilation,
            out_indices=out_indices,
            style='pytorch',
            deep_stem=True,  # mmdet: forward and freeze ``self.stem``
            avg_down=False,
            frozen_stages=frozen_stages,
            norm_cfg=norm_cfg,
            norm_eval=norm_eval,
            with_cp=with_cp,
            zero_init_residual=zero_init_residual,
            init_cfg=init_cfg,
        )

    def build_middle_layer(self, planes, stride, dilation):
        """The involution of a bottleneck (K = 7, r = 4, 16 channels/group)."""
        return Involution(
            planes, 7, stride, dilation=dilation, norm_cfg=self.norm_cfg
        )

    def _make_stem_layer(self, in_channels, stem_channels):
        half = stem_channels // 2
        self.stem = nn.Sequential(
            ConvModule(
                in_channels,
                half,
                3,
                stride=2,
                padding=1,
                norm_cfg=self.norm_cfg,
                inplace=True,
            ),
            Involution(half, self.stem_kernel_size, 1, norm_cfg=self.norm_cfg),
            build_norm_layer(self.norm_cfg, half)[1],
            nn.ReLU(inplace=True),
            ConvModule(
                half,
                stem_channels,
                3,
                stride=1,
                padding=1,
                norm_cfg=self.norm_cfg,
                inplace=True,
            ),
        )
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
