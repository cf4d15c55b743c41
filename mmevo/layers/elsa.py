"""ELSA (Zhou et al., 2021): Hadamard attention expanded by a ghost head."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmevo.ops import check_int, window_softmax
from mmevo.registry import MODELS

from .base import (
    EvolutionLayer,
    InitCfg,
    check_divisible,
    check_weight_size,
)
from .fastpath import cpu_fastpath_default, takes_cpu_fastpath


@MODELS.register_module()
class ELSA(EvolutionLayer):
    """Enhanced local self-attention on NCHW maps.

    Generation function: ``pre_proj`` (1x1) gives q, k (``dim_qk`` each) and
    v (``dim_v``); the Hadamard product ``q * k * scale`` (average-pooled by
    the stride) goes through ``attn`` = grouped K x K conv, GELU, grouped 1x1
    conv to K*K*num_heads logits; softmax over the window per head. The ghost
    head expands the per-head maps to a per-channel kernel,
    ``W[c] = M[c] ** lam * attn[head(c)] + gamma * A[c]`` (G = dim_v); with
    lam = gamma = 0 there is no ghost head and the heads are the groups
    (G = num_heads). After aggregating v, ``post_proj`` maps dim_v -> dim.
    Parameter names and shapes are the published ones (``ghost_head`` holds
    M and/or A as there).

    Pooling uses ``ceil_mode`` so that odd sizes with stride > 1 work; on
    sizes divisible by the stride the numbers are the published ones.

    With an additive ghost head only (lam = 0, gamma != 0: ELSA-Swin), on
    CPU in eager mode, while ``use_cpu_fastpath`` is True (see
    :mod:`mmevo.layers.fastpath`) and no kernel hook is registered,
    :meth:`forward` runs the same numbers without the per-channel kernel
    (:meth:`_forward_cpu`). :meth:`generate` always builds the published
    kernel.

    Args:
        dim (int): input = output channels.
        num_heads (int): attention heads; dim_v must be divisible by it.
        dim_qk (int, optional): q/k channels (>= 1), rounded up to a
            multiple of ``group_width``. Default: ``dim // 3 * 2``.
        dim_v (int, optional): v channels (>= 1). Default: ``dim``.
        kernel_size (int): K, odd. Default: 5.
        stride (int): window step. Default: 1.
        dilation (int): spacing of the window taps (and of the attention
            conv). Default: 1.
        qkv_bias (bool): bias of ``pre_proj``. Default: False.
        qk_scale (float, optional): Default: ``(dim_v // num_heads) ** -0.5``.
        attn_drop (float): dropout on the attention maps. Default: 0.
        proj_drop (float): dropout after ``post_proj``. Default: 0.
        group_width (int): channels per group of the K x K attention conv.
            Default: 8.
        groups (int): groups of the 1x1 attention conv. Default: 1.
        lam (float): exponent of the multiplicative ghost head. Default: 1.
        gamma (float): weight of the additive ghost head. Default: 1.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='ELSA', dim=24, num_heads=2,
        ...                           kernel_size=3, stride=2))
        >>> layer(torch.randn(2, 24, 7, 6)).shape
        torch.Size([2, 24, 4, 3])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        dim_qk: int | None = None,
        dim_v: int | None = None,
        kernel_size: int = 5,
        stride: int = 1,
        dilation: int = 1,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        group_width: int = 8,
        groups: int = 1,
        lam: float = 1,
        gamma: float = 1,
        init_cfg: InitCfg = None,
    ) -> None:
        super().__init__(
            kernel_size, stride, None, dilation, 'zeros', init_cfg
        )
        check_int('dim', dim)
        check_int('num_heads', num_heads)
        check_int('group_width', group_width)
        check_int('groups', groups)
        if dim_qk is None:
            dim_qk = dim // 3 * 2
            if dim_qk < 1:
                raise ValueError(
                    f'dim_qk defaults to dim // 3 * 2, which is '
                    f'0 for dim={dim}: pass dim_qk >= 1'
                )
        check_int('dim_qk', dim_qk)
        self.dim = dim
        self.num_heads = num_heads
        # Published rule: round dim_qk up to whole groups of the K x K conv.
        self.dim_qk = math.ceil(dim_qk / group_width) * group_width
        self.dim_v = dim if dim_v is None else dim_v
        check_int('dim_v', self.dim_v)
        check_divisible('dim_v', self.dim_v, 'num_heads', num_heads)
        check_divisible('dim_qk', self.dim_qk, 'groups', groups)
        check_divisible(
            'kernel_size**2 * num_heads',
            kernel_size**2 * num_heads,
            'groups',
            groups,
        )
        K = kernel_size
        for shape in (  # the weights kernel_size sizes
            (self.dim_qk, group_width, K, K),
            (K**2 * num_heads, self.dim_qk // groups),
            (2, self.dim_v, K, K),
        ):
            check_weight_size('kernel_size', K, shape)
        self.scale = (
            (self.dim_v // num_heads) ** -0.5 if qk_scale is None else qk_scale
        )
        self.lam = lam
        self.gamma = gamma

        self.pre_proj = nn.Conv2d(
            dim, self.dim_qk * 2 + self.dim_v, 1, bias=qkv_bias
        )
        if stride > 1:
            # ceil_mode: attention map and output both have ceil(H/s) rows.
            self.avgpool = nn.AvgPool2d(stride, stride, ceil_mode=True)
        self.attn = nn.Sequential(
            nn.Conv2d(
                self.dim_qk,
                self.dim_qk,
                kernel_size,
                padding=self.padding,
                dilation=dilation,
                groups=self.dim_qk // group_width,
            ),
            nn.GELU(),
            nn.Conv2d(
                self.dim_qk, kernel_size**2 * num_heads, 1, groups=groups
            ),
        )
        shape = (self.dim_v, kernel_size, kernel_size)
        mul = torch.randn(1, *shape)
        add = nn.init.trunc_normal_(torch.zeros(1, *shape), std=0.02)
        # Same layout as the published parameter: (2, 1, ...) for both,
        # (1, ...) for one of them, none when lam = gamma = 0.
        if lam != 0 and gamma != 0:
            self.ghost_head = nn.Parameter(torch.stack([mul, add]))
        elif gamma != 0:
            self.ghost_head = nn.Parameter(add)
        elif lam != 0:
            self.ghost_head = nn.Parameter(mul)
        else:
            self.ghost_head = None
        self.attn_drop = nn.Dropout(attn_drop)
        self.post_proj = nn.Linear(self.dim_v, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.use_cpu_fastpath = cpu_fastpath_default()

    def ghost_terms(
        self,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(M ** lam, gamma * A), each (dim_v, K, K) or None when absent."""
        if self.ghost_head is None:
            return None, None
        if self.lam != 0 and self.gamma != 0:
            return self.ghost_head[0, 0] ** self.lam, self.ghost_head[
                1, 0
            ] * self.gamma
        if self.gamma != 0:
            return None, self.ghost_head[0] * self.gamma
        return self.ghost_head[0] ** self.lam, None

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(v, attn)``: the per-head maps (B, num_heads, K, K, H, W)."""
        self.check_input(x, self.dim)
        q, k, v = torch.split(
            self.pre_proj(x), (self.dim_qk, self.dim_qk, self.dim_v), dim=1
        )
        quadratic = q * k * self.scale
        if self.stride > 1:
            quadratic = self.avgpool(quadratic)
        logits = self.attn(quadratic)
        B, _, H, W = logits.shape
        G, K = self.num_heads, self.kernel_size
        attn = window_softmax(logits.view(B, G, K, K, H, W))
        return v, self.attn_drop(attn)

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(v, kernel)``: kernel (B, dim_v, K, K, H_out, W_out), or
        (B, num_heads, ...) without a ghost head."""
        v, attn = self._heads(x)
        mul, add = self.ghost_terms()
        if mul is None and add is None:
            return v, attn
        B, G, K, _, H, W = attn.shape
        C = self.dim_v
        # Expand heads to channels: channel c reads its head's map.
        kernel = attn.unsqueeze(2)  # (B, G, 1, K, K, H, W)
        if mul is not None:
            kernel = kernel * mul.view(1, G, C // G, K, K, 1, 1)
        else:
            kernel = kernel.expand(B, G, C // G, K, K, H, W)
        if add is not None:
            kernel = kernel + add.view(1, G, C // G, K, K, 1, 1)
        return v, kernel.reshape(B, C, K, K, H, W)

    def _forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """``aggregate(v, attn[head(c)] + gamma * A)`` as the aggregation of
        the per-head maps plus ``gamma * A`` as a depthwise convolution of v
        (the aggregation is linear in the kernel).

        The per-channel kernel (B, dim_v, K, K, H, W) is never written:
        ELSA-Swin-T trains 1.8-1.9x faster in 0.35x the memory on the CPU
        (``docs/benchmarks.md``).
        """
        v, attn = self._heads(x)
        _, add = self.ghost_terms()
        out = self.aggregate(v, attn)
        return out + F.conv2d(
            v,
            add.unsqueeze(1),
            None,
            self.stride,
            self.padding,
            self.dilation,
            self.dim_v,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Aggregate v with the generated kernel, then project.

        Args:
            x (Tensor): (B, dim, H, W).

        Returns:
            Tensor: (B, dim, ceil(H / s), ceil(W / s)).
        """
        if (
            self.lam == 0
            and self.gamma != 0
            and not self._kernel_hooks
            and takes_cpu_fastpath(self, x)
        ):
            out = self._forward_cpu(x)
        else:
            out = self.aggregate(*self.generate(x))
        out = self.post_proj(out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.proj_drop(out)
