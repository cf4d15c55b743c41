"""Shifted-window blocks of ELSA-Swin's last stage and of ACmix-Swin."""

import torch
import torch.nn as nn

from .swin_family import (
    Mlp,
    pad_to_window,
    relative_index,
    shift_mask,
    window_geometry,
    window_partition,
    window_reverse,
)


class RelativeBias(nn.Module):
    """Gathers the (heads, N, N) relative-position bias from a table.

    The table is ``(2 * window_size - 1)**2`` entries per head; a smaller
    window (a small map in classification) reads its centre.
    """

    def __init__(self, window_size, transposed):
        super().__init__()
        self.window_size = window_size
        self.transposed = transposed
        # Rebuilt, so not in state_dict: checkpoints load with or without it.
        self.register_buffer(
            'index',
            relative_index(window_size, window_size, transposed),
            persistent=False,
        )

    def index_for(self, window_size):
        if window_size == self.window_size:
            return self.index
        return relative_index(
            window_size, self.window_size, self.transposed
        ).to(self.index.device)


def windowed_attention(q, k, v, bias, mask, attn_drop):
    """softmax(q @ k^T + bias [+ mask]) @ v over windows.

    q, k, v: (B * nW, heads, N, head_dim), q already scaled; bias (heads, N,
    N); mask (nW, N, N) or None. Returns (B * nW, N, heads * head_dim).
    """
    Bw, G, N, D = q.shape
    attn = q @ k.transpose(-2, -1) + bias.unsqueeze(0)
    if mask is not None:
        nW = mask.shape[0]
        # explicit sizes, no -1: empty batches have no size to infer
        attn = attn.view(Bw // nW, nW, G, N, N) + mask[None, :, None]
        attn = attn.view(Bw, G, N, N)
    attn = attn_drop(attn.softmax(-1))
    return (attn @ v).transpose(1, 2).reshape(Bw, N, G * D)


class ELSAWindowAttention(nn.Module):
    """Window attention of ELSA-Swin's last stage, in the published layout.

    ``pre_proj`` chunks are (v, q, k); the bias table ``rb`` is (heads,
    (2w - 1)**2), indexed by the key-minus-query offset; the scale
    multiplies ``q @ k^T``.
    """

    def __init__(
        self,
        dim,
        num_heads,
        window_size,
        qkv_bias=True,
        qk_scale=None,
        attn_drop=0.0,
        proj_drop=0.0,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.rb = nn.Parameter(
            torch.zeros(num_heads, (2 * window_size - 1) ** 2)
        )
        nn.init.trunc_normal_(self.rb, std=0.02)
        self.bias = RelativeBias(window_size, transposed=True)
        self.pre_proj = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.post_proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, window_size, mask):
        """x: (B, Hp, Wp, C), multiples of the window -> same shape."""
        B, Hp, Wp, C = x.shape
        windows = window_partition(x, window_size)
        Bw, N = windows.shape[:2]
        feat = self.pre_proj(windows).reshape(
            Bw, N, 3, self.num_heads, C // self.num_heads
        )
        v, q, k = feat.permute(2, 0, 3, 1, 4).unbind(0)
        index = self.bias.index_for(window_size)
        bias = self.rb[:, index.flatten()].view(-1, N, N)
        out = windowed_attention(
            q * self.scale, k, v, bias, mask, self.attn_drop
        )
        out = self.proj_drop(self.post_proj(out))
        return window_reverse(out, window_size, B, Hp, Wp)


class ShiftWindowBlock(nn.Module):
    """Swin block: x + attn(norm1(x)) over (shifted) windows, x + mlp(...).

    After ``norm1`` the map is zero-padded at the bottom/right to the
    window (padded tokens unmasked, as in the detection code), rolled by
    ``-shift`` in odd blocks, attended with the shifted-window mask, rolled
    back and cropped. See :func:`window_geometry` for ``pad_small_map``.

    Args:
        attn (nn.Module): called as ``attn(x, window, mask)`` on the padded,
            rolled (B, Hp, Wp, C) map; returns that shape.
    """

    def __init__(
        self,
        dim,
        attn,
        window_size,
        shift,
        mlp_ratio,
        pad_small_map,
        drop,
        drop_path,
    ):
        super().__init__()
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.pad_small_map = pad_small_map
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.drop_path = drop_path
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x):
        """x: (B, H, W, C) -> (B, H, W, C)."""
        H, W = x.shape[1:3]
        window, shift = window_geometry(
            H, W, self.window_size, self.shift_size, self.pad_small_map
        )
        y = pad_to_window(self.norm1(x), window)
        Hp, Wp = y.shape[1:3]
        mask = None
        if shift:
            y = torch.roll(y, (-shift, -shift), (1, 2))
            mask = shift_mask(Hp, Wp, window, shift, y.dtype, y.device)
        y = self.attn(y, window, mask)
        if shift:
            y = torch.roll(y, (shift, shift), (1, 2))
        x = x + self.drop_path(y[:, :H, :W])
        return x + self.drop_path(self.mlp(self.norm2(x)))
