"""ELSA: Hadamard attention, ghost-head expansion, as the published formula."""

import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import ELSA


def hadamard_attention(layer, x):
    """Published: q * k * scale, (pooled,) attn convs, softmax per head.

    Returns (v, attn) with attn (B * heads, K*K, h, w). ceil_mode pooling is
    the published floor pooling on even sizes and extends it to odd ones.
    """
    q, k, v = torch.split(
        layer.pre_proj(x), (layer.dim_qk, layer.dim_qk, layer.dim_v), 1
    )
    quadratic = q * k * layer.scale
    if layer.stride > 1:
        quadratic = F.avg_pool2d(quadratic, layer.stride, ceil_mode=True)
    attn = layer.attn(quadratic)
    B, _, h, w = attn.shape
    return v, attn.reshape(B * layer.num_heads, -1, h, w).softmax(1)


def published_elsa(layer, x, gh_mul=None, gh_add=None):
    """Published ELSA.forward via its unfold path: filters = mul * attn + add,
    ``mul``/``add`` (dim_v, K, K) per channel (None: ones / zeros)."""
    K, s, d, G = (
        layer.kernel_size,
        layer.stride,
        layer.dilation,
        layer.num_heads,
    )
    v, attn = hadamard_attention(layer, x)
    B, C = v.shape[:2]
    h, w = attn.shape[-2:]
    features = F.unfold(v, K, dilation=d, padding=K // 2 * d, stride=s)
    features = features.reshape(B * G, C // G, K * K, h * w)
    mul = torch.ones(C, K, K, dtype=x.dtype) if gh_mul is None else gh_mul
    add = torch.zeros(C, K, K, dtype=x.dtype) if gh_add is None else gh_add
    filters = mul.expand(B, C, K, K).reshape(
        B * G, C // G, K * K, 1
    ) * attn.reshape(B * G, 1, K * K, h * w) + add.expand(B, C, K, K).reshape(
        B * G, C // G, K * K, 1
    )
    out = (features * filters).sum(2).reshape(B, C, h, w)
    return layer.post_proj(out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize(
    'kernel_size, heads, stride, dilation, size',
    [
        (3, 2, 1, 1, (6, 7)),
        (5, 4, 2, 1, (8, 6)),
        (3, 3, 2, 2, (7, 9)),
    ],
)
def test_no_ghost_head_is_plain_hadamard_attention(
    kernel_size, heads, stride, dilation, size
):
    torch.manual_seed(0)
    layer = ELSA(
        24,
        heads,
        kernel_size=kernel_size,
        stride=stride,
        dilation=dilation,
        lam=0,
        gamma=0,
    ).double()
    assert layer.ghost_head is None
    x = torch.randn(2, 24, *size, dtype=torch.float64)
    kernel = layer.generate_kernel(x)
    assert kernel.shape[1] == heads  # the heads are the groups
    torch.testing.assert_close(layer(x), published_elsa(layer, x))


@pytest.mark.parametrize('lam, gamma', [(1, 1), (0, 1), (1, 0), (2, 0.5)])
def test_ghost_head_expansion(lam, gamma):
    torch.manual_seed(1)
    layer = ELSA(
        16, 2, dim_v=8, kernel_size=3, stride=2, lam=lam, gamma=gamma
    ).double()
    with torch.no_grad():
        layer.ghost_head.normal_()
    x = torch.randn(2, 16, 6, 8, dtype=torch.float64)
    gh = layer.ghost_head
    M = A = None
    if lam != 0 and gamma != 0:
        M, A = gh[0, 0] ** lam, gh[1, 0] * gamma
    elif gamma != 0:
        A = gh[0] * gamma
    else:
        M = gh[0] ** lam
    torch.testing.assert_close(layer(x), published_elsa(layer, x, M, A))
    # The kernel itself: W[c] = M[c]**lam * attn[head(c)] + gamma * A[c].
    _, attn = hadamard_attention(layer, x)
    attn = attn.view(2, 2, 1, 3, 3, 3, 4)
    M = torch.ones(8, 3, 3, dtype=x.dtype) if M is None else M
    A = torch.zeros(8, 3, 3, dtype=x.dtype) if A is None else A
    expected = (
        M.view(1, 2, 4, 3, 3, 1, 1) * attn + A.view(1, 2, 4, 3, 3, 1, 1)
    ).view(2, 8, 3, 3, 3, 4)
    torch.testing.assert_close(layer.generate_kernel(x), expected)


def test_published_parameter_layout():
    layer = ELSA(96, 3, kernel_size=5)
    assert layer.dim_qk == 64 and layer.dim_v == 96
    assert layer.ghost_head.shape == (2, 1, 96, 5, 5)
    assert layer.pre_proj.weight.shape == (64 * 2 + 96, 96, 1, 1)
    assert layer.attn[0].groups == 8
    assert layer.attn[2].weight.shape == (25 * 3, 64, 1, 1)
    assert layer.post_proj.weight.shape == (96, 96)
    assert ELSA(96, 3, dim_qk=20).dim_qk == 24  # rounded to group_width


@pytest.mark.parametrize(
    'args,message',
    [
        (dict(dim_qk=0), r'dim_qk must be >= 1, got 0'),
        (dict(dim_qk=-8), r'dim_qk must be >= 1, got -8'),
        (dict(dim_v=0), r'dim_v must be >= 1, got 0'),
        (dict(dim_v=-24), r'dim_v must be >= 1, got -24'),
        (dict(num_heads=0), r'num_heads must be >= 1, got 0'),
        (dict(num_heads=-2), r'num_heads must be >= 1, got -2'),
        (dict(group_width=0), r'group_width must be >= 1, got 0'),
        (dict(groups=0), r'groups must be >= 1, got 0'),
        (dict(groups=-1), r'groups must be >= 1, got -1'),
        (
            dict(dim=2, num_heads=1),
            r'dim_qk defaults to dim // 3 \* 2, which is '
            r'0 for dim=2: pass dim_qk >= 1',
        ),
    ],
)
def test_bad_sizes_are_refused(args, message):
    """0 and negative sizes raise; none is silently replaced by a default."""
    with pytest.raises(ValueError, match=message):
        ELSA(**dict(dict(dim=24, num_heads=2, kernel_size=3), **args))


def test_given_sizes_are_kept():
    layer = ELSA(24, 2, dim_qk=8, dim_v=12, kernel_size=3, qk_scale=0.0)
    assert (layer.dim_qk, layer.dim_v, layer.scale) == (8, 12, 0.0)
    assert ELSA(2, 1, dim_qk=1, kernel_size=3).dim_qk == 8  # whole groups
