"""ACmix-ResNet: torchvision ResNet v1.5 with ACmix middle layers."""

from typing import ClassVar

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmevo.layers import ACmix
from mmevo.registry import MODELS

from .dynamic_resnet import DynamicResNet


@MODELS.register_module()
class ACmixResNet(DynamicResNet):
    """ACmix-ResNet backbone (Pan et al., "On the Integration of
    Self-Attention and Convolution", CVPR 2022).

    torchvision's ResNet v1.5 (7x7 stem conv stride 2, BN, ReLU, max-pool;
    the stride on the middle layer) with ``ACmix(width, width, kernel_att,
    head, kernel_conv, stride, dilation)`` as every bottleneck's middle layer.
    Key names are torchvision's (``conv1``, ``bn1``, ``layer1.0.conv2.fc``),
    so a published ACmix-ResNet classifier loads with
    ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``; its ``fc.*``
    classifier head is dropped on load (see ``_load_from_state_dict``), so no
    key is reported missing or unexpected.

    Without ``init_cfg`` it is initialised as the published ACmix-ResNet:
    every ``nn.Conv2d`` weight Kaiming-normal (fan_out, ReLU gain) --
    ACmix's ``dep_conv`` included, so its shift kernels are overwritten --,
    conv biases left at PyTorch's default, norms weight 1 and bias 0,
    ``rate1 = rate2 = 0.5``, and no zero-init of the residual norms
    (torchvision's ``zero_init_residual=False``).

    Args:
        depth (int): 26, 38 or 50.
        in_channels (int): Input image channels. Default: 3.
        stem_channels (int): Stem output channels. Default: 64.
        base_channels (int): Middle channels of the first stage; stage i has
            ``base_channels * 2**i`` (divisible by ``head``). Default: 64.
        num_stages (int): 1 to 4. Default: 4.
        strides (Sequence[int]): Default: (1, 2, 2, 2).
        dilations (Sequence[int]): Dilation of the ACmix layers of each
            stage. Default: (1, 1, 1, 1).
        contract_dilation (bool): First block of a dilated stage uses half
            the dilation. Default: False.
        out_indices (Sequence[int]): Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the stem (0) and stages 1..n. Default: -1.
        norm_cfg (dict): Default: ``dict(type='BN', requires_grad=True)``.
        norm_eval (bool): Default: False.
        with_cp (bool): Default: False.
        zero_init_residual (bool): Zero-init the last norm of every block
            (default init only). Default: False, as published.
        kernel_att (int): Attention window. Default: 7.
        head (int): Attention heads. Default: 4.
        kernel_conv (int): Kernel of the convolution path. Default: 3.
        init_cfg (dict | list[dict] | None): Initialisation config.

    Example:
        >>> import torch
        >>> from mmevo.models import ACmixResNet
        >>> model = ACmixResNet(depth=26, stem_channels=16, base_channels=16)
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 64))]
        [(1, 64, 16, 16), (1, 128, 8, 8), (1, 256, 4, 4), (1, 512, 2, 2)]
    """

    arch_settings: ClassVar[dict] = {
        depth: setting
        for depth, setting in DynamicResNet.arch_settings.items()
        if depth in (26, 38, 50)
    }

    def __init__(
        self,
        depth,
        in_channels=3,
        stem_channels=64,
        base_channels=64,
        num_stages=4,
        strides=(1, 2, 2, 2),
        dilations=(1, 1, 1, 1),
        contract_dilation=False,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        with_cp=False,
        zero_init_residual=False,
        kernel_att=7,
        head=4,
        kernel_conv=3,
        init_cfg=None,
    ):
        self.kernel_att = kernel_att
        self.head = head
        self.kernel_conv = kernel_conv
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
            deep_stem=False,  # torchvision stem: conv1, bn1, relu, maxpool
            avg_down=False,
            frozen_stages=frozen_stages,
            norm_cfg=norm_cfg,
            norm_eval=norm_eval,
            with_cp=with_cp,
            zero_init_residual=zero_init_residual,
            # No mmengine initialiser (mmdet's default would zero the conv
            # biases): init_weights applies the published init instead.
            init_cfg=[] if init_cfg is None else init_cfg,
        )
        self._published_init = init_cfg is None

    def init_weights(self) -> None:
        """mmengine's initialisation (``init_cfg``, then every child's
        ``init_weights``); without ``init_cfg``, the published one after it
        (see the class docstring)."""
        first_call = not self.is_init
        super().init_weights()
        if self._published_init and first_call:
            self._init_published()

    def _init_published(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(
                    m.weight, mode='fan_out', nonlinearity='relu'
                )
            elif isinstance(m, (_BatchNorm, nn.GroupNorm)) and m.affine:
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, ACmix):
                nn.init.constant_(m.rate1, 0.5)
                nn.init.constant_(m.rate2, 0.5)
        if self.zero_init_residual:
            for name in self.res_layers:
                for block in getattr(self, name):
                    nn.init.constant_(block.norm3.weight, 0)

    def build_middle_layer(self, planes, stride, dilation):
        """The ACmix layer of a bottleneck (width -> width)."""
        return ACmix(
            planes,
            planes,
            self.kernel_att,
            self.head,
            self.kernel_conv,
            stride=stride,
            dilation=dilation,
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The published checkpoints are whole classifiers; a backbone has no
        # ``fc`` head, so drop it here rather than report unexpected keys.
        # (torch and mmengine both load from a copy of the caller's dict.)
        for key in [k for k in state_dict if k.startswith(prefix + 'fc.')]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
