"""mmevo::fused_local_attention against the stock composition
(local_correlation, the relative terms, window_softmax,
evolution_aggregate), in float64: the output, the log-sum-exp and the
gradients of query, key, value, rel_embed and rel_bias, on the C++ and the
PyTorch backends; low precision against float64; empty batches and
channels, channels-last, double backward, the fake kernels (opcheck),
torch.compile, what the backward saves, the Triton hand-off and the
bad-input messages."""

import os
import random
import subprocess
import sys
import types

import pytest
import torch

from mmevo.ops import (
    cpp_backend,
    evolution_aggregate,
    fused_local_attention,
    local_correlation,
    use_backend,
    window_softmax,
)
from mmevo.ops import fused_attention as fa
from mmevo.ops.checks import Window

needs_cpp = pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)


def out_size(n, K, s, p, d):
    return (n + 2 * p - d * (K - 1) - 1) // s + 1


def make(B, C, Cv, H, W, G, K, s, p, d, rel=True, bias=True, seed=0):
    """(query, key, value, rel_embed, rel_bias) in float64."""
    gen = torch.Generator().manual_seed(seed)
    Ho, Wo = out_size(H, K, s, p, d), out_size(W, K, s, p, d)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return (
        randn(B, C, Ho, Wo) / max(1, C // G) ** 0.5,
        randn(B, C, H, W),
        randn(B, Cv, H, W),
        randn(C, K, K) if rel else None,
        randn(G, K, K) if bias else None,
    )


def stock_logits(q, k, rel, bias, G, K, s, p, d, mode):
    """The logits of the independent reference, the spec's formula."""
    B, C, Ho, Wo = q.shape
    logits = local_correlation(q, k, G, K, s, p, d, mode)
    if rel is not None:
        logits = logits + torch.einsum(
            'bgdhw,gduv->bguvhw',
            q.view(B, G, C // G, Ho, Wo),
            rel.view(G, C // G, K, K),
        )
    if bias is not None:
        logits = logits + bias[None, :, :, :, None, None]
    return logits


def stock(q, k, v, rel, bias, G, K, s, p, d, mode):
    """The stock composition (mmevo's unfused ops, themselves tested
    against unfold)."""
    logits = stock_logits(q, k, rel, bias, G, K, s, p, d, mode)
    return evolution_aggregate(v, window_softmax(logits), s, p, d, mode)


def fused(q, k, v, rel, bias, G, K, s, p, d, mode):
    return fused_local_attention(
        q, k, v, G, K, s, p, d, mode, rel_embed=rel, rel_bias=bias
    )


NAMES = ('query', 'key', 'value', 'rel_embed', 'rel_bias')


def values_and_grads(fn, tensors, args, gy_seed=1, dtype=None):
    leaves = [
        None if t is None else t.to(dtype or t.dtype).requires_grad_()
        for t in tensors
    ]
    y = fn(*leaves, *args)
    gen = torch.Generator().manual_seed(gy_seed)
    # drawn in float64 for every dtype: the same numbers
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.dtype)
    wanted = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(y, wanted, gy) if y.numel() else ()
    if not y.numel():  # no path to the inputs: the gradients are zero
        y.sum().backward()
        grads = [
            t.grad if t.grad is not None else torch.zeros_like(t)
            for t in wanted
        ]
    names = [n for n, t in zip(NAMES, tensors, strict=True) if t is not None]
    return y, dict(zip(names, grads, strict=True))


def assert_matches_stock(tensors, args, tol=1e-10):
    y, grads = values_and_grads(fused, tensors, args)
    y_ref, grads_ref = values_and_grads(stock, tensors, args)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        ref = grads_ref[name]
        scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
        torch.testing.assert_close(
            g, ref, rtol=tol, atol=tol * scale, msg=name
        )


# (B, C, Cv, H, W, G, K, s, p, d, mode, rel, bias): odd sizes, every
# stride / dilation / padding mix, C_v != C, maps no larger than the
# padding (reflected repeatedly).
CASES = [
    (2, 12, 12, 7, 9, 3, 3, 1, 1, 1, 'zeros', True, True),
    (1, 16, 8, 5, 11, 4, 5, 2, 2, 1, 'reflect', True, False),
    (2, 8, 16, 7, 9, 1, 7, 1, 3, 1, 'reflect', False, True),
    (1, 12, 6, 9, 7, 3, 3, 2, 2, 2, 'zeros', False, False),
    (2, 16, 16, 5, 11, 4, 7, 1, 6, 2, 'zeros', True, True),
    (1, 4, 4, 3, 2, 1, 7, 1, 3, 1, 'reflect', True, True),
    (1, 6, 3, 2, 3, 3, 5, 2, 4, 2, 'reflect', True, True),
    (1, 8, 8, 11, 5, 4, 3, 3, 0, 1, 'zeros', True, True),
    # more taps in a window row than a chunk holds
    (1, 6, 4, 6, 13, 2, 9, 1, 4, 1, 'reflect', True, True),
    (2, 4, 4, 9, 23, 1, 11, 2, 5, 1, 'zeros', True, False),
]


def case_args(case):
    *shape, G, K, s, p, d, mode, rel, bias = case
    return make(*shape, G, K, s, p, d, rel, bias), (G, K, s, p, d, mode)


@pytest.mark.parametrize('backend', ['auto', 'torch'])
@pytest.mark.parametrize('case', CASES, ids=str)
def test_equals_stock_float64(case, backend):
    tensors, args = case_args(case)
    with use_backend(backend):
        assert_matches_stock(tensors, args)


@pytest.mark.parametrize('case', CASES[:3], ids=str)
def test_lse(case):
    tensors, args = case_args(case)
    q, k, v, rel, bias = tensors
    G, K, s, p, d, mode = args
    _, lse = torch.ops.mmevo.fused_local_attention(
        q, k, v, rel, bias, G, K, s, p, d, mode
    )
    logits = stock_logits(q, k, rel, bias, *args)
    assert (
        lse.dtype == torch.float64
        and lse.shape == logits.shape[:2] + (logits.shape[-2:])
    )
    torch.testing.assert_close(lse, logits.flatten(2, 3).logsumexp(2))


def test_seeded_sweep_odd_sizes():
    rng = random.Random(0)
    for seed in range(16):
        G, K = rng.choice([1, 3, 4]), rng.choice([1, 3, 5, 7])
        s, d = rng.choice([1, 2]), rng.choice([1, 2])
        mode = rng.choice(['zeros', 'reflect'])
        p = rng.choice([None, 0, 1, 3])
        p = d * (K - 1) // 2 if p is None else p
        H, W = rng.randint(1, 12), rng.randint(1, 12)
        if out_size(H, K, s, p, d) < 1 or out_size(W, K, s, p, d) < 1:
            p = d * (K - 1)  # a window that fits
        C, Cv = G * rng.choice([1, 2, 5]), G * rng.choice([1, 3])
        tensors = make(
            rng.randint(1, 3),
            C,
            Cv,
            H,
            W,
            G,
            K,
            s,
            p,
            d,
            rel=bool(seed % 2),
            bias=bool(seed % 3),
            seed=seed,
        )
        assert_matches_stock(tensors, (G, K, s, p, d, mode))


@needs_cpp
def test_same_bits_for_any_thread_count():
    tensors, args = case_args(CASES[4])
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            y, grads = values_and_grads(fused, tensors, args)
            results.append([y, *grads.values()])
    finally:
        torch.set_num_threads(threads)
    assert all(map(torch.equal, *results))


def test_gradcheck():
    tensors = [t.requires_grad_() for t in make(1, 4, 2, 5, 4, 2, 3, 2, 1, 1)]

    def fn(*tensors):
        return fused(*tensors, 2, 3, 2, 1, 1, 'reflect')

    assert torch.autograd.gradcheck(fn, tensors)


def test_double_backward_equals_stock():
    """create_graph=True: the second derivatives are the stock
    composition's."""
    tensors, args = case_args(CASES[1])
    results = []
    for fn in (fused, stock):
        leaves = [
            t.clone().requires_grad_() if t is not None else None
            for t in tensors
        ]
        wanted = [t for t in leaves if t is not None]
        y = fn(*leaves, *args)
        gen = torch.Generator().manual_seed(2)
        gy = torch.randn(y.shape, generator=gen, dtype=y.dtype)
        grads = torch.autograd.grad(y, wanted, gy, create_graph=True)
        total = sum((g * g.detach().sin()).sum() for g in grads)
        results.append(torch.autograd.grad(total, wanted))
    for g, ref in zip(*results, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    'B, C, Cv', [(0, 8, 8), (2, 0, 4), (2, 4, 0)], ids=str
)
def test_empty(B, C, Cv):
    """No batch, no query / key channels (the logits are the bias alone),
    no value channels."""
    tensors = make(max(B, 1), max(C, 2), max(Cv, 2), 7, 5, 2, 3, 2, 1, 1)
    q, k, v, rel, bias = tensors
    tensors = (q[:B, :C], k[:B, :C], v[:B, :Cv], rel[:C], bias)
    assert_matches_stock(tensors, (2, 3, 2, 1, 1, 'zeros'))


def test_channels_last():
    tensors, args = case_args(CASES[0])
    cl = torch.channels_last
    q, k, v = (t.to(memory_format=cl) for t in tensors[:3])
    y, grads = values_and_grads(fused, (q, k, v, *tensors[3:]), args)
    assert y.is_contiguous(memory_format=cl)
    y_ref, grads_ref = values_and_grads(stock, tensors, args)
    torch.testing.assert_close(y, y_ref)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], msg=name)


