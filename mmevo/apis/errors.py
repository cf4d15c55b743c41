"""mmevo's expected errors as one line and an exit status.

The library raises exceptions; a program (mmevo's tools, one's own) turns
the expected ones (a missing config, data set or checkpoint, a checkpoint
that does not fit, a busy work dir) into one line on stderr, printed by
rank 0 only so that a distributed job says it once, and an exit status,
never a traceback. The tools' argument parsing is :mod:`mmevo.cli`'s.
"""

import contextlib
import os
import sys

from mmevo.datasets import MissingDataError

from .checkpoint import CheckpointError
from .outputs import OutputPathError
from .workdir import WorkDirBusyError

#: Exit status of a usage error (as argparse's): missing config or data.
USAGE = 2


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
