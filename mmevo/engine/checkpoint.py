"""Let torch >= 2.6 load mmengine's own checkpoints with ``weights_only=True``.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: the
unpickler only rebuilds tensors, containers and an allowlist of types. A full
mmengine checkpoint (what ``--resume`` and ``tools/test.py`` read) also holds
the ``MessageHub`` state: ``HistoryBuffer`` objects with numpy arrays, whose
statistic methods are pickled as ``getattr(HistoryBuffer, 'mean')``. mmengine
0.10.7 calls ``torch.load`` without ``weights_only``, so resuming fails with
"Weights only load failed".

Two ways out: call ``torch.load(weights_only=False)`` (runs arbitrary pickled
code from the file: unsafe for a downloaded checkpoint), or teach the safe
unpickler exactly the types mmengine writes. We do the latter, once, at
``import mmevo``:

* ``mmengine.logging.HistoryBuffer`` (rebuilt by setting its ``__dict__``);
* numpy arrays and scalars of numeric dtypes (``_reconstruct``, ``ndarray``,
  ``dtype`` and the numeric ``numpy.dtypes`` classes, ``scalar``), as torch's
  documentation recommends for numpy data;
* ``builtins.getattr`` mapped to :func:`_history_buffer_getattr`, which only
  resolves ``HistoryBuffer``'s statistic methods and refuses anything else.

Every other global still fails to load, so ``weights_only`` keeps protecting
against malicious files.
"""
import numpy as np
import torch
from mmengine.logging import HistoryBuffer

_DEFAULT_STATISTICS = ('min', 'max', 'current', 'mean')


def _history_buffer_getattr(obj, name):
    """The ``getattr`` that mmengine checkpoints need, and nothing more.

    ``HistoryBuffer._statistics_methods`` maps names to methods of the class;
    pickle writes each as ``getattr(HistoryBuffer, name)``.

    Args:
        obj: Must be ``HistoryBuffer``.
        name (str): A registered statistic method name.

    Returns:
        Callable: ``getattr(HistoryBuffer, name)``.

    Example:
        >>> _history_buffer_getattr(HistoryBuffer, 'mean').__name__
        'mean'
    """
    if obj is HistoryBuffer and (name in _DEFAULT_STATISTICS
                                 or name in HistoryBuffer._statistics_methods):
        return getattr(HistoryBuffer, name)
    raise torch.serialization.pickle.UnpicklingError(
        f'weights_only load: getattr({obj!r}, {name!r}) is not allowed; only '
        'HistoryBuffer statistic methods are')


def _numpy_globals():
    """(object, pickled path) pairs for numeric numpy arrays and scalars, under
    both numpy 1 ('numpy.core') and numpy 2 ('numpy._core') paths."""
    try:
        from numpy._core import multiarray  # numpy >= 2 (1.26: an alias)
    except ImportError:
        from numpy.core import multiarray
    pairs = []
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        pairs += [(multiarray._reconstruct, f'{module}._reconstruct'),
                  (multiarray.scalar, f'{module}.scalar')]
    numeric = dict.fromkeys(  # (dict: drops the aliases, keeps the order)
        t for t in vars(np.dtypes).values()
        if isinstance(t, type) and issubclass(t, np.dtype)
        and t.type is not None and issubclass(t.type, (np.number, np.bool_)))
    return pairs + [np.ndarray, np.dtype] + list(numeric)


def register_checkpoint_safe_globals():
    """Allow the types of an mmengine checkpoint in ``weights_only`` loads.

    Idempotent; called when :mod:`mmevo.engine` is imported.

    Example:
        >>> import torch, mmevo
        >>> ckpt = torch.load('work_dirs/demo/epoch_1.pth')  # no error
    """
    torch.serialization.add_safe_globals(
        [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr')] +
        _numpy_globals())
