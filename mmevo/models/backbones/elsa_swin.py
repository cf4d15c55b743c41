"""ELSA-Swin (Zhou et al., 2021): Swin with ELSA blocks in stages 1-3."""

from typing import ClassVar

import torch.nn as nn

from mmevo.layers import ELSA
from mmevo.registry import MODELS

from .swin_family import SwinFamily
from .window_blocks import ELSAWindowAttention, Mlp, drop_path_layer


class ELSASwinBlock(nn.Module):
    """``x + ELSA(norm1(x))``, ``x + mlp(norm2(x))`` on (B, H, W, C) maps.

    The ELSA layer as published in these models: q * k with scale 1,
    ``dim_qk = dim // 3 * 2`` rounded up to the group width, bias on
    ``pre_proj``, no multiplicative ghost head (lam = 0) and an additive one
    (gamma = 1). ``drop_path`` is the stochastic-depth rate.
    """

    def __init__(
        self,
        dim,
        num_heads,
        *,
        kernel_size=7,
        group_width=8,
        lam=0,
        gamma=1,
        qkv_bias=True,
        mlp_ratio=4.0,
        drop=0.0,
        attn_drop=0.0,
        drop_path=0.0,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ELSA(
            dim,
            num_heads,
            kernel_size=kernel_size,
            qkv_bias=qkv_bias,
            qk_scale=1.0,
            attn_drop=attn_drop,
            group_width=group_width,
            lam=lam,
            gamma=gamma,
        )
        self.drop_path = drop_path_layer(drop_path)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x):
        y = self.attn(self.norm1(x).permute(0, 3, 1, 2))
        x = x + self.drop_path(y.permute(0, 2, 3, 1))
        return x + self.drop_path(self.mlp(self.norm2(x)))


@MODELS.register_module()
class ELSASwinTransformer(SwinFamily):
    """ELSA-Swin backbone ("ELSA: Enhanced Local Self-Attention for Vision
    Transformer", Zhou et al., 2021).

    Swin-T/S/B whose stages 1-3 are ELSA blocks (``ELSA`` layer, kernel
    ``elsa_kernel``) and whose stage 4 is Swin window attention in the
    published layout (:class:`ELSAWindowAttention`). Module names are those
    of damo-cv/ELSA, so an official classification checkpoint (``model``)
    or detection checkpoint (``state_dict``, ``prefix='backbone.'``) loads
    with ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=...)``,
    and an ``ImageClassifier`` with ``out_indices=(3,)``,
    ``GlobalAveragePooling`` and ``LinearClsHead`` is the published
    classifier (``tools/model_converters/elsa_swin_to_mmpretrain.py``).

    Any input size works: the patch embedding and the patch merging pad at
    the bottom/right, the last stage pads to its window.

    The arguments after ``window_size`` are keyword-only.

    Args:
        arch (str): 'tiny', 'small' or 'base'. Default: 'tiny'.
        embed_dims (int, optional): Overrides the preset's width.
        depths (Sequence[int], optional): Overrides the preset's depths.
        num_heads (Sequence[int], optional): Overrides the preset's heads.
        in_channels (int): Default: 3.
        patch_size (int): Default: 4.
        window_size (int): Window of the last stage. Default: 7.
        elsa_kernel (int): ELSA window. Default: 7.
        group_width (int, optional): Channels per group of ELSA's attention
            conv; the preset's (4 for tiny, 8 otherwise) when None.
        lam (float): ELSA multiplicative ghost-head exponent. Default: 0.
        gamma (float): ELSA additive ghost-head weight. Default: 1.
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        qk_scale (float, optional): Scale of the last stage's attention;
            ``head_dim ** -0.5`` when None. The ELSA stages use 1.
        drop_rate (float): Default: 0.
        attn_drop_rate (float): Default: 0.
        drop_path_rate (float): Default: 0.1.
        pad_small_map (bool): False (classification code): a last-stage map
            no larger than the window is one unshifted window. True
            (detection code): it is padded to the window and shifted.
            Default: False.
        out_indices (int | Sequence[int]): Stages whose outputs are
            returned, increasing (negative from the end). Default:
            (0, 1, 2, 3).
        frozen_stages (int): Default: -1.
        with_cp (bool): Gradient checkpointing of every block.
            Default: False.
        init_cfg (dict, optional): Initialisation config; a Pretrained
            checkpoint that does not fit raises or warns (see
            ``SwinFamily.init_weights``).

    Example:
        >>> import torch
        >>> from mmevo.models import ELSASwinTransformer
        >>> model = ELSASwinTransformer(embed_dims=16, depths=(1, 1, 1, 2),
        ...                             num_heads=(1, 2, 4, 8))
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 60, 50))]
        [(1, 16, 15, 13), (1, 32, 8, 7), (1, 64, 4, 4), (1, 128, 2, 2)]
    """

    arch_zoo: ClassVar[dict] = {
        'tiny': dict(
            embed_dims=96,
            depths=(2, 2, 6, 2),
            num_heads=(3, 6, 12, 24),
            group_width=4,
        ),
        'small': dict(
            embed_dims=96,
            depths=(2, 2, 18, 2),
            num_heads=(3, 6, 12, 24),
            group_width=8,
        ),
        'base': dict(
            embed_dims=128,
            depths=(2, 2, 18, 2),
            num_heads=(4, 8, 16, 32),
            group_width=8,
        ),
    }

    block_defaults: ClassVar[dict] = dict(
        elsa_kernel=7, group_width=None, lam=0, gamma=1
    )

    def build_block(self, stage, index, dim, num_heads, drop_path):
        if stage == 3:
            return self.window_block(
                ELSAWindowAttention, index, dim, num_heads, drop_path
            )
        cfg = self.block_cfg
        return ELSASwinBlock(
            dim,
            num_heads,
            kernel_size=cfg['elsa_kernel'],
            group_width=cfg['group_width'],
            lam=cfg['lam'],
            gamma=cfg['gamma'],
            qkv_bias=self.qkv_bias,
            mlp_ratio=self.mlp_ratio,
            drop=self.drop_rate,
            attn_drop=self.attn_drop_rate,
            drop_path=drop_path,
        )
