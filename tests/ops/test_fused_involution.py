"""mmevo::fused_involution against the unfused composition (the span
convolution, then the aggregation), in float64: values and the gradients of
the input, z, the span weight and bias, on every backend; low precision
against float64; empty batches, channels-last, double backward, the fake
kernel, what the backward saves, and the bad-input messages."""

import os
import random
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from mmevo.ops import cpp_backend, evolution_aggregate, use_backend
from mmevo.ops.fused_involution import fused_involution

needs_cpp = pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)


def out_size(n, K, s, d):
    return (n + 2 * (d * (K - 1) // 2) - d * (K - 1) - 1) // s + 1


def make(B, C, H, W, K, s, d, G, Cr, bias=True, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    Ho, Wo = out_size(H, K, s, d), out_size(W, K, s, d)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    return (
        randn(B, C, H, W),
        randn(B, Cr, Ho, Wo),
        randn(G * K * K, Cr, 1, 1) / Cr**0.5,
        randn(G * K * K) if bias else None,
    )


def unfused(x, z, S, b, K, s, d, G):
    """The independent reference: aten's 1x1 convolution, then the mmevo
    aggregation (itself tested against unfold)."""
    w = F.conv2d(z, S, b)
    w = w.view(w.shape[0], G, K, K, *w.shape[-2:])
    return evolution_aggregate(x, w, s, d * (K - 1) // 2, d)


def values_and_grads(fn, tensors, window, gy_seed=1):
    leaves = [
        t.clone().requires_grad_() if t is not None else None for t in tensors
    ]
    y = fn(*leaves, *window)
    gen = torch.Generator().manual_seed(gy_seed)
    # drawn in float64 for every dtype: the same numbers
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    gy = gy.to(y.dtype)
    wanted = [t for t in leaves if t is not None]
    return y, torch.autograd.grad(y, wanted, gy)


def assert_matches_unfused(tensors, window, atol=1e-10):
    y, grads = values_and_grads(fused_involution, tensors, window)
    y_ref, grads_ref = values_and_grads(unfused, tensors, window)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=atol)
    # no bias: three gradients, the names' first three
    for name, g, g_ref in zip(
        ('x', 'z', 'S', 'b'), grads, grads_ref, strict=False
    ):
        scale = max(1.0, float(g_ref.abs().max()))
        torch.testing.assert_close(
            g, g_ref, rtol=1e-10, atol=atol * scale, msg=name
        )


# (B, C, H, W, K, s, d, G, Cr): odd sizes, every stride / dilation mix,
# tiles whose last rows are 1, 2 or 3 vectors past the kernels' 4-vector
# blocks (float64 on AVX-512: 7 x 20 leaves one row of three).
CASES = [
    (2, 32, 9, 11, 3, 1, 1, 2, 8),
    (2, 16, 13, 10, 7, 2, 2, 1, 5),
    (1, 48, 7, 7, 5, 2, 1, 3, 3),
    (3, 8, 5, 6, 1, 1, 1, 8, 2),
    (1, 4, 20, 3, 3, 3, 2, 1, 1),
    (2, 64, 15, 17, 7, 1, 1, 4, 16),
    (1, 16, 7, 20, 3, 1, 1, 2, 4),
]


@pytest.mark.parametrize('backend', ['auto', 'torch'])
@pytest.mark.parametrize('case', CASES, ids=str)
def test_equals_unfused_float64(case, backend):
    *shape, K, s, d, G, Cr = case
    with use_backend(backend):
        assert_matches_unfused(make(*shape, K, s, d, G, Cr), (K, s, d, G))


def test_seeded_sweep_odd_sizes():
    rng = random.Random(0)
    for seed in range(12):
        G, K = rng.choice([1, 2, 3]), rng.choice([1, 3, 5, 7])
        s, d = rng.choice([1, 2, 3]), rng.choice([1, 2])
        C = G * rng.choice([1, 3, 5, 16])
        H, W = rng.randint(1, 14), rng.randint(1, 14)
        tensors = make(
            rng.randint(1, 3),
            C,
            H,
            W,
            K,
            s,
            d,
            G,
            rng.randint(1, 9),
            bias=bool(seed % 2),
            seed=seed,
        )
        assert_matches_unfused(tensors, (K, s, d, G))


@needs_cpp
@pytest.mark.parametrize('shape', [(4, 16, 7, 7, 7, 1, 1, 4, 32), CASES[5]])
def test_same_bits_for_any_thread_count(shape):
    """The backward's plan (strips, and runs each summing its own grad_S)
    depends on the shapes alone: 1, 2 and 3 threads give the same bits.
    The first shape's grad_S partial sums are each larger than x (4 runs
    all the same, shared out between the threads)."""
    tensors = make(*shape, dtype=torch.float32)
    K, s, d, G = shape[4:8]
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y, grads = values_and_grads(
                fused_involution, tensors, (K, s, d, G)
            )
            results.append([y, *grads])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(map(torch.equal, results[0], other))


@needs_cpp
def test_gradcheck_and_gradgradcheck():
    x, z, S, b = (t.requires_grad_() for t in make(1, 4, 5, 6, 3, 2, 2, 2, 3))
    window = (3, 2, 2, 2)

    def fn(*tensors):
        return fused_involution(*tensors, *window)

    assert torch.autograd.gradcheck(fn, (x, z, S, b))
    # The double backward differentiates the unfused composition.
    assert torch.autograd.gradgradcheck(fn, (x, z, S, b))


def test_backward_saves_no_kernel_map():
    B, C, H, K, G, Cr = 2, 16, 12, 7, 2, 4
    tensors = [t.requires_grad_() for t in make(B, C, H, H, K, 1, 1, G, Cr)]
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fused_involution(*tensors, K, 1, 1, G)
    y.sum().backward()
    kernel_map = B * G * K * K * H * H
    assert saved and max(saved) < kernel_map
    assert max(saved) == B * C * H * H  # x itself


@pytest.mark.parametrize('B, C', [(0, 16), (2, 0)])
def test_empty(B, C):
    x, z, S, b = make(B, max(C, 1), 9, 7, 3, 2, 1, 1, 4)
    x = x[:, :C].clone().requires_grad_()
    z, S, b = (t.requires_grad_() for t in (z, S, b))
    y = fused_involution(x, z, S, b, 3, 2, 1, 1)
    assert y.shape == (B, C, 5, 4)
    y.sum().backward()
    assert x.grad.shape == x.shape and not x.grad.any()
    assert not z.grad.any() and not S.grad.any() and not b.grad.any()


def channels_last(tensors, z_layout):
    """x channels-last, z channels-last, NCHW or a strided view."""
    x, z, S, b = tensors
    x = x.contiguous(memory_format=torch.channels_last)
    if z_layout == 'channels_last':
        z = z.contiguous(memory_format=torch.channels_last)
    elif z_layout == 'strided':  # every other column of a wider map
        wide = z.new_zeros(*z.shape[:-1], 2 * z.shape[-1])
        wide[..., ::2] = z
        z = wide[..., ::2]
    return x, z, S, b


# CASES with output maps of 14² pixels or more, where the C++ kernel reads
# channels-last maps in place and computes the kernel per row.
LARGE_CASES = [
    (2, 32, 19, 21, 3, 1, 1, 2, 8),
    (1, 16, 29, 30, 7, 2, 2, 1, 5),
    (1, 48, 14, 17, 5, 1, 1, 3, 3),
    (2, 12, 16, 15, 1, 1, 1, 4, 2),
    (1, 20, 45, 44, 3, 3, 2, 4, 1),
]


@pytest.mark.parametrize(
    'z_layout', ['channels_last', 'contiguous', 'strided']
)
@pytest.mark.parametrize('case', CASES + LARGE_CASES, ids=str)
def test_channels_last_equals_unfused_float64(case, z_layout):
    """A channels-last input is read in place, whatever z's layout (the C++
    kernel's channels-last paths; every case has a map larger than 1 x 1,
    so the input is channels-last and not also contiguous)."""
    *shape, K, s, d, G, Cr = case
    tensors = channels_last(make(*shape, K, s, d, G, Cr), z_layout)
    y = fused_involution(*tensors, K, s, d, G)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert_matches_unfused(tensors, (K, s, d, G))


def test_channels_last_seeded_sweep_odd_sizes():
    """Groups of any width (a vector's channels and a scalar tail), pixel
    blocks cut by the map's edge, K = 1, strides past the window, and
    output maps on both sides of 14² pixels, below which the C++ kernel
    takes the kernel map from one matmul."""
    rng = random.Random(1)
    pixels = []
    for seed in range(20):
        G, K = rng.choice([1, 2, 3]), rng.choice([1, 3, 5, 7])
        s, d = rng.choice([1, 1, 2, 3]), rng.choice([1, 2])
        C = G * rng.choice([1, 3, 5, 8, 16, 20])
        H, W = rng.randint(2, 37), rng.randint(2, 37)
        pixels.append(out_size(H, K, s, d) * out_size(W, K, s, d))
        tensors = make(
            rng.randint(1, 2),
            C,
            H,
            W,
            K,
            s,
            d,
            G,
            rng.randint(1, 9),
            bias=bool(seed % 2),
            seed=seed,
        )
        z_layout = rng.choice(['channels_last', 'contiguous', 'strided'])
        assert_matches_unfused(channels_last(tensors, z_layout), (K, s, d, G))
    assert min(pixels) < 14 * 14 <= max(pixels)


@pytest.mark.parametrize(
    'dtype, tol',
    [(torch.float32, 1e-5), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)],
)
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
def test_low_precision_against_float64(dtype, tol, layout):
    # 16 x 15 output pixels: channels-last, the fused kernel's path
    tensors = make(2, 32, 16, 15, 7, 1, 1, 2, 8)
    if layout == 'channels_last':
        tensors = channels_last(tensors, 'channels_last')
    window = (7, 1, 1, 2)
    y64, g64 = values_and_grads(fused_involution, tensors, window)
    low = [t.to(dtype) for t in tensors]
    y, grads = values_and_grads(fused_involution, low, window)
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    scale = float(y64.abs().max())
    torch.testing.assert_close(y.double(), y64, rtol=tol, atol=tol * scale)
    for g, ref in zip(grads, g64, strict=True):
        torch.testing.assert_close(
            g.double(), ref, rtol=tol, atol=tol * float(ref.abs().max())
        )


def test_fake_kernel_shape():
    x, z, S, b = (t.to('meta') for t in make(2, 16, 9, 8, 3, 2, 1, 2, 4))
    y = fused_involution(x, z, S, b, 3, 2, 1, 2)
    assert y.device.type == 'meta' and y.shape == (2, 16, 5, 4)
    grads = torch.ops.mmevo.fused_involution_backward(
        y, x, z, S, b, 3, 2, 1, 2
    )
    assert [g.shape for g in grads] == [x.shape, z.shape, S.shape, b.shape]


def _args(**change):
    x, z, S, b = make(2, 8, 9, 9, 3, 1, 1, 2, 4)
    args = dict(
        input=x,
        z=z,
        span_weight=S,
        span_bias=b,
        kernel_size=3,
        stride=1,
        dilation=1,
        groups=2,
    )
    args.update(change)
    return args


BAD = [
    (dict(input=torch.randn(8, 9, 9)), ValueError, r'input must be \(B, C'),
    (
        dict(z=torch.randn(2, 4, 9, 9).float()),
        TypeError,
        'input and z must have the same dtype',
    ),
    (
        dict(z=torch.zeros(2, 4, 9, 9, dtype=torch.int64)),
        TypeError,
        'z must be a floating point tensor',
    ),
    (
        dict(z=torch.randn(2, 4, 8, 9, dtype=torch.float64)),
        ValueError,
        r'z must be \(B, C_r, H_out, W_out\) = \(2, 4, 9, 9\)',
    ),
    (
        dict(z=torch.randn(2, 5, 9, 9, dtype=torch.float64)),
        ValueError,
        r'span_weight must be \(G\*K\*K, C_r, 1, 1\) = \(18, 5, 1, 1\)',
    ),
    (
        dict(span_weight=torch.randn(18, 4, 3, 1, dtype=torch.float64)),
        ValueError,
        'span_weight must be',
    ),
    (
        dict(span_bias=torch.randn(17, dtype=torch.float64)),
        ValueError,
        r'span_bias must be \(G\*K\*K,\) = \(18,\)',
    ),
    (
        dict(span_bias=torch.randn(18).to('meta').double()),
        ValueError,
        'input and span_bias must be on the same device',
    ),
    (dict(kernel_size=4), ValueError, 'kernel_size must be odd'),
    (dict(kernel_size=2.0), TypeError, 'kernel_size must be an int'),
    (dict(stride=0), ValueError, 'stride must be >= 1'),
    (dict(dilation=2**63), ValueError, 'dilation must be < 2\\*\\*63'),
    (dict(dilation=2**62), ValueError, 'does not fit in int64'),
    (dict(dilation=2**62 - 1), ValueError, 'dilation=4611686018427387903 '),
    (dict(groups=3), ValueError, 'must be divisible by groups=3'),
]


@pytest.mark.parametrize(
    'change, error, message',
    BAD,
    # by argument and message: the tensors' values would differ between
    # pytest-xdist's workers
    ids=[f'{next(iter(change))}: {message}' for change, _, message in BAD],
)
def test_bad_input(change, error, message):
    with pytest.raises(error, match=message):
        fused_involution(**_args(**change))


@pytest.mark.parametrize('bias', [True, False])
def test_opcheck(bias):
    """Schema, autograd registration, fake kernel and AOT dispatch
    (torch.compile's path through the op)."""
    x, z, S, b = make(1, 8, 7, 6, 3, 2, 1, 2, 3, bias=bias)
    tensors = [
        t.requires_grad_() if t is not None else t for t in (x, z, S, b)
    ]
    torch.library.opcheck(
        torch.ops.mmevo.fused_involution.default, (*tensors, 3, 2, 1, 2)
    )


def test_gradient_of_some_inputs_only():
    x, z, S, b = make(2, 16, 9, 8, 5, 1, 1, 2, 4)
    ref = values_and_grads(unfused, (x, z, S, b), (5, 1, 1, 2))[1]
    z, S = z.clone().requires_grad_(), S.clone().requires_grad_()
    y = fused_involution(x, z, S, b, 5, 1, 1, 2)
    gen = torch.Generator().manual_seed(1)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    grad_z, grad_s = torch.autograd.grad(y, (z, S), gy)
    torch.testing.assert_close(grad_z, ref[1], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_s, ref[2], rtol=1e-10, atol=1e-9)


ISA_SCRIPT = r"""
import sys
sys.path.insert(0, {here!r})
from mmevo.ops import cpp_backend
from test_fused_involution import (
    CASES, LARGE_CASES, assert_matches_unfused, channels_last, make
)
assert cpp_backend.isa() == {isa!r}, cpp_backend.isa()
for *shape, K, s, d, G, Cr in CASES:
    assert_matches_unfused(make(*shape, K, s, d, G, Cr), (K, s, d, G))
for *shape, K, s, d, G, Cr in CASES + LARGE_CASES:
    tensors = channels_last(make(*shape, K, s, d, G, Cr), 'channels_last')
    assert_matches_unfused(tensors, (K, s, d, G))
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


def test_a_stride_past_the_map_reads_one_window():
    """A stride past the padded map, up to int64's largest: one output
    pixel, the values and gradients of the smallest such stride."""
    gen = torch.Generator().manual_seed(6)
    args = [
        torch.randn(*shape, generator=gen, dtype=torch.float64)
        for shape in ((1, 4, 5, 6), (1, 3, 1, 1), (18, 3, 1, 1), (18,))
    ]
    outs = []
    for stride in (2**62, 8):
        leaves = [t.clone().requires_grad_() for t in args]
        y = fused_involution(*leaves, 3, stride, 1, 2)
        y.sum().backward()
        outs.append((y, *(t.grad for t in leaves)))
    for got, ref in zip(*outs, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
