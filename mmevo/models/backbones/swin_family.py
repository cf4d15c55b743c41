"""What ELSA-Swin and ACmix-Swin share: the Swin skeleton, its arguments and
its initialisation.

Module names are those of the authors' code (``patch_embed``,
``layers.{i}.blocks.{j}``, ``layers.{i}.downsample``, ``mlp.fc1``), so their
checkpoints load by name; the feature maps run channels-last (B, H, W, C)
between blocks, as there. mmpretrain's ``ShiftWindowMSA`` is not reused: its
modules have mmpretrain's names (``attn.w_msa.qkv``, ``ffn.layers.0.0``),
not the official ones the published checkpoints hold. It also pads and masks
with Python branches on the map's size, which a traced graph with symbolic
H and W cannot hold (:mod:`.window_blocks` builds both from comparisons).
"""

import logging
import numbers
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_

from mmevo.ops import check_int

from .swin_convert import fit_problem, official_load_hook, state_fit
from .window_blocks import ShiftWindowBlock, is_symbolic, round_up


class PatchEmbed(nn.Module):
    """Conv patch x patch / patch, LayerNorm; zero-pads right/bottom first.

    Returns (B, H / patch, W / patch, C), rounded up.
    """

    def __init__(self, in_channels, dim, patch_size=4):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, dim, patch_size, patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        p = self.patch_size
        H, W = x.shape[2:]
        x = F.pad(x, (0, round_up(W, p) - W, 0, round_up(H, p) - H))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class PatchMerging(nn.Module):
    """2 x 2 neighbours concatenated as (0,0), (1,0), (0,1), (1,1); norm;
    linear 4C -> 2C. Odd sizes are zero-padded at the bottom/right."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        H, W = x.shape[1:3]
        pad_b, pad_r = round_up(H, 2) - H, round_up(W, 2) - W
        if is_symbolic(H, W) or pad_b or pad_r:
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        x = torch.cat(
            [
                x[:, 0::2, 0::2],
                x[:, 1::2, 0::2],
                x[:, 0::2, 1::2],
                x[:, 1::2, 1::2],
            ],
            -1,
        )
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """The blocks of one stage and the patch merging after them."""

    def __init__(self, blocks, downsample, with_cp):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample
        self.with_cp = with_cp

    def forward(self, x):
        for block in self.blocks:
            if self.with_cp and x.requires_grad:
                x = cp.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class SwinFamily(BaseModule):
    """The Swin skeleton: patch embedding, four stages, one norm per output.

    A subclass declares its presets (``arch_zoo``: ``embed_dims``,
    ``depths``, ``num_heads`` and any block argument), the names and
    defaults of its own block arguments (``block_defaults``, taken as
    keywords and kept in ``block_cfg``; one left None takes the preset's
    value) and :meth:`build_block`. Outputs are NCHW, ``norm{i}`` applied to
    stage ``i`` before its patch merging, as in mmdet's ``SwinTransformer``;
    the last norm is the classifier's final norm. ``frozen_stages`` as
    there: 0 freezes the patch embedding, n also stages 1..n and their
    norms. The arguments after ``window_size`` are keyword-only.

    Loading: every ``load_state_dict`` (torch's, mmengine's) takes official
    checkpoints as they are (:func:`.swin_convert.official_load_hook`), so
    ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` (``prefix=...``
    for a detector's or mmpretrain's checkpoint) is mmengine's own
    ``PretrainedInit``. See :meth:`init_weights` for a checkpoint that does
    not fit.
    """

    arch_zoo: ClassVar[dict] = {}
    block_defaults: ClassVar[dict] = {}

    def __init__(
        self,
        arch='tiny',
        embed_dims=None,
        depths=None,
        num_heads=None,
        in_channels=3,
        patch_size=4,
        window_size=7,
        *,
        mlp_ratio=4.0,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.1,
        pad_small_map=False,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        with_cp=False,
        init_cfg=None,
        **block_kwargs,
    ):
        super().__init__(init_cfg=init_cfg)
        pretrained = _pretrained(self.init_cfg)  # a copy of init_cfg
        if pretrained is not None and pretrained.get('prefix') == '':
            del pretrained['prefix']  # mmengine reads '' as '.'
        if arch not in self.arch_zoo:
            raise ValueError(
                f'arch must be one of {sorted(self.arch_zoo)}, got {arch!r}'
            )
        unknown = sorted(set(block_kwargs) - set(self.block_defaults))
        if unknown:
            raise TypeError(
                f'{type(self).__name__} got unexpected keyword arguments '
                f'{unknown} (its block arguments: '
                f'{sorted(self.block_defaults)})'
            )
        preset = self.arch_zoo[arch]
        given = dict(
            embed_dims=embed_dims,
            depths=depths,
            num_heads=num_heads,
            **{**self.block_defaults, **block_kwargs},
        )
        cfg = {
            k: preset[k] if v is None and k in preset else v
            for k, v in given.items()
        }
        embed_dims = cfg.pop('embed_dims')
        depths = tuple(cfg.pop('depths'))
        num_heads = tuple(cfg.pop('num_heads'))
        check_int('embed_dims', embed_dims)
        check_int('in_channels', in_channels)
        check_int('patch_size', patch_size)
        check_int('window_size', window_size)
        if len(depths) != 4 or len(num_heads) != 4:
            raise ValueError(
                f'depths and num_heads must have 4 entries, got '
                f'{depths} and {num_heads}'
            )
        for i, depth in enumerate(depths):
            check_int(f'depths[{i}]', depth)
        check_real('mlp_ratio', mlp_ratio, '> 0', lambda v: v > 0)
        if qk_scale is not None:
            check_real('qk_scale', qk_scale, '> 0', lambda v: v > 0)
        for name, rate in (
            ('drop_rate', drop_rate),
            ('attn_drop_rate', attn_drop_rate),
            ('drop_path_rate', drop_path_rate),
        ):
            check_real(name, rate, 'in [0, 1)', lambda v: 0 <= v < 1)
        check_int('frozen_stages', frozen_stages, minimum=-1)
        if frozen_stages > 4:
            raise ValueError(
                f'frozen_stages must be -1..4, got {frozen_stages}'
            )
        self.arch = arch
        self.embed_dims = embed_dims
        self.depths = depths
        self.num_heads = num_heads
        self.in_channels = in_channels
        self.window_size = window_size
        self.mlp_ratio = mlp_ratio
        self.qkv_bias = qkv_bias
        self.qk_scale = qk_scale
        self.drop_rate = drop_rate
        self.attn_drop_rate = attn_drop_rate
        self.pad_small_map = pad_small_map
        self.out_indices = check_out_indices(out_indices)
        self.frozen_stages = frozen_stages
        self.block_cfg = cfg
        self.num_features = [embed_dims * 2**i for i in range(4)]
        check_heads(self.num_features, num_heads)

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        rates = torch.linspace(
            0, drop_path_rate, sum(depths), device='cpu'
        ).tolist()
        self.layers = nn.ModuleList()
        for i, (depth, heads) in enumerate(
            zip(depths, num_heads, strict=True)
        ):
            dim = self.num_features[i]
            start = sum(depths[:i])
            blocks = [
                self.build_block(i, j, dim, heads, rates[start + j])
                for j in range(depth)
            ]
            self.layers.append(
                SwinStage(
                    blocks, PatchMerging(dim) if i < 3 else None, with_cp
                )
            )
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.num_features[i]))
        self._freeze_stages()
        self.register_load_state_dict_pre_hook(official_load_hook)

    def build_block(self, stage, index, dim, num_heads, drop_path):
        """Block ``index`` of ``stage`` (an ``nn.Module`` on NHWC maps);
        ``drop_path`` is its stochastic-depth rate."""
        raise NotImplementedError

    def window_block(self, attention, index, dim, num_heads, drop_path):
        """A :class:`.ShiftWindowBlock` around ``attention(dim, num_heads,
        window_size, qkv_bias=, qk_scale=, attn_drop=, proj_drop=)``,
        shifted when ``index`` is odd."""
        attn = attention(
            dim,
            num_heads,
            self.window_size,
            qkv_bias=self.qkv_bias,
            qk_scale=self.qk_scale,
            attn_drop=self.attn_drop_rate,
            proj_drop=self.drop_rate,
        )
        return ShiftWindowBlock(
            dim,
            attn,
            window_size=self.window_size,
            shift=index % 2 == 1,
            mlp_ratio=self.mlp_ratio,
            pad_small_map=self.pad_small_map,
            drop=self.drop_rate,
            drop_path=drop_path,
        )

    def forward(self, x):
        """Args: x (Tensor): (B, in_channels, H, W), any H, W.

        Returns:
            tuple[Tensor]: ``(B, embed_dims * 2**i, ceil(H / 2**(i+2)),
            ceil(W / 2**(i+2)))`` for each ``i`` in ``out_indices``.
        """
        C = x.shape[1] if x.dim() == 4 else None
        if x.dim() != 4 or (not is_symbolic(C) and C != self.in_channels):
            raise ValueError(
                f'x must be (B, C, H, W) with C = in_channels '
                f'({self.in_channels}), got shape {tuple(x.shape)}'
            )
        x = self.pos_drop(self.patch_embed(x))
        outs = []
        for i, stage in enumerate(self.layers):
            x = stage(x)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(out.permute(0, 3, 1, 2).contiguous())
            if stage.downsample is not None:
                x = stage.downsample(x)
        return tuple(outs)

    def _freeze_stages(self):
        frozen = [self.patch_embed] if self.frozen_stages >= 0 else []
        for i in range(self.frozen_stages):
            frozen.append(self.layers[i])
            if i in self.out_indices:
                frozen.append(getattr(self, f'norm{i}'))
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode=True):
        super().train(mode)
        self._freeze_stages()
        return self

    def init_weights(self):
        """The published init (Linear trunc-normal std 0.02 and zero bias,
        LayerNorm 1 / 0), then mmengine's (``init_cfg``).

        With ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``, mmengine
        loads PATH over the published init (``strict=False``, mismatches
        logged as WARNING); then, beyond mmengine: a checkpoint of which no
        tensor fits (wrong ``prefix``, another model's file) or one of the
        other Swin family raises ValueError naming PATH, and a partial fit
        logs one WARNING with the counts and the first keys left at the
        published init (a detector initialised from an ImageNet checkpoint:
        ``norm0``-``norm2``).
        """
        if self.is_init:  # mmengine warns and does nothing
            super().init_weights()
            return
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        fits = []
        handle = self.register_load_state_dict_pre_hook(
            lambda module, state, prefix, *_: fits.append(
                state_fit(module, state, prefix)
            )
        )
        try:
            super().init_weights()
        finally:
            handle.remove()
        pretrained = _pretrained(self.init_cfg)
        for fit in fits if pretrained else ():
            name = type(self).__name__
            level, message = fit_problem(name, pretrained['checkpoint'], *fit)
            if level == 'error':
                raise ValueError(message)
            if level == 'warning':
                print_log(message, logger='current', level=logging.WARNING)


def _pretrained(init_cfg):
    """The Pretrained entry of ``init_cfg``, or None."""
    for cfg in init_cfg if isinstance(init_cfg, list) else [init_cfg]:
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            return cfg
    return None


def check_real(name, value, allowed, ok):
    """Raise unless ``value`` is a real number for which ``ok`` holds
    (``allowed`` says which, for the message)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f'{name} must be a number {allowed}, got '
            f'{type(value).__name__} {value!r}'
        )
    if not ok(value):
        raise ValueError(f'{name} must be {allowed}, got {value}')


def check_out_indices(out_indices):
    """``out_indices`` (an int or a sequence, negative from the end, as
    mmpretrain's SwinTransformer takes them) as increasing stages 0..3."""
    if type(out_indices) is int:  # not a bool
        out_indices = (out_indices,)
    valid = isinstance(out_indices, (tuple, list)) and all(
        type(i) is int and -4 <= i < 4 for i in out_indices
    )
    stages = tuple(i % 4 for i in out_indices) if valid else ()
    if not stages or list(stages) != sorted(set(stages)):
        raise ValueError(
            f'out_indices must be a stage (0..3, or -4..-1 from the end) '
            f'or a non-empty sequence of distinct stages in increasing '
            f'order (the outputs come in stage order), got {out_indices!r}'
        )
    return stages


def check_heads(dims, num_heads):
    """Raise unless each stage's width is divisible by its heads."""
    for i, (dim, heads) in enumerate(zip(dims, num_heads, strict=True)):
        check_int(f'num_heads[{i}]', heads)
        if dim % heads:
            raise ValueError(
                f'stage {i}: width {dim} must be divisible by '
                f'num_heads[{i}] ({heads})'
            )
