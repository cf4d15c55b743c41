"""Decoupled dynamic filter (DDF, Zhou et al., CVPR 2021)."""

import torch
import torch.nn as nn
from torch.nn.init import calculate_gain

from mmevo.ops import check_int
from mmevo.registry import MODELS

from .base import EvolutionLayer, InitCfg, check_weight_size


class FilterNorm(nn.Module):
    """DDF's filter normalisation: zero mean, unit std over the K*K taps,
    times a gain (a fixed ``gain / K`` or a learnable per-tap ``std``).

    Args:
        channels (int): filter channels (1 for the spatial filter).
        kernel_size (int): K.
        nonlinearity (str): gain of :func:`torch.nn.init.calculate_gain`.
        running_std (bool): learn the per-tap std. Default: False.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        nonlinearity: str,
        running_std: bool = False,
    ) -> None:
        super().__init__()
        self.channels = channels
        std = calculate_gain(nonlinearity) / kernel_size
        if running_std:
            self.std = nn.Parameter(
                torch.randn(channels * kernel_size**2) * std
            )
        else:
            self.std = std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise x (B, channels*K*K, H, W) over the K*K taps."""
        B, C, H, W = x.shape
        taps = x.reshape(B, self.channels, C // self.channels, H * W)
        taps = taps - taps.mean(dim=2, keepdim=True)
        taps = taps / (taps.std(dim=2, keepdim=True) + 1e-10)
        x = taps.reshape(x.shape)
        if torch.is_tensor(self.std):
            return x * self.std.view(1, -1, 1, 1)
        return x * self.std


@MODELS.register_module()
class DynamicFilter(EvolutionLayer):
    """DDF: a per-pixel spatial filter times a per-sample channel filter.

    Generation function: spatial filter (B, K*K, H_out, W_out) from a 1x1
    conv (with the stride; optionally after a depth-wise
    ``gen_kernel_size`` conv), normalised over the taps; channel filter
    (B, C, K, K) from global pooling, 1x1 conv C -> C*se_ratio, ReLU, 1x1
    conv -> C*K*K, normalised with a learnable gain. Kernel
    ``W[c, u, v, i, j] = spatial[u, v, i, j] * channel[c, u, v]`` ('mul') or
    ``+`` ('add'); G = C, zero "same" padding. Submodule names are those of
    the published ``DDFPack``.

    Args:
        channels (int): input = output channels C.
        kernel_size (int): K, odd and >= 3 (the taps are normalised).
            Default: 3.
        stride (int): window step. Default: 1.
        dilation (int): spacing of the window taps. Default: 1.
        se_ratio (float): channel branch bottleneck ratio. Default: 0.2.
        nonlinearity (str): gain used by the filter normalisation.
            Default: 'relu'.
        gen_kernel_size (int): odd kernel of the depth-wise conv before the
            spatial 1x1 conv; 1 = none. Default: 1.
        kernel_combine (str): 'mul' or 'add'. Default: 'mul'.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='DynamicFilter', channels=16,
        ...                           stride=2))
        >>> layer(torch.randn(2, 16, 7, 8)).shape
        torch.Size([2, 16, 4, 4])
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        dilation: int = 1,
        se_ratio: float = 0.2,
        nonlinearity: str = 'relu',
        gen_kernel_size: int = 1,
        kernel_combine: str = 'mul',
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(
            kernel_size, stride, None, dilation, 'zeros', init_cfg
        )
        check_int('channels', channels)
        check_int('gen_kernel_size', gen_kernel_size)
        if kernel_size < 3:
            raise ValueError(
                f'kernel_size must be >= 3 (DynamicFilter '
                f'normalises over the K*K taps), got '
                f'{kernel_size}'
            )
        if gen_kernel_size % 2 == 0:
            raise ValueError(
                f'gen_kernel_size must be odd, got {gen_kernel_size}'
            )
        if kernel_combine not in ('mul', 'add'):
            raise ValueError(
                f"kernel_combine must be 'mul' or 'add', got "
                f'{kernel_combine!r}'
            )
        mid = int(channels * se_ratio)
        if mid < 1:
            raise ValueError(
                f'int(channels * se_ratio) must be >= 1, got '
                f'int({channels} * {se_ratio}) = {mid}'
            )
        self.channels = channels
        self.kernel_combine = kernel_combine
        K2 = kernel_size**2
        check_weight_size('kernel_size', kernel_size, (K2, channels))
        spatial = [nn.Conv2d(channels, K2, 1, stride=stride)]
        if gen_kernel_size > 1:
            spatial = [
                nn.Conv2d(
                    channels,
                    channels,
                    gen_kernel_size,
                    stride=stride,
                    padding=gen_kernel_size // 2,
                    groups=channels,
                ),
                nn.Conv2d(channels, K2, 1),
            ]
        self.spatial_branch = nn.Sequential(
            *spatial, FilterNorm(1, kernel_size, nonlinearity)
        )
        self.channel_branch = nn.Sequential(
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Conv2d(channels, mid, 1),
            nn.ReLU(True),
            nn.Conv2d(mid, channels * K2, 1),
            FilterNorm(channels, kernel_size, nonlinearity, running_std=True),
        )

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, kernel)``, kernel (B, C, K, K, H_out, W_out)."""
        self.check_input(x, self.channels)
        B, C = x.shape[:2]
        K = self.kernel_size
        channel = self.channel_branch(x).view(B, C, K, K, 1, 1)
        spatial = self.spatial_branch(x)
        spatial = spatial.view(B, 1, K, K, *spatial.shape[-2:])
        if self.kernel_combine == 'mul':
            return x, channel * spatial
        return x, channel + spatial
