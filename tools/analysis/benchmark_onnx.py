"""Inference latency: onnxruntime (CPU) against PyTorch eager.

One process; each model is exported once with plain ``torch.onnx.export``
(H and W dynamic, :func:`mmevo.deployment.export_onnx`), then timed: a round
runs PyTorch and onnxruntime of every model in turn, so a load change on a
shared machine hits all alike, each timed on its second call (the threads
of the runtime before have stopped spinning); median over ``--iters``
rounds after ``--warmup``. Both use ``torch.get_num_threads()`` threads (set
OMP_NUM_THREADS). Ratios: onnxruntime / PyTorch of the same model, and each
model to ResNet-50 on the same runtime.

Models: ``resnet50`` (mmdet's ResNet) and ``rednet50`` backbones at B1
``--size``^2, and ``demo``, the demo RetinaNet's tensor outputs at 128^2.
``rednet50-windowless`` (onnxruntime only, not a model to deploy: its
outputs are wrong) is RedNet-50 exported with each involution's window sum
replaced by one pointwise product, the input times the kernel's centre tap:
everything else of the graph, so its time bounds from below what any
formulation of the window sum can reach in onnxruntime.

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_onnx.py
"""
import argparse
import contextlib
import os.path as osp
import statistics
import tempfile
import time
from unittest import mock

import torch

from mmevo.apis import MAX_SIDE, int_in_range
from mmevo.deployment import OnnxModel, TensorOutputs, export_onnx
from mmevo.ops import export

DEMO = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs',
    'demo', 'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py')


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
        'rednet50-windowless': lambda: RedNet(50)
    }
    if name not in builders:
        raise ValueError(f'model must be one of {sorted(builders) + ["demo"]}'
                         f', got {name!r}')
    backbone = builders[name]()
    backbone.eval()  # mmdet's ResNet.train returns None: no chaining
    return (TensorOutputs(backbone,
                          lambda m, x: m(x)), torch.randn(1, 3, size, size))


def _centre_tap(input, kernel, stride, padding, dilation, padding_mode):
    """The export's window sum minus its windows: the input (strided) times
    the kernel's centre tap, the same shapes."""
    k = kernel.shape[2] // 2
    x = input[..., ::stride, ::stride].unflatten(1, (kernel.shape[1], -1))
    return (x * kernel[:, :, k, k].unsqueeze(2)).flatten(1, 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=['resnet50', 'rednet50', 'rednet50-windowless', 'demo'])
    parser.add_argument('--size', type=int_in_range(1, MAX_SIDE), default=224)
    parser.add_argument('--warmup', type=int_in_range(0), default=3)
    parser.add_argument('--iters', type=int_in_range(1), default=10)
    parser.add_argument(
        '--exporter', choices=['dynamo', 'torchscript'], default='torchscript')
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, x = build(name, args.size)
            path = osp.join(tmp, f'{name}.onnx')
            windowless = name.endswith('-windowless')
            with (mock.patch.object(export, 'aggregate', _centre_tap)
                  if windowless else contextlib.nullcontext()):
                export_onnx(model, x, path, dynamo=args.exporter == 'dynamo')

            def eager(model=model, x=x):
                with torch.no_grad():
                    model(x)

            session = OnnxModel(path)
            runs[name] = {'onnxruntime': lambda s=session, x=x: s(x)}
            if not windowless:
                runs[name]['torch'] = eager
        times = {(n, r): [] for n in runs for r in runs[n]}
        for it in range(args.warmup + args.iters):
            for (name, runtime), samples in times.items():
                # an untimed call first: onnxruntime's threads spin a while
                # after a run, taking the cores from the next one timed
                runs[name][runtime]()
                start = time.perf_counter()
                runs[name][runtime]()
                if it >= args.warmup:
                    samples.append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f'threads {torch.get_num_threads()}, median of {args.iters}, ms')
    print('| model | PyTorch eager | onnxruntime | onnxruntime / eager |')
    print('|---|---|---|---|')
    for name in runs:
        o = med[(name, 'onnxruntime')]
        if (name, 'torch') in med:
            t = med[(name, 'torch')]
            print(f'| {name} | {t:.1f} | {o:.1f} | {o / t:.2f} |')
        else:
            print(f'| {name} | - | {o:.1f} | - |')
    if 'resnet50' in runs:
        for name, runtime in med:
            if name.startswith('rednet50'):
                ratio = med[(name, runtime)] / med[('resnet50', runtime)]
                print(f'{name} / resnet50 ({runtime}): {ratio:.2f}')
    return med


if __name__ == '__main__':
    main()
