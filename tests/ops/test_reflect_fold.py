"""The transpose of reflect padding (the input gradient) in low precision.

When the padding is not smaller than the map, it reflects repeatedly and a
pixel receives up to ``(1 + 2 * padding)**2`` gradient terms; they are summed
in fp32, so the bf16 / fp16 gradient is the float64 one up to a few ulps.
"""

import pytest
import torch

from mmevo.ops import evolution_aggregate
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference


@pytest.mark.parametrize(
    'dtype, ulp', [(torch.bfloat16, 2**-8), (torch.float16, 2**-11)]
)
@pytest.mark.parametrize('size', [(1, 1), (2, 3)])
def test_reflect_fold_low_precision(dtype, ulp, size):
    gen = torch.Generator().manual_seed(0)
    K, d = 7, 3
    p = d * (K - 1) // 2  # 9: reflected many times on a 1x1 or 2x3 map
    x = torch.randn(2, 4, *size, generator=gen).to(dtype)
    w = (torch.randn(2, 2, K, K, *size, generator=gen) / K).to(dtype)
    gy = torch.randn(2, 4, *size, generator=gen).to(dtype)
    xr = x.requires_grad_()
    (gx,) = torch.autograd.grad(
        evolution_aggregate(xr, w, 1, p, d, 'reflect'), xr, gy
    )
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(
        aggregate_reference(x64, w.double(), Window(K, 1, p, d, 'reflect')),
        x64,
        gy.double(),
    )
    err = (gx.double() - ref).abs().max() / ref.abs().max()
    assert err <= 2 * ulp
