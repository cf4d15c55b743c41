"""The fused involution's Triton kernels against the unfused composition:
interpreted on CPU tensors (``TRITON_INTERPRET=1``, set by
``tests/conftest.py`` before triton is imported), compiled on CUDA. Their
compiles for sm_80 / sm_90 / sm_100 without a GPU are rows of the AOT
matrix (``tests/tools/analysis/kernels/test_aot.py``).

The reference is the span convolution then the reference aggregation,
differentiated by autograd, in float64.
"""

import pytest
import torch

from mmevo.ops import fused_involution, triton_fused, use_backend
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference, span_kernel
from mmevo.ops.triton_fused import (
    fused_involution_backward,
    fused_involution_forward,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = pytest.mark.cuda

# (B, C, G, C_r, H, W, K, stride, dilation)
GEOMETRIES = [
    (2, 8, 2, 3, 5, 7, 3, 1, 1),
    (1, 6, 1, 5, 5, 7, 3, 2, 2),
    (1, 4, 2, 2, 7, 5, 7, 1, 1),
    (1, 4, 1, 2, 6, 5, 7, 2, 2),
    # one z channel: the default tiles split the map in two (5 x 4, 5 x 3)
    (1, 4, 1, 1, 5, 7, 3, 1, 1),
    # 65 z channels: two z-channel blocks
    (1, 4, 2, 65, 5, 5, 3, 2, 1),
]


def out_size(n, K, s, d):
    return (n - 1) // s + 1  # "same" padding d * (K - 1) // 2, K odd


def make_inputs(geom, dtype, seed, bias=True):
    B, C, G, Cr, H, W, K, s, d = geom
    Ho, Wo = out_size(H, K, s, d), out_size(W, K, s, d)
    gen = torch.Generator().manual_seed(seed)
    shapes = [(B, C, H, W), (B, Cr, Ho, Wo), (G * K * K, Cr, 1, 1)]
    shapes += [(G * K * K,)] if bias else []
    tensors = [torch.randn(*sh, generator=gen) for sh in shapes]
    grad = torch.randn(B, C, Ho, Wo, generator=gen)
    tensors = [t.to(DEVICE, dtype) for t in tensors]
    return tensors if bias else [*tensors, None], grad.to(DEVICE, dtype)


def reference(inputs, grad, geom):
    """Output and the four gradients (None: no bias) of the unfused
    composition, in float64."""
    _, _, G, _, _, _, K, s, d = geom
    leaves = [
        None if t is None else t.detach().double().requires_grad_()
        for t in inputs
    ]
    x, z, S, b = leaves
    w = span_kernel(z, S, b, K, G)
    y = aggregate_reference(x, w, Window(K, s, d * (K - 1) // 2, d))
    wanted = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(y, wanted, grad.double(), allow_unused=True)
    grads = [
        torch.zeros_like(t) if g is None else g
        for g, t in zip(grads, wanted, strict=True)
    ]
    return y.detach(), grads


def fused(inputs, grad, geom, tile=None):
    _, _, G, _, _, _, K, s, d = geom
    y = fused_involution_forward(*inputs, K, s, d, G, tile)
    grads = fused_involution_backward(grad, *inputs, K, s, d, G, tile)
    return y, grads


@pytest.mark.parametrize('geom', GEOMETRIES)
def test_float64_values_and_gradients(geom):
    inputs, grad = make_inputs(geom, torch.float64, 0)
    y, grads = fused(inputs, grad, geom)
    y_ref, grads_ref = reference(inputs, grad, geom)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(
        ('x', 'z', 'S', 'b'), grads, grads_ref, strict=True
    ):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize(
    ('geom', 'tile'),
    [
        (GEOMETRIES[0], (1, 1)),  # a program per position
        (GEOMETRIES[0], (2, 3)),  # partial tiles on both edges
        (GEOMETRIES[3], (2, 1)),  # stride and dilation 2: input tiles 4 x 2
        (GEOMETRIES[5], (1, 2)),  # stride 2, two z-channel blocks
        (GEOMETRIES[1], (3, 4)),  # one tile: the whole map
    ],
)
def test_any_tiling_gives_the_reference(geom, tile):
    """The tiles partition the output map, and stride times them the
    input map: every tiling computes the same values and gradients."""
    inputs, grad = make_inputs(geom, torch.float64, 5)
    y, grads = fused(inputs, grad, geom, tile)
    y_ref, grads_ref = reference(inputs, grad, geom)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for name, got, want in zip(
        ('x', 'z', 'S', 'b'), grads, grads_ref, strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize('tile', [(0, 2), (2,), (2, 2.0)])
def test_bad_tile_is_refused(tile):
    inputs, grad = make_inputs(GEOMETRIES[0], torch.float64, 6)
    with pytest.raises(ValueError, match='tile must be'):
        fused_involution_forward(*inputs, 3, 1, 1, 2, tile)
    with pytest.raises(ValueError, match='tile must be'):
        fused_involution_backward(grad, *inputs, 3, 1, 1, 2, tile)


def test_without_bias():
    """No span bias: the kernel is S z alone, and grad_b (still returned,
    as the op's backward does) is the bias gradient it would have had."""
    geom = GEOMETRIES[1]
    inputs, grad = make_inputs(geom, torch.float64, 1, bias=False)
    y, (gx, gz, gs, gb) = fused(inputs, grad, geom)
    y_ref, grads_ref = reference(inputs, grad, geom)
    torch.testing.assert_close(y, y_ref)
    for got, want in zip((gx, gz, gs), grads_ref, strict=True):
        torch.testing.assert_close(got, want)
    x, z, S, _ = inputs
    with_zero_bias = [x, z, S, S.new_zeros(S.shape[0])]
    torch.testing.assert_close(gb, reference(with_zero_bias, grad, geom)[1][3])


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_within_rounding(dtype):
    """fp16 / bf16 in, fp32 accumulation, out in the input dtype: within
    the dtype's rounding of the float64 result of the same inputs."""
    geom = GEOMETRIES[0]
    inputs, grad = make_inputs(geom, dtype, 2)
    y, grads = fused(inputs, grad, geom)
    y_ref, grads_ref = reference(inputs, grad, geom)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    for got, want in zip((y, *grads), (y_ref, *grads_ref), strict=True):
        assert got.dtype == dtype
        err = (got.double() - want).abs().max()
        assert err <= tol * want.abs().max() + 1e-6


def test_empty_batch():
    geom = (0, 8, 2, 3, 5, 7, 3, 1, 1)
    inputs, grad = make_inputs(geom, torch.float64, 3)
    y, (gx, gz, gs, gb) = fused(inputs, grad, geom)
    assert y.shape == (0, 8, 5, 7)
    assert gx.shape == inputs[0].shape and gz.shape == inputs[1].shape
    assert gs.shape == inputs[2].shape and gb.shape == inputs[3].shape
    assert not gs.any() and not gb.any()


@pytest.mark.parametrize('enabled', [True, False])
def test_the_op_takes_the_kernels_behind_its_switch(enabled, monkeypatch):
    """``mmevo.ops.fused_involution`` on the Triton backend runs these
    kernels with ``MMEVO_FUSED_TRITON=1`` only; either way its values and
    gradients are the unfused composition's in float64."""
    monkeypatch.setenv('MMEVO_FUSED_TRITON', '1' if enabled else '0')
    calls = []
    for name in ('fused_involution_forward', 'fused_involution_backward'):
        real = getattr(triton_fused, name)
        monkeypatch.setattr(
            triton_fused,
            name,
            lambda *a, real=real, name=name: calls.append(name) or real(*a),
        )
    geom = GEOMETRIES[1]
    _, _, G, _, _, _, K, s, d = geom
    inputs, grad = make_inputs(geom, torch.float64, 4)
    leaves = [t.requires_grad_() for t in inputs]
    with use_backend('triton'):
        y = fused_involution(*leaves, K, s, d, G)
        grads = torch.autograd.grad(y, leaves, grad)
    y_ref, grads_ref = reference(inputs, grad, geom)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    expected = ['fused_involution_forward', 'fused_involution_backward']
    assert calls == (expected if enabled else [])


def test_backward_is_deterministic_and_takes_any_layout():
    """Channels-last inputs give the contiguous inputs' results, and a
    second backward the same bits (per-program partials, no atomics)."""
    geom = GEOMETRIES[4]
    inputs, grad = make_inputs(geom, torch.float32, 4)
    y, grads = fused(inputs, grad, geom)
    last = [
        t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
        for t in inputs
    ]
    y2, grads2 = fused(
        last, grad.contiguous(memory_format=torch.channels_last), geom
    )
    assert torch.equal(y, y2)
    for a, b in zip(grads, grads2, strict=True):
        assert torch.equal(a, b)
    _y_ref, grads_ref = reference(inputs, grad, geom)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
