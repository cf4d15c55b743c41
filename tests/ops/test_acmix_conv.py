"""``mmevo::acmix_conv`` (ACmix's grouped conv path on its channels-last
q/k/v buffer, groups interleaved) and ``mmevo::acmix_add_heads_`` against
plain PyTorch in float64: ``F.conv2d`` of the group-major copy and its
autograd gradients, and strided ``add_`` of the attention's gradients.
Seeded sweeps over odd sizes, strides, kernel sizes, group counts that do
not fill a vector, empty batches, every dtype and instruction set."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from mmevo.ops import cpp_backend

pytestmark = pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)

ops = torch.ops.mmevo

# (B, J, G, O, H, W, k, stride): ACmix-ResNet-50's group shape (12 -> 4) at
# 16 and 32 groups, group counts below, across and past a vector (float32:
# 16 lanes with AVX-512, 8 with AVX2), odd J and O, 1 x 1 maps, k 1 and 5,
# strides 2 and 3 on odd sizes.
GEOMETRIES = [
    (2, 12, 16, 4, 7, 9, 3, 1),
    (1, 12, 32, 4, 8, 8, 3, 2),
    (2, 5, 3, 3, 5, 6, 3, 1),
    (1, 7, 19, 5, 6, 5, 3, 2),
    (3, 3, 2, 1, 1, 1, 3, 1),
    (1, 12, 17, 4, 9, 11, 5, 2),
    (1, 2, 1, 2, 4, 3, 1, 1),
    (2, 12, 9, 4, 5, 4, 3, 3),
    (1, 4, 24, 6, 3, 7, 3, 1),
    (1, 3, 16, 2, 6, 9, 5, 2),
    (2, 4, 8, 3, 4, 13, 5, 1),
]


def group_major(x, groups):
    """The channels j * G + g of x as the g * J + j of a grouped conv."""
    return x.unflatten(1, (-1, groups)).transpose(1, 2).flatten(1, 2)


def reference(x, w, groups, stride, padding, gy):
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = F.conv2d(group_major(x, groups), w, None, stride, padding, 1, groups)
    gx, gw = torch.autograd.grad(y, (x, w), gy)
    return y.detach(), gx, gw


def inputs(B, J, G, n_out, H, W, k, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, W, J * G, generator=gen, dtype=dtype)
    w = torch.randn(G * n_out, J, k, k, generator=gen, dtype=dtype)
    return x.permute(0, 3, 1, 2), w


@pytest.mark.parametrize('geometry', GEOMETRIES)
def test_conv_and_gradients_equal_grouped_conv(geometry):
    B, J, G, n_out, H, W, k, s = geometry
    x, w = inputs(B, J, G, n_out, H, W, k)
    p = k // 2
    y = ops.acmix_conv(x, w, G, s, p)
    gy = torch.randn_like(y)
    y_ref, gx_ref, gw_ref = reference(x, w, G, s, p, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    assert y.is_contiguous()
    for mask in ([True, True], [True, False], [False, True]):
        gx, gw = ops.acmix_conv_backward(gy, x, w, G, s, p, mask)
        if mask[0]:
            torch.testing.assert_close(gx, gx_ref, rtol=1e-10, atol=1e-10)
            # the buffer's layout, so that the layer adds in place
            assert gx.is_contiguous(memory_format=torch.channels_last)
        else:
            assert gx is None
        if mask[1]:
            torch.testing.assert_close(gw, gw_ref, rtol=1e-10, atol=1e-10)
        else:
            assert gw is None


@pytest.mark.parametrize('groups', [5, 8])
def test_any_input_layout_and_padding(groups):
    """NCHW inputs and a grad of any layout give the same numbers; padding
    need not be k // 2 (with groups that fill whole vectors, read in place,
    or not, copied)."""
    x, w = inputs(2, 6, groups, 3, 7, 6, 3)
    for p in (0, 2, 4):
        Ho, Wo = (7 + 2 * p - 3) // 2 + 1, (6 + 2 * p - 3) // 2 + 1
        gy = torch.randn(2, 3 * groups, Ho, Wo, dtype=torch.float64)
        y_ref, gx_ref, gw_ref = reference(x, w, groups, 2, p, gy)
        for xi in (x, x.contiguous()):
            y = ops.acmix_conv(xi, w, groups, 2, p)
            torch.testing.assert_close(y, y_ref)
        gx, gw = ops.acmix_conv_backward(
            gy.contiguous(memory_format=torch.channels_last),
            x.contiguous(),
            w,
            groups,
            2,
            p,
            [True, True],
        )
        torch.testing.assert_close(gx, gx_ref)
        torch.testing.assert_close(gw, gw_ref)


@pytest.mark.parametrize(
    'dtype, tol',
    [(torch.float32, 1e-4), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)],
)
def test_low_precision_against_float64(dtype, tol):
    """float32 and bf16 / fp16 (accumulated in float32) against float64,
    relative to the sums' scale."""
    x, w = inputs(2, 12, 16, 4, 9, 7, 3)
    gy = torch.randn(2, 64, 9, 7, dtype=torch.float64)
    y_ref, gx_ref, gw_ref = reference(x, w, 16, 1, 1, gy)
    y = ops.acmix_conv(x.to(dtype), w.to(dtype), 16, 1, 1)
    gx, gw = ops.acmix_conv_backward(
        gy.to(dtype), x.to(dtype), w.to(dtype), 16, 1, 1, [True, True]
    )
    for got, want in ((y, y_ref), (gx, gx_ref), (gw, gw_ref)):
        assert got.dtype == dtype
        scale = float(want.abs().max())
        torch.testing.assert_close(
            got.double(), want, rtol=tol, atol=tol * scale
        )


