"""The fused local attention's Triton kernels against the stock composition
(``local_correlation`` + relative embedding and bias + ``window_softmax``
+ ``evolution_aggregate`` on the PyTorch backend, differentiated by
autograd, in float64): interpreted on CPU tensors (``TRITON_INTERPRET=1``,
set by ``tests/conftest.py`` before triton is imported), compiled on CUDA.
Their compiles for sm_80 / sm_90 / sm_100 without a GPU are rows of the
AOT matrix (``tests/tools/analysis/kernels/test_aot.py``).
"""

import pytest
import torch

from mmevo.ops import (
    evolution_aggregate,
    local_correlation,
    use_backend,
    window_softmax,
)
from mmevo.ops.checks import Window
from mmevo.ops.triton_fused_attention import backward, forward

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = pytest.mark.cuda

# (B, C, C_v, G, H, W, K, stride, dilation, padding_mode, rel_embed,
# rel_bias); "same" padding, d * (K - 1) // 2
GEOMETRIES = {
    'g3-odd': (2, 6, 6, 3, 5, 7, 3, 1, 1, 'zeros', True, True),
    's2d2-reflect-cv': (1, 4, 6, 2, 7, 6, 3, 2, 2, 'reflect', True, False),
    'k7-g1': (1, 4, 4, 1, 5, 5, 7, 1, 1, 'zeros', False, True),
    'k7-s2-reflect': (1, 3, 3, 1, 6, 5, 7, 2, 1, 'reflect', True, True),
    # padding 3 >= H = 1, W = 3: repeated reflection
    'tiny-reflect': (1, 2, 4, 2, 1, 3, 7, 1, 1, 'reflect', True, True),
    # one head channel over 35 pixels: grad_query's programs take two
    # strips of two tiles each
    'plain-strips': (2, 2, 2, 2, 5, 7, 3, 1, 1, 'zeros', True, False),
    'plain-s2': (2, 4, 2, 2, 6, 7, 3, 2, 1, 'zeros', False, False),
}


def window_of(geom):
    K, s, d, mode = geom[6:10]
    return Window.resolve(K, s, None, d, mode)


def make_inputs(geom, dtype, seed):
    """(query, key, value, rel_embed | None, rel_bias | None) and the
    output's gradient."""
    B, C, Cv, G, H, W, K = geom[:7]
    embed, bias = geom[10:]
    window = window_of(geom)
    Ho, Wo = window.output_size(H), window.output_size(W)
    gen = torch.Generator().manual_seed(seed)
    shapes = [(B, C, Ho, Wo), (B, C, H, W), (B, Cv, H, W)]
    shapes += [(C, K, K) if embed else None, (G, K, K) if bias else None]
    tensors = [
        None if sh is None else torch.randn(*sh, generator=gen).to(DEVICE)
        for sh in shapes
    ]
    grad = torch.randn(B, Cv, Ho, Wo, generator=gen).to(DEVICE)
    return [None if t is None else t.to(dtype) for t in tensors], grad.to(
        dtype
    )


def reference(inputs, grad, geom):
    """out, lse and the five gradients (None: absent) of the stock
    composition, in float64 on the PyTorch backend."""
    G, _, _, K = geom[3:7]
    window = window_of(geom)
    leaves = [
        None if t is None else t.detach().double().requires_grad_()
        for t in inputs
    ]
    q, k, v, r, bias = leaves
    B, C, Ho, Wo = q.shape
    args = (window.stride, window.padding, window.dilation)
    with use_backend('torch'):
        logits = local_correlation(q, k, G, K, *args, window.padding_mode)
        if r is not None:
            logits = logits + torch.einsum(
                'bgdhw,gduv->bguvhw',
                q.view(B, G, C // G, Ho, Wo),
                r.view(G, C // G, K, K),
            )
        if bias is not None:
            logits = logits + bias[None, :, :, :, None, None]
        attn = window_softmax(logits)
        out = evolution_aggregate(v, attn, *args, window.padding_mode)
    lse = logits.flatten(2, 3).logsumexp(2)
    wanted = [t for t in leaves if t is not None]
    got = iter(torch.autograd.grad(out, wanted, grad.double()))
    grads = [None if t is None else next(got) for t in leaves]
    return out.detach(), lse.detach(), grads


def fused(inputs, grad, geom):
    G, window = geom[3], window_of(geom)
    out, lse = forward(*inputs, G, window)
    grads = backward(grad, out, lse, *inputs, G, window)
    return out, lse, grads


NAMES = ('query', 'key', 'value', 'rel_embed', 'rel_bias')


@pytest.fixture(scope='module')
def float64_results():
    """Fused and reference results of every geometry, computed once."""
    results = {}
    for name, geom in GEOMETRIES.items():
        inputs, grad = make_inputs(geom, torch.float64, 0)
        results[name] = (
            fused(inputs, grad, geom),
            reference(inputs, grad, geom),
        )
    return results


@pytest.mark.parametrize('name', GEOMETRIES)
def test_float64_values_and_gradients(name, float64_results):
    (out, lse, grads), (out_ref, lse_ref, grads_ref) = float64_results[name]
    assert out.dtype == lse.dtype == torch.float64
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-10, atol=1e-10)
    for arg, got, want in zip(NAMES, grads, grads_ref, strict=True):
        if want is None:
            assert got is None, arg
            continue
        assert got.shape == want.shape and got.is_contiguous(), arg
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=arg)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_within_rounding(dtype):
    """fp16 / bf16 in, fp32 accumulation and lse, results in the input
    dtype: within a few roundings of the float64 result of the same
    (rounded) inputs (the backward's D is the row sum of the gradient
    times the rounded output, as in flash attention)."""
    geom = GEOMETRIES['s2d2-reflect-cv']
    inputs, grad = make_inputs(geom, dtype, 1)
    out, lse, grads = fused(inputs, grad, geom)
    out_ref, lse_ref, grads_ref = reference(inputs, grad, geom)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-5)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    pairs = [(out, out_ref)] + [
        (g, w) for g, w in zip(grads, grads_ref, strict=True) if w is not None
    ]
    for got, want in pairs:
        assert got.dtype == dtype
        err = (got.double() - want).abs().max()
        assert err <= tol * want.abs().max() + 1e-6


def test_any_layout_and_a_repeatable_backward():
    """Channels-last and strided (non-contiguous) inputs give the
    contiguous inputs' bits, and a second backward the same bits
    (per-program partials, no atomics)."""
    geom = GEOMETRIES['plain-strips']
    inputs, grad = make_inputs(geom, torch.float32, 2)
    out, lse, grads = fused(inputs, grad, geom)

    def strided(t):
        if t is None:
            return None
        wide = torch.cat([t, t], -1)[..., ::2]  # every other column
        assert not wide.is_contiguous()
        return wide.copy_(t)

    last = [
        t.contiguous(memory_format=torch.channels_last)
        if t is not None and t.dim() == 4
        else t
        for t in inputs
    ]
    for variant, gvar in ((last, grad), ([strided(t) for t in inputs], grad)):
        out2, lse2, grads2 = fused(variant, strided(gvar), geom)
        assert torch.equal(out, out2) and torch.equal(lse, lse2)
        for a, b in zip(grads, grads2, strict=True):
            assert (a is None and b is None) or torch.equal(a, b)
    out_ref, _, grads_ref = reference(inputs, grad, geom)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, grads_ref, strict=True):
        if want is not None:
            torch.testing.assert_close(
                got.double(), want, rtol=1e-5, atol=1e-5
            )
