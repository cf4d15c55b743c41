"""Compile a model into an AOTInductor package (``.pt2``).

``torch.export`` (H and W dynamic with ``--dynamic``) then AOTInductor, the
weights frozen: the package holds the graph ``pytorch2onnx.py`` exports
(a backbone's features; a single-stage detector's raw head outputs; the
detections of a two-stage one, with the mask head's outputs on them; a
segmentor's logits), calling mmevo's own kernels
(``torch.ops.mmevo.*``). ``tools/deployment/aoti_test.py`` evaluates it
on the config's test set. The package is checked against PyTorch at the
export size and, with ``--dynamic``, at another size.

Example:
    python tools/deployment/pytorch2aoti.py CONFIG CHECKPOINT \
        --out work_dirs/demo/model.pt2 --shape 128 128 --dynamic
"""
import argparse
import os.path as osp
import sys
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

import torch

from mmevo.deploy import AotiModel, export_aoti, exportable

# tools/_cli.py one folder up, the exporter's helpers beside this script
sys.path[:0] = [
    osp.dirname(osp.dirname(osp.abspath(__file__))),
    osp.dirname(osp.abspath(__file__))
]
from _cli import fail
from pytorch2onnx import build_model, report_parity


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Compile a model into an AOTInductor package')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='the .pt2 file')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        default=[128, 128],
        metavar=('H', 'W'),
        help='example input size (default: 128 128)')
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic height and width (one package for every size)')
    parser.add_argument(
        '--device',
        choices=['cpu', 'cuda'],
        default='cpu',
        help='the device the package runs on (default: cpu)')
    parser.add_argument(
        '--inline-ops',
        action='store_true',
        help="mmevo's ops as standard operators: for a runtime without "
        "mmevo's op library (slower)")
    return parser.parse_args(argv)


def other_size(shape):
    """An input size of another aspect, odd, for the check of a dynamic
    package: 3/4 of the height, 5/4 of the width, rounded to odd."""
    h, w = shape
    return [max(1, h * 3 // 4) | 1, max(1, w * 5 // 4) | 1]


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        fail(f"checkpoint '{args.checkpoint}' does not exist")
    if args.device == 'cuda' and not torch.cuda.is_available():
        fail('--device cuda: no CUDA device is available')
    _, model = build_model(args.config, args.checkpoint)
    model, kind = exportable(model.to(args.device))
    shapes = [args.shape] + ([other_size(args.shape)] if args.dynamic else [])
    inputs = [torch.randn(1, 3, *hw, device=args.device) for hw in shapes]
    export_aoti(
        model,
        inputs[0],
        args.out,
        dynamic=args.dynamic,
        inline_ops=args.inline_ops)
    report_parity(model, AotiModel(args.out), inputs, kind, 'AOTInductor')
    return args.out


if __name__ == '__main__':
    main()
