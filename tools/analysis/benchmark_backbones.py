"""Train-step time and peak memory of ResNet-50, RedNet-50, ACmix-ResNet-50.

One process, the same input for every model (default B4 x 3 x 224 x 224,
fp32, CPU; ``--device cuda`` on a GPU). A train step is forward + backward
of the backbone (all four stage outputs, loss = sum of their means). Time:
median over ``--iters`` rounds after ``--warmup`` rounds; a round runs
one step of every model in turn, so a load change on a shared machine hits
all models alike. Peak
memory: the largest amount of tensor memory allocated at once during one
step, above what was allocated before
it (the weights), read from the PyTorch profiler's allocation events, so
it covers every op, compiled extensions included (on CUDA, from
``torch.cuda.max_memory_allocated``). Ratios are to ResNet-50.

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_backbones.py
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_backbones.py \\
        --models rednet50 --profile
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_backbones.py --stages
    python tools/analysis/benchmark_backbones.py --device cuda --batch 32
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from mmevo.cli import MAX_SIDE, int_in_range

# run as a file: the repository root, for tools.analysis
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.analysis.timing import (
    median_times,
    op_profile,
    ops_backend,
    peak_memory,
    time_steps,
)


def build(name, builder='mmdet'):
    """Return the backbone called ``name``: mmdet's ResNet or mmevo's
    (``builder='mmdet'``), or torchvision's ResNet (``'torchvision'``)."""
    if builder == 'torchvision':
        model = torchvision_backbone(name)
    else:
        from mmdet.models.backbones import ResNet

        from mmevo.models import ACmixResNet, RedNet

        builders = {
            'resnet50': lambda: ResNet(50, norm_eval=False),
            'resnet50_fastpath': resnet50_fastpath,
            'rednet50': lambda: RedNet(50),
            'acmix_resnet50': lambda: ACmixResNet(50),
        }
        if name not in builders:
            raise ValueError(
                f'model must be one of {sorted(builders)}, got {name!r}'
            )
        model = builders[name]()
        model.init_weights()
    model.train()  # mmdet's ResNet.train returns None: no chaining
    return model


def resnet50_fastpath():
    """mmdet's ResNet-50 (its modules, keys and numbers) on the CPU fast
    paths of mmevo's backbones (the channels-last stem, the bottlenecks'
    1x1 convs), its 3x3 convs as they are: what those paths alone give a
    ResNet-50, to set against what the dynamic layers give."""
    from torch import nn

    from mmevo.models.backbones.dynamic_resnet import DynamicResNet

    class ResNetFastPath(DynamicResNet):
        def build_middle_layer(self, planes, stride, dilation):
            return nn.Conv2d(
                planes, planes, 3, stride, dilation, dilation, bias=False
            )

    return ResNetFastPath(50, norm_eval=False)


class _Stages(torch.nn.Module):
    """A torchvision ResNet without its head: the four stage outputs."""

    def __init__(self, net):
        super().__init__()
        del net.avgpool, net.fc
        self.net = net

    def forward(self, x):
        net = self.net
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        outs = []
        for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
            x = stage(x)
            outs.append(x)
        return outs


def torchvision_backbone(name):
    """ResNet-50 or RedNet-50 (its involution middle layers and stem) from
    torchvision's ResNet-50: the layers and parameter shapes of mmdet's
    ``ResNet(50)`` and mmevo's ``RedNet(50)``, for a machine where mmdet
    does not import (its models need mmcv's compiled ops)."""
    from torch import nn
    from torchvision.models import resnet50

    from mmevo.layers import Involution

    if name not in ('resnet50', 'rednet50'):
        raise ValueError(
            f'the torchvision builder has resnet50 and rednet50, got {name!r}'
        )
    net = resnet50()
    if name == 'rednet50':
        for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
            for block in stage:
                conv = block.conv2
                block.conv2 = Involution(conv.in_channels, 7, conv.stride[0])
        # RedNet's stem; torchvision's bn1 and ReLU follow its last conv.
        net.conv1 = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            Involution(32, 7, 1),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, 1, 1, bias=False),
        )
    return _Stages(net)


def stages(model):
    """``[(name, part)]``: the stem (with the max pool; mmevo's backbones'
    ``forward_stem``, with its CPU fast path) and the residual stages of an
    mmdet ``ResNet`` (or subclass), in order, each a callable of the
    previous one's output."""

    def stem(x):
        if model.deep_stem:
            x = model.stem(x)
        else:
            x = model.relu(model.norm1(model.conv1(x)))
        return model.maxpool(x)

    stem = getattr(model, 'forward_stem', stem)
    return [('stem', stem)] + [
        (name, getattr(model, name)) for name in model.res_layers
    ]


def stage_times(models, x, warmup, iters):
    """``{model: {stage: seconds}}``: the train step of each stage alone
    (forward + backward of its input and weights, loss = the mean of its
    output), on the input the stages before it give ``x``; all stages of
    all models interleaved, as :func:`time_steps`."""
    steps = {}
    for name, model in models.items():
        t = x
        for stage, part in stages(model):
            with torch.no_grad():
                out = part(t)

            def step(model=model, part=part, t=t):
                model.zero_grad(set_to_none=True)
                # A fresh non-leaf input (in-place ReLUs), with a gradient
                # past the stem as in the whole backbone.
                inp = t.clone().requires_grad_(t is not x) * 1
                part(inp).mean().backward()

            steps[name, stage] = step
            t = out
    times = median_times(steps, x.device, warmup, iters)
    result = {}
    for (name, stage), seconds in times.items():
        result.setdefault(name, {})[stage] = seconds
    return result


