"""Export a detector's or a segmentor's tensor outputs to ONNX.

Plain ``torch.onnx.export`` (the evolution ops lower to standard ONNX
operators by themselves): the graph holds the preprocessed image -> raw head
outputs (per-level class scores and boxes of a single-stage detector; the
detections of a two-stage one, with the mask head's outputs on them; the
logits of a segmentor); ``tools/deployment/onnx_test.py`` post-processes them
with the config's own heads. The export is checked in onnxruntime.

Example:
    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT \
        --out work_dirs/demo/model.onnx --shape 128 128 --dynamic
"""
import argparse
import os.path as osp
import sys
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

import torch
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from mmevo.deploy import OnnxModel, check_outputs, export_onnx, exportable
from mmevo.registry import MODELS

# tools/_cli.py, one folder up
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from _cli import check_checkpoint_fits, fail, load_config


def build_model(config, checkpoint=None):
    """``(cfg, model)``: the config's model in eval mode, weights loaded."""
    cfg = load_config(config) if isinstance(config, str) else config
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    if checkpoint is not None:
        # a partial checkpoint would export a half-initialised model
        check_checkpoint_fits(model, checkpoint,
                              'export the checkpoint the config trained')
        load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    return cfg, model.eval()


def report_parity(model, runtime, inputs, kind, name):
    """Print how far ``runtime`` (``name``) is from PyTorch on each input;
    exit with one line if too far (:func:`mmevo.deploy.check_outputs`)."""
    try:
        errs = check_outputs(model, runtime, inputs, kind)
    except ValueError as e:
        fail(f'{name} {e}')
    for x, err in zip(inputs, errs):
        print(f'[export] {tuple(x.shape)}: {name} vs PyTorch max relative '
              f'difference {err:.1e}')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export a model to ONNX')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='the .onnx file')
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
        help='dynamic height and width (one export for every size)')
    parser.add_argument(
        '--exporter',
        choices=['dynamo', 'torchscript'],
        default='dynamo',
        help="torch.onnx.export's exporter (default: dynamo, torch's; "
        'torchscript is the older one, faster to export)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        fail(f"checkpoint '{args.checkpoint}' does not exist")
    _, model = build_model(args.config, args.checkpoint)
    model, kind = exportable(model)
    x = torch.randn(1, 3, *args.shape)
    export_onnx(
        model,
        x,
        args.out,
        dynamic=args.dynamic,
        dynamo=args.exporter == 'dynamo')
    report_parity(model, OnnxModel(args.out), [x], kind, 'onnxruntime')
    return args.out


if __name__ == '__main__':
    main()
