"""Command-line behaviour shared by the tools (train, test, deployment).

The library raises exceptions; the tools turn the expected ones (a missing
config, data set or checkpoint, a checkpoint that does not fit) into one line
on stderr, printed by rank 0 only so that a distributed job says it once, and
an exit status, never a traceback.
"""
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction
from mmengine.runner import CheckpointLoader

from mmevo.datasets import (MissingDataError, check_data_exists,
                            check_pretrained_exists)
from mmevo.engine import state_dict_mismatch

# exit status of a usage error (as argparse): missing config or data
USAGE = 2
# the Makefile target that generates a synthetic set (and trains its demo)
_MAKE_TARGETS = {
    'det': 'make demo',
    'seg': 'make demo-seg',
    'cls': 'make demo-cls'
}
# keys listed per kind in the mismatch message (then: "... and N more")
_MAX_KEYS = 10


def add_evaluation_args(parser):
    """The options of the tools that evaluate on a config's test set
    (``test.py``, ``onnx_test.py``): ``--work-dir``, ``--out`` and
    ``--cfg-options``."""
    parser.add_argument(
        '--work-dir', help='the dir to save the evaluation metrics and logs')
    parser.add_argument(
        '--out', help='also dump the raw predictions to this pickle file')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value')


def fail(message, status=1):
    """Print ``error: <message>`` (rank 0 only) and exit with ``status``.

    Args:
        message (str): One line.
        status (int): The exit status. Default: 1.

    Example:
        >>> fail("checkpoint 'x.pth' does not exist")
    """
    rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))
    if rank == '0':
        print(f'error: {message}', file=sys.stderr)
    raise SystemExit(status)


def load_config(path):
    """The config at ``path``; exit with status 2 when the file is missing.

    Args:
        path (str): The config file.

    Returns:
        mmengine.Config: The config.
    """
    if not osp.isfile(path):
        fail(f"config file '{path}' does not exist", USAGE)
    return Config.fromfile(path)


def exit_if_data_missing(cfg, dataloaders, pretrained=False):
    """Exit with status 2 and one line if the run's data is missing.

    Runs :func:`mmevo.datasets.check_data_exists` (and, with ``pretrained``,
    :func:`mmevo.datasets.check_pretrained_exists`) and reports their
    :class:`mmevo.datasets.MissingDataError` with :func:`fail`, adding the
    ``make`` target that generates a missing demo set.

    Args:
        cfg (mmengine.Config): The config.
        dataloaders (Sequence[str]): Dataloader keys the run uses.
        pretrained (bool): Also check the local ``Pretrained`` checkpoints
            the model initialises from (training). Default: False.

    Example:
        >>> exit_if_data_missing(cfg, ['test_dataloader'])
    """
    try:
        check_data_exists(cfg, dataloaders)
        if pretrained:
            check_pretrained_exists(cfg)
    except MissingDataError as e:
        make = _MAKE_TARGETS.get(e.synthetic)
        fail(
            f'{e} (`{make}` generates it and trains the demo)'
            if make else str(e), USAGE)


def _list(keys):
    """'N (key, key, ...)', at most ``_MAX_KEYS`` of them named."""
    more = f', ... and {len(keys) - _MAX_KEYS} more' \
        if len(keys) > _MAX_KEYS else ''
    return f"{len(keys)} ({', '.join(keys[:_MAX_KEYS])}{more})"


def check_checkpoint_fits(model, checkpoint, hint):
    """Exit with one line if ``checkpoint`` does not fit ``model``: its
    missing, unexpected and mis-shaped keys, then ``hint``.

    Args:
        model (nn.Module): The model (wrapped or not).
        checkpoint (str): The checkpoint's path or URL.
        hint (str): What the user can do about it.
    """
    state = CheckpointLoader.load_checkpoint(checkpoint, map_location='cpu')
    missing, unexpected, misshaped = state_dict_mismatch(model, state)
    problems = [
        f'{what} keys {_list(keys)}'
        for what, keys in (('missing', missing), ('unexpected', unexpected),
                           ('mis-shaped', misshaped)) if keys
    ]
    if problems:
        fail(f"checkpoint '{checkpoint}' does not fit the model: "
             f"{'; '.join(problems)}; {hint}")


def dump_results(cfg, out):
    """Make ``cfg``'s test run also dump the raw predictions to ``out``
    (mmengine's ``DumpResults``: generic, mmdet and mmseg alike).

    Args:
        cfg (mmengine.Config): The config; its ``test_evaluator`` grows.
        out (str): The pickle file.
    """
    evaluators = cfg.test_evaluator
    if not isinstance(evaluators, (list, tuple)):
        evaluators = [evaluators]
    cfg.test_evaluator = list(evaluators) + [
        dict(type='DumpResults', out_file_path=out)
    ]
