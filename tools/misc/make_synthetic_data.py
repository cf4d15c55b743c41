"""Generate the synthetic demo data sets (deterministic, no download).

Example:
    python tools/misc/make_synthetic_data.py            # all sets into data/
    python tools/misc/make_synthetic_data.py cls        # ImageNet layout
    python tools/misc/make_synthetic_data.py det --out-dir /tmp/shapes
"""

import argparse
import time

from mmevo.demo import (
    make_synthetic_cityscapes,
    make_synthetic_coco,
    make_synthetic_imagenet,
)

MAKERS = dict(
    det=(make_synthetic_coco, 'data/synthetic_coco'),
    seg=(make_synthetic_cityscapes, 'data/synthetic_cityscapes'),
    cls=(make_synthetic_imagenet, 'data/synthetic_imagenet'),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Generate the synthetic COCO-format detection set, the '
        'Cityscapes-layout segmentation set and/or the ImageNet-layout '
        'classification set.'
    )
    parser.add_argument(
        'which', nargs='?', choices=['det', 'seg', 'cls', 'all'], default='all'
    )
    parser.add_argument(
        '--out-dir',
        help='output directory (with det, seg or cls); default: '
        + ', '.join(f'{k}: {v[1]}' for k, v in MAKERS.items()),
    )
    parser.add_argument('--num-train', type=int, help='training images')
    parser.add_argument('--num-val', type=int, help='validation images')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--if-missing',
        action='store_true',
        help='skip a set already complete with the same arguments',
    )
    args = parser.parse_args(argv)
    if args.out_dir and args.which == 'all':
        parser.error('--out-dir needs det, seg or cls')
    return args


def main(argv=None):
    args = parse_args(argv)
    sizes = {
        k: v
        for k, v in (('num_train', args.num_train), ('num_val', args.num_val))
        if v is not None
    }
    for which in list(MAKERS) if args.which == 'all' else [args.which]:
        maker, default_dir = MAKERS[which]
        start = time.time()
        maker(
            args.out_dir or default_dir,
            seed=args.seed,
            skip_if_ready=args.if_missing,
            **sizes,
        )
        print(
            f'[data] {args.out_dir or default_dir} ready '
            f'({time.time() - start:.1f} s)'
        )


if __name__ == '__main__':
    main()
