"""Inference latency of the deployed models: onnxruntime (CPU) and
AOTInductor packages against PyTorch eager.

One process; each model is exported once (H and W dynamic, or the input
size only with ``--static``): to ONNX with
plain ``torch.onnx.export`` (:func:`mmevo.deploy.export_onnx`) and, with
``--runtimes ... aoti``, to an AOTInductor package
(:func:`mmevo.deploy.export_aoti`, weights frozen, mmevo's kernels;
``aoti-inline``: the ops inlined as standard operators;
``aoti-unfused``: without the fused involution;
``aoti-prepacked``: oneDNN's weights laid out at compile time for
``--size`` and this process's thread count). Then timed, at ``--size``
or, with ``--run-size``, at another size of the dynamic exports: a
round runs every runtime of every model in turn, so a load change on a
shared machine hits all alike, each timed on its second call (the threads
of the runtime before have stopped spinning); median over ``--iters``
rounds after ``--warmup``. All use ``torch.get_num_threads()`` threads (set
OMP_NUM_THREADS; ``--run-threads`` sets another count for the timed runs
than the exports had). Ratios: each runtime to PyTorch eager of the same model,
and each model to ResNet-50 on the same runtime; the largest difference to
eager of each export, relative to the output's largest value.

``torch-onednn`` is PyTorch eager with ``MMEVO_CONV1X1=onednn``: every
float32 1x1 convolution of 64 channels or more on oneDNN, where by default
(on AMD CPUs) inference takes the matmul for the small ones
(``mmevo.layers.fastpath.takes_onednn_conv1x1``).

``--cpp-runner`` (deploy/cpp's ``aoti_runner``) also times the
packages in C++ without Python (``aoti C++``: the
runner loads mmevo's op library, ``mmevo/_ext*.so``), in a process of its
own after the rounds (median of ``--iters`` runs after one).

Models: ``resnet50`` (mmdet's ResNet) and ``rednet50`` backbones at B1
``--size``^2, and ``demo``, the demo RetinaNet's tensor outputs at 128^2.
``rednet50-windowless`` (onnxruntime only, not a model to deploy: its
outputs are wrong) is RedNet-50 exported with each involution's window sum
replaced by one pointwise product, the input times the kernel's centre tap:
everything else of the graph, so its time bounds from below what any
formulation of the window sum can reach in onnxruntime.

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_onnx.py \
        --models resnet50 rednet50 demo --runtimes torch onnxruntime aoti
"""

import argparse
import contextlib
import importlib.util
import os
import os.path as osp
import re
import statistics
import subprocess
import tempfile
import time
from unittest import mock

import torch

from mmevo.cli import MAX_SIDE, int_in_range
from mmevo.deploy import (
    AotiModel,
    OnnxModel,
    TensorOutputs,
    export_aoti,
    export_onnx,
    max_difference,
)
from mmevo.ops import decompositions

DEMO = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
    'configs',
    'demo',
    'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py',
)
#: the AOTInductor packages: plain, prepacked, inlined and without the
#: fused involution (``export_aoti(..., fused_involution=False)``)
AOTI_RUNTIMES = ('aoti', 'aoti-prepacked', 'aoti-inline', 'aoti-unfused')
RUNTIMES = ('torch', 'torch-onednn', 'onnxruntime', *AOTI_RUNTIMES)


def build(name, size):
    """``(model, input)``: ``name``'s eval-mode model with flat outputs."""
    from mmdet.models.backbones import ResNet
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from mmevo.models import RedNet
    from mmevo.registry import MODELS

    if name == 'demo':
        cfg = Config.fromfile(DEMO)
        init_default_scope('mmdet')
        model = TensorOutputs(MODELS.build(cfg.model).eval())
        return model, torch.randn(1, 3, 128, 128)
    builders = {
        'resnet50': lambda: ResNet(50),
        'rednet50': lambda: RedNet(50),
        'rednet50-windowless': lambda: RedNet(50),
    }
    if name not in builders:
        raise ValueError(
            f'model must be one of {[*sorted(builders), "demo"]}, got {name!r}'
        )
    backbone = builders[name]()
    backbone.eval()  # mmdet's ResNet.train returns None: no chaining
    return (
        TensorOutputs(backbone, lambda m, x: m(x)),
        torch.randn(1, 3, size, size),
    )


def _centre_tap(input, kernel, window):
    """The export's window sum minus its windows: the input (strided) times
    the kernel's centre tap, the same shapes."""
    k, stride = kernel.shape[2] // 2, window.stride
    x = input[..., ::stride, ::stride].unflatten(1, (kernel.shape[1], -1))
    return (x * kernel[:, :, k, k].unsqueeze(2)).flatten(1, 2)


def _exports(name, model, x, runtimes, tmp, exporter, dynamic):
    """``{runtime: callable}`` of ``name``'s exports, and ``{runtime:
    path}`` of its packages."""
    runs, packages = {}, {}
    windowless = name.endswith('-windowless')
    if 'onnxruntime' in runtimes:
        path = osp.join(tmp, f'{name}.onnx')
        with (
            mock.patch.object(decompositions, 'aggregate', _centre_tap)
            if windowless
            else contextlib.nullcontext()
        ):
            export_onnx(
                model, x, path, dynamic=dynamic, dynamo=exporter == 'dynamo'
            )
        runs['onnxruntime'] = OnnxModel(path)
    if windowless:
        return runs, packages
    if 'torch' in runtimes:

        def eager(x, model=model):
            with torch.no_grad():
                return model(x)

        runs['torch'] = eager
    if 'torch-onednn' in runtimes:

        def eager_onednn(x, model=model):
            with mock.patch.dict(os.environ, {'MMEVO_CONV1X1': 'onednn'}):
                with torch.no_grad():
                    return model(x)

        runs['torch-onednn'] = eager_onednn
    for runtime in AOTI_RUNTIMES:
        if runtime in runtimes:
            path = osp.join(tmp, f'{name}-{runtime}.pt2')
            export_aoti(
                model,
                x,
                path,
                dynamic=dynamic,
                inline_ops=runtime == 'aoti-inline',
                prepack=runtime == 'aoti-prepacked',
                fused_involution=runtime != 'aoti-unfused',
            )
            runs[runtime] = AotiModel(path)
            packages[runtime] = path
    return runs, packages