@pytest.mark.parametrize(
    'dtype, tol',
    [(torch.float32, 1e-5), (torch.bfloat16, 5e-2), (torch.float16, 1e-2)],
)
def test_low_precision_against_float64(dtype, tol):
    tensors, args = case_args(CASES[4])
    y64, g64 = values_and_grads(fused, tensors, args)
    y, grads = values_and_grads(fused, tensors, args, dtype=dtype)
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads.values())
    scale = float(y64.detach().abs().max())
    torch.testing.assert_close(y.double(), y64, rtol=tol, atol=tol * scale)
    for name, g in grads.items():
        ref = g64[name]
        torch.testing.assert_close(
            g.double(),
            ref,
            rtol=tol,
            atol=tol * float(ref.abs().max()),
            msg=name,
        )


def test_backward_saves_no_attention_map():
    B, C, H, K, G = 2, 8, 12, 7, 4
    tensors = [t.requires_grad_() for t in make(B, C, C, H, H, G, K, 1, 3, 1)]
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fused(*tensors, G, K, 1, 3, 1, 'zeros')
    y.sum().backward()
    assert saved and max(saved) == B * C * H * H  # the maps themselves
    assert max(saved) < B * G * K * K * H * H


def grouped(t, G, stride=1):
    """``t`` (B, C, H, W) as a grouped view (B, G, C / G, H, W) of a
    channels-last buffer whose channels interleave the groups (as ACmix's
    projection does), every ``stride``-th pixel of a larger map."""
    B, C, H, W = t.shape
    buf = t.new_zeros(B, H * stride, W * stride, C // G, G)
    view = buf.permute(0, 4, 3, 1, 2)[..., ::stride, ::stride]
    return view.copy_(t.view(B, G, C // G, H, W))


@pytest.mark.parametrize('backend', ['auto', 'torch'])
@pytest.mark.parametrize('case', CASES[:5] + CASES[8:], ids=str)
def test_grouped_views_equal_stock_float64(case, backend):
    """query (strided), key and value as grouped views of any strides: the
    stock numbers of the maps, with each gradient in its view's shape."""
    tensors, args = case_args(case)
    views = [
        grouped(t, args[0], 2 if i == 0 else 1)  # the query strided
        for i, t in enumerate(tensors[:3])
    ]
    with use_backend(backend):
        y, grads = values_and_grads(fused, (*views[:3], *tensors[3:]), args)
    y_ref, grads_ref = values_and_grads(stock, tensors, args)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    assert y.is_contiguous()
    for name, view in zip(NAMES[:3], views[:3], strict=True):
        assert grads[name].shape == view.shape
        torch.testing.assert_close(
            grads[name].flatten(1, 2), grads_ref[name], rtol=1e-10, atol=1e-9
        )


def assert_close_scaled(got, want, tol, msg=''):
    """(y, grads) against the float64 (y, grads) of the stock ops, each to
    ``tol`` of its largest magnitude; gradients in any view's shape."""
    (y, grads), (y_ref, grads_ref) = got, want
    scale = float(y_ref.detach().abs().max())
    torch.testing.assert_close(
        y.double(), y_ref, rtol=tol, atol=tol * scale, msg=msg or None
    )
    for name, g in grads.items():
        ref = grads_ref[name]
        torch.testing.assert_close(
            g.double().reshape(ref.shape),
            ref,
            rtol=tol,
            atol=tol * float(ref.abs().max()),
            msg=f'{name} {msg}',
        )


def head_major(t, G, stride=1):
    """``t`` (B, C, H, W) as ACmix reads its heads: a grouped view (B, G, C
    / G, H, W) of a channels-last buffer in which each head's channels are
    contiguous, every ``stride``-th pixel of a larger map."""
    B, C, H, W = t.shape
    buf = t.new_zeros(B, H * stride, W * stride, G, C // G)
    view = buf.permute(0, 3, 4, 1, 2)[..., ::stride, ::stride]
    return view.copy_(t.view(B, G, C // G, H, W))


# Heads of 20, 16 and 17 channels, rows of 35 to 41 pixels: whole tiles of
# V pixels by V channels (which the C++ kernels transpose in registers, V =
# 2 to 16 by dtype and instruction set) and the pixels and channels past
# them.
HEAD_MAJOR_CASES = [
    (2, 40, 40, 9, 37, 2, 5, 1, 2, 1, 'reflect', True, True),
    (1, 32, 16, 11, 35, 2, 3, 2, 1, 1, 'zeros', False, True),
    (1, 34, 34, 8, 41, 2, 3, 1, 2, 2, 'reflect', True, False),
]


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('case', HEAD_MAJOR_CASES, ids=str)
def test_head_major_views_equal_stock(case, dtype):
    """query (strided at stride 2), key and value as ACmix reads them:
    the stock float64 numbers (float32 to its rounding), each gradient in
    its view's shape."""
    tensors, args = case_args(case)
    G, s = args[0], args[2]
    views = [
        head_major(t.to(dtype), G, s if i == 0 else 1)
        for i, t in enumerate(tensors[:3])
    ]
    extra = [None if t is None else t.to(dtype) for t in tensors[3:]]
    y, grads = values_and_grads(fused, (*views, *extra), args)
    y_ref, grads_ref = values_and_grads(stock, tensors, args)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    assert_close_scaled((y, grads), (y_ref, grads_ref), tol)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('views', [False, True], ids=['maps', 'views'])
def test_every_row_width_equals_stock(dtype, views):
    """Output rows of every width from 1 to 12, across the switch of the
    C++ kernels from their AVX-512 build to the AVX2 one (rows of at most
    32 bytes: 4 doubles, 8 floats) and across maps narrower than the
    padding, as maps and as channels-last grouped views (read a pixel at a
    time), at stride 1 and 2: the stock float64 numbers (float32 to its
    rounding)."""
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for W in range(1, 13):
        s = 2 if W % 3 == 0 else 1
        args = (2, 5, s, 2, 1, 'reflect' if W > 2 else 'zeros')
        tensors = make(2, 6, 4, 5, W * s, *args[:5], seed=W)
        inputs = [grouped(t, 2) if views else t for t in tensors[:3]]
        y, grads = values_and_grads(
            fused, (*inputs, *tensors[3:]), args, dtype=dtype
        )
        y_ref, grads_ref = values_and_grads(stock, tensors, args)
        assert y.shape[-1] == W
        assert_close_scaled((y, grads), (y_ref, grads_ref), tol, f'W={W}')


@needs_cpp
def test_grouped_views_are_read_in_place():
    """The backward keeps the views (their buffers), no copies."""
    tensors, args = case_args(CASES[0])
    views = [grouped(t, args[0]).requires_grad_() for t in tensors[:3]]
    saved = set()
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.add(t.untyped_storage().data_ptr()) or t, lambda t: t
    ):
        y = fused(*views, *tensors[3:], *args)
    y.sum().backward()
    assert {v.untyped_storage().data_ptr() for v in views} <= saved
    assert len(saved) == 3 + 2 + 2  # the views, rel terms, out and lse


# Dilations and paddings far beyond a 4x4 map: windows of zeros or of
# repeated reflections, which the C++ kernel would buffer as rows of the
# padded map (the stock composition runs them).
FAR_CASES = [
    (2, 8, 8, 4, 4, 2, 3, 1, 1000, 1000, 'zeros', True, True),
    (1, 6, 3, 4, 5, 3, 5, 2, 600, 300, 'reflect', True, False),
]


@pytest.mark.parametrize('case', FAR_CASES, ids=str)
def test_far_windows_equal_stock_float64(case):
    tensors, args = case_args(case)
    assert_matches_stock(tensors, args)


@needs_cpp
@pytest.mark.skipif(
    not os.path.exists('/proc/self/clear_refs'), reason='Linux /proc only'
)
def test_far_windows_stay_small():
    """Dilation 1000 on a 4x4 map takes a few MiB (the C++ kernel's row
    buffers would have taken ~0.5 GB and ~1 s). A fresh process, whose
    peak resident size is reset just before the call."""
    code = """if True:
        import torch
        from mmevo.ops import fused_local_attention
        def kib(key):
            with open('/proc/self/status') as f:
                return next(int(l.split()[1]) for l in f if l.startswith(key))
        q, k, v = (torch.randn(1, 8, 4, 4, requires_grad=True) for _ in 'qkv')
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        before = kib('VmRSS:')
        y = fused_local_attention(q, k, v, 1, 3, dilation=1000)
        y.sum().backward()
        print((kib('VmHWM:') - before) // 1024)
    """
    run = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(run.stdout.split()[-1]) < 64, run.stdout  # MiB


@pytest.mark.parametrize('rel', [True, False])
def test_opcheck(rel):
    """Schemas, autograd registration, fake kernels and AOT dispatch (the
    path of torch.compile through the ops)."""
    tensors, args = case_args(CASES[1])
    q, k, v, r, b = tensors
    if not rel:
        r = b = None
    inputs = [t.requires_grad_() if t is not None else t for t in (q, k, v)]
    extra = [t.requires_grad_() if t is not None else t for t in (r, b)]
    torch.library.opcheck(
        torch.ops.mmevo.fused_local_attention.default,
        (*inputs, *extra, *args),
    )
    with torch.no_grad():
        out, lse = torch.ops.mmevo.fused_local_attention(q, k, v, r, b, *args)
    detached = [t.detach() if t is not None else t for t in (q, k, v, r, b)]
    torch.library.opcheck(
        torch.ops.mmevo.fused_local_attention_backward.default,
        (torch.randn_like(out), out, lse, *detached, *args),
    )


def test_fake_shapes_and_absent_rel_grads():
    tensors, args = case_args(CASES[2])  # rel_embed None, rel_bias given
    q, k, v, r, b = (t.to('meta') if t is not None else t for t in tensors)
    out, lse = torch.ops.mmevo.fused_local_attention(q, k, v, r, b, *args)
    assert out.shape == (2, 16, 7, 9) and lse.shape == (2, 1, 7, 9)
    grads = torch.ops.mmevo.fused_local_attention_backward(
        out, out, lse, q, k, v, r, b, *args
    )
    assert [tuple(g.shape) for g in grads] == [
        tuple(q.shape),
        tuple(k.shape),
        tuple(v.shape),
        (0,),
        tuple(b.shape),
    ]
    cpu = torch.ops.mmevo.fused_local_attention_backward(
        *(torch.zeros(out.shape, dtype=torch.float64),) * 2,
        torch.zeros(lse.shape, dtype=torch.float64),
        *(t for t in tensors),
        *args,
    )
    assert [g.shape for g in cpu] == [g.shape for g in grads]


def _compiled_matches_eager(backend):
    tensors, args = case_args(CASES[0])

    def layer(q, k, v, rel, bias):
        return fused(q * 2, k, v, rel, bias, *args).relu()

    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    y, grads = values_and_grads(compiled, tensors, ())
    y_ref, grads_ref = values_and_grads(layer, tensors, ())
    torch.testing.assert_close(y, y_ref)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], msg=name)


def test_torch_compile_fullgraph():
    """One graph through the op, forward and backward (AOT autograd on the
    fake kernels)."""
    _compiled_matches_eager('aot_eager')


def test_torch_compile_inductor():
    """Inductor's graph around the op: the layouts it assumes of the op's
    outputs are the fake kernels'."""
    _compiled_matches_eager('inductor')


def test_autocast():
    """Under CPU autocast every tensor is cast to its dtype, like a
    convolution's inputs."""
    tensors, args = case_args(CASES[0])
    low = [t.float() for t in tensors]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = fused(*low, *args)
    assert y.dtype == torch.bfloat16
    ref = stock(*tensors, *args)
    torch.testing.assert_close(
        y.double(), ref, rtol=5e-2, atol=5e-2 * float(ref.abs().max())
    )


def test_triton_module_hand_off(monkeypatch):
    """On the triton backend with MMEVO_FUSED_TRITON=1, the forward and
    backward are the fused Triton module's (stood in for here), with the
    resolved window; without the flag, the composition runs."""
    tensors, args = case_args(CASES[0])
    y_ref, grads_ref = values_and_grads(stock, tensors, args)
    calls = []

    def forward(q, k, v, rel, bias, groups, window):
        calls.append(('forward', groups, window))
        with use_backend('torch'):
            return fa._unfused_forward(q, k, v, rel, bias, groups, window)

    def backward(grad, out, lse, q, k, v, rel, bias, groups, window):
        calls.append(('backward', groups, window))
        with use_backend('torch'):
            grads = fa._unfused_backward(
                grad, out, lse, q, k, v, rel, bias, groups, window
            )
        return (*grads[:3], None if rel is None else grads[3], grads[4])

    module = types.ModuleType(fa.TRITON_MODULE)
    module.forward, module.backward = forward, backward
    monkeypatch.setitem(sys.modules, fa.TRITON_MODULE, module)
    monkeypatch.setattr(
        fa.importlib.util, 'find_spec', lambda name: name == fa.TRITON_MODULE
    )
    real = fa.backends.backend_name
    # 'auto' is the triton backend here; the stand-in forces 'torch'
    monkeypatch.setattr(
        fa.backends,
        'backend_name',
        lambda t: 'triton' if fa.backends.forced() == 'auto' else real(t),
    )
    monkeypatch.setenv('MMEVO_FUSED_TRITON', '1')
    y, grads = values_and_grads(fused, tensors, args)
    window = Window(*args[1:])
    assert calls == [('forward', 3, window), ('backward', 3, window)]
    torch.testing.assert_close(y, y_ref)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], msg=name)
    monkeypatch.setenv('MMEVO_FUSED_TRITON', '0')
    assert not fa._fused_triton(tensors[0])


def _args(**change):
    q, k, v, r, b = make(2, 8, 4, 9, 9, 2, 3, 1, 1, 1)
    args = dict(
        query=q,
        key=k,
        value=v,
        groups=2,
        kernel_size=3,
        stride=1,
        padding=1,
        dilation=1,
        padding_mode='zeros',
        rel_embed=r,
        rel_bias=b,
    )
    args.update(change)
    return args


f64 = torch.float64
BAD = [
    (dict(query=torch.randn(8, 9, 9)), ValueError, r'query must be \(B, C'),
    (dict(key=[1.0]), TypeError, 'key must be a Tensor'),
    (
        dict(key=torch.randn(2, 4, 2, 9, 9, dtype=f64)),
        ValueError,
        r'key must be \(B, C, H, W\) or \(B, G, C / G, H, W\) with G = '
        r'groups = 2, got \(2, 4, 2, 9, 9\)',
    ),
    (
        dict(value=torch.zeros(2, 4, 9, 9, dtype=torch.int64)),
        TypeError,
        'value must be a floating point tensor',
    ),
    (
        dict(key=torch.randn(2, 8, 9, 9)),
        TypeError,
        'query and key must have the same dtype',
    ),
    (
        dict(value=torch.randn(2, 4, 9, 9, dtype=f64, device='meta')),
        ValueError,
        'query and value must be on the same device',
    ),
    (
        dict(rel_embed=torch.randn(8, 3, 3)),
        TypeError,
        'query and rel_embed must have the same dtype',
    ),
    (
        dict(rel_bias=torch.randn(2, 3, 3, dtype=f64, device='meta')),
        ValueError,
        'query and rel_bias must be on the same device',
    ),
    (
        dict(rel_embed=torch.randn(8, 3, dtype=f64)),
        ValueError,
        r'rel_embed must be \(C, K, K\), got',
    ),
    (
        dict(rel_embed=torch.randn(8, 3, 5, dtype=f64)),
        ValueError,
        r'rel_embed must be \(C, K, K\) = \(8, 3, 3\)',
    ),
    (
        dict(rel_bias=torch.randn(4, 3, 3, dtype=f64)),
        ValueError,
        r'rel_bias must be \(G, K, K\) = \(2, 3, 3\)',
    ),
    (
        dict(query=torch.randn(2, 8, 8, 9, dtype=f64)),
        ValueError,
        r'query must be \(B, C, H_out, W_out\) = \(2, 8, 9, 9\)',
    ),
    (
        dict(value=torch.randn(2, 4, 9, 8, dtype=f64)),
        ValueError,
        'value must be .* with the B, H, W of key',
    ),
    (
        dict(value=torch.randn(2, 3, 9, 9, dtype=f64)),
        ValueError,
        r'value channels \(3\) must be divisible by groups=2',
    ),
    (
        dict(groups=3, rel_bias=None),
        ValueError,
        r'key channels \(8\) must be divisible by groups=3',
    ),
    (dict(groups=0), ValueError, 'groups must be >= 1'),
    (dict(groups=2.0), TypeError, 'groups must be an int'),
    (dict(kernel_size=True), TypeError, 'kernel_size must be an int'),
    (dict(stride=0), ValueError, 'stride must be >= 1'),
    (dict(padding=-1), ValueError, 'padding must be >= 0'),
    (dict(padding=2**63), ValueError, r'padding must be < 2\*\*63'),
    (
        dict(padding=2**62),
        ValueError,
        r'key \+ 2 \* padding does not fit|does not fit in int64',
    ),
    (dict(dilation=2**62), ValueError, 'does not fit in int64'),
    (
        dict(kernel_size=4, padding=None),
        ValueError,
        'needs an odd kernel_size',
    ),
    (dict(padding_mode='circular'), ValueError, 'padding_mode must be one'),
    (
        dict(padding=0, kernel_size=11, rel_embed=None, rel_bias=None),
        ValueError,
        'key height of 9 is too small for kernel_size=11',
    ),
]


@pytest.mark.parametrize(
    'change, error, message',
    BAD,
    ids=[f'{next(iter(change))}: {message}' for change, _, message in BAD],
)
def test_bad_input(change, error, message):
    with pytest.raises(error, match=message):
        fused_local_attention(**_args(**change))


def test_bad_backward_input():
    a = _args()
    q, k, v, r, b = (a[n] for n in NAMES)
    scalars = (2, 3, 1, 1, 1, 'zeros')
    out, lse = torch.ops.mmevo.fused_local_attention(q, k, v, r, b, *scalars)
    op = torch.ops.mmevo.fused_local_attention_backward
    with pytest.raises(ValueError, match=r'grad must be \(B, C_v, H_out'):
        op(out[:, :2], out, lse, q, k, v, r, b, *scalars)
    with pytest.raises(TypeError, match=r'lse must be torch\.float64'):
        op(out, out, lse.float(), q, k, v, r, b, *scalars)
    with pytest.raises(ValueError, match=r'lse must be \(B, G, H_out'):
        op(out, out, lse[:1], q, k, v, r, b, *scalars)


ISA_SCRIPT = r"""
import sys
sys.path.insert(0, {here!r})
from mmevo.ops import cpp_backend
import torch
from test_fused_attention import (
    CASES, HEAD_MAJOR_CASES, assert_matches_stock, case_args,
    test_head_major_views_equal_stock)
assert cpp_backend.isa() == {isa!r}, cpp_backend.isa()
for case in CASES:
    assert_matches_stock(*case_args(case))
for case in HEAD_MAJOR_CASES:
    for dtype in (torch.float64, torch.float32):
        test_head_major_views_equal_stock(case, dtype)
print('ok')
"""


@needs_cpp
@pytest.mark.parametrize('isa', ['avx2', 'base'])
def test_narrower_instruction_sets(isa):
    """The AVX2 and baseline builds of the kernels (``MMEVO_CPU_ISA``, read
    when the library loads: a subprocess each)."""
    if isa == 'avx2' and cpp_backend.isa() == 'base':
        pytest.skip('this CPU has no AVX2')
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MMEVO_CPU_ISA=isa, OMP_NUM_THREADS='2')
    result = subprocess.run(
        [sys.executable, '-c', ISA_SCRIPT.format(here=here, isa=isa)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and 'ok' in result.stdout, result.stderr
