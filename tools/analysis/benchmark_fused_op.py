"""The fused involution op on CUDA: its Triton kernels against the unfused
composition, and the default of their switch the measurement supports.

``mmevo.ops.fused_involution`` forward + backward of every input on the
Triton backend, at the RedNet-50 stem (32 channels, 112²) and stage shapes
(K = 7, 16 channels per group, C_r = C / 4, B8): with the fused kernels
(``MMEVO_FUSED_TRITON=1``, the kernel map never written) and without (the
span convolution's kernel map, then the aggregation). Time: the median of
``--repeat`` rounds after one warm-up, both variants in each round; peak:
``torch.cuda.max_memory_allocated`` above the inputs. The last line says
whether the fused kernels win in time and memory at every shape, which is
what turning the switch on by default needs.

Example:
    python tools/analysis/benchmark_fused_op.py --device cuda
    python tools/analysis/benchmark_fused_op.py --device cuda --dtype bfloat16
"""

import argparse
import os
import sys
from pathlib import Path

import torch

from mmevo.cli import device_arg, int_in_range
from mmevo.ops import fused_involution, use_backend

# run as a file: the repository root, for tools.analysis
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.analysis.timing import median_times, peak_bytes

# (B, C, H, G): the stem involution of the detection RedNet-50, the stages.
SHAPES = [
    (8, 32, 112, 2),
    (8, 64, 56, 4),
    (8, 128, 28, 8),
    (8, 256, 14, 16),
    (8, 512, 7, 32),
]
K = 7


def measure(B, C, H, G, device, dtype, repeat):
    """(ms, peak MiB) of a step with the fused kernels and without."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(B, C, H, H), (B, C // 4, H, H), (G * K * K, C // 4, 1, 1)]
    leaves = [torch.randn(*s, generator=gen) for s in shapes]
    leaves.append(torch.randn(G * K * K, generator=gen))
    leaves = [t.to(device, dtype).requires_grad_() for t in leaves]
    gy = torch.randn(B, C, H, H, generator=gen).to(device, dtype)

    def step(switch):
        os.environ['MMEVO_FUSED_TRITON'] = switch
        y = fused_involution(*leaves, K, 1, 1, G)
        torch.autograd.grad(y, leaves, gy)

    steps = {'fused': lambda: step('1'), 'unfused': lambda: step('0')}
    with use_backend('triton'):
        seconds = median_times(steps, device, 1, repeat)
        mib = {n: peak_bytes(f, device) / 2**20 for n, f in steps.items()}
    return {n: (seconds[n] * 1e3, mib[n]) for n in steps}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', type=device_arg, default='cuda')
    parser.add_argument(
        '--dtype',
        default='float32',
        choices=['float32', 'float16', 'bfloat16'],
    )
    parser.add_argument('--repeat', type=int_in_range(1), default=10)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type != 'cuda':
        parser.error(
            f'--device: the Triton kernels run on CUDA, got {args.device}'
        )
    dtype = getattr(torch, args.dtype)
    print(
        f'device={torch.cuda.get_device_name(device)} dtype={args.dtype} '
        f'fwd+bwd median of {args.repeat}\n'
        '| B·C·H²·K·G | fused ms | unfused ms | time fused/unfused | '
        'peak fused/unfused |\n|---|---|---|---|---|'
    )
    wins = 0
    previous = os.environ.get('MMEVO_FUSED_TRITON')
    try:
        for B, C, H, G in SHAPES:
            r = measure(B, C, H, G, device, dtype, args.repeat)
            (t1, m1), (t0, m0) = r['fused'], r['unfused']
            wins += t1 < t0 and m1 <= m0
            print(
                f'| {B}·{C}·{H}²·{K}·{G} | {t1:.2f} | {t0:.2f} | '
                f'{t1 / t0:.2f}× | {m1 / m0:.2f}× |',
                flush=True,
            )
    finally:
        if previous is None:
            os.environ.pop('MMEVO_FUSED_TRITON', None)
        else:
            os.environ['MMEVO_FUSED_TRITON'] = previous
    default = '1' if wins == len(SHAPES) else '0'
    print(
        f'supported default: MMEVO_FUSED_TRITON={default} (the fused kernels '
        f'win in time and memory at {wins} of {len(SHAPES)} shapes)'
    )


if __name__ == '__main__':
    main()
