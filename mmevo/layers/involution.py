"""Involution (Li et al., CVPR 2021): a kernel generated per pixel from it."""
import torch.nn.functional as F
from mmcv.cnn import ConvModule

from mmevo.ops import check_int, cpu_fastpath
from mmevo.registry import MODELS
from .base import EvolutionLayer, check_divisible


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

    def __init__(self,
                 channels,
                 kernel_size=7,
                 stride=1,
                 reduction_ratio=4,
                 group_channels=16,
                 dilation=1,
                 norm_cfg=dict(type='BN'),
                 act_cfg=dict(type='ReLU'),
                 init_cfg=None):
        super().__init__(kernel_size, stride, None, dilation, 'zeros',
                         init_cfg)
        check_int('channels', channels)
        check_int('reduction_ratio', reduction_ratio)
        check_int('group_channels', group_channels)
        check_divisible('channels', channels, 'group_channels', group_channels)
        if channels // reduction_ratio < 1:
            raise ValueError(f'channels // reduction_ratio must be >= 1, got '
                             f'{channels} // {reduction_ratio}')
        self.channels = channels
        self.reduction_ratio = reduction_ratio
        self.group_channels = group_channels
        self.groups = channels // group_channels
        self.conv1 = ConvModule(
            channels,
            channels // reduction_ratio,
            1,
            norm_cfg=norm_cfg,
            act_cfg=act_cfg)
        self.conv2 = ConvModule(
            channels // reduction_ratio,
            kernel_size**2 * self.groups,
            1,
            norm_cfg=None,
            act_cfg=None)

    def generate(self, x):
        """Return ``(x, kernel)``, kernel (B, G, K, K, H_out, W_out)."""
        self.check_input(x, self.channels)
        if self.stride > 1:
            # ceil_mode: the last, partial window averages its valid pixels,
            # so the kernel map has exactly the output's ceil(H/s) rows.
            x_gen = F.avg_pool2d(x, self.stride, self.stride, ceil_mode=True)
        else:
            x_gen = x
        if cpu_fastpath.enabled(x_gen):
            # The same modules, their 1x1 convolutions as matmuls.
            weight = cpu_fastpath.conv1x1(
                self.conv2, cpu_fastpath.conv1x1(self.conv1, x_gen))
        else:
            weight = self.conv2(self.conv1(x_gen))
        B, _, H, W = weight.shape
        K = self.kernel_size
        return x, weight.view(B, self.groups, K, K, H, W)
