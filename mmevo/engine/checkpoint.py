"""Checkpoints: safe loading under torch >= 2.6, crash-safe writing, checks.

* :func:`register_checkpoint_safe_globals` (below) lets torch load
  mmengine's own checkpoints with ``weights_only=True``;
* :class:`AtomicLocalBackend` writes a checkpoint to a temporary file and
  renames it, so a crash never leaves a truncated ``epoch_N.pth``;
* :func:`checkpoint_error`, :func:`find_resumable_checkpoint` and
  :func:`state_dict_mismatch` tell whether a checkpoint can be resumed from
  or loaded into a model.

Safe loading.

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
import contextlib
import os
import os.path as osp
import re
import tempfile
import warnings
import zipfile

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer
from mmengine.model import is_model_wrapper

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


def atomic_write(data, path):
    """Write ``data`` to ``path`` so that ``path`` is never left partial.

    The bytes go to a temporary file in the same directory, which is synced
    and then renamed over ``path`` (``os.replace`` is atomic on POSIX and
    Windows). A crash or a full disk leaves the previous ``path`` (or none)
    and no temporary file.

    Args:
        data (bytes): The content.
        path (str | Path): The final file name.

    Example:
        >>> atomic_write(b'hello', 'work_dirs/x/epoch_1.pth')
    """
    path = osp.abspath(os.fspath(path))
    directory = osp.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=directory, prefix=f'.{osp.basename(path)}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; give it what open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if hasattr(os, 'O_DIRECTORY'):  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@register_backend('atomic_local', force=True)
class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose ``put`` is :func:`atomic_write`.

    ``tools/train.py`` gives it to the ``CheckpointHook`` (as
    ``backend_args=dict(backend='atomic_local')``) unless the config names
    another backend, so ``epoch_N.pth`` is either complete or absent.

    Example:
        >>> default_hooks = dict(checkpoint=dict(
        ...     type='CheckpointHook',
        ...     backend_args=dict(backend='atomic_local')))
    """

    def put(self, obj, filepath):
        atomic_write(obj, filepath)

    def put_text(self, obj, filepath, encoding='utf-8'):
        atomic_write(obj.encode(encoding), filepath)


def checkpoint_error(path):
    """Why the checkpoint file ``path`` cannot be loaded, or ``None``.

    Reads the file through (every member's CRC is checked, nothing is
    unpickled), so a truncated or corrupt file is found before torch fails
    with "failed finding central directory".

    Args:
        path (str): A local checkpoint written by ``torch.save``.

    Returns:
        str | None: A short reason, or ``None`` when the file is sound.

    Example:
        >>> checkpoint_error('work_dirs/demo/epoch_20.pth') is None
        True
    """
    if not osp.isfile(path):
        return 'no such file'
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f'truncated or not a torch checkpoint ({e})'
    if bad is not None:
        return f'corrupt member {bad}'
    return None


def _checkpoint_step(name):
    """The epoch or iteration number of 'epoch_N.pth' / 'iter_N.pth'."""
    match = re.fullmatch(r'(?:epoch|iter)_(\d+)\.pth', name)
    return int(match.group(1)) if match else None


def find_resumable_checkpoint(work_dir):
    """The newest sound checkpoint of ``work_dir`` to resume from, or None.

    Starts from the one ``last_checkpoint`` names (what mmengine's automatic
    resume takes), then tries the other ``epoch_N.pth``/``iter_N.pth`` files
    from the highest N down. A corrupt or missing one is skipped with a
    warning.

    Args:
        work_dir (str): The work dir of the run.

    Returns:
        str | None: A checkpoint path; ``None`` when there is none.

    Example:
        >>> find_resumable_checkpoint('work_dirs/demo')
        'work_dirs/demo/epoch_20.pth'
    """
    candidates = []
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            last = f.read().strip()
        if last:
            candidates.append(last)
    names = os.listdir(work_dir) if osp.isdir(work_dir) else []
    steps = [(_checkpoint_step(n), n) for n in names
             if _checkpoint_step(n) is not None]
    candidates += [osp.join(work_dir, n) for _, n in sorted(steps)[::-1]]
    tried = set()
    for path in candidates:
        if path in tried:
            continue
        tried.add(path)
        reason = checkpoint_error(path)
        if reason is None:
            return path
        warnings.warn(
            f"cannot resume from '{path}': {reason}; trying an "
            'older checkpoint',
            stacklevel=2)
    return None


def state_dict_mismatch(model, state_dict):
    """Keys of ``state_dict`` that do not fit ``model``.

    Compares as mmengine loads: a leading ``module.`` is dropped from the
    checkpoint's keys, and a wrapped model (DDP) is compared by its module.

    Args:
        model (nn.Module): The model (or its wrapper).
        state_dict (dict): The checkpoint's ``state_dict`` (or the whole
            checkpoint when it has none).

    Returns:
        tuple[list[str], list[str], list[str]]: The missing keys, the
        unexpected keys and the mis-shaped ones, each described as
        ``'key (checkpoint (3, 4), model (3, 5))'``.

    Example:
        >>> missing, unexpected, misshaped = state_dict_mismatch(
        ...     model, torch.load('epoch_1.pth')['state_dict'])
    """
    if is_model_wrapper(model):
        model = model.module
    state_dict = state_dict.get('state_dict', state_dict)
    theirs = {re.sub(r'^module\.', '', k): v for k, v in state_dict.items()}
    ours = model.state_dict()
    missing = [k for k in ours if k not in theirs]
    unexpected = [k for k in theirs if k not in ours]
    misshaped = [
        f'{k} (checkpoint {tuple(theirs[k].shape)}, model '
        f'{tuple(v.shape)})' for k, v in ours.items()
        if k in theirs and hasattr(theirs[k], 'shape')
        and tuple(theirs[k].shape) != tuple(v.shape)
    ]
    return missing, unexpected, misshaped
