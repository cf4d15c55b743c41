"""Runtime fixes for today's stack (torch >= 2.6, CPU-only machines).

Importing this package (``import mmevo`` does) lets mmengine resume from and
test its own checkpoints under torch's ``weights_only`` default and registers
the crash-safe ``atomic_local`` file backend; see :mod:`.checkpoint`.
:class:`RandomStateHook` makes resuming bit-exact with random augmentation;
see :mod:`.randomness`. :func:`setup_cpu_distributed` makes the ``pytorch``
and ``slurm`` launchers work without a GPU and bounds a stalled rank's wait;
see :mod:`.dist`.
"""
from .checkpoint import (AtomicLocalBackend, atomic_write, checkpoint_error,
                         find_resumable_checkpoint,
                         register_checkpoint_safe_globals, state_dict_mismatch)
from .dist import (DEFAULT_DIST_TIMEOUT, CPUDistributedDataParallel,
                   convert_sync_bn_to_bn, setup_cpu_distributed)
from .randomness import RandomStateHook, get_rng_state, set_rng_state

register_checkpoint_safe_globals()

__all__ = [
    'register_checkpoint_safe_globals', 'AtomicLocalBackend', 'atomic_write',
    'checkpoint_error', 'find_resumable_checkpoint', 'state_dict_mismatch',
    'CPUDistributedDataParallel', 'DEFAULT_DIST_TIMEOUT',
    'convert_sync_bn_to_bn', 'setup_cpu_distributed', 'RandomStateHook',
    'get_rng_state', 'set_rng_state'
]
