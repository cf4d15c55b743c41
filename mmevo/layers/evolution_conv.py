"""Static convolution as the constant-kernel case of the evolution formula."""

import math

import torch
import torch.nn as nn

from mmevo.ops import check_int
from mmevo.registry import MODELS

from .base import (
    EvolutionLayer,
    InitCfg,
    check_divisible,
    check_weight_size,
)


@MODELS.register_module()
class EvolutionConv(EvolutionLayer):
    """Depth-wise / grouped-kernel convolution through the evolution op.

    Generation function: none -- a learnable (G, K, K) weight, broadcast to
    every sample and pixel (an expanded view, no copy). Channel c uses kernel
    c // (C / G): G = C is a depth-wise convolution, G < C shares a kernel
    within each block of C / G channels. Equals ``F.conv2d`` with the weight
    repeated over each block and ``groups=C``.

    Args:
        channels (int): input = output channels C.
        kernel_size (int): K. Default: 3.
        groups (int, optional): kernels G, dividing C. Default: C.
        stride (int): window step. Default: 1.
        padding (int | None): None = "same" (odd K). Default: None.
        dilation (int): spacing of the window taps. Default: 1.
        padding_mode (str): 'zeros' or 'reflect'. Default: 'zeros'.
        bias (bool): add a learnable per-channel bias. Default: True.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='EvolutionConv', channels=8,
        ...                           kernel_size=3, stride=2))
        >>> layer(torch.randn(2, 8, 7, 6)).shape
        torch.Size([2, 8, 4, 3])
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        groups: int | None = None,
        stride: int = 1,
        padding: int | None = None,
        dilation: int = 1,
        padding_mode: str = 'zeros',
        bias: bool = True,
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(
            kernel_size, stride, padding, dilation, padding_mode, init_cfg
        )
        groups = channels if groups is None else groups
        check_int('channels', channels)
        check_int('groups', groups)
        check_divisible('channels', channels, 'groups', groups)
        shape = (groups, kernel_size, kernel_size)
        check_weight_size('kernel_size', kernel_size, shape)
        self.channels = channels
        self.groups = groups
        self.weight = nn.Parameter(
            torch.empty(groups, kernel_size, kernel_size)
        )
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The default init of a depth-wise ``nn.Conv2d`` (fan-in K*K)."""
        bound = 1 / math.sqrt(self.kernel_size**2)
        # kaiming_uniform_(a=sqrt(5)) on fan-in K*K has this same bound.
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, kernel)``: the weight as (B, G, K, K, Ho, Wo)."""
        self.check_input(x, self.channels)
        B, _, H, W = x.shape
        K = self.kernel_size
        kernel = self.weight.view(1, self.groups, K, K, 1, 1).expand(
            B, -1, -1, -1, self.output_size(H), self.output_size(W)
        )
        return x, kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Aggregate with the static kernel, add the bias.

        Args:
            x (Tensor): (B, C, H, W).

        Returns:
            Tensor: (B, C, H_out, W_out), the convolution output size.
        """
        out = self.aggregate(*self.generate(x))
        if self.bias is not None:
            out = out + self.bias.view(1, -1, 1, 1)
        return out
