"""Every layer on the Triton backend: the GPU check's part of the layer
tests (``pytest -m cuda``).

Output and every gradient (input and parameters) against the shift-and-add
backend (``use_backend('torch')``) in float64, and under bf16 autocast
against that float64 run; ``torch.compile(fullgraph=True)`` against eager
on CUDA. Without a GPU the layers run on CPU tensors through Triton's
interpreter; each layer gets its own tile config.
"""

import copy
import importlib

import pytest
import torch

from mmevo.layers import (
    ELSA,
    ACmix,
    DynamicFilter,
    EvolutionConv,
    Involution,
    LocalSelfAttention,
)
from mmevo.ops.library import use_backend

pytestmark = pytest.mark.slow

CUDA = torch.cuda.is_available()
tk = importlib.import_module('mmevo.ops.triton_backend')

# name -> (module factory, input shape): strided, odd sizes.
LAYERS = {
    'EvolutionConv': (lambda: EvolutionConv(8, 3, stride=2), (2, 8, 7, 6)),
    'Involution': (lambda: Involution(32, 7, stride=2), (2, 32, 15, 16)),
    'DynamicFilter': (lambda: DynamicFilter(16, stride=2), (2, 16, 7, 8)),
    'LocalSelfAttention': (
        lambda: LocalSelfAttention(16, num_heads=4, kernel_size=5, stride=2),
        (2, 16, 9, 8),
    ),
    'ELSA': (lambda: ELSA(24, 2, kernel_size=3, stride=2), (2, 24, 7, 6)),
    'ACmix': (lambda: ACmix(32, 32, stride=2), (2, 32, 7, 3)),
}
# A chain of bf16 ops against float64, by the relative L2 norm.
AUTOCAST_TOL = 5e-2


def run(layer, x, backend, autocast=None):
    """name -> output, grad of the input and of every parameter."""
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with (
        use_backend(backend),
        torch.autocast(
            x.device.type,
            dtype=autocast or torch.float32,
            enabled=autocast is not None,
        ),
    ):
        out = layer(x)
    params = [p for p in layer.parameters() if p.requires_grad]
    gout = torch.randn(
        out.shape,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64,
    ).to(x.device, out.dtype)
    grads = torch.autograd.grad(out, [x, *params], gout, allow_unused=True)
    # A compiled module prefixes its parameters' names.
    names = ['out', 'grad_input'] + [
        'grad_' + n.removeprefix('_orig_mod.')
        for n, p in layer.named_parameters()
        if p.requires_grad
    ]
    return dict(zip(names, [out, *list(grads)], strict=True))


def errors(got, ref, norm):
    """|got - ref| / |ref| per tensor (max or L2 norms, float64), each
    reference norm floored at 1% of the largest: a gradient that is zero in
    theory (ACmix's positional-encoding bias, which the softmax cancels)
    holds only rounding noise, against which any difference is huge."""
    size = {
        k: float(r.detach().abs().max() if norm == 'max' else r.norm())
        for k, r in ref.items()
        if r is not None
    }
    floor = 1e-2 * max(size.values())
    out = {}
    for k in size:
        assert got[k] is not None, k
        diff = got[k].detach().double() - ref[k].detach().double()
        num = diff.abs().max() if norm == 'max' else diff.norm()
        out[k] = float(num) / max(size[k], floor)
    return out


@pytest.mark.cuda
@pytest.mark.parametrize('name', list(LAYERS))
def test_triton_matches_torch_backend(name, device):
    factory, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = factory().to(device)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    index = list(LAYERS).index(name) % len(tk.CONFIGS)
    with tk.fixed_config(index):
        ref = run(copy.deepcopy(layer).double(), x.double(), 'torch')
        got = run(copy.deepcopy(layer).double(), x.double(), 'triton')
        low = run(copy.deepcopy(layer), x, 'triton', torch.bfloat16)
    assert len(ref) > 2  # parameters were checked too
    worst = errors(got, ref, 'max')
    assert max(worst.values()) <= 1e-10, worst
    worst = errors(low, ref, 'l2')
    assert max(worst.values()) <= AUTOCAST_TOL, worst


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason='needs a CUDA device')
def test_involution_compiles_fullgraph(device):
    torch.manual_seed(0)
    layer = Involution(64, 7).to(device)
    x = torch.randn(2, 64, 15, 17, device=device)
    with tk.fixed_config(0):
        eager = run(layer, x, 'auto')
        got = run(torch.compile(layer, fullgraph=True), x, 'auto')
    assert eager.keys() == got.keys()
    for k in eager:
        torch.testing.assert_close(got[k], eager[k], rtol=1e-4, atol=1e-4)
