"""Involution equals the published (unfold) formula; works on every size."""

import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import Involution


def published_involution(layer, x, ceil_mode=False):
    """The published ``involution_naive.forward``, written with unfold.

    The published code pools with floor; ``ceil_mode=True`` is the same
    formula with a kernel row for the last, partial window (odd sizes).
    """
    K, s, d = layer.kernel_size, layer.stride, layer.dilation
    G, gc, C = layer.groups, layer.group_channels, layer.channels
    pooled = x if s == 1 else F.avg_pool2d(x, s, s, ceil_mode=ceil_mode)
    weight = layer.conv2(layer.conv1(pooled))
    b, _, h, w = weight.shape
    weight = weight.view(b, G, K * K, h, w).unsqueeze(2)
    windows = F.unfold(x, K, d, d * (K - 1) // 2, s).view(
        b, G, gc, K * K, h, w
    )
    return (weight * windows).sum(dim=3).view(b, C, h, w)


@pytest.mark.parametrize(
    'channels, kernel_size, stride, dilation, size',
    [
        (32, 7, 1, 1, (8, 10)),
        (32, 7, 2, 1, (8, 12)),
        (16, 3, 1, 2, (9, 7)),
        (32, 5, 2, 2, (10, 6)),
    ],
)
def test_equals_published_on_even_sizes(
    channels, kernel_size, stride, dilation, size
):
    torch.manual_seed(0)
    layer = (
        Involution(channels, kernel_size, stride, dilation=dilation)
        .double()
        .eval()
    )
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    torch.testing.assert_close(layer(x), published_involution(layer, x))


def test_train_mode_batch_norm_matches_too():
    torch.manual_seed(1)
    layer = Involution(16, 3, 2).double().train()
    x = torch.randn(2, 16, 6, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x), published_involution(layer, x))


@pytest.mark.parametrize('size', [(7, 9), (5, 4), (1, 1), (2, 3), (3, 1)])
def test_odd_sizes_with_stride_two(size):
    torch.manual_seed(2)
    layer = Involution(16, 3, 2).double().eval()
    x = torch.randn(1, 16, *size, dtype=torch.float64)
    out = layer(x)
    expected_hw = tuple(-(-n // 2) for n in size)  # ceil(n / 2)
    assert out.shape == (1, 16, *expected_hw)
    assert layer.generate_kernel(x).shape[-2:] == expected_hw
    torch.testing.assert_close(
        out, published_involution(layer, x, ceil_mode=True)
    )


def test_published_names_and_shapes():
    """The keys of the published RedNet stem involution (32 channels, K=7)."""
    layer = Involution(32, 7)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        'conv1.conv.weight': (8, 32, 1, 1),
        'conv1.bn.weight': (8,),
        'conv1.bn.bias': (8,),
        'conv1.bn.running_mean': (8,),
        'conv1.bn.running_var': (8,),
        'conv1.bn.num_batches_tracked': (),
        'conv2.conv.weight': (98, 8, 1, 1),
        'conv2.conv.bias': (98,),
    }


def test_stride_pooling_is_a_module_hooks_see():
    """As the published involution's ``avgpool``: a forward hook sees the
    ceil-mode pooling the kernel is generated from."""
    layer = Involution(16, 3, 2).eval()
    assert isinstance(layer.avgpool, torch.nn.AvgPool2d)
    assert not hasattr(Involution(16, 3), 'avgpool')
    seen = []
    layer.avgpool.register_forward_hook(
        lambda m, args, out: seen.append(out.shape)
    )
    layer(torch.randn(1, 16, 7, 4))
    assert seen == [(1, 16, 4, 2)]


def test_kernel_layout_is_group_major_then_row_major():
    """A kernel that is one-hot at (u, v) for one group shifts that group."""
    torch.manual_seed(3)
    layer = Involution(32, 3).double().eval()
    with torch.no_grad():
        layer.conv2.conv.weight.zero_()
        layer.conv2.conv.bias.zero_()
        # group 1, window position (0, 2): channel 1*9 + 0*3 + 2 = 11
        layer.conv2.conv.bias[11] = 1.0
    x = torch.randn(1, 32, 5, 6, dtype=torch.float64)
    out = layer(x)
    assert out[:, :16].abs().max() == 0
    # tap (0, 2) reads x[i - 1, j + 1]
    shifted = F.pad(x[:, 16:], (0, 1, 1, 0))[:, :, :5, 1:]
    torch.testing.assert_close(out[:, 16:], shifted)
