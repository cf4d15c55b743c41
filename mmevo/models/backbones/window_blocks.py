"""Shifted windows: their geometry, the window attention of ELSA-Swin's last
stage and the Swin block around a window attention (ELSA-Swin's last stage,
every ACmix-Swin block). Feature maps are channels-last (B, H, W, C).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath


def round_up(n, multiple):
    """``n`` rounded up to a multiple, as a ceiling division: of a dynamic
    size, ``torch.export`` keeps one floor division, where the padding
    ``(m - n % m) % m`` nests two modulos through every later size (an
    ELSA-Swin block's export took 5x, its AOTInductor compile 11x the
    time)."""
    return (n + multiple - 1) // multiple * multiple


def pad_to_window(x, window_size):
    """Zero-pad (B, H, W, C) at the bottom/right to multiples of the window.

    The detection code pads after ``norm1``; padded tokens are not masked.
    """
    H, W = x.shape[1:3]
    pad_b = round_up(H, window_size) - H
    pad_r = round_up(W, window_size) - W
    if is_symbolic(H, W) or pad_b or pad_r:
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    return x


def crop_window_padding(x, H, W):
    """The top-left H x W of a map :func:`pad_to_window` padded.

    A view, except under ``torch.export`` and ``torch.compile`` (SymInt
    sizes), where it is a negative pad, a copy: the view's strides hold
    the padded width, and tracing records whether it equals W, a guard
    that refuses every size padded unlike the example.
    """
    if isinstance(H, torch.SymInt) or isinstance(W, torch.SymInt):
        return F.pad(x, (0, 0, 0, W - x.shape[2], 0, H - x.shape[1]))
    return x[:, :H, :W]


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


def drop_path_layer(rate):
    """``DropPath(rate)``, or an identity for rate 0."""
    return DropPath(rate) if rate > 0 else nn.Identity()


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
        *,
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
        dim (int): Channels.
        attn (nn.Module): called as ``attn(x, window, mask)`` on the padded,
            rolled (B, Hp, Wp, C) map; returns that shape.
        window_size (int): Default: 7.
        shift (bool): Shift by ``window_size // 2`` (odd blocks).
            Default: False.
        mlp_ratio (float): Default: 4.
        pad_small_map (bool): Default: False.
        drop (float): Dropout of the MLP. Default: 0.
        drop_path (float): Stochastic depth of both branches. Default: 0.
    """

    def __init__(
        self,
        dim,
        attn,
        *,
        window_size=7,
        shift=False,
        mlp_ratio=4.0,
        pad_small_map=False,
        drop=0.0,
        drop_path=0.0,
    ):
        super().__init__()
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self.pad_small_map = pad_small_map
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.drop_path = drop_path_layer(drop_path)
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
        x = x + self.drop_path(crop_window_padding(y, H, W))
        return x + self.drop_path(self.mlp(self.norm2(x)))
