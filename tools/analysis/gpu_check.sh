#!/usr/bin/env bash
# GPU check of mmevo.ops, one command, under 5 minutes on an H200:
#   1. the Triton kernels (forward, grad-input, grad-kernel, grad-query, grad-key)
#      against the float64 reference in fp32 / fp16 / bf16, both padding modes,
#      plus a determinism check (two runs, identical bits);
#   2. tools/analysis/benchmark_ops.py on CUDA (unfold vs pure PyTorch vs mmevo,
#      fwd+bwd time and peak memory) in fp32 and fp16, with the forward's achieved
#      memory bandwidth against the device's peak (target >= 80%).
# Usage: bash tools/analysis/gpu_check.sh   (PY=path/to/python to override)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH=${PYTHONPATH:-.}

"$PY" - <<'EOF'
import torch

from mmevo.ops import evolution_aggregate, local_correlation, output_size
from mmevo.ops.library import use_backend
from mmevo.ops.reference import aggregate_reference, correlation_reference

assert torch.cuda.is_available(), 'gpu_check.sh needs a CUDA device'
dev = torch.device('cuda')
torch.manual_seed(0)
# (B, C, G, H, W, K, stride, dilation, mode): odd sizes, tiny maps, RedNet shapes.
GEOMS = [(2, 64, 4, 56, 56, 7, 1, 1, 'zeros'), (2, 256, 16, 15, 13, 7, 2, 1, 'zeros'),
         (3, 48, 3, 9, 11, 5, 2, 2, 'reflect'), (2, 16, 16, 2, 3, 7, 1, 1, 'reflect'),
         (1, 32, 1, 1, 1, 3, 3, 3, 'zeros'), (4, 128, 4, 17, 31, 3, 1, 3, 'reflect')]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
failed = 0
for dtype, tol in TOL.items():
    for B, C, G, H, W, K, s, d, mode in GEOMS:
        p = d * (K - 1) // 2
        Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
        x = torch.randn(B, C, H, W, device=dev, dtype=torch.float64)
        w = torch.randn(B, G, K, K, Ho, Wo, device=dev, dtype=torch.float64) / K
        q = torch.randn(B, C, Ho, Wo, device=dev, dtype=torch.float64)
        gy = torch.randn(B, C, Ho, Wo, device=dev, dtype=torch.float64)
        go = torch.randn(B, G, K, K, Ho, Wo, device=dev, dtype=torch.float64)

        def run(fn_agg, fn_corr, cast):
            xs, ws, qs = (cast(t).requires_grad_() for t in (x, w, q))
            y, o = fn_agg(xs, ws), fn_corr(qs, xs)
            torch.autograd.backward([y, o], [cast(gy), cast(go)])
            return [y, o, xs.grad, ws.grad, qs.grad]

        with use_backend('triton'):
            got = run(lambda a, b: evolution_aggregate(a, b, s, None, d, mode),
                      lambda a, b: local_correlation(a, b, G, K, s, None, d, mode),
                      lambda t: t.to(dtype))
            again = run(lambda a, b: evolution_aggregate(a, b, s, None, d, mode),
                        lambda a, b: local_correlation(a, b, G, K, s, None, d, mode),
                        lambda t: t.to(dtype))
        ref = run(lambda a, b: aggregate_reference(a, b, s, p, d, mode),
                  lambda a, b: correlation_reference(a, b, G, K, s, p, d, mode),
                  lambda t: t.clone())
        names = ['y', 'corr', 'grad_x', 'grad_w', 'grad_q']
        errs = {n: ((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
                for n, g, r in zip(names, got, ref)}
        same = all(torch.equal(a, b) for a, b in zip(got, again))
        ok = all(e <= tol for e in errs.values()) and same
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {str(dtype):15s} B{B} C{C} G{G} {H}x{W} K{K} "
              f"s{s} d{d} {mode:7s} deterministic={same} max rel err "
              + ' '.join(f'{n}={e:.1e}' for n, e in errs.items()))
print(f'{failed} failed')
raise SystemExit(failed > 0)
EOF

"$PY" tools/analysis/benchmark_ops.py --device cuda --dtype float32 --repeat 20
"$PY" tools/analysis/benchmark_ops.py --device cuda --dtype float16 --repeat 20
