"""DynamicFilter equals the DDF formula (spatial x channel filter)."""

import math

import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import DynamicFilter


def normalise(t, dim):
    t = t - t.mean(dim=dim, keepdim=True)
    return t / (t.std(dim=dim, keepdim=True) + 1e-10)


def ddf_reference(layer, x):
    """DDFPack.forward: filter branches, FilterNorm, the DDF op by unfold."""
    K, s, d = layer.kernel_size, layer.stride, layer.dilation
    B, C, _H, _W = x.shape
    gain = math.sqrt(2) / K  # calculate_gain('relu') / K
    spatial_convs = [
        m for m in layer.spatial_branch if isinstance(m, torch.nn.Conv2d)
    ]
    spatial = x
    for conv in spatial_convs:
        spatial = conv(spatial)
    spatial = normalise(spatial, 1) * gain  # (B, K*K, h, w)
    convs = [m for m in layer.channel_branch if isinstance(m, torch.nn.Conv2d)]
    pooled = x.mean(dim=(2, 3), keepdim=True)
    channel = convs[1](F.relu(convs[0](pooled))).view(B, C, K * K)
    channel = normalise(channel, 2).view(B, C * K * K)
    channel = (channel * layer.channel_branch[-1].std).view(B, C, K * K, 1)
    h, w = spatial.shape[-2:]
    spatial = spatial.view(B, 1, K * K, h * w)
    if layer.kernel_combine == 'mul':
        filters = channel * spatial
    else:
        filters = channel + spatial
    windows = F.unfold(x, K, d, d * (K - 1) // 2, s).view(B, C, K * K, h * w)
    return (windows * filters).sum(2).view(B, C, h, w)


@pytest.mark.parametrize(
    'kernel_size, stride, dilation, gen_kernel_size, combine, size',
    [
        (3, 1, 1, 1, 'mul', (6, 7)),
        (3, 2, 1, 1, 'add', (8, 6)),
        (5, 1, 2, 3, 'mul', (7, 9)),
        (3, 2, 1, 3, 'add', (7, 5)),
    ],
)
def test_equals_ddf_formula(
    kernel_size, stride, dilation, gen_kernel_size, combine, size
):
    torch.manual_seed(0)
    layer = DynamicFilter(
        10,
        kernel_size,
        stride,
        dilation,
        gen_kernel_size=gen_kernel_size,
        kernel_combine=combine,
    ).double()
    x = torch.randn(2, 10, *size, dtype=torch.float64)
    torch.testing.assert_close(layer(x), ddf_reference(layer, x))


def test_published_names():
    names = {k for k, _ in DynamicFilter(16).named_parameters()}
    assert names == {
        'spatial_branch.0.weight',
        'spatial_branch.0.bias',
        'channel_branch.1.weight',
        'channel_branch.1.bias',
        'channel_branch.3.weight',
        'channel_branch.3.bias',
        'channel_branch.4.std',
    }
