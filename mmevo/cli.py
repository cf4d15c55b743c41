"""The command line of mmevo's tools: what every ``tools/*.py`` imports.

It holds the tools' argparse types and options, so that each tool only
declares its own, and hides one warning that is noise to a user:
mmengine resolves ``mmdet::`` config bases through ``pkg_resources``,
which setuptools 80 (the last that has it) flags as deprecated each time.
Importing this module (a tool does, before it runs) installs that filter
for the process; a library import of mmevo changes no warning filter.

Example:
    >>> import argparse
    >>> from mmevo import cli
    >>> parser = argparse.ArgumentParser()
    >>> cli.add_shape_arg(parser, default=[128, 128])
    >>> parser.add_argument('--iters', type=cli.int_in_range(1))
"""

import argparse
import warnings

from mmengine.config import DictAction

#: The largest image side the tools accept (``--shape``, ``--size``): four
#: times a Cityscapes frame; a larger one only exhausts the memory.
MAX_SIDE = 8192

warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)


def int_in_range(low, high=None):
    """An argparse ``type``: an int in ``[low, high]``, else a one-line
    usage error naming the bounds.

    Args:
        low (int): The smallest value.
        high (int, optional): The largest value; no bound when None.

    Example:
        >>> parser.add_argument('--iters', type=int_in_range(1), default=10)
    """

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f'expected an integer, got {text!r}'
            ) from None
        if value < low or (high is not None and value > high):
            bounds = f'>= {low}' if high is None else f'in [{low}, {high}]'
            raise argparse.ArgumentTypeError(
                f'expected an integer {bounds}, got {value}'
            )
        return value

    parse.__name__ = 'int'  # argparse names the type in its message
    return parse


def device_arg(text):
    """An argparse ``type``: a device torch knows and this machine has
    (``cuda`` without a GPU is a usage error, not a deep RuntimeError).

    Example:
        >>> parser.add_argument('--device', type=device_arg, default='cpu')
    """
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"expected a device such as 'cpu' or 'cuda:0', got {text!r}"
        ) from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f'expected an available device, got {text!r}: no CUDA device'
        )
    return device


device_arg.__name__ = 'device'


def add_shape_arg(parser, default=None, help=''):
    """``--shape H W``: the input's height and width, each in
    ``[1, MAX_SIDE]``.

    Example:
        >>> add_shape_arg(parser, default=[128, 128])
    """
    parser.add_argument(
        '--shape',
        type=int_in_range(1, MAX_SIDE),
        nargs=2,
        default=default,
        metavar=('H', 'W'),
        help=help or f'input height and width (at most {MAX_SIDE})',
    )


def add_evaluation_args(parser):
    """The options of the tools that evaluate on a config's test set
    (``test.py``, ``onnx_test.py``): ``--work-dir``, ``--out`` and
    ``--cfg-options``."""
    parser.add_argument(
        '--work-dir', help='the dir to save the evaluation metrics and logs'
    )
    parser.add_argument(
        '--out', help='also dump the raw predictions to this pickle file'
    )
    add_cfg_options(parser)


def add_cfg_options(parser):
    """``--cfg-options key=value ...``: config overrides."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value (e.g. '
        'train_cfg.max_epochs=3 "model.backbone.depth=26")',
    )


def add_launcher_args(parser):
    """``--launcher`` and ``--local-rank`` of the distributed tools."""
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher',
    )
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
