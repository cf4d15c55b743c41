"""Draw the kernels an evolution layer generates at chosen pixels of an image.

Builds the model of an mmdet / mmseg config, loads a checkpoint, runs one
image through the model's feature extractor (backbone and neck), captures the
kernels (B, G, K, K, H_out, W_out) of one :class:`mmevo.layers.EvolutionLayer`
with a kernel hook, and writes a PNG: the image with the chosen points marked,
and beside it, for every point, the K x K kernel of each group (involution
kernels, DDF filters, attention maps) at the output position over that point.

Example:
    python tools/analysis/visualize_kernels.py \
        configs/rednet/retinanet_rednet50_fpn_1x_coco.py rednet50.pth \
        demo.jpg --layer backbone.layer2.0.conv2 --points 120,200 300,410 \
        --out kernels.png

    # which layers can be drawn:
    python tools/analysis/visualize_kernels.py CONFIG CKPT IMAGE --list-layers
"""

import argparse
import os.path as osp

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt
import mmcv
import numpy as np

from mmevo import apis, cli
from mmevo.apis import kernel_capture as kernels
from mmevo.integrations import mmengine as fixes

# the most --points drawn (a row of the figure each)
MAX_POINTS = 64


def parse_point(text):
    """'y,x' -> (y, x) in pixels of the original image."""
    try:
        y, x = (float(v) for v in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'a point is "y,x" in image pixels, got {text!r}'
        ) from None
    return y, x


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet / mmseg config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('image', help='image file')
    parser.add_argument(
        '--layer',
        help='module name of an evolution layer, '
        'e.g. backbone.layer1.0.conv2 (see --list-layers)',
    )
    parser.add_argument(
        '--points',
        nargs='+',
        type=parse_point,
        default=[],
        metavar='Y,X',
        help='pixels (row,column) of the '
        'original image whose kernels are drawn',
    )
    parser.add_argument(
        '--out',
        help='output PNG (default: '
        '<image>_<layer>_kernels.png beside the image)',
    )
    parser.add_argument(
        '--max-groups',
        type=cli.int_in_range(1),
        default=8,
        help='draw at most this many kernel groups per point',
    )
    parser.add_argument(
        '--max-size',
        type=cli.int_in_range(0, cli.MAX_SIDE),
        default=800,
        help='rescale the image so its longer side is at most this (0: keep)',
    )
    parser.add_argument('--device', type=cli.device_arg, default='cpu')
    parser.add_argument(
        '--list-layers',
        action='store_true',
        help='print the drawable layers and exit',
    )
    cli.add_cfg_options(parser)
    args = parser.parse_args(argv)
    if not args.list_layers and (args.layer is None or not args.points):
        parser.error('--layer and --points are required (or --list-layers)')
    if len(args.points) > MAX_POINTS:  # a row each: the figure grows
        parser.error(
            f'argument --points: expected at most {MAX_POINTS} '
            f'points, got {len(args.points)}'
        )
    return args


def draw(image_rgb, points, kernel, positions, max_groups, title):
    """Figure: the image with numbered points, and a row of K x K kernels
    (one per group) for every point."""
    G = kernel.shape[0]
    groups = min(G, max_groups)
    rows = len(points)
    # Kernels are unit squares; the image spans all rows at its own aspect.
    image_width = rows * image_rgb.shape[1] / image_rgb.shape[0]
    fig = plt.figure(
        figsize=(1.4 * (image_width + 0.2 + groups), 1.4 * rows + 0.8)
    )
    grid = fig.add_gridspec(
        rows, groups + 2, width_ratios=[image_width, 0.2] + [1] * groups
    )
    ax = fig.add_subplot(grid[:, 0])
    ax.imshow(image_rgb)
    colors = plt.cm.tab10(np.arange(rows) % 10)
    for n, ((y, x), color) in enumerate(zip(points, colors, strict=True)):
        ax.scatter([x], [y], s=60, color=color, edgecolors='white')
        ax.annotate(
            str(n),
            (x, y),
            xytext=(4, 4),
            textcoords='offset points',
            color='white',
            fontsize=9,
            weight='bold',
        )
    ax.axis('off')
    for n, (i, j) in enumerate(positions):
        for g in range(groups):
            kax = fig.add_subplot(grid[n, g + 2])
            kax.imshow(kernel[g, :, :, i, j].numpy(), cmap='viridis')
            kax.set_xticks([])
            kax.set_yticks([])
            for side in kax.spines.values():
                side.set_edgecolor(colors[n])
                side.set_linewidth(2)
            if n == 0:
                kax.set_title(f'group {g}', fontsize=8)
            if g == 0:
                kax.set_ylabel(f'point {n}\n({i}, {j})', fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main(argv=None):
    args = parse_args(argv)
    fixes.safe_globals.install()  # mmengine's own checkpoints load
    with apis.one_line_errors():
        model = apis.build_model(
            apis.load_config(args.config, args.cfg_options),
            args.checkpoint,
            args.device,
            'draw the kernels of the config the checkpoint trained',
        )
    layers = kernels.evolution_layers(model)
    if args.list_layers:
        for name, layer in layers.items():
            print(f'{name}\t{type(layer).__name__}')
        return
    if args.layer not in layers:
        apis.fail(
            f'--layer {args.layer!r} is not an evolution layer of '
            'this model; choose one of: '
            f'{", ".join(layers) or "(none)"}'
        )
    image = mmcv.imread(args.image) if osp.isfile(args.image) else None
    if image is None:  # BGR, as the datasets load it
        apis.fail(f'cannot read image {args.image!r}')
    height, width = image.shape[:2]
    for y, x in args.points:
        if not (0 <= y < height and 0 <= x < width):
            apis.fail(
                f'point ({y}, {x}) is outside the {height}x{width} image'
            )
    scale = 1.0
    if args.max_size and max(height, width) > args.max_size:
        scale = args.max_size / max(height, width)
        image = mmcv.imrescale(image, scale)
    inputs = kernels.preprocess(model, image).to(args.device)
    try:
        kernel = kernels.capture_kernel(model, layers[args.layer], inputs)
    except ValueError as e:
        apis.fail(f'--layer {args.layer}: {e}')

    # The kernel grid covers the padded input; map each point onto it.
    H_in, W_in = inputs.shape[-2:]
    H_out, W_out = kernel.shape[-2:]
    positions = [
        (
            min(int(y * scale * H_out / H_in), H_out - 1),
            min(int(x * scale * W_out / W_in), W_out - 1),
        )
        for y, x in args.points
    ]
    layer = layers[args.layer]
    title = (
        f'{args.layer} ({type(layer).__name__}, '
        f'{kernel.shape[0]} groups, K={kernel.shape[1]}, '
        f'kernel grid {H_out}x{W_out})'
    )
    points = [(y * scale, x * scale) for y, x in args.points]
    fig = draw(
        mmcv.bgr2rgb(image), points, kernel, positions, args.max_groups, title
    )
    out = (
        args.out
        or osp.splitext(args.image)[0]
        + f'_{args.layer.replace(".", "-")}_kernels.png'
    )
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f'kernels of {args.layer} at {len(positions)} points -> {out}')


if __name__ == '__main__':
    main()