def test_empty_batch():
    x, w = inputs(0, 12, 16, 4, 5, 5, 3)
    y = ops.acmix_conv(x, w, 16, 2, 1)
    assert y.shape == (0, 64, 3, 3)
    gx, gw = ops.acmix_conv_backward(y, x, w, 16, 2, 1, [True, True])
    assert gx.shape == x.shape
    assert torch.equal(gw, torch.zeros_like(w))


def test_same_bits_for_any_thread_count():
    """The weight gradient sums its tasks' partial sums in task order."""
    x, w = inputs(3, 12, 16, 4, 13, 11, 3, dtype=torch.float32)
    gy = torch.randn(3, 64, 13, 11)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.acmix_conv_backward(gy, x, w, 16, 1, 1, [True, True])
        torch.set_num_threads(2)
        two = ops.acmix_conv_backward(gy, x, w, 16, 1, 1, [True, True])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    'call, error, match',
    [
        (
            lambda x, w: ops.acmix_conv(x[:, :-1], w, 16, 1, 1),
            ValueError,
            'input must have J \\* G = 192 channels',
        ),
        (
            lambda x, w: ops.acmix_conv(x, w[..., 0], 16, 1, 1),
            ValueError,
            'weight must be \\(G \\* O, J, k, k\\)',
        ),
        (
            lambda x, w: ops.acmix_conv(x, w[:-1], 16, 1, 1),
            ValueError,
            'weight must be \\(G \\* O, J, k, k\\) with G = groups = 16',
        ),
        (
            lambda x, w: ops.acmix_conv(x, w.float(), 16, 1, 1),
            TypeError,
            'input and weight must have the same dtype',
        ),
        (
            lambda x, w: ops.acmix_conv(x.long(), w.long(), 16, 1, 1),
            TypeError,
            'input must be a floating point tensor',
        ),
        (
            lambda x, w: ops.acmix_conv(x, w, 16, 0, 1),
            ValueError,
            'stride must be >= 1',
        ),
        (
            lambda x, w: ops.acmix_conv(x, w, 16, 1, -1),
            ValueError,
            'padding must be >= 0',
        ),
        (
            lambda x, w: ops.acmix_conv(x[..., :1, :1], w, 16, 1, 0),
            ValueError,
            'input height of 1 is too small for kernel_size=3',
        ),
        (
            lambda x, w: ops.acmix_conv_backward(
                torch.zeros(2, 64, 5, 4, dtype=x.dtype),
                x,
                w,
                16,
                1,
                1,
                [True, True],
            ),
            ValueError,
            'grad must be \\(B, G \\* O, H_out, W_out\\) = \\(2, 64, 5, 5\\)',
        ),
    ],
)
def test_bad_arguments_name_the_argument(call, error, match):
    x, w = inputs(2, 12, 16, 4, 5, 5, 3)
    with pytest.raises(error, match=match):
        call(x, w)


