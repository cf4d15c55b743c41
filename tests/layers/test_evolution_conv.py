"""EvolutionConv is F.conv2d: the static-kernel evolution."""

import pytest
import torch
import torch.nn.functional as F

from mmevo.layers import EvolutionConv


@pytest.mark.parametrize(
    'channels, groups, kernel_size, stride, padding, dilation, size',
    [
        (6, 6, 3, 1, None, 1, (7, 5)),  # depth-wise, "same"
        (6, 2, 3, 2, None, 1, (7, 8)),  # 3 channels share each kernel
        (4, 1, 5, 1, None, 2, (9, 6)),  # one kernel for all, dilated
        (4, 4, 3, 2, 0, 1, (6, 7)),  # no padding
        (4, 2, 2, 1, 1, 1, (5, 4)),  # even kernel, explicit padding
        (4, 4, 3, 3, 2, 2, (11, 10)),  # everything at once
    ],
)
def test_equals_conv2d(
    channels, groups, kernel_size, stride, padding, dilation, size
):
    torch.manual_seed(0)
    layer = EvolutionConv(
        channels, kernel_size, groups, stride, padding, dilation
    ).double()
    x = torch.randn(2, channels, *size, dtype=torch.float64)
    # Expand the G kernels to one per channel, in contiguous blocks.
    weight = layer.weight.repeat_interleave(channels // groups, 0)[:, None]
    p = dilation * (kernel_size - 1) // 2 if padding is None else padding
    expected = F.conv2d(
        x, weight, layer.bias, stride, p, dilation, groups=channels
    )
    torch.testing.assert_close(layer(x), expected)


def test_reflect_padding_equals_padded_conv2d():
    torch.manual_seed(1)
    layer = EvolutionConv(4, 3, padding_mode='reflect', bias=False).double()
    x = torch.randn(1, 4, 5, 6, dtype=torch.float64)
    expected = F.conv2d(
        F.pad(x, (1, 1, 1, 1), mode='reflect'), layer.weight[:, None], groups=4
    )
    torch.testing.assert_close(layer(x), expected)


def test_kernel_is_static():
    layer = EvolutionConv(4, 3, groups=2)
    kernel = layer.generate_kernel(torch.randn(3, 4, 5, 6))
    assert kernel.shape == (3, 2, 3, 3, 5, 6)
    assert torch.equal(kernel[2, :, :, :, 4, 5], layer.weight)
    assert torch.equal(kernel[0, :, :, :, 0, 0], layer.weight)
