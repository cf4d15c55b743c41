"""The Triton kernels against the reference: interpreted on CPU, compiled on
CUDA.

Without CUDA, Triton's interpreter runs the kernels on CPU tensors. Triton
decides whether a function is interpreted when it is decorated (its own
``triton.language`` helpers included), so ``TRITON_INTERPRET=1`` must be set
before anything imports triton: ``tests/conftest.py`` sets it (torch >= 2.14
imports triton with ``torch._dynamo``), and the check below says so when the
file runs in a process that imported triton first. With CUDA the same
checks run the compiled kernels on the GPU. The interpreter is slow: a small
sweep, forward and every gradient, fp32 and bf16.
"""

import importlib
import os
import sys

import torch

INTERPRET = not torch.cuda.is_available()
if INTERPRET:
    assert (
        'triton' not in sys.modules
        or os.environ.get('TRITON_INTERPRET') == '1'
    ), (
        'triton was imported before TRITON_INTERPRET=1 could be set: run '
        'tests/ops/test_triton_interpret.py in its own process'
    )
    os.environ['TRITON_INTERPRET'] = '1'
DEVICE = 'cpu' if INTERPRET else 'cuda'

# Imported after TRITON_INTERPRET is set (E402 is off for this file in
# pyproject.toml).
import pytest

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

tk = importlib.import_module('mmevo.ops.triton_backend')
pytestmark = [pytest.mark.cuda, pytest.mark.slow]

# (B, C, G, H, W, K, stride, padding, dilation)
GEOMETRIES = [
    (2, 16, 1, 7, 9, 3, 1, 1, 1),
    (1, 32, 2, 9, 6, 5, 2, 2, 1),
    (1, 6, 6, 5, 7, 3, 3, 2, 2),
    (1, 4, 4, 2, 3, 7, 1, 3, 1),
    (1, 12, 3, 1, 1, 1, 1, 0, 1),
    (1, 8, 2, 11, 5, 3, 2, 3, 3),
    (
        1,
        40,
        1,
        5,
        4,
        3,
        1,
        1,
        1,
    ),  # 40 channels in a group: several channel blocks
]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def run_primitives(x, w, q, gy, go, geom):
    """Triton forward and the three gradient products, computed directly."""
    _, _, G, H, W, K, s, p, d = geom
    window = Window(K, s, p, d)
    return dict(
        y=tk.aggregate(x, w, window),
        gx=tk.aggregate_transpose(gy, w, (H, W), window),
        gw=tk.correlate(gy, x, G, window),
        o=tk.correlate(q, x, G, window),
        gq=tk.aggregate(x, go, window),
        gk=tk.aggregate_transpose(q, go, (H, W), window),
        a=tk.correlate(q, x, G, window, softmax=True),
    )


def reference_products(x, w, q, gy, go, geom):
    """The same six tensors from the reference formula and autograd."""
    _, _, G, _H, _W, K, s, p, d = geom
    xr, wr = leaf(x), leaf(w)
    y = aggregate_reference(xr, wr, Window(K, s, p, d, 'zeros'))
    y.backward(gy)
    qc, xc = leaf(q), leaf(x)
    o = correlation_reference(qc, xc, G, Window(K, s, p, d, 'zeros'))
    o.backward(go)
    return dict(
        y=y,
        gx=xr.grad,
        gw=wr.grad,
        o=o,
        gq=qc.grad,
        gk=xc.grad,
        a=attention_weights_reference(q, x, G, Window(K, s, p, d, 'zeros')),
    )


def make_inputs(geom, dtype, seed):
    B, C, G, H, W, K, s, p, d = geom
    Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
    gen = torch.Generator().manual_seed(seed)
    shapes = [
        (B, C, H, W),
        (B, G, K, K, Ho, Wo),
        (B, C, Ho, Wo),
        (B, C, Ho, Wo),
        (B, G, K, K, Ho, Wo),
    ]
    return [torch.randn(*sh, generator=gen).to(DEVICE, dtype) for sh in shapes]


@pytest.mark.parametrize('geom', GEOMETRIES)
def test_triton_fp32(geom):
    inputs = make_inputs(geom, torch.float32, 0)
    got = run_primitives(*inputs, geom)
    ref = reference_products(*[t.double() for t in inputs], geom)
    for name in ref:
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(
            got[name].double(), ref[name], rtol=1e-5, atol=1e-5, msg=name
        )


@pytest.mark.parametrize('geom', GEOMETRIES[:3])
def test_triton_bf16(geom):
    """bf16 in, fp32 accumulation, bf16 out: within bf16 rounding of the
    result."""
    inputs = make_inputs(geom, torch.bfloat16, 1)
    got = run_primitives(*inputs, geom)
    ref = reference_products(*[t.double() for t in inputs], geom)
    for name in ref:
        assert got[name].dtype == torch.bfloat16
        err = (got[name].double() - ref[name]).abs().max()
        assert err <= 1e-2 * ref[name].abs().max() + 1e-6, (name, err)


@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
def test_triton_through_the_ops(mode):
    """The registered ops on the Triton backend: padding modes and autograd."""
    gen = torch.Generator().manual_seed(5)
    x, w, q, gy = (
        torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE)
        for shape in [
            (1, 8, 4, 5),
            (1, 2, 5, 5, 4, 5),
            (1, 8, 4, 5),
            (1, 8, 4, 5),
        ]
    )
    results = []
    for triton_backend in (True, False):
        xa, wa, qa = leaf(x), leaf(w), leaf(q)
        with library.use_backend('triton' if triton_backend else 'auto'):
            if triton_backend:
                y = evolution_aggregate(xa, wa, 1, None, 1, mode)
                o = local_correlation(qa, xa, 2, 5, 1, None, 1, mode)
                a = local_attention_weights(qa, xa, 2, 5, 1, None, 1, mode)
            else:
                y = aggregate_reference(xa, wa, Window(5, 1, 2, 1, mode))
                o = correlation_reference(qa, xa, 2, Window(5, 1, 2, 1, mode))
                a = attention_weights_reference(
                    qa, xa, 2, Window(5, 1, 2, 1, mode)
                )
            # Inside the block: the backward runs the ops (on this backend)
            # too.
            (y * gy).sum().add(o.square().sum()).add(
                a.square().sum()
            ).backward()
        results.append([y, o, a, xa.grad, wa.grad, qa.grad])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)
