"""Train-step time and peak memory of ResNet-50, RedNet-50, ACmix-ResNet-50.

One process, the same input for every model (default B4 x 3 x 224 x 224,
fp32, CPU). A train step is forward + backward of the backbone (all four
stage outputs, loss = sum of their means). Time: median over ``--iters``
rounds after ``--warmup`` rounds; a round runs one step of every model in
turn, so a load change on a shared machine hits all models alike. Peak
memory: the largest amount of tensor memory allocated at once during one
step, above what was allocated before
it (the weights), read from the PyTorch profiler's allocation events, so
it covers every op, compiled extensions included. Ratios are to ResNet-50.

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_backbones.py
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_backbones.py \\
        --models rednet50 --profile
"""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mmevo.apis import MAX_SIDE, int_in_range


def build(name):
    """Return the backbone called ``name`` (mmdet's ResNet or mmevo's)."""
    from mmdet.models.backbones import ResNet

    from mmevo.models import ACmixResNet, RedNet
    builders = {
        'resnet50': lambda: ResNet(50, norm_eval=False),
        'rednet50': lambda: RedNet(50),
        'acmix_resnet50': lambda: ACmixResNet(50),
    }
    if name not in builders:
        raise ValueError(f'model must be one of {sorted(builders)}, '
                         f'got {name!r}')
    model = builders[name]()
    model.init_weights()
    model.train()  # mmdet's ResNet.train returns None: no chaining
    return model


def train_step(model, x):
    """Forward and backward of one batch; gradients are dropped first."""
    model.zero_grad(set_to_none=True)
    outs = model(x)
    sum(o.mean() for o in outs).backward()


def time_steps(models, x, warmup, iters):
    """Median wall time (s) of a train step of each model, interleaved."""
    times = {name: [] for name in models}
    for it in range(warmup + iters):
        for name, model in models.items():
            start = time.perf_counter()
            train_step(model, x)
            if it >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_memory(model, x):
    """Peak bytes allocated during one train step, above the start."""
    model.zero_grad(set_to_none=True)
    with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, x)
    events = sorted((e.start_ns(), e.nbytes())
                    for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]')
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def op_profile(model, x, rows):
    """Table of the ops taking the most CPU time in one train step."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(model, x)
    return prof.key_averages().table(
        sort_by='self_cpu_time_total', row_limit=rows)


def ops_backend():
    """Say which implementation backs ``mmevo.ops`` in this process."""
    import glob
    import os.path as osp

    import mmevo
    root = osp.dirname(mmevo.__file__)
    libs = glob.glob(osp.join(root, '_ext*.so'))
    return ('C++ extension ' + osp.basename(libs[0])) if libs else (
        'no compiled extension found (pure-PyTorch fallback)')


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=['resnet50', 'rednet50', 'acmix_resnet50'],
        help='resnet50 (the reference for the ratios), rednet50, '
        'acmix_resnet50')
    parser.add_argument('--batch', type=int_in_range(1, 1024), default=4)
    parser.add_argument('--size', type=int_in_range(1, MAX_SIDE), default=224)
    parser.add_argument('--warmup', type=int_in_range(0), default=1)
    parser.add_argument('--iters', type=int_in_range(1), default=3)
    parser.add_argument(
        '--profile',
        action='store_true',
        help='also print the most expensive ops of each model')
    parser.add_argument('--rows', type=int_in_range(1), default=15)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    print(f'input {tuple(x.shape)} fp32, {torch.get_num_threads()} threads, '
          f'torch {torch.__version__}; mmevo.ops: {ops_backend()}')
    models = {name: build(name) for name in args.models}
    seconds = time_steps(models, x, args.warmup, args.iters)
    rows = []
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters()) / 1e6
        peak = peak_memory(model, x) / 2**20
        rows.append((name, params, seconds[name], peak))
        print(
            f'{name}: {seconds[name]:.3f} s/step, peak {peak:.0f} MiB',
            flush=True)
        if args.profile:
            print(op_profile(model, x, args.rows), flush=True)
    ref = {name: (t, m) for name, _, t, m in rows}.get('resnet50')
    print()
    print('| model | params (M) | train step (s) | time / ResNet-50 '
          '| peak memory (MiB) | memory / ResNet-50 |')
    print('|---|---|---|---|---|---|')
    for name, params, step, peak in rows:
        ratio_t = f'{step / ref[0]:.2f}x' if ref else '-'
        ratio_m = f'{peak / ref[1]:.2f}x' if ref else '-'
        print(f'| {name} | {params:.2f} | {step:.3f} | {ratio_t} '
              f'| {peak:.0f} | {ratio_m} |')


if __name__ == '__main__':
    main()
