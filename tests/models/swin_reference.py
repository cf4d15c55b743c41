"""Float64 derivations of the official ELSA-Swin / ACmix-Swin formulas.

Written from the papers' equations and the facts of the authors' code listed
in ``docs/reference/swin_family.md`` (damo-cv/ELSA f3b7ac7, LeapLabTHU/ACmix
81dddb6), with torch primitives only: window by window, offset by offset,
without mmevo's modules. ``p`` is a state dict of one block or one model,
in the official key names.
"""

import math

import torch
import torch.nn.functional as F


def layer_norm(x, p, name):
    return F.layer_norm(
        x, x.shape[-1:], p[f'{name}.weight'], p[f'{name}.bias'], 1e-5
    )


def linear(x, p, name):
    y = x @ p[f'{name}.weight'].T
    bias = p.get(f'{name}.bias')
    return y if bias is None else y + bias


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def mlp(x, p):
    return linear(gelu(linear(x, p, 'mlp.fc1')), p, 'mlp.fc2')


def elsa_block(x, p, num_heads, group_width, kernel_size=7):
    """ELSA block on NHWC ``x``: scale-1 Hadamard attention, softmax over the
    K*K taps per head, filter = attention of the channel's head + additive
    ghost head, unfold-sum with zero padding, post_proj, MLP."""
    B, H, W, C = x.shape
    K = kernel_size
    dim_qk = math.ceil((C // 3 * 2) / group_width) * group_width
    y = layer_norm(x, p, 'norm1').permute(0, 3, 1, 2)
    qkv = torch.einsum(
        'bchw,oc->bohw', y, p['attn.pre_proj.weight'][:, :, 0, 0]
    )
    qkv = qkv + p['attn.pre_proj.bias'][:, None, None]
    q, k, v = qkv.split([dim_qk, dim_qk, C], 1)
    h = F.conv2d(
        q * k,
        p['attn.attn.0.weight'],
        p['attn.attn.0.bias'],
        padding=K // 2,
        groups=dim_qk // group_width,
    )
    logits = torch.einsum(
        'bchw,oc->bohw', gelu(h), p['attn.attn.2.weight'][:, :, 0, 0]
    )
    logits = logits + p['attn.attn.2.bias'][:, None, None]
    attn = logits.view(B, num_heads, K * K, H, W).softmax(2)
    head_of = torch.arange(C) // (C // num_heads)
    ghost = p['attn.ghost_head'][0].reshape(C, K * K)
    filters = attn[:, head_of] + ghost[None, :, :, None, None]
    patches = F.unfold(v, K, padding=K // 2).view(B, C, K * K, H, W)
    out = (patches * filters).sum(2).permute(0, 2, 3, 1)
    x = x + linear(out, p, 'attn.post_proj')
    return x + mlp(layer_norm(x, p, 'norm2'), p)


def _offset_index(di, dj, table):
    return (di + table - 1) * (2 * table - 1) + (dj + table - 1)


def window_block(
    x, p, num_heads, window_size, shift, pad_small_map, layout, qk_scale=None
):
    """Shifted-window block on NHWC ``x``, ``layout`` 'elsa' (stage 4 of
    ELSA-Swin: chunks v, q, k; ``rb[h, offset(key - query)]``) or 'acmix'
    (chunks q, k, v; ``table[offset(query - key), h]``; plus the conv path
    on the whole padded, rolled map, mixed with rate1/rate2)."""
    B, H, W, C = x.shape
    d = C // num_heads
    scale = qk_scale or d**-0.5
    ws, s = window_size, (window_size // 2 if shift else 0)
    if not pad_small_map and min(H, W) <= ws:
        ws, s = min(H, W), 0
    y = layer_norm(x, p, 'norm1')
    Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws
    y = F.pad(y, (0, 0, 0, Wp - W, 0, Hp - H))
    if s:
        y = torch.roll(y, (-s, -s), (1, 2))

    def region(i, n):
        return 0 if i < n - ws else (1 if i < n - s else 2)

    name = 'attn.pre_proj' if layout == 'elsa' else 'attn.qkv'
    qkv_map = linear(y, p, name)
    if layout == 'elsa':
        table = round(math.sqrt(p['attn.rb'].shape[1]) + 1) // 2
    else:
        table = (
            round(
                math.sqrt(p['attn.relative_position_bias_table'].shape[0]) + 1
            )
            // 2
        )
    out = torch.zeros_like(y)
    N = ws * ws
    cells = [(i, j) for i in range(ws) for j in range(ws)]
    bias = torch.zeros(num_heads, N, N, dtype=x.dtype)
    for a, (qi, qj) in enumerate(cells):
        for b, (ki, kj) in enumerate(cells):
            if layout == 'elsa':
                bias[:, a, b] = p['attn.rb'][
                    :, _offset_index(ki - qi, kj - qj, table)
                ]
            else:
                bias[:, a, b] = p['attn.relative_position_bias_table'][
                    _offset_index(qi - ki, qj - kj, table)
                ]
    for r0 in range(0, Hp, ws):
        for c0 in range(0, Wp, ws):
            t = qkv_map[:, r0 : r0 + ws, c0 : c0 + ws].reshape(
                B, N, 3, num_heads, d
            )
            if layout == 'elsa':
                v, q, k = t.unbind(2)
            else:
                q, k, v = t.unbind(2)
            logits = torch.einsum('bnhd,bmhd->bhnm', q, k) * scale + bias
            if s:
                labels = torch.tensor(
                    [
                        region(r0 + i, Hp) * 3 + region(c0 + j, Wp)
                        for i, j in cells
                    ]
                )
                differ = labels[:, None] != labels[None, :]
                logits = logits - 100.0 * differ.to(x.dtype)
            o = torch.einsum('bhnm,bmhd->bnhd', logits.softmax(-1), v)
            name = 'attn.post_proj' if layout == 'elsa' else 'attn.proj'
            o = linear(o.reshape(B, N, C), p, name)
            out[:, r0 : r0 + ws, c0 : c0 + ws] = o.view(B, ws, ws, C)
    if layout == 'acmix':
        # fc over the 3 * heads (q, k, v) heads, output channel d * 9 + tap
        heads = qkv_map.view(B, Hp, Wp, 3 * num_heads, d)
        mixed = torch.einsum(
            'bxyjd,tj->bdtxy', heads, p['attn.fc.weight'][:, :, 0, 0]
        )
        mixed = mixed + p['attn.fc.bias'][None, None, :, None, None]
        conv = F.conv2d(
            mixed.reshape(B, d * 9, Hp, Wp),
            p['attn.dep_conv.weight'],
            padding=1,
            groups=d,
        ).permute(0, 2, 3, 1)
        out = p['attn.rate1'] * out + p['attn.rate2'] * conv
    if s:
        out = torch.roll(out, (s, s), (1, 2))
    x = x + out[:, :H, :W]
    return x + mlp(layer_norm(x, p, 'norm2'), p)


def patch_merging(x, p):
    H, W = x.shape[1:3]
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
    return linear(layer_norm(x, p, 'norm'), p, 'reduction')


def sub(p, prefix):
    return {k[len(prefix) :]: v for k, v in p.items() if k.startswith(prefix)}


def swin_model(
    img,
    p,
    depths,
    num_heads,
    family,
    group_width=4,
    window_size=7,
    pad_small_map=False,
    out_indices=(0, 1, 2, 3),
):
    """Whole backbone: patch embedding (zero-padded to 4), stages, a norm
    per output (``norm{i}``; ``norm`` of a classifier is ``norm3``)."""
    H, W = img.shape[2:]
    img = F.pad(img, (0, -W % 4, 0, -H % 4))
    x = F.conv2d(
        img, p['patch_embed.proj.weight'], p['patch_embed.proj.bias'], stride=4
    ).permute(0, 2, 3, 1)
    x = layer_norm(x, p, 'patch_embed.norm')
    outs = []
    for i, depth in enumerate(depths):
        for j in range(depth):
            bp = sub(p, f'layers.{i}.blocks.{j}.')
            if family == 'elsa' and i < 3:
                x = elsa_block(x, bp, num_heads[i], group_width)
            else:
                x = window_block(
                    x,
                    bp,
                    num_heads[i],
                    window_size,
                    j % 2,
                    pad_small_map,
                    family,
                )
        if i in out_indices:
            outs.append(layer_norm(x, p, f'norm{i}').permute(0, 3, 1, 2))
        if i < 3:
            x = patch_merging(x, sub(p, f'layers.{i}.downsample.'))
    return outs


def randomised(module, seed=0, std=0.2):
    """Perturb every parameter (so that zero biases or unit norms hide
    nothing) and return the float64 state dict."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn(param.shape, generator=g) * std)
    return {k: v.double() for k, v in module.state_dict().items()}
