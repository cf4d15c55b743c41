"""Involution (Li et al., CVPR 2021): a kernel generated per pixel from it."""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule

from mmevo.ops import check_int
from mmevo.registry import MODELS

from .base import EvolutionLayer, InitCfg, check_divisible, check_layer_cfg
from .fastpath import cpu_fastpath_default, pointwise, takes_cpu_fastpath


@MODELS.register_module()
class Involution(EvolutionLayer):
    """Involution: per-pixel K x K kernels shared by groups of channels.

    Generation function: (average-pool by the stride) -> 1x1 conv C -> C/r,
    BN, ReLU (``conv1``) -> 1x1 conv C/r -> K*K*G with bias (``conv2``),
    reshaped to (G, K, K) group-major then row-major. Aggregation: zero
    "same" padding, G = C / group_channels. Parameter names match the
    published code, so its checkpoints load unchanged.

    Unlike the published code, pooling uses ``ceil_mode`` so that odd sizes
    with stride > 1 work: the kernel map and the output are both
    ceil(H / s) x ceil(W / s). On sizes divisible by the stride the numbers
    are the published ones.

    On CPU in eager mode the 1x1 convolutions of the generation function run
    as matmuls (:meth:`_kernel_weights_cpu`, the same modules and numbers)
    while ``use_cpu_fastpath`` is True (see :mod:`mmevo.layers.fastpath`).

    Args:
        channels (int): input = output channels C.
        kernel_size (int): K, odd. Default: 7.
        stride (int): window step. Default: 1.
        reduction_ratio (int): r of the bottleneck C -> C/r. Default: 4.
        group_channels (int): channels per kernel group; C must be divisible
            by it. Default: 16.
        dilation (int): spacing of the window taps. Default: 1.
        norm_cfg (dict | None): norm of ``conv1``. Default: BN.
        act_cfg (dict | None): activation of ``conv1``. Default: ReLU.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='Involution', channels=64,
        ...                           kernel_size=7, stride=2))
        >>> layer(torch.randn(2, 64, 15, 16)).shape
        torch.Size([2, 64, 8, 8])
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        stride: int = 1,
        reduction_ratio: int = 4,
        group_channels: int = 16,
        dilation: int = 1,
        norm_cfg: Optional[dict] = dict(type='BN'),
        act_cfg: Optional[dict] = dict(type='ReLU'),
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(
            kernel_size, stride, None, dilation, 'zeros', init_cfg
        )
        check_layer_cfg('norm_cfg', norm_cfg, 'BN')
        check_layer_cfg('act_cfg', act_cfg, 'ReLU')
        check_int('channels', channels)
        check_int('reduction_ratio', reduction_ratio)
        check_int('group_channels', group_channels)
        check_divisible('channels', channels, 'group_channels', group_channels)
        if channels // reduction_ratio < 1:
            raise ValueError(
                f'channels // reduction_ratio must be >= 1, got '
                f'{channels} // {reduction_ratio}'
            )
        if stride > 1:
            # ceil_mode: the last, partial window averages its valid pixels,
            # so the kernel map has exactly the output's ceil(H/s) rows.
            self.avgpool = nn.AvgPool2d(stride, stride, ceil_mode=True)
        self.channels = channels
        self.reduction_ratio = reduction_ratio
        self.group_channels = group_channels
        self.groups = channels // group_channels
        self.conv1 = ConvModule(
            channels,
            channels // reduction_ratio,
            1,
            norm_cfg=norm_cfg,
            act_cfg=act_cfg,
        )
        self.conv2 = ConvModule(
            channels // reduction_ratio,
            kernel_size**2 * self.groups,
            1,
            norm_cfg=None,
            act_cfg=None,
        )
        self.use_cpu_fastpath = cpu_fastpath_default()

    def _kernel_weights_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """``conv2(conv1(x))`` with both 1x1 convolutions as matmuls."""
        conv1, conv2 = self.conv1, self.conv2
        out = pointwise(x, conv1.conv.weight, conv1.conv.bias)
        if conv1.with_norm:
            out = conv1.norm(out)
        if conv1.with_activation:
            out = conv1.activate(out)
        return pointwise(out, conv2.conv.weight, conv2.conv.bias)

    def generate(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, kernel)``, kernel (B, G, K, K, H_out, W_out)."""
        self.check_input(x, self.channels)
        x_gen = self.avgpool(x) if self.stride > 1 else x
        if takes_cpu_fastpath(self, x_gen):
            weight = self._kernel_weights_cpu(x_gen)
        else:
            weight = self.conv2(self.conv1(x_gen))
        B, _, H, W = weight.shape
        K = self.kernel_size
        return x, weight.view(B, self.groups, K, K, H, W)
