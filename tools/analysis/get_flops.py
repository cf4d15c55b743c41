"""Parameters and FLOPs of a whole detector, segmentor or classifier built
from a config.

Counts with mmengine's ``FlopAnalyzer`` and mmevo's op handles, on the
published ``forward_dummy`` (see :mod:`mmevo.apis.complexity`). Prints the
trainable parameters (the published convention) and all of them, the FLOPs
with and without the mmevo ops (which the published counter did not see),
and the FLOPs by operator; docs/benchmarks.md compares with the published
tables.

Example:
    python tools/analysis/get_flops.py configs/rednet50_fpn_coco.py
    python tools/analysis/get_flops.py \
        configs/rednet/rednet50_64xb32-warmup-coslr_in1k.py
    python tools/analysis/get_flops.py \
        configs/rednet/fpn_rednet50_4xb2-80k_cityscapes-512x1024.py \
        --shape 2048 1024
"""

import argparse

from mmevo import apis, cli
from mmevo.apis.complexity import (
    DEFAULT_SHAPES,
    count_flops,
    count_parameters,
    task_of,
)
from mmevo.ops.flops import MMEVO_OPS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Parameters and FLOPs of a detector, segmentor or '
        'classifier'
    )
    parser.add_argument('config', help='config file')
    cli.add_shape_arg(
        parser,
        help='input height and width (default: 1280 800 for detection, '
        '2048 1024 for segmentation, 224 224 for classification, as mmdet '
        '2.x / mmseg 0.x / mmcls 0.x get_flops; '
        f'at most {cli.MAX_SIDE})',
    )
    cli.add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    with apis.one_line_errors():
        model = apis.build_model(
            apis.load_config(args.config, args.cfg_options)
        )
    shape = tuple(args.shape) if args.shape else DEFAULT_SHAPES[task_of(model)]
    total_params, trainable = count_parameters(model)
    flops = count_flops(model, shape)
    total = sum(flops.values())
    in_ops = sum(flops.get(op, 0) for op in MMEVO_OPS)
    print(
        f'Config: {args.config}\nInput shape: (1, 3, {shape[0]}, {shape[1]})'
    )
    print(
        f'Params: {trainable / 1e6:.2f} M trainable (published convention)'
        f', {total_params / 1e6:.2f} M in all'
    )
    print(
        f'FLOPs: {total / 1e9:.1f} G ({(total - in_ops) / 1e9:.1f} G '
        f'without mmevo ops, which the published counter did not see; '
        f'{in_ops / 1e9:.2f} G in mmevo ops)'
    )
    print(
        'FLOPs by operator (G): '
        + ', '.join(f'{op} {n / 1e9:.2f}' for op, n in flops.most_common())
    )


if __name__ == '__main__':
    main()
