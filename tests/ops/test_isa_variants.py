"""Every instruction-set variant of the C++ kernels against the reference.

The extension picks the widest of AVX-512 / AVX2 / baseline vectors the CPU
has; ``MMEVO_CPU_ISA`` selects a narrower one (read once, when the library
loads), so each variant runs here in a subprocess on the same wide-map,
strided geometries, NCHW and channels-last.
"""

import os
import subprocess
import sys

import pytest

from mmevo.ops import cpp_backend

pytestmark = pytest.mark.slow

SCRIPT = r"""
import torch
from mmevo.ops import (cpp_backend, evolution_aggregate,
                       local_attention_weights, local_correlation,
                       output_size)
from mmevo.ops.checks import Window
from mmevo.ops.reference import (aggregate_reference,
                                 attention_weights_reference,
                                 correlation_reference)
assert cpp_backend.isa() == {isa!r}, cpp_backend.isa()
torch.manual_seed(0)
for B, C, G, K, H, W, s, d in [(2, 20, 1, 7, 17, 33, 1, 1),
                               (1, 36, 3, 5, 19, 40, 2, 1),
                               (1, 16, 1, 3, 26, 21, 3, 2),
                               (1, 4, 1, 3, 9, 14, 1, 1)]:
    p = d * (K - 1) // 2
    Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        x = torch.randn(B, C, H, W, dtype=dtype, requires_grad=True)
        w = torch.randn(B, G, K, K, Ho, Wo, dtype=dtype, requires_grad=True)
        q = torch.randn(B, C, Ho, Wo, dtype=dtype, requires_grad=True)
        outs = []
        window = Window(K, s, p, d, 'zeros')
        for agg, corr, attn in (
                (lambda x, w: evolution_aggregate(x, w, s, p, d, 'zeros'),
                 lambda q, x: local_correlation(q, x, G, K, s, p, d,
                                                'zeros'),
                 lambda q, x: local_attention_weights(q, x, G, K, s, p, d,
                                                      'zeros')),
                (lambda x, w: aggregate_reference(x, w, window),
                 lambda q, x: correlation_reference(q, x, G, window),
                 lambda q, x: attention_weights_reference(q, x, G, window))):
            y = agg(x, w)
            o = corr(q, x)
            a = attn(q, x)
            loss = y.square().sum() + o.square().sum() + a.square().sum()
            grads = torch.autograd.grad(loss, (x, w, q))
            outs.append((y, o, a) + grads)
        for got, want in zip(*outs):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        # the channels-last kernel (a channels-last span conv's kernel map)
        xc = x.detach().to(memory_format=torch.channels_last)
        wc = w.detach().flatten(1, 3).to(memory_format=torch.channels_last)
        y = evolution_aggregate(xc, wc.view_as(w), s, p, d, 'zeros')
        torch.testing.assert_close(y, outs[1][0], rtol=tol, atol=tol)
print('ok')
"""


@pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)
@pytest.mark.parametrize('isa', ['avx2', 'base'])
def test_narrower_isa_matches_reference(isa):
    if isa == 'avx2' and cpp_backend.isa() == 'base':
        pytest.skip('this CPU has no AVX2')
    env = dict(os.environ, MMEVO_CPU_ISA=isa, OMP_NUM_THREADS='2')
    run = subprocess.run(
        [sys.executable, '-c', SCRIPT.format(isa=isa)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith('ok')