@pytest.mark.parametrize('shape', [(2, 6, 7, 5), (2, 37, 5, 35)], ids=str)
@pytest.mark.parametrize('stride', [1, 2, 3])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_add_heads_equals_strided_adds(shape, stride, dtype):
    """Every element added once, exactly: the second shape has whole
    tiles of V channels by V pixels (transposed in registers, V = 2 to 16
    by dtype and instruction set) and channels and pixels past them."""
    B, C, H, W = shape
    Ho, Wo = -(-H // stride), -(-W // stride)
    gen = torch.Generator().manual_seed(stride)
    grad = torch.randn(B, H, W, 3, C, generator=gen, dtype=dtype)
    gq = torch.randn(B, C, Ho, Wo, generator=gen, dtype=dtype)
    gk, gv = (
        torch.randn(B, C, H, W, generator=gen, dtype=dtype) for _ in '12'
    )
    want = grad.clone()
    rows = want.permute(0, 3, 4, 1, 2)  # (B, 3, C, H, W)
    rows[:, 0, :, ::stride, ::stride] += gq
    rows[:, 1] += gk
    rows[:, 2] += gv
    ops.acmix_add_heads_(grad, gq, gk, gv, stride)
    torch.testing.assert_close(grad, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match='g_query must be'):
        ops.acmix_add_heads_(grad, gk, gk, gv, 2 if stride == 1 else stride)
    with pytest.raises(ValueError, match='grad must be a contiguous'):
        ops.acmix_add_heads_(grad[:, :-1], gq, gk, gv, stride)
    with pytest.raises(TypeError, match='grad and g_value must have the same'):
        ops.acmix_add_heads_(grad, gq, gk, gv.half(), stride)


SCRIPT = r"""
import sys
import torch, torch.nn.functional as F
from mmevo.ops import cpp_backend
sys.path.insert(0, {here!r})
from test_acmix_conv import test_add_heads_equals_strided_adds
assert cpp_backend.isa() == {isa!r}, cpp_backend.isa()
torch.manual_seed(0)
for B, J, G, O, H, W, k, s in {geometries!r}:
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        x = torch.randn(B, H, W, J * G, dtype=dtype).permute(0, 3, 1, 2)
        w = torch.randn(G * O, J, k, k, dtype=dtype)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        xs = xr.unflatten(1, (J, G)).transpose(1, 2).flatten(1, 2)
        y_ref = F.conv2d(xs, wr, None, s, k // 2, 1, G)
        gy = torch.randn_like(y_ref)
        want = (y_ref, *torch.autograd.grad(y_ref, (xr, wr), gy))
        got = (torch.ops.mmevo.acmix_conv(x, w, G, s, k // 2),
               *torch.ops.mmevo.acmix_conv_backward(gy, x, w, G, s, k // 2,
                                                    [True, True]))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
for dtype in (torch.float64, torch.float32):
    for stride in (1, 2, 3):
        test_add_heads_equals_strided_adds((2, 37, 5, 35), stride, dtype)
print('ok')
"""


@pytest.mark.slow
@pytest.mark.parametrize('isa', ['avx2', 'base'])
def test_every_instruction_set(isa):
    """Slow: a subprocess per instruction set (read once, when the library
    loads), ~5 s each. The AVX2 and baseline builds have their own register
    tiles (2 pixels, 2 inputs of a weight-gradient tile) and transposes
    (``acmix_add_heads_``)."""
    if cpp_backend.isa() == 'base' and isa == 'avx2':
        pytest.skip('the CPU has no AVX2')
    run = subprocess.run(
        [
            sys.executable,
            '-c',
            SCRIPT.format(
                isa=isa,
                geometries=GEOMETRIES,
                here=os.path.dirname(os.path.abspath(__file__)),
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, MMEVO_CPU_ISA=isa, OMP_NUM_THREADS='1'),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith('ok')
