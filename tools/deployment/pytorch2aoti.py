"""Compile a model into an AOTInductor package (``.pt2``).

``torch.export`` (H and W dynamic with ``--dynamic``) then AOTInductor, the
weights frozen: the package holds the graph
``pytorch2onnx.py`` exports (a backbone's features; a single-stage
detector's raw head outputs; a two-stage detector's detections; a
segmentor's logits), calling mmevo's own kernels
(``torch.ops.mmevo.*``). ``tools/deployment/aoti_test.py`` evaluates it
on the config's test set. The package is checked against PyTorch at the
export size and, with ``--dynamic``, at another size.

Example:
    python tools/deployment/pytorch2aoti.py CONFIG CHECKPOINT \
        --out work_dirs/demo/model.pt2 --shape 128 128 --dynamic
"""

import argparse
import warnings

import torch

from mmevo import apis, cli
from mmevo.apis.deploy import other_size, report_parity
from mmevo.deploy import AotiModel, exportable
from mmevo.deploy.aoti import (
    WeightLayoutWarning,
    compile_program,
    export_program,
)
from mmevo.integrations import mmengine as fixes
from mmevo.integrations.mmengine.atomic_backend import atomic_output


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Compile a model into an AOTInductor package'
    )
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='the .pt2 file')
    cli.add_shape_arg(
        parser,
        default=[128, 128],
        help=f'example input size (default: 128 128; at most {cli.MAX_SIDE})',
    )
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic height and width (one package for every size)',
    )
    parser.add_argument(
        '--device',
        choices=['cpu', 'cuda'],
        default='cpu',
        help='the device the package runs on (default: cpu)',
    )
    parser.add_argument(
        '--inline-ops',
        action='store_true',
        help="mmevo's ops as standard operators: for a runtime without "
        "mmevo's op library (slower)",
    )
    parser.add_argument(
        '--unfused-involution',
        action='store_true',
        help='on CPU, each Involution as its span convolution and '
        'aggregation (the stock graph) rather than one '
        'mmevo::fused_involution, which never writes the kernel map',
    )
    parser.add_argument(
        '--prepack',
        action='store_true',
        help="with --dynamic: oneDNN's convolution weights laid out at "
        "compile time for the --shape and this process's thread count, "
        'faster there, 3-10x slower at other sizes or thread counts (a '
        'static package is always laid out so: compile it with the '
        'thread count it will run with)',
    )
    return parser.parse_args(argv)


def summary(error, limit=300):
    """The first lines of ``error``'s message as one line, at most
    ``limit`` characters."""
    text = ' '.join(line.strip() for line in str(error).splitlines()[:3])
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + '...'


def main(argv=None):
    args = parse_args(argv)
    if args.prepack and not args.dynamic:
        apis.fail(
            '--prepack applies to --dynamic packages: a static package '
            'always has its weights laid out for its size and this '
            "process's thread count"
        )
    if args.device == 'cuda' and not torch.cuda.is_available():
        apis.fail('--device cuda: no CUDA device is available')
    fixes.safe_globals.install()  # mmengine's own checkpoints load
    with apis.one_line_errors():
        # before the compile: a bad --out fails at once, not after it
        apis.check_output(
            args.out,
            {'config': args.config, 'checkpoint': args.checkpoint},
            suffix='.pt2',
        )
        # a partial checkpoint would compile a half-initialised model
        model = apis.build_model(
            apis.load_config(args.config),
            args.checkpoint,
            args.device,
            hint='compile the checkpoint the config trained',
        )
    model, kind = exportable(model)
    shapes = [args.shape] + ([other_size(args.shape)] if args.dynamic else [])
    inputs = [torch.randn(1, 3, *hw, device=args.device) for hw in shapes]
    try:
        program = export_program(
            model,
            inputs[0],
            dynamic=args.dynamic,
            inline_ops=args.inline_ops,
            fused_involution=not args.unfused_involution,
        )
    except Exception as e:  # torch.export's own errors
        size = ' '.join(map(str, args.shape))
        apis.fail(
            f'torch.export at --shape {size}'
            f'{" --dynamic" if args.dynamic else ""} failed: '
            f'{summary(e)} (an input too small for the model? try '
            'its test size, e.g. --shape 128 128)'
        )
    # the package appears under --out only once it passed the checks
    with atomic_output(args.out, suffix='.pt2') as tmp:
        compile_program(program, tmp, prepack=args.prepack)
        package = AotiModel(tmp, name=f"the package for '{args.out}'")
        with warnings.catch_warnings():
            # the check's second size is not a size to time a prepacked
            # package at
            warnings.simplefilter('ignore', WeightLayoutWarning)
            report_parity(
                model, package, inputs, kind, 'AOTInductor', args.dynamic
            )
    return args.out


if __name__ == '__main__':
    main()
