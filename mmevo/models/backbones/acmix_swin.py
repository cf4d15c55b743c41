"""ACmix-Swin (Pan et al., CVPR 2022): Swin whose window attention shares
its q/k/v with a shift convolution."""

from typing import ClassVar

import torch
import torch.nn as nn

from mmevo.registry import MODELS

from .swin_family import SwinFamily
from .window_blocks import (
    RelativeBias,
    window_partition,
    window_reverse,
    windowed_attention,
)


class ACmixWindowAttention(nn.Module):
    """``rate1 * proj(window attention) + rate2 * conv path``, published.

    Attention: Swin's (``qkv`` chunks q, k, v; table
    ``relative_position_bias_table`` (169, heads)). Convolution path on the
    whole (padded, rolled) map: ``fc`` mixes the 3 * heads q/k/v heads
    (channel ``s * heads + h``) into 9 shifted copies, laid out as channel
    ``d * 9 + tap``; the grouped 3 x 3 ``dep_conv`` (no bias, shift-kernel
    init) maps them to the block's channels. ``rate1 = rate2 = 0.5``.
    """

    def __init__(
        self,
        dim,
        num_heads,
        window_size,
        *,
        qkv_bias=True,
        qk_scale=None,
        attn_drop=0.0,
        proj_drop=0.0,
    ):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads)
        )
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.bias = RelativeBias(window_size, transposed=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fc = nn.Conv2d(3 * num_heads, 9, 1)
        # Published: built with a bias, then ``bias = zeros(bias)`` = None.
        self.dep_conv = nn.Conv2d(
            9 * head_dim, dim, 3, padding=1, groups=head_dim, bias=False
        )
        self.rate1 = nn.Parameter(torch.full((1,), 0.5))
        self.rate2 = nn.Parameter(torch.full((1,), 0.5))
        self.reset_shift_kernel()

    def reset_shift_kernel(self):
        """Every output channel's tap i reads input channel i of its group."""
        kernel = torch.zeros(9, 3, 3)
        for i in range(9):
            kernel[i, i // 3, i % 3] = 1.0
        with torch.no_grad():
            self.dep_conv.weight.copy_(kernel.expand_as(self.dep_conv.weight))

    def forward(self, x, window_size, mask):
        """x: (B, Hp, Wp, C), multiples of the window -> same shape."""
        B, Hp, Wp, C = x.shape
        G, D = self.num_heads, C // self.num_heads
        qkv = self.qkv(x)
        heads = qkv.reshape(B, Hp * Wp, 3 * G, D).permute(0, 2, 1, 3)
        shifted = self.fc(heads).permute(0, 3, 1, 2).reshape(B, 9 * D, Hp, Wp)
        out_conv = self.dep_conv(shifted).permute(0, 2, 3, 1)

        windows = window_partition(qkv, window_size)
        Bw, N = windows.shape[:2]
        q, k, v = (
            windows.reshape(Bw, N, 3, G, D).permute(2, 0, 3, 1, 4).unbind(0)
        )
        index = self.bias.index_for(window_size)
        bias = (
            self.relative_position_bias_table[index.flatten()]
            .view(N, N, -1)
            .permute(2, 0, 1)
        )
        out = windowed_attention(
            q * self.scale, k, v, bias, mask, self.attn_drop
        )
        out = window_reverse(self.proj(out), window_size, B, Hp, Wp)
        return self.proj_drop(self.rate1 * out + self.rate2 * out_conv)


@MODELS.register_module()
class ACmixSwinTransformer(SwinFamily):
    """ACmix-Swin backbone ("On the Integration of Self-Attention and
    Convolution", Pan et al., CVPR 2022).

    Swin-T/S with every window attention replaced by
    :class:`ACmixWindowAttention`, module names those of LeapLabTHU/ACmix
    (``layers.{i}.blocks.{j}.attn.qkv``, ``.fc``, ``.dep_conv``), so its
    classification checkpoints load with ``init_cfg=dict(type='Pretrained',
    checkpoint=...)`` and convert with
    ``tools/model_converters/acmix_swin_to_mmpretrain.py``. The published
    classifier takes 224 x 224 only; here any size works (see
    :class:`ShiftWindowBlock`): the convolution path runs on the padded,
    rolled map, which equals the published one on multiples of the window.

    The arguments after ``window_size`` are keyword-only.

    Args:
        arch (str): 'tiny' or 'small'. Default: 'tiny'.
        embed_dims (int, optional): Overrides the preset's width.
        depths (Sequence[int], optional): Overrides the preset's depths.
        num_heads (Sequence[int], optional): Overrides the preset's heads.
        in_channels (int): Default: 3.
        patch_size (int): Default: 4.
        window_size (int): Default: 7.
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        qk_scale (float, optional): ``head_dim ** -0.5`` when None.
        drop_rate (float): Default: 0.
        attn_drop_rate (float): Default: 0.
        drop_path_rate (float): Default: 0.1.
        pad_small_map (bool): False (classification): a map no larger than
            the window is one unshifted window; True (detection,
            segmentation): padded to the window and shifted. Default: False.
        out_indices (int | Sequence[int]): Stages whose outputs are
            returned, increasing (negative from the end). Default:
            (0, 1, 2, 3).
        frozen_stages (int): Default: -1.
        with_cp (bool): Default: False.
        init_cfg (dict, optional): Initialisation config; a Pretrained
            checkpoint that does not fit raises or warns (see
            ``SwinFamily.init_weights``).

    Example:
        >>> import torch
        >>> from mmevo.models import ACmixSwinTransformer
        >>> model = ACmixSwinTransformer(embed_dims=16, depths=(1, 1, 2, 1),
        ...                              num_heads=(1, 2, 4, 8))
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 36))]
        [(1, 16, 16, 9), (1, 32, 8, 5), (1, 64, 4, 3), (1, 128, 2, 2)]
    """

    arch_zoo: ClassVar[dict] = {
        'tiny': dict(
            embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)
        ),
        'small': dict(
            embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)
        ),
    }

    def build_block(self, stage, index, dim, num_heads, drop_path):
        return self.window_block(
            ACmixWindowAttention, index, dim, num_heads, drop_path
        )