def print_stage_table(times):
    """One row per stage, each model's time and its ratio to ResNet-50."""
    names = list(times)
    ref = times.get('resnet50')
    head = ' | '.join(
        f'{n} (ms)' + (' | / resnet50' if ref and n != 'resnet50' else '')
        for n in names
    )
    print(f'| stage | {head} |')
    cols = sum(2 if ref and n != 'resnet50' else 1 for n in names)
    print('|---' * (cols + 1) + '|')
    for stage in [*times[names[0]], 'total']:
        cells = []
        for n in names:
            t = times[n]
            ms = 1e3 * (sum(t.values()) if stage == 'total' else t[stage])
            cells.append(f'{ms:.1f}')
            if ref and n != 'resnet50':
                r = sum(ref.values()) if stage == 'total' else ref[stage]
                cells.append(f'{ms / 1e3 / r:.2f}x')
        print(f'| {stage} | ' + ' | '.join(cells) + ' |')


def hook_checks(model, step):
    """What the fast paths' hook checks cost in one forward of ``model``
    (every module with ``use_cpu_fastpath`` walks its submodules for hooks,
    :func:`mmevo.layers.fastpath.has_hooks`), as text; '' for a model
    without fast paths. Best of 20 walks, against the train step."""
    from mmevo.layers.fastpath import has_hooks

    sites = [m for m in model.modules() if hasattr(m, 'use_cpu_fastpath')]
    if not sites:
        return ''
    best = float('inf')
    for _ in range(20):
        start = time.perf_counter()
        for m in sites:
            has_hooks(m)
        best = min(best, time.perf_counter() - start)
    return (
        f', hook checks {best * 1e3:.2f} ms a forward '
        f'({best / step:.2%} of the step)'
    )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=['resnet50', 'rednet50', 'acmix_resnet50'],
        help='resnet50 (the reference for the ratios), resnet50_fastpath '
        "(mmdet's ResNet-50 on mmevo's CPU fast paths), rednet50, "
        'acmix_resnet50',
    )
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--builder',
        default='mmdet',
        choices=['mmdet', 'torchvision'],
        help="the models' code: mmdet's ResNet and mmevo's backbones, or "
        "torchvision's ResNet (resnet50, rednet50; no mmdet needed)",
    )
    parser.add_argument('--batch', type=int_in_range(1, 1024), default=4)
    parser.add_argument('--size', type=int_in_range(1, MAX_SIDE), default=224)
    parser.add_argument('--warmup', type=int_in_range(0), default=1)
    parser.add_argument('--iters', type=int_in_range(1), default=3)
    parser.add_argument(
        '--profile',
        action='store_true',
        help='also print the most expensive ops of each model',
    )
    parser.add_argument('--rows', type=int_in_range(1), default=15)
    parser.add_argument(
        '--stages',
        action='store_true',
        help='also time the train step of each stage alone (the stem and '
        'the four residual stages; mmdet builder)',
    )
    args = parser.parse_args()
    if args.stages and args.builder != 'mmdet':
        parser.error('--stages needs --builder mmdet')
    return args


def main():
    args = parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    where = (
        torch.cuda.get_device_name(x.device)
        if x.is_cuda
        else f'{torch.get_num_threads()} threads; mmevo.ops: {ops_backend()}'
    )
    print(
        f'input {tuple(x.shape)} fp32 on {where}, torch {torch.__version__}'
        f', {args.builder} models'
    )
    models = {
        name: build(name, args.builder).to(x.device) for name in args.models
    }
    seconds = time_steps(models, x, args.warmup, args.iters)
    rows = []
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters()) / 1e6
        peak = peak_memory(model, x) / 2**20
        rows.append((name, params, seconds[name], peak))
        print(
            f'{name}: {seconds[name]:.3f} s/step, peak {peak:.0f} MiB'
            + hook_checks(model, seconds[name]),
            flush=True,
        )
        if args.profile:
            print(op_profile(model, x, args.rows), flush=True)
    ref = {name: (t, m) for name, _, t, m in rows}.get('resnet50')
    print()
    print(
        '| model | params (M) | train step (s) | time / ResNet-50 '
        '| peak memory (MiB) | memory / ResNet-50 |'
    )
    print('|---|---|---|---|---|---|')
    for name, params, step, peak in rows:
        ratio_t = f'{step / ref[0]:.2f}x' if ref else '-'
        ratio_m = f'{peak / ref[1]:.2f}x' if ref else '-'
        print(
            f'| {name} | {params:.2f} | {step:.3f} | {ratio_t} '
            f'| {peak:.0f} | {ratio_m} |'
        )
    if args.stages:
        print()
        print_stage_table(stage_times(models, x, args.warmup, args.iters))


if __name__ == '__main__':
    main()
