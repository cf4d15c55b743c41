"""Resources and memory traffic of mmevo's Triton kernels, without a GPU.

* resources (default): every kernel x CUDA config x dtype x target compiled
  ahead of time (:mod:`tools.analysis.kernels.aot`); one row per kernel and
  config, one column per target with the registers per thread for fp32 /
  fp16 / bf16 / fp64, then the spilled bytes and local memory (summed over
  the row's binaries) and the most shared memory;
* ``--traffic``: the model of :mod:`tools.analysis.kernels.traffic` at the
  RedNet-50 involution stage shapes and an ACmix attention shape, per
  operand: minimal bytes (a), requested (b, the worst CUDA tile), the
  L2-aware estimate (c), b / a, and the roofline time of (a) at 4.3 TB/s.

Example:
    python tools/analysis/gpu_kernels.py                 # sm_80/90/100
    python tools/analysis/gpu_kernels.py --device        # this GPU's
    python tools/analysis/gpu_kernels.py --traffic
"""

import argparse
import json
import sys
from pathlib import Path

from mmevo.ops.checks import Window

# run as a file: the repository root, for tools.analysis
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.analysis.kernels import aot, traffic

# (name, B, C, G, H, K, dtype bytes, bytes of the correlation's output)
SHAPES = [
    (f'RedNet-50 stage {i + 1}', 64, c, c // 16, h, 7, 2, 2)
    for i, (c, h) in enumerate(((64, 56), (128, 28), (256, 14), (512, 7)))
]
# ACmix-R50 stage 3's attention (4 heads of 64 channels), logits in fp32.
SHAPES.append(('ACmix-R50 stage 3 attention', 64, 256, 4, 14, 7, 2, 4))


def resource_table(rows):
    """Markdown of :func:`tools.analysis.kernels.aot.run`'s rows."""
    targets = sorted({r['target'] for r in rows})
    cells = {}
    for r in rows:
        name = r['kernel'] + (
            ' (fp32 out)' if r['out_dtype'] != r['dtype'] else ''
        )
        cells.setdefault((name, r['config'], r['config_str']), []).append(r)
    head = ['kernel', 'config'] + [f'sm_{t} regs' for t in targets]
    lines = [
        '| ' + ' | '.join([*head, 'spill B', 'local B', 'shared B']) + ' |',
        '|' + '---|' * (len(head) + 3),
    ]
    for (name, _, cfg), group in sorted(cells.items()):
        regs = []
        for t in targets:
            by_dt = {r['dtype']: r for r in group if r['target'] == t}
            regs.append(
                '/'.join(
                    str(by_dt[d]['regs']) if d in by_dt else '-'
                    for d in aot.DTYPES
                )
            )
        err = [r['error'] for r in group if r['error']]
        if err:
            raise RuntimeError(f'{name} {cfg}: {err[0]}')
        cfg = cfg.split(', num_ctas')[0]
        lines.append(
            '| '
            + ' | '.join(
                [
                    name,
                    cfg,
                    *regs,
                    str(sum(r['spill_bytes'] for r in group)),
                    str(sum(r['local'] for r in group)),
                    str(max(r['shared'] for r in group)),
                ]
            )
            + ' |'
        )
    return '\n'.join(lines)


def traffic_table():
    """Markdown of the traffic model at :data:`SHAPES`."""
    from mmevo.ops.triton_kernels import GPU_CONFIGS

    tiles = sorted({c.kwargs['BLOCK_P'] for c in GPU_CONFIGS})
    lines = [
        '| shape | kernel | per operand: (a) / (b) / (c) MB (b / a) '
        '| roofline of (a) |',
        '|---|---|---|---|',
    ]
    for name, B, C, G, H, K, size, out_size in SHAPES:
        for kernel, model in traffic.KERNELS.items():
            extra = {} if kernel != 'correlate' else {'out_itemsize': out_size}
            runs = [
                model(B, C, G, (H, H), Window(K, 1, K // 2), bp, size, **extra)
                for bp in tiles
            ]
            worst = max(
                runs, key=lambda t: sum(v.requested for v in t.values())
            )
            ops = '; '.join(
                f'{op} {t.minimal / 1e6:.1f} / {t.requested / 1e6:.1f} / '
                f'{t.l2 / 1e6:.1f} ({t.requested / t.minimal:.2f}x)'
                for op, t in worst.items()
            )
            us = traffic.roofline_seconds(worst) * 1e6
            lines.append(f'| {name} | {kernel} | {ops} | {us:.1f} us |')
    return '\n'.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--targets', type=int, nargs='+', help='compute capabilities'
    )
    parser.add_argument(
        '--device',
        action='store_true',
        help='the compute capability of CUDA device 0',
    )
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument('--traffic', action='store_true')
    parser.add_argument('--json', help='also write the compiled rows here')
    args = parser.parse_args()
    if args.traffic:
        print(traffic_table())
        return
    targets = args.targets
    if args.device:
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        targets = [major * 10 + minor]
    rows = aot.run(aot.matrix(targets), args.processes)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    print(resource_table(rows))


if __name__ == '__main__':
    main()
