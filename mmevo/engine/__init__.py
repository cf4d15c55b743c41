"""Runtime fixes for today's stack (torch >= 2.6, CPU-only machines).

Importing this package (``import mmevo`` does) lets mmengine resume from and
test its own checkpoints under torch's ``weights_only`` default; see
:mod:`.checkpoint`. :func:`setup_cpu_distributed` makes the ``pytorch`` and
``slurm`` launchers work without a GPU; see :mod:`.dist`.
"""
from .checkpoint import register_checkpoint_safe_globals
from .dist import (CPUDistributedDataParallel, convert_sync_bn_to_bn,
                   setup_cpu_distributed)

register_checkpoint_safe_globals()

__all__ = [
    'register_checkpoint_safe_globals', 'CPUDistributedDataParallel',
    'convert_sync_bn_to_bn', 'setup_cpu_distributed'
]
