"""The ops on the Triton backend against the float64 reference: the GPU
check's part of the op tests (``pytest -m cuda``).

On a GPU: fp32 / fp16 / bf16 over 160 seeded geometries of
``test_evolution_ops.random_config``, every geometry with one tile config
(round-robin, so the sweep covers all of them without autotuning); second
derivatives; bit-identical reruns; a map of more than 2**31 elements; the
autotuned configs at the RedNet-50 stage shapes. Without one, a few
geometries run on CPU tensors through Triton's interpreter (one tile
config) and the CUDA-only checks skip.
"""

import importlib
import random

import pytest
import torch
from test_evolution_ops import make, random_config

from mmevo.ops import (
    evolution_aggregate,
    local_attention_weights,
    local_correlation,
    output_size,
)
from mmevo.ops.checks import Window
from mmevo.ops.library import use_backend
from mmevo.ops.reference import (
    aggregate_reference,
    attention_weights_reference,
    correlation_reference,
)

pytestmark = pytest.mark.slow

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason='needs a CUDA device')
tk = importlib.import_module('mmevo.ops.triton_backend')

# The interpreter is slow: a few geometries in CI.
N_GEOMETRIES = 160 if CUDA else 3
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# max |got - ref| / max |ref|, ref in float64 of the same rounded inputs:
# what is left is the rounding of the result (fp32 accumulation).
TOL = {
    torch.float32: 2e-5,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
    torch.float64: 1e-10,
}


SMALL = dict(
    B=2,
    C=6,
    G=3,
    H=5,
    W=4,
    K=3,
    s=2,
    d=1,
    p=1,
    pad=1,
    mode='reflect',
    layout='contiguous',
)


def rel_err(got, ref):
    """max |got - ref| / max |ref| in float64; inf if ``got`` is not
    finite."""
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape
    if not torch.isfinite(got).all():
        return float('inf')
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def op_cases(cfg):
    """name -> (mmevo op, its reference, input names, grad-output name)."""
    G, K, s, d, mode = (cfg[k] for k in ('G', 'K', 's', 'd', 'mode'))
    p, pad = cfg['p'], cfg['pad']
    return {
        'aggregate': (
            lambda x, w: evolution_aggregate(x, w, s, p, d, mode),
            lambda x, w: aggregate_reference(x, w, Window(K, s, pad, d, mode)),
            ('x', 'w'),
            'gy',
        ),
        'correlation': (
            lambda q, x: local_correlation(q, x, G, K, s, p, d, mode),
            lambda q, x: correlation_reference(
                q, x, G, Window(K, s, pad, d, mode)
            ),
            ('q', 'x'),
            'go',
        ),
        'attention': (
            lambda q, x: local_attention_weights(q, x, G, K, s, p, d, mode),
            lambda q, x: attention_weights_reference(
                q, x, G, Window(K, s, pad, d, mode)
            ),
            ('q', 'x'),
            'go',
        ),
    }


def inputs(cfg, seed, dtype, device):
    """Seeded inputs in ``cfg['layout']``, already rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    B, C, G, K = cfg['B'], cfg['C'], cfg['G'], cfg['K']
    Ho = output_size(cfg['H'], K, cfg['s'], cfg['pad'], cfg['d'])
    Wo = output_size(cfg['W'], K, cfg['s'], cfg['pad'], cfg['d'])
    shapes = dict(
        x=(B, C, cfg['H'], cfg['W']),
        w=(B, G, K, K, Ho, Wo),
        q=(B, C, Ho, Wo),
        gy=(B, C, Ho, Wo),
        go=(B, G, K, K, Ho, Wo),
    )
    out = {n: make(sh, cfg['layout'], gen) for n, sh in shapes.items()}
    # O(1) outputs: kernel taps ~ 1/K, attention logits ~ 1 (1/sqrt(d)).
    out['w'] = out['w'] / K
    out['q'] = out['q'] * (C // G) ** -0.5
    return {n: t.to(dtype).to(device) for n, t in out.items()}


def forward_backward(fn, tensors, grad_out):
    """[output, grad of every input]."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    return [out.detach(), *list(torch.autograd.grad(out, leaves, grad_out))]


def sweep_config(seed):
    return random_config(random.Random(10_000 + seed))


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('seed', range(N_GEOMETRIES))
def test_triton_matches_float64(seed, dtype, device):
    """Forward and every input gradient of the three ops."""
    cfg = sweep_config(seed)
    t = inputs(cfg, seed, dtype, device)
    with tk.fixed_config(seed % len(tk.CONFIGS)):
        for name, (op, ref, args, gout) in op_cases(cfg).items():
            with use_backend('triton'):
                got = forward_backward(op, [t[a] for a in args], t[gout])
            want = forward_backward(
                ref, [t[a].double() for a in args], t[gout].double()
            )
            for what, a, b in zip(
                ['out', *list(args)], got, want, strict=True
            ):
                assert a.dtype == dtype, (name, what)
                err = rel_err(a, b)
                assert err <= TOL[dtype], (name, what, err, cfg)


