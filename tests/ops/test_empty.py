"""Empty batches (B = 0) and maps without channels (C = 0) on every backend.

Every op, forward and backward, against the reference: empty results of the
right shape, and where the result is not empty (the correlation and the
kernel gradient with C = 0: sums over no channels) zeros, or the uniform
softmax. The registered ops answer these before any backend runs; each
backend is forced in turn all the same, so that the answer stays right for
every one of them (Triton, if it is ever reached, interpreted on CPU
tensors: ``tests/conftest.py`` sets ``TRITON_INTERPRET=1``).
"""

import pytest
import torch

from mmevo.ops import (
    evolution_aggregate,
    library,
    local_attention_weights,
    local_correlation,
    output_size,
)
from mmevo.ops.checks import Window
from mmevo.ops.reference import (
    aggregate_reference,
    attention_weights_reference,
    correlation_reference,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'

# (B, C, G, H, W, K, stride, padding, dilation): one of B and C is 0.
GEOMETRIES = [
    (0, 8, 2, 7, 9, 3, 1, 1, 1),
    (2, 0, 2, 7, 9, 3, 1, 1, 1),
    (0, 6, 3, 9, 6, 5, 2, 2, 1),
    (1, 0, 1, 9, 6, 5, 2, 2, 1),
    (0, 4, 4, 5, 7, 3, 3, 4, 2),
    (2, 0, 4, 5, 7, 3, 3, 4, 2),
    (3, 0, 1, 1, 1, 1, 1, 0, 1),
]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def inputs(geom):
    B, C, G, H, W, K, s, p, d = geom
    Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
    gen = torch.Generator().manual_seed(0)
    shapes = dict(
        x=(B, C, H, W),
        w=(B, G, K, K, Ho, Wo),
        q=(B, C, Ho, Wo),
        gy=(B, C, Ho, Wo),
        go=(B, G, K, K, Ho, Wo),
    )
    return {
        name: torch.randn(*shape, generator=gen, dtype=torch.float64).to(
            DEVICE
        )
        for name, shape in shapes.items()
    }


def value_and_grads(fn, args, grad):
    """fn(*args) and the gradients of <fn(*args), grad> in every arg."""
    args = [leaf(a) for a in args]
    out = fn(*args)
    grads = torch.autograd.grad(out, args, grad, allow_unused=True)
    return [out] + [
        torch.zeros_like(a) if g is None else g
        for a, g in zip(args, grads, strict=True)
    ]


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('backend', ['cpp', 'torch', 'triton'])
@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
@pytest.mark.parametrize('geom', GEOMETRIES)
def test_empty_matches_reference(backend, mode, geom):
    B, C, G, _H, _W, K, s, p, d = geom
    t = inputs(geom)
    window = (s, p, d, mode)
    # (op, reference, inputs, output gradient)
    cases = [
        (
            lambda x, w: evolution_aggregate(x, w, *window),
            lambda x, w: aggregate_reference(x, w, Window(K, *window)),
            (t['x'], t['w']),
            t['gy'],
        ),
        (
            lambda q, x: local_correlation(q, x, G, K, *window),
            lambda q, x: correlation_reference(q, x, G, Window(K, *window)),
            (t['q'], t['x']),
            t['go'],
        ),
        (
            lambda q, x: local_attention_weights(q, x, G, K, *window),
            lambda q, x: attention_weights_reference(
                q, x, G, Window(K, *window)
            ),
            (t['q'], t['x']),
            t['go'],
        ),
    ]
    for op, ref, args, grad in cases:
        with library.use_backend(backend):
            got = value_and_grads(op, args, grad)
        want = value_and_grads(ref, args, grad)
        assert_same(got, want)
    if C == 0 and B > 0:  # not empty: sums over no channels
        assert torch.equal(got[0], torch.full_like(got[0], 1 / K**2))
        assert got[0].numel() > 0


@pytest.mark.parametrize('backend', ['cpp', 'torch', 'triton'])
@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
@pytest.mark.parametrize('geom', GEOMETRIES[:2])
def test_empty_transpose_and_double_backward(backend, mode, geom):
    """The transpose op (the input gradient), and its own gradients."""
    B, C, _G, H, W, K, s, p, d = geom
    t = inputs(geom)
    window = (s, p, d, mode)

    def transpose(gy, w):
        return torch.ops.mmevo.evolution_aggregate_transpose(
            gy, w, H, W, *window
        )

    def transpose_reference(gy, w):
        x = torch.zeros(
            B, C, H, W, dtype=gy.dtype, device=gy.device, requires_grad=True
        )
        y = aggregate_reference(x, w, Window(K, *window))
        return torch.autograd.grad(y, x, gy, create_graph=True)[0]

    args, grad = (t['gy'], t['w']), t['x']
    with library.use_backend(backend):
        got = value_and_grads(transpose, args, grad)
    want = value_and_grads(transpose_reference, args, grad)
    assert_same(got, want)
    assert got[0].shape == (B, C, H, W)


def test_public_ops_at_zero_channels_do_not_crash():
    """The reported crash: the C++ kernels divided by C = 0 (SIGFPE)."""
    y = evolution_aggregate(
        torch.randn(2, 0, 9, 11), torch.randn(2, 1, 3, 3, 9, 11)
    )
    assert y.shape == (2, 0, 9, 11)
    q = torch.randn(2, 0, 9, 11, requires_grad=True)
    k = torch.randn(2, 0, 9, 11, requires_grad=True)
    out = local_correlation(q, k, 1, 3)
    out.backward(torch.randn_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


@pytest.mark.parametrize('shape', [(1, 4, 0, 9), (1, 4, 9, 0)])
def test_empty_map_is_refused(shape):
    name = 'height' if shape[2] == 0 else 'width'
    with pytest.raises(ValueError, match=rf'input {name} must be >= 1, got 0'):
        evolution_aggregate(
            torch.randn(shape), torch.randn(1, 1, 1, 1, 2, 2), padding=1
        )
    with pytest.raises(ValueError, match=rf'key {name} must be >= 1, got 0'):
        local_correlation(
            torch.randn(1, 4, 2, 2), torch.randn(shape), 1, 1, padding=1
        )
