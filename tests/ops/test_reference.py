"""The oracle at zero-padded borders: an Inf or NaN in the map does not
leak into the padding (a multiplication by a 0/1 mask turned it into NaN
where a convolution reads 0)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference, correlation_reference

K = 3


def _map():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 6, 7, dtype=torch.float64)
    x[0, 0, 0, 0] = float('inf')  # corners and an edge: every border
    x[0, 0, -1, -1] = float('-inf')
    x[0, 0, 2, -1] = float('nan')
    return x


def _out_size(size, stride, padding, dilation):
    return (size + 2 * padding - dilation * (K - 1) - 1) // stride + 1


# dilation 2 with padding 2: windows that skip the border pixel reach into
# the padding on the border's side, where a clamped index fetches it
GEOMETRY = [(1, 1, 1), (1, 2, 2), (2, 2, 2), (1, 3, 1)]


@pytest.mark.parametrize('stride,padding,dilation', GEOMETRY)
@pytest.mark.parametrize('u,v', list(itertools.product(range(K), repeat=2)))
def test_aggregate_is_a_one_hot_convolution(u, v, stride, padding, dilation):
    x = _map()
    weight = torch.zeros(1, 1, K, K, dtype=torch.float64)
    weight[0, 0, u, v] = 1
    expected = F.conv2d(
        x, weight, stride=stride, padding=padding, dilation=dilation
    )
    out_hw = [_out_size(n, stride, padding, dilation) for n in x.shape[-2:]]
    kernel = weight.view(1, 1, K, K, 1, 1).expand(1, 1, K, K, *out_hw)
    out = aggregate_reference(
        x, kernel, Window(K, stride, padding, dilation, 'zeros')
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize('stride,padding,dilation', GEOMETRY)
def test_correlation_reads_zero_padding(stride, padding, dilation):
    # with a query of ones, correlation is the zero-padded window itself:
    # F.unfold, which gathers and never multiplies
    key = _map()
    out_hw = [_out_size(n, stride, padding, dilation) for n in key.shape[-2:]]
    query = torch.ones(1, 1, *out_hw, dtype=torch.float64)
    out = correlation_reference(
        query, key, 1, Window(K, stride, padding, dilation, 'zeros')
    )
    expected = F.unfold(
        key, K, dilation=dilation, padding=padding, stride=stride
    ).view(1, 1, K, K, *out_hw)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
