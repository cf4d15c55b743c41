"""Export a detector's or a segmentor's tensor outputs to ONNX.

Plain ``torch.onnx.export`` (the evolution ops lower to standard ONNX
operators by themselves): the graph holds the preprocessed image -> raw head
outputs (per-level class scores and boxes of a single-stage detector; the
detections of a two-stage one, with the mask head's outputs on them; the
logits of a segmentor); ``tools/deployment/onnx_test.py`` post-processes them
with the config's own heads. The export is checked in onnxruntime against
PyTorch, with ``--dynamic`` at a second size too, before it is written to
``--out``.

Example:
    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT \
        --out work_dirs/demo/model.onnx --shape 128 128 --dynamic
"""

import argparse

import torch

from mmevo import apis, cli
from mmevo.apis.deploy import other_size, report_parity
from mmevo.deploy import OnnxModel, export_onnx, exportable
from mmevo.integrations import mmengine as fixes
from mmevo.integrations.mmengine.atomic_backend import atomic_output


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export a model to ONNX')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='the .onnx file')
    cli.add_shape_arg(
        parser,
        default=[128, 128],
        help=f'example input size (default: 128 128; at most {cli.MAX_SIDE})',
    )
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic height and width (one export for every size)',
    )
    parser.add_argument(
        '--exporter',
        choices=['dynamo', 'torchscript'],
        default='dynamo',
        help="torch.onnx.export's exporter (default: dynamo, torch's; "
        'torchscript is the older one, faster to export)',
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    fixes.safe_globals.install()  # mmengine's own checkpoints load
    with apis.one_line_errors():
        # before the export: a bad --out fails at once, not after it
        apis.check_output(
            args.out, {'config': args.config, 'checkpoint': args.checkpoint}
        )
        # a partial checkpoint would export a half-initialised model
        model = apis.build_model(
            apis.load_config(args.config),
            args.checkpoint,
            hint='export the checkpoint the config trained',
        )
    model, kind = exportable(model)
    shapes = [args.shape] + ([other_size(args.shape)] if args.dynamic else [])
    inputs = [torch.randn(1, 3, *hw) for hw in shapes]
    # the graph appears under --out only once it passed the checks
    with atomic_output(args.out, suffix='.onnx') as tmp:
        export_onnx(
            model,
            inputs[0],
            tmp,
            dynamic=args.dynamic,
            dynamo=args.exporter == 'dynamo',
        )
        session = OnnxModel(tmp, name=f"the ONNX model for '{args.out}'")
        report_parity(
            model, session, inputs, kind, 'onnxruntime', args.dynamic
        )
    return args.out


if __name__ == '__main__':
    main()
