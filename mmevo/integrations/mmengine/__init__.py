"""Fixes of mmengine 0.10.7, each turned on by its ``install()``.

* :mod:`.safe_globals`: its checkpoints load under torch >= 2.6's
  ``weights_only`` default;
* :mod:`.atomic_backend`: the ``atomic_local`` file backend, which never
  leaves a truncated checkpoint;
* :mod:`.checkpoint_hook`: :class:`SafeCheckpointHook`, which writes the new
  checkpoint before it removes an old one;
* :mod:`.randomness`: :class:`RandomStateHook`, bit-exact resume;
* :mod:`.dist`: distributed runs without a GPU.

Importing this package changes nothing; :func:`install_all` turns every
fix on (the tools call it, and so does ``mmevo.register_all_modules``).
Each fix warns (:class:`UpstreamVersionWarning`) on an mmengine other than
the one it was written for, and refuses one that lacks what it relies on.
"""

from . import atomic_backend, checkpoint_hook, dist, randomness, safe_globals
from ._version import WRITTEN_FOR, UpstreamVersionWarning
from .atomic_backend import AtomicLocalBackend, atomic_write, remove_stale_tmp
from .checkpoint_hook import SafeCheckpointHook, use_safe_hook
from .dist import (
    DEFAULT_DIST_TIMEOUT,
    CPUDistributedDataParallel,
    convert_sync_bn_to_bn,
    setup_cpu_distributed,
)
from .randomness import RandomStateHook, get_rng_state, set_rng_state


def install_all():
    """Turn on every mmengine fix of mmevo (idempotent).

    Example:
        >>> from mmevo.integrations.mmengine import install_all
        >>> install_all()
    """
    for fix in (
        safe_globals,
        atomic_backend,
        checkpoint_hook,
        randomness,
        dist,
    ):
        fix.install()


__all__ = [
    'DEFAULT_DIST_TIMEOUT',
    'WRITTEN_FOR',
    'AtomicLocalBackend',
    'CPUDistributedDataParallel',
    'RandomStateHook',
    'SafeCheckpointHook',
    'UpstreamVersionWarning',
    'atomic_write',
    'convert_sync_bn_to_bn',
    'get_rng_state',
    'install_all',
    'remove_stale_tmp',
    'set_rng_state',
    'setup_cpu_distributed',
    'use_safe_hook',
]
