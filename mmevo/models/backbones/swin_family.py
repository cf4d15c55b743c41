"""What ELSA-Swin and ACmix-Swin share: the Swin skeleton and its windows.

Module names are those of the authors' code (``patch_embed``,
``layers.{i}.blocks.{j}``, ``layers.{i}.downsample``, ``mlp.fc1``), so their
checkpoints load by name; the feature maps run channels-last (B, H, W, C)
between blocks, as there.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn.bricks import DropPath
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.runner.checkpoint import CheckpointLoader

from mmevo.ops import check_int

from .swin_convert import official_state_dict


def pad_to_window(x, window_size):
    """Zero-pad (B, H, W, C) at the bottom/right to multiples of the window.

    The detection code pads after ``norm1``; padded tokens are not masked.
    """
    H, W = x.shape[1:3]
    pad_b = (window_size - H % window_size) % window_size
    pad_r = (window_size - W % window_size) % window_size
    if is_symbolic(H, W) or pad_b or pad_r:
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    return x


def is_symbolic(*sizes):
    """Whether sizes are traced (TorchScript tensors, ``torch.export``
    SymInts) rather than Python ints: a graph then pads unconditionally
    (zero-width pads), as no branch on the size can be recorded."""
    return not all(type(s) is int for s in sizes)


def window_partition(x, window_size):
    """(B, H, W, C) -> (B * nW, window_size**2, C); H, W multiples of it."""
    B, H, W, C = x.shape
    h, w = H // window_size, W // window_size
    x = x.reshape(B, h, window_size, w, window_size, C).transpose(2, 3)
    return x.reshape(B * h * w, window_size * window_size, C)


def window_reverse(windows, window_size, B, H, W):
    """Inverse of :func:`window_partition` (explicit B: empty batches)."""
    h, w, C = H // window_size, W // window_size, windows.shape[-1]
    x = windows.reshape(B, h, w, window_size, window_size, C).transpose(2, 3)
    return x.reshape(B, H, W, C)


def window_geometry(H, W, window_size, shift_size, pad_small_map):
    """``(window, shift)`` of a block on an H x W map.

    Classification code (``pad_small_map=False``): a map no larger than the
    window is one unshifted window of its own size. Detection code
    (``True``): the window stays and the map is padded to it.

    Raises:
        RuntimeError: classification geometry on traced (symbolic) sizes:
            TorchScript tracing, or ``torch.export`` with dynamic H, W.
    """
    if pad_small_map:
        return window_size, shift_size
    if is_symbolic(H, W):
        raise RuntimeError(
            'pad_small_map=False (the classification geometry) takes its '
            'window and shift from the size of each map, which a traced '
            'graph cannot hold: export it with dynamic=False and the '
            'dynamo exporter (one fixed size), or build the backbone with '
            'pad_small_map=True (the detection geometry: every size in one '
            'graph)'
        )
    if min(H, W) <= window_size:
        return min(H, W), 0
    return window_size, shift_size


def shift_mask(Hp, Wp, window_size, shift_size, dtype, device):
    """(nW, N, N) additive mask (0 / -100) of the shifted windows.

    The regions of the rolled map (rows and columns ``[0, -window)``,
    ``[-window, -shift)``, ``[-shift, end)``) are found by comparisons, not
    by slicing, so a graph with symbolic Hp, Wp holds every size.
    """

    def region(n):
        r = torch.arange(n, device=device)
        return (r >= n - window_size).long() + (r >= n - shift_size).long()

    img = (region(Hp)[:, None] * 3 + region(Wp)[None, :]).to(dtype)
    ids = window_partition(img[None, :, :, None], window_size).squeeze(-1)
    mask = ids.unsqueeze(1) - ids.unsqueeze(2)
    # -100 as published; built in the map's dtype (fp16/bf16 included).
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def relative_index(window_size, table_size, transposed=False):
    """(N, N) index into a (2 * table_size - 1)**2 relative-position table.

    ``window_size <= table_size`` (a small map's shrunk window reads the
    centre of the table). ``transposed`` is ELSA-Swin's key-minus-query
    offset, the transpose of Swin's query-minus-key.
    """
    coords = torch.stack(
        torch.meshgrid(
            torch.arange(window_size), torch.arange(window_size), indexing='ij'
        )
    ).flatten(1)
    rel = (
        coords[:, None, :] - coords[:, :, None]
        if transposed
        else coords[:, :, None] - coords[:, None, :]
    )
    rel = rel + table_size - 1
    return rel[0] * (2 * table_size - 1) + rel[1]


class Mlp(nn.Module):
    """``fc1``, GELU, dropout, ``fc2``, dropout (timm's ``Mlp``)."""

    def __init__(self, dim, hidden, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


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
        x = F.pad(x, (0, (p - W % p) % p, 0, (p - H % p) % p))
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
        if is_symbolic(H, W) or H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
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

    Subclasses give ``arch_zoo`` and :meth:`build_block`. Outputs are NCHW,
    ``norm{i}`` applied to stage ``i`` before its patch merging, as in
    mmdet's ``SwinTransformer``; the last norm is the classifier's final
    norm. ``frozen_stages`` as there: 0 freezes the patch embedding, n also
    stages 1..n and their norms.
    """

    arch_zoo = {}

    def __init__(
        self,
        arch='tiny',
        embed_dims=None,
        depths=None,
        num_heads=None,
        in_channels=3,
        patch_size=4,
        window_size=7,
        mlp_ratio=4.0,
        drop_rate=0.0,
        drop_path_rate=0.1,
        pad_small_map=False,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        with_cp=False,
        init_cfg=None,
    ):
        super().__init__(init_cfg=init_cfg)
        if arch not in self.arch_zoo:
            raise ValueError(
                f'arch must be one of {sorted(self.arch_zoo)}, got {arch!r}'
            )
        preset = self.arch_zoo[arch]
        embed_dims = preset['embed_dims'] if embed_dims is None else embed_dims
        depths = tuple(preset['depths'] if depths is None else depths)
        num_heads = tuple(
            preset['num_heads'] if num_heads is None else num_heads
        )
        check_int('embed_dims', embed_dims)
        check_int('window_size', window_size)
        if len(depths) != 4 or len(num_heads) != 4:
            raise ValueError(
                f'depths and num_heads must have 4 entries, got '
                f'{depths} and {num_heads}'
            )
        out_indices = tuple(out_indices)
        if not out_indices or any(i not in range(4) for i in out_indices):
            raise ValueError(
                f'out_indices must be a non-empty subset of '
                f'0..3, got {out_indices}'
            )
        if frozen_stages not in range(-1, 5):
            raise ValueError(
                f'frozen_stages must be -1..4, got {frozen_stages}'
            )
        self.arch = arch
        self.embed_dims = embed_dims
        self.depths = depths
        self.num_heads = num_heads
        self.window_size = window_size
        self.mlp_ratio = mlp_ratio
        self.drop_rate = drop_rate
        self.pad_small_map = pad_small_map
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.num_features = [embed_dims * 2**i for i in range(4)]
        check_heads(self.num_features, num_heads)

        self.patch_embed = PatchEmbed(in_channels, embed_dims, patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        rates = torch.linspace(
            0, drop_path_rate, sum(depths), device='cpu'
        ).tolist()
        self.layers = nn.ModuleList()
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
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
        for i in out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.num_features[i]))
        self._freeze_stages()

    def build_block(self, stage, index, dim, num_heads, drop_path):
        """Block ``index`` of ``stage`` (an ``nn.Module`` on NHWC maps)."""
        raise NotImplementedError

    def drop_path(self, rate):
        return DropPath(rate) if rate > 0 else nn.Identity()

    def forward(self, x):
        """Args: x (Tensor): (B, C, H, W), any H, W.

        Returns:
            tuple[Tensor]: ``(B, embed_dims * 2**i, ceil(H / 2**(i+2)),
            ceil(W / 2**(i+2)))`` for each ``i`` in ``out_indices``.
        """
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
        """Published init (Linear trunc-normal 0.02, LayerNorm 1/0), or
        ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=...)``
        with an official or a converted checkpoint."""
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self._load_pretrained(cfg['checkpoint'], cfg.get('prefix', ''))
            return
        super().init_weights()
        if cfg is None:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

    def _load_pretrained(self, path, prefix):
        checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu')
        state = official_state_dict(checkpoint, prefix)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            print_log(
                f'{type(self).__name__} from {path}: missing keys {missing}, '
                f'unexpected keys {unexpected}',
                logger='current',
            )
        self._is_init = True


def check_heads(dims, num_heads):
    """Raise unless each stage's width is divisible by its heads."""
    for i, (dim, heads) in enumerate(zip(dims, num_heads)):
        check_int(f'num_heads[{i}]', heads)
        if dim % heads:
            raise ValueError(
                f'stage {i}: width {dim} must be divisible by '
                f'num_heads[{i}] ({heads})'
            )
