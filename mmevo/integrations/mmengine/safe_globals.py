"""Fix: mmengine 0.10.7's checkpoints do not load under torch >= 2.6.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: the
unpickler only rebuilds tensors, containers and an allowlist of types. A full
mmengine checkpoint (what ``--resume`` and ``tools/test.py`` read) also holds
the ``MessageHub`` state: ``HistoryBuffer`` objects with numpy arrays, whose
statistic methods are pickled as ``getattr(HistoryBuffer, 'mean')``. mmengine
0.10.7 calls ``torch.load`` without ``weights_only``, so resuming fails with
"Weights only load failed".

Two ways out: call ``torch.load(weights_only=False)`` (runs arbitrary pickled
code from the file: unsafe for a downloaded checkpoint), or teach the safe
unpickler exactly the types mmengine writes. :func:`install` does the
latter:

* ``mmengine.logging.HistoryBuffer`` (rebuilt by setting its ``__dict__``);
* numpy arrays and scalars of numeric dtypes (``_reconstruct``, ``ndarray``,
  ``dtype`` and the numeric ``numpy.dtypes`` classes, ``scalar``), as torch's
  documentation recommends for numpy data;
* ``builtins.getattr`` mapped to :func:`_history_buffer_getattr`, which only
  resolves ``HistoryBuffer``'s statistic methods and refuses anything else.

Every other global still fails to load, so ``weights_only`` keeps protecting
against malicious files. Delete this module when mmengine loads its own
checkpoints under ``weights_only`` (it does not in 0.10.7).
"""

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from ._version import check_mmengine

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
    if obj is HistoryBuffer and (
        name in _DEFAULT_STATISTICS
        or name in HistoryBuffer._statistics_methods
    ):
        return getattr(HistoryBuffer, name)
    raise torch.serialization.pickle.UnpicklingError(
        f'weights_only load: getattr({obj!r}, {name!r}) is not allowed; only '
        'HistoryBuffer statistic methods are'
    )


def _numpy_globals():
    """(object, pickled path) pairs for numeric numpy arrays and scalars, under
    both numpy 1 ('numpy.core') and numpy 2 ('numpy._core') paths."""
    try:
        from numpy._core import multiarray  # numpy >= 2 (1.26: an alias)
    except ImportError:
        from numpy.core import multiarray
    pairs = []
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        pairs += [
            (multiarray._reconstruct, f'{module}._reconstruct'),
            (multiarray.scalar, f'{module}.scalar'),
        ]
    numeric = dict.fromkeys(  # (dict: drops the aliases, keeps the order)
        t
        for t in vars(np.dtypes).values()
        if isinstance(t, type)
        and issubclass(t, np.dtype)
        and t.type is not None
        and issubclass(t.type, (np.number, np.bool_))
    )
    return [*pairs, np.ndarray, np.dtype, *list(numeric)]


def safe_globals():
    """What :func:`install` allows: for ``torch.serialization``'s
    ``add_safe_globals`` or its ``safe_globals`` context manager.

    Returns:
        list: Types and ``(function, pickled name)`` pairs.

    Example:
        >>> with torch.serialization.safe_globals(safe_globals()):
        ...     ckpt = torch.load('work_dirs/demo/epoch_1.pth')
    """
    return [
        HistoryBuffer,
        (_history_buffer_getattr, 'builtins.getattr'),
        *_numpy_globals(),
    ]


def install():
    """Allow the types of an mmengine checkpoint in ``weights_only`` loads,
    for the rest of the process (idempotent).

    Example:
        >>> install()
        >>> ckpt = torch.load('work_dirs/demo/epoch_1.pth')  # no error
    """
    check_mmengine('checkpoint allowlist')
    torch.serialization.add_safe_globals(safe_globals())
