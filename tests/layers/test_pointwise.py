"""The matmul 1x1 convolution against F.conv2d: values and every gradient."""
import pytest
import torch
import torch.nn.functional as F

from mmevo.layers.pointwise import _SINGLE_MATMUL_PIXELS, pointwise


# Both weight-gradient paths: fewer pixels than the threshold and more.
@pytest.mark.parametrize('size', [(1, 1), (7, 7), (3, 50), (13, 11)])
@pytest.mark.parametrize('bias', [True, False])
def test_equals_conv2d_with_gradients(size, bias):
    assert 7 * 7 < _SINGLE_MATMUL_PIXELS < 13 * 11
    gen = torch.Generator().manual_seed(size[0])
    x = torch.randn(3, 6, *size, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    w = torch.randn(5, 6, 1, 1, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    b = torch.randn(5, generator=gen, dtype=torch.float64,
                    requires_grad=True) if bias else None
    inputs = [t for t in (x, w, b) if t is not None]
    g = torch.randn(3, 5, *size, generator=gen, dtype=torch.float64)
    ours = pointwise(x, w, b)
    ref = F.conv2d(x, w, b)
    torch.testing.assert_close(ours, ref)
    for a, r in zip(torch.autograd.grad(ours, inputs, g),
                    torch.autograd.grad(ref, inputs, g)):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradgradcheck(pointwise, (x, w, b), fast_mode=True)


def test_autocast_bf16():
    """Under CPU autocast it computes in bf16; gradients keep their dtypes."""
    x = torch.randn(2, 8, 5, 4, requires_grad=True)
    conv = torch.nn.Conv2d(8, 3, 1)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = pointwise(x, conv.weight, conv.bias)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == conv.weight.grad.dtype == torch.float32
    torch.testing.assert_close(y.float(), conv(x), atol=5e-2, rtol=2e-2)
