"""What the tools do, as functions: configs, models, runners, checkpoints.

``tools/*.py`` parse their arguments (with :mod:`mmevo.cli`), call these
and print; a program of one's own can call them the same way. They need
mmengine, mmcv and the OpenMMLab library of the config (mmdet, mmseg).

Example:
    >>> from mmevo.apis import build_model, load_config
    >>> model = build_model(load_config('configs/rednet50_fpn_coco.py'),
    ...                     'work_dirs/rednet50_fpn_coco/epoch_12.pth')
"""

from .checkpoint import (
    CheckpointError,
    check_checkpoint_fits,
    checkpoint_error,
    find_resumable_checkpoint,
    read_checkpoint,
    state_dict_mismatch,
)
from .convert import convert_swin_checkpoint
from .errors import USAGE, fail, launch_rank, one_line_errors
from .outputs import OutputPathError, check_output
from .resume import check_resume_fits, optimizer_mismatch
from .runner import (
    build_model,
    build_runner,
    check_data,
    default_work_dir,
    dump_results,
    load_config,
)
from .workdir import LOCK_FILE, WorkDirBusyError, WorkDirLock, lock_work_dir

__all__ = [
    'LOCK_FILE',
    'USAGE',
    'CheckpointError',
    'OutputPathError',
    'WorkDirBusyError',
    'WorkDirLock',
    'build_model',
    'build_runner',
    'check_checkpoint_fits',
    'check_data',
    'check_output',
    'check_resume_fits',
    'checkpoint_error',
    'convert_swin_checkpoint',
    'default_work_dir',
    'dump_results',
    'fail',
    'find_resumable_checkpoint',
    'launch_rank',
    'load_config',
    'lock_work_dir',
    'one_line_errors',
    'optimizer_mismatch',
    'read_checkpoint',
    'state_dict_mismatch',
]