@pytest.mark.cuda
def test_sweep_covers_every_tile_config():
    """The GPU sweep runs each tile config on many geometries."""
    per_config = N_GEOMETRIES // len(tk.CONFIGS)
    assert per_config >= (16 if CUDA else 3)
    cfgs = [sweep_config(s) for s in range(N_GEOMETRIES)]
    assert {c['mode'] for c in cfgs} == {'zeros', 'reflect'}
    if CUDA:
        assert {c['K'] for c in cfgs} == {1, 3, 5, 7}
        assert {c['s'] for c in cfgs} == {1, 2, 3} == {c['d'] for c in cfgs}


@pytest.mark.cuda
def test_second_derivatives_match_reference(device):
    """d/d(inputs) of <v, grad(out)> of every op, float64, against the
    reference's."""
    cfg = SMALL
    t = inputs(cfg, 7, torch.float64, device)
    for name, (op, ref, args, gout) in op_cases(cfg).items():
        results = []
        for fn, backend in ((op, 'triton'), (ref, 'auto')):
            leaves = [t[a].clone().requires_grad_() for a in args]
            # One tile config: not autotuned.
            with use_backend(backend), tk.fixed_config(len(tk.CONFIGS) - 1):
                grads = torch.autograd.grad(
                    fn(*leaves), leaves, t[gout], create_graph=True
                )
                gen = torch.Generator().manual_seed(1)
                total = sum(
                    (
                        g
                        * torch.randn(
                            g.shape, generator=gen, dtype=g.dtype
                        ).to(device)
                    ).sum()
                    for g in grads
                )
                results.append(torch.autograd.grad(total, leaves))
        for a, got, want in zip(args, *results, strict=True):
            assert rel_err(got, want) <= TOL[torch.float64], (name, a)


@pytest.mark.cuda
@needs_cuda
def test_gradgradcheck_aggregate(device):
    gen = torch.Generator().manual_seed(0)
    x, w = (
        torch.randn(*shape, generator=gen, dtype=torch.float64)
        .to(device)
        .requires_grad_()
        for shape in [(1, 4, 5, 4), (1, 2, 3, 3, 3, 2)]
    )
    with use_backend('triton'):
        assert torch.autograd.gradgradcheck(
            lambda a, b: evolution_aggregate(a, b, 2, 1, 1, 'reflect'), (x, w)
        )


@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize('seed', range(12 if CUDA else 1))
def test_reruns_are_bit_identical(seed, dtype, device):
    """Forward and gradients of every op: the same bits twice (the kernels
    use no atomics)."""
    # The interpreter: one small map (a sweep geometry can take minutes).
    cfg = (
        sweep_config(1000 + seed)
        if CUDA
        else dict(SMALL, mode='zeros' if dtype == torch.float32 else 'reflect')
    )
    t = inputs(cfg, seed, dtype, device)
    with tk.fixed_config(seed % len(tk.CONFIGS)), use_backend('triton'):
        for name, (op, _, args, gout) in op_cases(cfg).items():
            first, second = (
                forward_backward(op, [t[a] for a in args], t[gout])
                for _ in range(2)
            )
            assert all(map(torch.equal, first, second)), name


@pytest.mark.cuda
@needs_cuda
def test_more_than_2_31_elements(device):
    """fp16 maps of 2.5e9 elements: the kernels' offsets are int64."""
    B, C, H, W, K = 2, 1024, 1100, 1100, 3
    assert B * C * H * W > 2**31
    x = torch.randn(B, C, H, W, device=device, dtype=torch.float16)
    w = torch.randn(B, 1, K, K, H, W, device=device, dtype=torch.float16) / K
    gy = torch.randn_like(x)
    x.requires_grad_()
    with use_backend('triton'), tk.fixed_config(0):
        y = evolution_aggregate(x, w, 1, 1, 1, 'zeros')
        (gx,) = torch.autograd.grad(y, x, gy)
    # The last channels: offsets above 2**31.
    xs = x.detach()[:, -2:].double().requires_grad_()
    ys = aggregate_reference(xs, w.double(), Window(K, 1, 1, 1, 'zeros'))
    (gxs,) = torch.autograd.grad(ys, xs, gy[:, -2:].double())
    assert rel_err(y[:, -2:], ys) <= TOL[torch.float16]
    assert rel_err(gx[:, -2:], gxs) <= TOL[torch.float16]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize('C,H', [(64, 56), (128, 28), (256, 14), (512, 7)])
def test_autotuned_rednet50_stages(C, H, dtype, device):
    """The configs autotuning picks at RedNet-50's involutions (K = 7, 16
    channels per group, batch 8), against the shift-and-add formulation in
    float64."""
    gen = torch.Generator().manual_seed(C)
    x = torch.randn(8, C, H, H, generator=gen).to(device, dtype)
    w = (torch.randn(8, C // 16, 7, 7, H, H, generator=gen) / 7).to(
        device, dtype
    )
    gy = torch.randn(8, C, H, H, generator=gen).to(device, dtype)
    with use_backend('triton'):
        got = forward_backward(evolution_aggregate, [x, w], gy)
    with use_backend('torch'):
        want = forward_backward(
            evolution_aggregate, [x.double(), w.double()], gy.double()
        )
    for what, a, b in zip(('out', 'x', 'w'), got, want, strict=True):
        assert rel_err(a, b) <= TOL[dtype], what
