"""Command-line behaviour shared by the tools.

The library raises exceptions; the tools turn the expected ones (a missing
config, data set or checkpoint, a checkpoint that does not fit, a busy work
dir) into one line on stderr, printed by rank 0 only so that a distributed
job says it once, and an exit status, never a traceback.
"""

import argparse
import contextlib
import os
import sys

from mmengine.config import DictAction

from mmevo.datasets import MissingDataError

from .checkpoint import CheckpointError
from .outputs import OutputPathError
from .workdir import WorkDirBusyError

#: Exit status of a usage error (as argparse's): missing config or data.
USAGE = 2
#: The largest image side the tools accept (``--shape``, ``--size``): four
#: times a Cityscapes frame; a larger one only exhausts the memory.
MAX_SIDE = 8192


def launch_rank():
    """This process's rank as the launcher set it (before any process
    group exists): torchrun's ``RANK``, SLURM's ``SLURM_PROCID``, else 0."""
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0')))


def fail(message, status=1):
    """Print ``error: <message>`` (rank 0 only) and exit with ``status``.

    Args:
        message (str): One line.
        status (int): The exit status. Default: 1.

    Example:
        >>> fail("checkpoint 'x.pth' does not exist")
    """
    if launch_rank() == 0:
        print(f'error: {message}', file=sys.stderr)
    raise SystemExit(status)


@contextlib.contextmanager
def one_line_errors():
    """Turn mmevo's expected errors into :func:`fail`: a missing data set
    (status 2), a checkpoint that cannot be loaded or does not fit, a work
    dir in use, an output path that cannot be written (status 1).

    Example:
        >>> with one_line_errors():
        ...     check_checkpoint_fits(model, 'other.pth')
    """
    try:
        yield
    except MissingDataError as e:
        fail(str(e), USAGE)
    except (CheckpointError, OutputPathError, WorkDirBusyError) as e:
        fail(str(e))


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
