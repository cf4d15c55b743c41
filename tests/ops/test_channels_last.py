"""The aggregation of channels-last tensors, as Inductor's convolutions
leave them in a package: read in place by the C++ kernel (any kernel
layout), the output channels-last on every backend and in the fake kernel
(a compiled graph assumes the fake's strides), equal to the reference."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from mmevo.ops import evolution_aggregate, output_size, use_backend
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference

CL = torch.channels_last

# B, C, G, K, H, W, stride, dilation: odd sizes; groups of 1, 3, 4, 8, 16
# and 24 channels (whole vectors and not, for every instruction set); rows
# whose inner pixels are summed in blocks of 4, 2 and 1 (runs of 1-2, 3-4
# and more vectors), and the pixels past the last whole block.
CASES = [
    (2, 12, 4, 3, 9, 11, 1, 1),
    (1, 48, 3, 5, 13, 10, 2, 1),
    (2, 8, 8, 3, 17, 15, 3, 2),
    (1, 32, 2, 7, 14, 15, 1, 1),
    (1, 72, 3, 3, 5, 7, 1, 3),
    (2, 8, 1, 3, 10, 13, 1, 1),
    (1, 8, 2, 5, 15, 21, 2, 2),
    (1, 16, 1, 3, 11, 19, 1, 1),
]


def inputs(B, C, G, K, H, W, s, d, kernel_layout, dtype=torch.float64):
    p = d * (K - 1) // 2
    Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
    x = torch.randn(B, C, H, W, dtype=dtype).to(memory_format=CL)
    k4 = torch.randn(B, G * K * K, Ho, Wo, dtype=dtype)
    if kernel_layout == 'span-conv':  # a channels-last 1x1 conv's output
        k4 = k4.to(memory_format=CL)
    w = k4.view(B, G, K, K, Ho, Wo)
    if kernel_layout == 'transposed':  # any other strides
        w = w.transpose(4, 5).contiguous().transpose(4, 5)
    return x, w, p


@pytest.mark.parametrize('backend', ['cpp', 'torch'])
@pytest.mark.parametrize(
    'kernel_layout', ['span-conv', 'contiguous', 'transposed']
)
@pytest.mark.parametrize('padding_mode', ['zeros', 'reflect'])
@pytest.mark.parametrize('case', CASES)
def test_channels_last_matches_reference(
    case, padding_mode, kernel_layout, backend
):
    torch.manual_seed(0)
    x, w, p = inputs(*case, kernel_layout)
    s, d = case[6], case[7]
    with use_backend(backend):
        y = evolution_aggregate(x, w, s, p, d, padding_mode)
    assert y.is_contiguous(memory_format=CL) and not y.is_contiguous()
    ref = aggregate_reference(
        x.contiguous(),
        w.contiguous(),
        Window(w.shape[2], s, p, d, padding_mode),
    )
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    'case', [(1, 48, 3, 5, 13, 10, 2, 1), (1, 16, 1, 3, 12, 17, 1, 1)]
)
@pytest.mark.parametrize(
    'dtype', [torch.float32, torch.bfloat16, torch.float16]
)
def test_channels_last_low_precision(dtype, case):
    torch.manual_seed(0)
    x, w, p = inputs(*case, 'span-conv', dtype)
    s = case[6]
    y = evolution_aggregate(x, w, s, p, 1)
    ref = aggregate_reference(
        x.double().contiguous(),
        w.double(),
        Window(w.shape[2], s, p, 1, 'zeros'),
    )
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}[
        dtype
    ]
    assert y.dtype == dtype and y.is_contiguous(memory_format=CL)
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err <= tol, float(err)


def test_channels_last_gradients():
    torch.manual_seed(0)
    x, w, p = inputs(1, 6, 2, 3, 5, 6, 2, 1, 'span-conv')
    x.requires_grad_(), w.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w: evolution_aggregate(x, w, 2, p, 1), (x, w)
    )


def test_channels_last_empty_batch():
    x = torch.randn(0, 8, 7, 9).to(memory_format=CL)
    y = evolution_aggregate(x, torch.randn(0, 2, 3, 3, 7, 9))
    assert y.shape == (0, 8, 7, 9)


@pytest.mark.parametrize('layout', [CL, torch.contiguous_format])
def test_fake_strides_match_the_kernel(layout):
    """The fake kernel's output strides are the real kernel's, for each
    input layout (and a 1x1 map, contiguous in both formats)."""
    for H, W in [(9, 7), (1, 1)]:
        x = torch.randn(2, 8, H, W).to(memory_format=layout)
        w = torch.randn(2, 2 * 9, H, W).to(memory_format=layout)
        w = w.view(2, 2, 3, 3, H, W)
        real = evolution_aggregate(x, w)
        with FakeTensorMode() as mode:
            fake = evolution_aggregate(
                mode.from_tensor(x), mode.from_tensor(w)
            )
        assert fake.stride() == real.stride()
