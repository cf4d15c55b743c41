"""The CPU ops (C++ kernels, PyTorch fallback) against the plain reference
(float64).

A seeded random sweep over the window geometry (odd sizes, 1x1 and 2x3 maps,
K in {1, 3, 5, 7}, stride and dilation 1-3, G in {1, C/16, C}, both padding
modes, non-contiguous and channels_last inputs), forward and every gradient;
gradcheck; reduced precision; reflect padding against torch/numpy; and
torch.compile of a function using the ops. The fused attention weights are
checked against the softmax of the reference correlation.
"""

import random

import numpy as np
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

N_CONFIGS = 240


def random_config(rng):
    """One valid geometry: returns a dict of sizes and window arguments."""
    while True:
        # 80 channels in one group span three channel blocks of the kernels
        # (32, 32, 16).
        C = rng.choice([16, 32, 80, 6, 12])
        G = rng.choice([1, C // 16, C] if C % 16 == 0 else [1, 3, C])
        K = rng.choice([1, 3, 5, 7])
        s, d = rng.randint(1, 3), rng.randint(1, 3)
        shape = rng.choice(['odd', 'odd', 'odd', '1x1', '2x3'])
        H, W = {'1x1': (1, 1), '2x3': (2, 3)}.get(
            shape, (rng.randint(1, 13), rng.randint(1, 13))
        )
        mode = rng.choice(['zeros', 'reflect'])
        p = None if rng.random() < 0.5 else rng.randint(0, d * (K - 1))
        pad = d * (K - 1) // 2 if p is None else p
        if (
            output_size(H, K, s, pad, d) >= 1
            and output_size(W, K, s, pad, d) >= 1
        ):
            return dict(
                B=rng.randint(1, 2),
                C=C,
                G=G,
                K=K,
                H=H,
                W=W,
                s=s,
                d=d,
                p=p,
                pad=pad,
                mode=mode,
                layout=rng.choice(['contiguous', 'strided', 'channels_last']),
            )


def make(shape, layout, gen, dtype=torch.float64):
    """A random tensor of ``shape`` stored with the requested ``layout``."""
    if layout == 'strided':  # every other element of a wider tensor
        big = torch.randn(
            *shape[:-1], 2 * shape[-1], generator=gen, dtype=dtype
        )
        return big[..., ::2]
    t = torch.randn(*shape, generator=gen, dtype=dtype)
    if layout == 'channels_last' and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    return t


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def cases():
    """(backend, seed): the C++ kernels on the full sweep, the PyTorch
    fallback on a part."""
    return [('cpp', seed) for seed in range(N_CONFIGS)] + [
        ('torch', seed) for seed in range(40)
    ]


@pytest.mark.parametrize('backend,seed', cases())
def test_matches_reference(backend, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = random_config(rng)
    B, C, G, K, s, d = (cfg[k] for k in 'B C G K s d'.split())
    pad, mode, layout = cfg['pad'], cfg['mode'], cfg['layout']
    Ho = output_size(cfg['H'], K, s, pad, d)
    Wo = output_size(cfg['W'], K, s, pad, d)
    x = make((B, C, cfg['H'], cfg['W']), layout, gen)
    w = make((B, G, K, K, Ho, Wo), layout, gen)
    q = make((B, C, Ho, Wo), layout, gen)
    gy = torch.randn(B, C, Ho, Wo, generator=gen, dtype=torch.float64)
    go = torch.randn(B, G, K, K, Ho, Wo, generator=gen, dtype=torch.float64)

    with library.use_backend(backend):
        xa, wa = leaf(x), leaf(w)
        y = evolution_aggregate(xa, wa, s, cfg['p'], d, mode)
        y.backward(gy)
        xc, qc = leaf(x), leaf(q)
        o = local_correlation(qc, xc, G, K, s, cfg['p'], d, mode)
        o.backward(go)
        xs, qs = leaf(x), leaf(q)
        a = local_attention_weights(qs, xs, G, K, s, cfg['p'], d, mode)
        a.backward(go)

    xr, wr = leaf(x), leaf(w)
    y_ref = aggregate_reference(xr, wr, Window(K, s, pad, d, mode))
    y_ref.backward(gy)
    xq, qq = leaf(x), leaf(q)
    o_ref = correlation_reference(qq, xq, G, Window(K, s, pad, d, mode))
    o_ref.backward(go)
    xt, qt = leaf(x), leaf(q)
    a_ref = attention_weights_reference(qt, xt, G, Window(K, s, pad, d, mode))
    a_ref.backward(go)

    tol = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(xa.grad, xr.grad, **tol)
    torch.testing.assert_close(wa.grad, wr.grad, **tol)
    torch.testing.assert_close(o, o_ref, **tol)
    torch.testing.assert_close(qc.grad, qq.grad, **tol)
    torch.testing.assert_close(xc.grad, xq.grad, **tol)
    torch.testing.assert_close(a, a_ref, **tol)
    torch.testing.assert_close(qs.grad, qt.grad, **tol)
    torch.testing.assert_close(xs.grad, xt.grad, **tol)


# Maps wider and taller than the kernels' register tiles: several column
# vectors with a partial last one, several row tiles with a partial last one,
# channel blocks with a partial last quad, every stride phase.
WIDE = [
    # B, C, G, K, H, W, s, d, p
    (2, 32, 2, 7, 23, 37, 1, 1, None),
    (1, 36, 3, 5, 19, 40, 2, 1, None),
    (1, 16, 1, 3, 26, 21, 3, 2, 1),
    (2, 20, 1, 7, 17, 33, 2, 2, 0),
    (1, 48, 1, 3, 13, 70, 1, 3, 5),
]


@pytest.mark.parametrize('geom', WIDE)
@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
def test_wide_maps_match_reference(geom, mode):
    B, C, G, K, H, W, s, d, p = geom
    gen = torch.Generator().manual_seed(H * W + C)
    pad = d * (K - 1) // 2 if p is None else p
    Ho, Wo = output_size(H, K, s, pad, d), output_size(W, K, s, pad, d)
    x = torch.randn(B, C, H, W, generator=gen, dtype=torch.float64)
    w = torch.randn(B, G, K, K, Ho, Wo, generator=gen, dtype=torch.float64)
    q = torch.randn(B, C, Ho, Wo, generator=gen, dtype=torch.float64)
    gy = torch.randn(B, C, Ho, Wo, generator=gen, dtype=torch.float64)
    go = torch.randn(B, G, K, K, Ho, Wo, generator=gen, dtype=torch.float64)
    outs = []
    window = Window(K, s, pad, d, mode)
    for fn_a, fn_c, fn_s in (
        (
            lambda x, w: evolution_aggregate(x, w, s, p, d, mode),
            lambda q, x: local_correlation(q, x, G, K, s, p, d, mode),
            lambda q, x: local_attention_weights(q, x, G, K, s, p, d, mode),
        ),
        (
            lambda x, w: aggregate_reference(x, w, window),
            lambda q, x: correlation_reference(q, x, G, window),
            lambda q, x: attention_weights_reference(q, x, G, window),
        ),
    ):
        xa, wa, qa, xc, qs, xs = (leaf(t) for t in (x, w, q, x, q, x))
        with library.use_backend('cpp'):
            y = fn_a(xa, wa)
            o = fn_c(qa, xc)
            a = fn_s(qs, xs)
        (y * gy).sum().backward()
        (o * go).sum().backward()
        (a * go).sum().backward()
        outs.append(
            (y, o, a, xa.grad, wa.grad, qa.grad, xc.grad, qs.grad, xs.grad)
        )
    for got, want in zip(*outs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_sweep_covers_the_issue_list():
    """The seeded configurations include every case the sweep promises."""
    cfgs = [random_config(random.Random(i)) for i in range(N_CONFIGS)]
    seen = lambda key: {c[key] for c in cfgs}  # noqa: E731
    assert seen('K') == {1, 3, 5, 7}
    assert seen('s') == {1, 2, 3} and seen('d') == {1, 2, 3}
    assert seen('mode') == {'zeros', 'reflect'}
    assert seen('layout') == {'contiguous', 'strided', 'channels_last'}
    assert {(c['H'], c['W']) for c in cfgs} >= {(1, 1), (2, 3)}
    groups = {
        (
            '1'
            if c['G'] == 1
            else 'C/16'
            if c['G'] == c['C'] // 16
            else 'C'
            if c['G'] == c['C']
            else 'other'
        )
        for c in cfgs
        if c['C'] >= 16
    }
    assert groups >= {'1', 'C/16', 'C'}
    assert any(c['C'] // c['G'] > 64 for c in cfgs)  # several channel blocks
    # Reflect paddings as large as the map (numpy-style re-reflection).
    assert any(
        c['mode'] == 'reflect' and c['pad'] >= min(c['H'], c['W'])
        for c in cfgs
    )


@pytest.mark.slow
@pytest.mark.parametrize('backend', ['cpp', 'torch'])
@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
def test_gradcheck(backend, mode):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(
        1, 4, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True
    )
    w = torch.randn(
        1,
        2,
        3,
        3,
        3,
        3,
        generator=gen,
        dtype=torch.float64,
        requires_grad=True,
    )
    q = torch.randn(
        1, 4, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True
    )
    with library.use_backend(backend):
        assert torch.autograd.gradcheck(
            lambda a, b: evolution_aggregate(a, b, 2, 1, 1, mode), (x, w)
        )
        assert torch.autograd.gradcheck(
            lambda a, b: local_correlation(a, b, 2, 3, 2, 2, 2, mode), (q, x)
        )
        # Second order: the backward is made of the same differentiable ops.
        assert torch.autograd.gradgradcheck(
            lambda a, b: evolution_aggregate(a, b, 2, 1, 1, mode),
            (x, w),
            fast_mode=True,
        )
        assert torch.autograd.gradgradcheck(
            lambda a, b: local_correlation(a, b, 2, 3, 2, 2, 2, mode),
            (q, x),
            fast_mode=True,
        )
        assert torch.autograd.gradcheck(
            lambda a, b: local_attention_weights(a, b, 2, 3, 2, 2, 2, mode),
            (q, x),
        )
        assert torch.autograd.gradgradcheck(
            lambda a, b: local_attention_weights(a, b, 2, 3, 2, 2, 2, mode),
            (q, x),
            fast_mode=True,
        )


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
def test_reduced_precision(dtype, mode):
    """bf16/fp16 accumulate in fp32: close to the fp32 reference, dtype
    kept."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 9, 11, generator=gen)
    w = torch.randn(2, 2, 7, 7, 5, 6, generator=gen) / 7
    q = torch.randn(2, 32, 5, 6, generator=gen)
    gy = torch.randn(2, 32, 5, 6, generator=gen)
    with library.use_backend('cpp'):
        xl, wl = leaf(x.to(dtype)), leaf(w.to(dtype))
        y = evolution_aggregate(xl, wl, 2, None, 1, mode)
        y.backward(gy.to(dtype))
        o = local_correlation(q.to(dtype), x.to(dtype), 2, 7, 2, None, 1, mode)
        a = local_attention_weights(
            q.to(dtype) / 8, x.to(dtype), 2, 7, 2, None, 1, mode
        )
    xr, wr = leaf(x), leaf(w)
    y_ref = aggregate_reference(xr, wr, Window(7, 2, 3, 1, mode))
    y_ref.backward(gy)
    o_ref = correlation_reference(q, x, 2, Window(7, 2, 3, 1, mode))
    a_ref = attention_weights_reference(q / 8, x, 2, Window(7, 2, 3, 1, mode))
    assert a.dtype == dtype
    assert (a.float() - a_ref).abs().max() < (
        2e-2 if dtype == torch.bfloat16 else 3e-3
    )
    assert y.dtype == o.dtype == xl.grad.dtype == wl.grad.dtype == dtype
    # Rounding the inputs to bf16 (8 bits) dominates: tolerance relative to
    # the scale.
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    for got, ref in [
        (y, y_ref),
        (o, o_ref),
        (xl.grad, xr.grad),
        (wl.grad, wr.grad),
    ]:
        err = (got.float() - ref).abs().max() / ref.abs().max()
        assert err < tol, (got.dtype, err)


@pytest.mark.parametrize('padding_mode', ['zeros', 'reflect'])
def test_autocast_mixed_dtypes(padding_mode):
    """Under autocast a fp32 map and a bf16 kernel (from a conv) run in
    bf16, reflect padding too (whose padding ATen's autocast would run in
    fp32)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 16, 7, 9, generator=gen, requires_grad=True)
    w = (
        torch.randn(2, 2, 3, 3, 7, 9, generator=gen)
        .bfloat16()
        .requires_grad_()
    )
    key = torch.randn(2, 16, 7, 9, generator=gen).bfloat16()
    window = dict(padding_mode=padding_mode)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = evolution_aggregate(x, w, **window)
        o = local_correlation(x, key, 4, 3, **window)
        a = local_attention_weights(x, key, 4, 3, **window)
    assert y.dtype == o.dtype == a.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.bfloat16
    ref = aggregate_reference(
        x.double(), w.double(), Window(w.shape[2], 1, 1, 1, padding_mode)
    )
    assert (y.double() - ref).abs().max() < 2e-2 * ref.abs().max()
    ref = correlation_reference(
        x.double(), key.double(), 4, Window(3, 1, 1, 1, padding_mode)
    )
    assert (o.double() - ref).abs().max() < 2e-2 * ref.abs().max()


@pytest.mark.parametrize('size', [(6, 7), (2, 3), (1, 1), (3, 2)])
@pytest.mark.parametrize('padding', [1, 2, 3, 5])
def test_reflect_is_reflection_pad(size, padding):
    """'reflect' equals ReflectionPad2d where it is defined, numpy's
    'reflect' beyond."""
    gen = torch.Generator().manual_seed(padding)
    x = torch.randn(1, 4, *size, generator=gen, dtype=torch.float64)
    if padding < min(size):
        xp = torch.nn.ReflectionPad2d(padding)(x)
    else:
        xp = torch.from_numpy(
            np.pad(
                x.numpy(),
                [(0, 0), (0, 0)] + [(padding, padding)] * 2,
                mode='reflect',
            )
        )
    K = 3
    Ho, Wo = (output_size(n, K, 1, padding, 1) for n in size)
    w = torch.randn(1, 2, K, K, Ho, Wo, generator=gen, dtype=torch.float64)
    q = torch.randn(1, 4, Ho, Wo, generator=gen, dtype=torch.float64)
    with library.use_backend('cpp'):
        y = evolution_aggregate(x, w, 1, padding, 1, 'reflect')
        o = local_correlation(q, x, 2, K, 1, padding, 1, 'reflect')
    torch.testing.assert_close(
        y, aggregate_reference(xp, w, Window(K, 1, 0, 1, 'zeros'))
    )
    torch.testing.assert_close(
        o, correlation_reference(q, xp, 2, Window(K, 1, 0, 1, 'zeros'))
    )


def test_backends_agree_bitwise_across_threads():
    """The C++ kernels own their output rows: the thread count changes no
    bit."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 32, 15, 13, generator=gen)
    w = torch.randn(2, 2, 5, 5, 8, 7, generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            xl, wl = leaf(x), leaf(w)
            with library.use_backend('cpp'):
                y = evolution_aggregate(xl, wl, 2, None, 1, 'reflect')
                y.square().sum().backward()
            results.append((y, xl.grad, wl.grad))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_torch_compile_fullgraph():
    """The ops inside one torch.compile(fullgraph=True) graph, forward and
    backward."""

    def attention(q, k, v):
        logits = local_correlation(q, k, 2, 3, 1, None, 1, 'reflect')
        attn = logits.flatten(2, 3).softmax(2).view_as(logits)
        fused = local_attention_weights(v, k, 2, 3, 1, None, 1, 'zeros')
        return evolution_aggregate(
            v, attn, 1, None, 1, 'zeros'
        ) + evolution_aggregate(q, fused, 1, None, 1, 'zeros')

    gen = torch.Generator().manual_seed(3)
    args = [torch.randn(1, 4, 5, 6, generator=gen) for _ in range(3)]
    compiled = torch.compile(attention, fullgraph=True)
    a, b = [leaf(t) for t in args], [leaf(t) for t in args]
    out, ref = compiled(*a), attention(*b)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for ta, tb in zip(a, b, strict=True):
        torch.testing.assert_close(ta.grad, tb.grad)


def test_ops_are_registered():
    """The torch.library names other code (FLOP counters) relies on."""
    assert (
        torch.ops.mmevo.evolution_aggregate.default._schema.arguments[2].name
        == 'stride'
    )
    assert [
        a.name
        for a in torch.ops.mmevo.local_correlation.default._schema.arguments
    ] == [
        'query',
        'key',
        'groups',
        'kernel_size',
        'stride',
        'padding',
        'dilation',
        'padding_mode',
    ]
    x = torch.randn(1, 4, 5, 5)
    w = torch.randn(1, 2, 3, 3, 5, 5)
    torch.testing.assert_close(
        torch.ops.mmevo.evolution_aggregate(x, w, 1, 1, 1, 'zeros'),
        aggregate_reference(x, w, Window(3, 1, 1, 1, 'zeros')),
    )


def test_jit_trace_records_the_ops():
    """FLOP counters (mmengine's FlopAnalyzer) trace models with torch.jit:
    the entry points must accept traced sizes and leave one node per op."""
    x = torch.randn(1, 8, 5, 6)
    w = torch.randn(1, 2, 3, 3, 5, 6)

    def f(x, w):
        return evolution_aggregate(x, w) + local_correlation(x, x, 2, 3).sum(
            (2, 3)
        ).repeat_interleave(4, 1)

    with pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(f, (x, w))
    kinds = [n.kind() for n in traced.graph.nodes()]
    assert kinds.count('mmevo::evolution_aggregate') == 1
    assert kinds.count('mmevo::local_correlation') == 1
    torch.testing.assert_close(traced(x, w), f(x, w))


@pytest.mark.parametrize('backend', ['cpp', 'torch'])
@pytest.mark.parametrize('padding_mode', ['zeros', 'reflect'])
@pytest.mark.parametrize('stride', [2**61, 2**62, 2**63 - 1])
def test_a_stride_past_the_map_reads_one_window(stride, padding_mode, backend):
    """Any stride at least the padded map's size gives one output pixel,
    the first window's: the same values and gradients as the smallest such
    stride, up to int64's largest (whose views would overflow)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 5, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(2, 2, 3, 3, 1, 1, generator=gen, dtype=torch.float64)
    q = torch.randn(2, 4, 1, 1, generator=gen, dtype=torch.float64)
    window = dict(dilation=1, padding_mode=padding_mode)
    outs = []
    for s in (stride, 8):
        xs, ws, qs = (t.clone().requires_grad_() for t in (x, w, q))
        with library.use_backend(backend):
            y = evolution_aggregate(xs, ws, s, 1, **window)
            o = local_attention_weights(qs, xs, 2, 3, s, 1, **window)
            (y.sum() + (o * o).sum()).backward()
        outs.append((y, o, xs.grad, ws.grad, qs.grad))
    for got, ref in zip(*outs, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
