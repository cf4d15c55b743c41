"""Train-step time and peak memory of ELSA-Swin-T and ACmix-Swin-T against
mmdet's Swin-T, in one process.

The same input for every model (default B2 x 3 x 224 x 224, fp32, CPU). A
train step is forward + backward of the backbone (all four stage outputs,
loss = sum of their means), as in ``benchmark_backbones.py``, whose timing
(median over interleaved rounds) and peak-memory measurement
(:mod:`tools.analysis.timing`) this reuses.
``elsa_swin_t_unfold`` is ELSA-Swin-T with the aggregation of the official
code's CPU path (``F.unfold`` of v, times the filter, summed over the
taps: damo-cv/ELSA ``elsa.py:139-148``) in place of mmevo's op. Ratios are
to mmdet's Swin-T.

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_swin.py
    python tools/analysis/benchmark_swin.py --models swin_t elsa_swin_t \\
        --iters 5
"""

import argparse
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from mmevo.cli import MAX_SIDE, int_in_range

# run as a file: the repository root, for tools.analysis
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.analysis.timing import (
    ops_backend,
    peak_memory,
    time_steps,
)

MODELS = ('swin_t', 'elsa_swin_t', 'elsa_swin_t_unfold', 'acmix_swin_t')


def unfold_aggregate(layer, v, kernel):
    """The official ELSA CPU aggregation: out[c, p] = sum over taps t of
    unfold(v)[c, t, p] * kernel[c, t, p], zero padding (stride 1).

    Args:
        layer (ELSA): the layer (its kernel size).
        v (Tensor): (B, C, H, W).
        kernel (Tensor): (B, C, K, K, H, W).

    Returns:
        Tensor: (B, C, H, W).
    """
    B, C, H, W = v.shape
    K = layer.kernel_size
    cols = F.unfold(v, K, padding=K // 2).view(B, C, K * K, H, W)
    return (cols * kernel.reshape(B, C, K * K, H, W)).sum(2)


def build(name):
    """The backbone called ``name`` (one of :data:`MODELS`) in train mode:
    the Swin-T sizes, the detection geometry (the last stage padded to its
    window), four outputs, no drop-path (every step does the same work).

    Args:
        name (str): a name of :data:`MODELS`.

    Returns:
        nn.Module: the backbone.

    Example:
        >>> model = build('elsa_swin_t')
        >>> [o.shape[1] for o in model(torch.randn(1, 3, 64, 64))]
        [96, 192, 384, 768]
    """
    from mmdet.models.backbones import SwinTransformer

    from mmevo.layers import ELSA
    from mmevo.models import ACmixSwinTransformer, ELSASwinTransformer

    if name not in MODELS:
        raise ValueError(f'model must be one of {MODELS}, got {name!r}')
    if name == 'swin_t':
        model = SwinTransformer(drop_path_rate=0.0)
    elif name.startswith('elsa'):
        model = ELSASwinTransformer(drop_path_rate=0.0, pad_small_map=True)
        if name.endswith('_unfold'):
            for m in model.modules():
                if isinstance(m, ELSA):
                    # The official graph: the per-channel kernel, unfolded.
                    m.use_cpu_fastpath = False
                    m.aggregate = types.MethodType(unfold_aggregate, m)
    else:
        model = ACmixSwinTransformer(drop_path_rate=0.0, pad_small_map=True)
    model.init_weights()
    model.train()
    return model


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        choices=MODELS,
        default=list(MODELS),
        help='swin_t (the reference of the ratios) and the others',
    )
    parser.add_argument('--batch', type=int_in_range(1, 1024), default=2)
    parser.add_argument('--size', type=int_in_range(1, MAX_SIDE), default=224)
    parser.add_argument('--warmup', type=int_in_range(0), default=1)
    parser.add_argument('--iters', type=int_in_range(1), default=3)
    parser.add_argument(
        '--no-memory',
        action='store_true',
        help='skip the (profiled, slower) peak-memory step',
    )
    return parser.parse_args(argv)


def main(argv=None):
    """Print the table; return ``{name: (params M, s/step, peak MiB)}``."""
    args = parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    print(
        f'input {tuple(x.shape)} fp32 on CPU, '
        f'{torch.get_num_threads()} threads; mmevo.ops: {ops_backend()}; '
        f'torch {torch.__version__}'
    )
    models = {name: build(name) for name in args.models}
    seconds = time_steps(models, x, args.warmup, args.iters)
    rows = {}
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters()) / 1e6
        peak = 0.0 if args.no_memory else peak_memory(model, x) / 2**20
        rows[name] = (params, seconds[name], peak)
    ref = rows.get('swin_t')
    print(
        '| model | params (M) | train step (s) | time / Swin-T '
        '| peak memory (MiB) | memory / Swin-T |'
    )
    print('|---|---|---|---|---|---|')
    for name, (params, step, peak) in rows.items():
        ratio_t = f'{step / ref[1]:.2f}x' if ref else '-'
        ratio_m = f'{peak / ref[2]:.2f}x' if ref and ref[2] else '-'
        print(
            f'| {name} | {params:.2f} | {step:.3f} | {ratio_t} '
            f'| {peak:.0f} | {ratio_m} |'
        )
    return rows


if __name__ == '__main__':
    main()