def _cpp_median(runner, path, x, iters, inline):
    """Median ms of ``iters`` runs of the package in the C++ runner (which
    loads mmevo's op library unless the package is ``inline``)."""
    cmd = [
        runner,
        path,
        '--shape',
        *map(str, x.shape),
        '--iters',
        str(iters),
        '--threads',
        str(torch.get_num_threads()),
    ]
    if not inline:
        cmd += ['--ops-library', importlib.util.find_spec('mmevo._ext').origin]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'{" ".join(cmd)}: {out.stderr.strip()}')
    return float(re.search(r'median ([0-9.]+) ms', out.stdout).group(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=['resnet50', 'rednet50', 'rednet50-windowless', 'demo'],
    )
    parser.add_argument(
        '--runtimes',
        nargs='+',
        choices=RUNTIMES,
        default=['torch', 'onnxruntime'],
    )
    parser.add_argument('--size', type=int_in_range(1, MAX_SIDE), default=224)
    parser.add_argument(
        '--run-size',
        type=int_in_range(1, MAX_SIDE),
        nargs=2,
        metavar=('H', 'W'),
        help="the input size timed (default: the export's, --size^2; the "
        'demo 128^2)',
    )
    parser.add_argument(
        '--run-threads',
        type=int_in_range(1),
        help='the threads of the timed runs, set after the exports '
        '(default: as many as the exports had)',
    )
    parser.add_argument('--warmup', type=int_in_range(0), default=3)
    parser.add_argument('--iters', type=int_in_range(1), default=10)
    parser.add_argument(
        '--exporter', choices=['dynamo', 'torchscript'], default='torchscript'
    )
    parser.add_argument(
        '--static',
        action='store_true',
        help='export every model for the input size only (default: H and W '
        'dynamic)',
    )
    parser.add_argument(
        '--cpp-runner',
        help="deploy/cpp's aoti_runner: also time the aoti and aoti-inline "
        'packages in C++',
    )
    args = parser.parse_args(argv)
    if args.static and args.run_size:
        parser.error('--run-size needs dynamic exports (without --static)')
    if 'aoti-prepacked' in args.runtimes and args.static:
        parser.error('aoti-prepacked is a dynamic package (without --static)')
    torch.manual_seed(0)
    runs, inputs, packages, errs = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, example = build(name, args.size)
            runs[name], packages[name] = _exports(
                name,
                model,
                example,
                args.runtimes,
                tmp,
                args.exporter,
                not args.static,
            )
            x = example
            if args.run_size:
                x = torch.randn(*example.shape[:2], *args.run_size)
            inputs[name] = x
            if not name.endswith('-windowless'):
                with torch.no_grad():
                    expected = model(x)
                for runtime, run in runs[name].items():
                    errs[(name, runtime)] = max_difference(run(x), expected)[0]
        if args.run_threads:
            torch.set_num_threads(args.run_threads)
        times = {(n, r): [] for n in runs for r in runs[n]}
        for it in range(args.warmup + args.iters):
            for (name, runtime), samples in times.items():
                run, x = runs[name][runtime], inputs[name]
                # an untimed call first: onnxruntime's threads spin a while
                # after a run, taking the cores from the next one timed
                run(x)
                start = time.perf_counter()
                run(x)
                if it >= args.warmup:
                    samples.append(time.perf_counter() - start)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        if args.cpp_runner:
            for name in packages:
                for runtime, path in packages[name].items():
                    try:
                        med[(name, f'{runtime} C++')] = _cpp_median(
                            args.cpp_runner,
                            path,
                            inputs[name],
                            args.iters,
                            runtime == 'aoti-inline',
                        )
                    except RuntimeError as e:  # the table still prints
                        print(f'{name} {runtime} C++: {e}')
    _print(med, errs, args)
    return med


def _print(med, errs, args):
    runtimes = [r for r in RUNTIMES if r in args.runtimes]
    if args.cpp_runner:
        runtimes += [f'{r} C++' for r in AOTI_RUNTIMES if r in runtimes]
    models = list(dict.fromkeys(n for n, _ in med))
    size = ' x '.join(map(str, args.run_size or [args.size] * 2))
    print(
        f'threads {torch.get_num_threads()}, input {size}, median of '
        f'{args.iters}, ms'
    )
    print(f'| model | {" | ".join(runtimes)} |')
    print(f'|---|{"---|" * len(runtimes)}')
    for name in models:
        cells = [
            f'{med[(name, r)]:.1f}' if (name, r) in med else '-'
            for r in runtimes
        ]
        print(f'| {name} | {" | ".join(cells)} |')
    for (name, runtime), ms in med.items():
        if runtime != 'torch' and (name, 'torch') in med:
            print(f'{name} {runtime} / eager: {ms / med[(name, "torch")]:.2f}')
        if name.startswith('rednet50') and ('resnet50', runtime) in med:
            ratio = ms / med[('resnet50', runtime)]
            print(f'{name} / resnet50 ({runtime}): {ratio:.2f}')
    for (name, runtime), err in errs.items():
        if runtime != 'torch':
            print(
                f'{name} {runtime} vs eager: max relative difference {err:.1e}'
            )


if __name__ == '__main__':
    main()
