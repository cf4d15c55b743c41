"""LocalSelfAttention: the SASA formula; convolution as a special case."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import LocalSelfAttention


def pad(x, p, mode):
    if mode == 'zeros':
        return F.pad(x, (p, p, p, p))
    widths = ((0, 0), (0, 0), (p, p), (p, p))
    return torch.from_numpy(np.pad(x.detach().numpy(), widths, mode='reflect'))


def sasa_reference(layer, x):
    """logits = q . (k(n) + r(n - i)) + b(n - i), softmax, sum v; by unfold."""
    K, s, d, G = (
        layer.kernel_size,
        layer.stride,
        layer.dilation,
        layer.num_heads,
    )
    p = d * (K - 1) // 2
    q = layer.query(x)[:, :, ::s, ::s] * layer.scale
    k, v = layer.key(x), layer.value(x)
    B, C, Ho, Wo = q.shape
    D = C // G

    def windows(t):
        return F.unfold(
            pad(t, p, layer.padding_mode), K, dilation=d, stride=s
        ).view(B, G, D, K * K, Ho, Wo)

    r = torch.zeros(C, K, K, dtype=x.dtype)
    if layer.rel_h is not None:
        half = C // 2
        for c in range(C):
            for u in range(K):
                for w in range(K):
                    r[c, u, w] = (
                        layer.rel_h[c, u]
                        if c < half
                        else layer.rel_w[c - half, w]
                    )
    logits = (
        q.view(B, G, D, 1, Ho, Wo) * (windows(k) + r.view(G, D, K * K, 1, 1))
    ).sum(2)
    if layer.rel_pos_bias is not None:
        logits = logits + layer.rel_pos_bias.view(1, G, K * K, 1, 1)
    att = logits.softmax(2)
    return (att.unsqueeze(2) * windows(v)).sum(3).view(B, C, Ho, Wo)


@pytest.mark.parametrize(
    'channels, heads, kernel_size, stride, dilation, mode, bias, size',
    [
        (8, 2, 3, 1, 1, 'zeros', False, (6, 7)),
        (8, 4, 5, 2, 1, 'zeros', True, (7, 8)),
        (12, 3, 3, 2, 2, 'reflect', True, (9, 6)),
        (8, 2, 7, 1, 1, 'reflect', False, (2, 3)),
        (8, 8, 3, 2, 1, 'zeros', False, (1, 1)),
    ],
)
def test_equals_sasa_formula(
    channels, heads, kernel_size, stride, dilation, mode, bias, size
):
    torch.manual_seed(0)
    layer = LocalSelfAttention(
        channels,
        kernel_size=kernel_size,
        num_heads=heads,
        stride=stride,
        dilation=dilation,
        padding_mode=mode,
        qkv_bias=True,
        rel_pos_bias=bias,
    ).double()
    if bias:
        with torch.no_grad():
            layer.rel_pos_bias.normal_()
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    torch.testing.assert_close(layer(x), sasa_reference(layer, x))


@pytest.mark.parametrize(
    'mode, stride, dilation',
    [('zeros', 1, 1), ('zeros', 2, 2), ('reflect', 2, 1)],
)
def test_zero_qk_is_static_depthwise_conv(mode, stride, dilation):
    """W_Q = W_K = 0, relative bias only: a fixed softmax(b) per head."""
    torch.manual_seed(1)
    C, G, K = 12, 3, 5
    layer = LocalSelfAttention(
        C,
        kernel_size=K,
        num_heads=G,
        stride=stride,
        dilation=dilation,
        padding_mode=mode,
        rel_pos_embed=False,
        rel_pos_bias=True,
    ).double()
    with torch.no_grad():
        layer.query.weight.zero_()
        layer.key.weight.zero_()
        layer.rel_pos_bias.normal_()
    x = torch.randn(2, C, 9, 8, dtype=torch.float64)
    kernel = layer.rel_pos_bias.view(G, K * K).softmax(1).view(G, 1, K, K)
    weight = kernel.repeat_interleave(C // G, 0)  # shared within a head
    p = dilation * (K - 1) // 2
    v = pad(layer.value(x), p, mode)
    expected = F.conv2d(v, weight, stride=stride, dilation=dilation, groups=C)
    torch.testing.assert_close(layer(x), expected)
