"""Local (SASA-style) multi-head self-attention as an evolution layer."""

import torch
import torch.nn as nn

from mmevo.ops import (
    check_int,
    fused_local_attention,
    local_correlation,
    window_softmax,
)
from mmevo.registry import MODELS

from .base import (
    EvolutionLayer,
    InitCfg,
    check_divisible,
    check_weight_size,
)
from .fastpath import cpu_fastpath_default, takes_fused_cpu


@MODELS.register_module()
class LocalSelfAttention(EvolutionLayer):
    """Multi-head self-attention over a K x K window around every pixel.

    Generation function: ``logits(n) = q(i) . k(n) [+ q(i) . r(n - i)]
    [+ b_head(n - i)]``, softmax over the window, one kernel per head
    (G = num_heads); then aggregate v. ``r`` is the SASA relative embedding:
    the first half of the channels embed the row offset, the second half the
    column offset. ``b`` is an optional learnable bias per head and offset.
    The logits come from :func:`mmevo.ops.local_correlation`, never from an
    unfolded key tensor. With zero q/k projections and only ``b``, the layer
    is a static depth-wise convolution of v with ``softmax(b)`` per head.

    On CPU in eager mode, while ``use_cpu_fastpath`` is True (see
    :mod:`mmevo.layers.fastpath`), the correlation, softmax and
    aggregation run as one op, :func:`mmevo.ops.fused_local_attention` (C++),
    which never writes the (B, heads, K, K, H_out, W_out) attention map and
    saves a per-pixel log-sum-exp for the backward instead: the same
    numbers, faster and in less memory (``docs/benchmarks.md``). The q, k
    and v projections are still called as modules. It steps aside for a
    kernel hook (which must see the attention map), a module hook, and
    where the C++ kernel cannot take the call (autocast, an input dtype
    other than the layer's, another backend forced).

    Args:
        in_channels (int): input channels.
        out_channels (int, optional): q/k/v = output channels, divisible by
            ``num_heads``. Default: ``in_channels``.
        kernel_size (int): K, odd (the window is centred). Default: 7.
        num_heads (int): heads G. Default: 8.
        stride (int): window step; queries are taken at ``[::s, ::s]``.
            Default: 1.
        dilation (int): spacing of the window taps. Default: 1.
        padding_mode (str): 'zeros' or 'reflect' for k and v. Default: 'zeros'.
        qkv_bias (bool): bias of the 1x1 projections. Default: False.
        qk_scale (float, optional): query scale. Default: head_dim ** -0.5.
        rel_pos_embed (bool): add the ``q . r`` term. Default: True.
        rel_pos_bias (bool): add the per-head bias table ``b``. Default: False.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='LocalSelfAttention',
        ...                           in_channels=16, num_heads=4,
        ...                           kernel_size=5, stride=2))
        >>> layer(torch.randn(2, 16, 9, 8)).shape
        torch.Size([2, 16, 5, 4])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        kernel_size: int = 7,
        num_heads: int = 8,
        stride: int = 1,
        dilation: int = 1,
        padding_mode: str = 'zeros',
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        rel_pos_embed: bool = True,
        rel_pos_bias: bool = False,
        init_cfg: InitCfg = None,
    ) -> None:
        # Queries sit on pixels, so the window is centred: "same" padding.
        super().__init__(
            kernel_size, stride, None, dilation, padding_mode, init_cfg
        )
        out_channels = in_channels if out_channels is None else out_channels
        check_int('in_channels', in_channels)
        check_int('out_channels', out_channels)
        check_int('num_heads', num_heads)
        check_divisible('out_channels', out_channels, 'num_heads', num_heads)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_heads = num_heads
        head_dim = out_channels // num_heads
        self.scale = head_dim**-0.5 if qk_scale is None else qk_scale
        self.query = nn.Conv2d(in_channels, out_channels, 1, bias=qkv_bias)
        self.key = nn.Conv2d(in_channels, out_channels, 1, bias=qkv_bias)
        self.value = nn.Conv2d(in_channels, out_channels, 1, bias=qkv_bias)
        if rel_pos_embed:
            shape = (out_channels, kernel_size)
            check_weight_size('kernel_size', kernel_size, shape)
            half = out_channels // 2
            self.rel_h = nn.Parameter(torch.randn(half, kernel_size))
            self.rel_w = nn.Parameter(
                torch.randn(out_channels - half, kernel_size)
            )
        else:
            self.rel_h = self.rel_w = None
        if rel_pos_bias:
            shape = (num_heads, kernel_size, kernel_size)
            check_weight_size('kernel_size', kernel_size, shape)
        self.rel_pos_bias = (
            nn.Parameter(torch.zeros(num_heads, kernel_size, kernel_size))
            if rel_pos_bias
            else None
        )
        self.use_cpu_fastpath = cpu_fastpath_default()

    def relative_embedding(self) -> torch.Tensor:
        """r (C_out, K, K): row embedding for the first half, column for the
        second half of the channels."""
        K = self.kernel_size
        return torch.cat(
            [
                self.rel_h.unsqueeze(2).expand(-1, K, K),
                self.rel_w.unsqueeze(1).expand(-1, K, K),
            ]
        )

    def _projections(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (scaled, at the window centres), k and v of ``x``."""
        self.check_input(x, self.in_channels)
        s = self.stride
        # A 1x1 projection commutes with subsampling: project only the
        # query pixels.
        q = self.query(x[:, :, ::s, ::s]) * self.scale
        return q, self.key(x), self.value(x)

    def _takes_fused(self, x: torch.Tensor) -> bool:
        """Whether the fused op runs this call (see the class docstring)."""
        return x.dim() == 4 and takes_fused_cpu(
            self, x, self.query.weight.dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over each pixel's window (fused on CPU).

        Args:
            x (Tensor): (B, in_channels, H, W).

        Returns:
            Tensor: (B, out_channels, H_out, W_out).
        """
        if not (isinstance(x, torch.Tensor) and self._takes_fused(x)):
            return super().forward(x)
        q, k, v = self._projections(x)
        return fused_local_attention(
            q,
            k,
            v,
            self.num_heads,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.padding_mode,
            rel_embed=(
                self.relative_embedding() if self.rel_h is not None else None
            ),
            rel_bias=self.rel_pos_bias,
        )

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(v, attention)``; attention (B, heads, K, K, Ho, Wo)."""
        q, k, v = self._projections(x)
        s = self.stride
        B, C, H_out, W_out = q.shape
        logits = local_correlation(
            q,
            k,
            self.num_heads,
            self.kernel_size,
            s,
            self.padding,
            self.dilation,
            self.padding_mode,
        )
        G, K = self.num_heads, self.kernel_size
        if self.rel_h is not None:
            r = self.relative_embedding().view(G, C // G, K, K)
            logits = logits + torch.einsum(
                'bgdhw,gduv->bguvhw', q.view(B, G, C // G, H_out, W_out), r
            )
        if self.rel_pos_bias is not None:
            logits = logits + self.rel_pos_bias[None, :, :, :, None, None]
        attention = window_softmax(logits)
        return v, attention
