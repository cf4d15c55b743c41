"""Fix: mmengine 0.10.7's local file backend writes a checkpoint in place.

``LocalBackend.put`` opens ``epoch_N.pth`` and writes into it, so a crash or
a full disk leaves a truncated file under the final name. The
``atomic_local`` backend that :func:`install` registers writes to a
temporary file beside it, syncs it and renames it over the final name; a
crash leaves the previous file (or none) and, at worst, a temporary file
that :func:`remove_stale_tmp` deletes at the next start. Delete this module
when mmengine's local backend writes atomically.
"""

import contextlib
import os
import os.path as osp
import re
import tempfile

from mmengine.evaluator import DumpResults
from mmengine.fileio import LocalBackend, dump, register_backend
from mmengine.fileio.backends import backends
from mmengine.logging import print_log
from mmengine.registry import METRICS

from ._version import check_mmengine

BACKEND = 'atomic_local'
#: the name of :class:`AtomicDumpResults` in mmengine's metric registry
DUMP_RESULTS = 'AtomicDumpResults'
# what atomic_output's temporary files are called:
# '.<name>.<8 chars>.tmp[<suffix>]'
_TMP = re.compile(r'\..+\.[a-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?')


def _sync_dir(directory):
    """Make a rename in ``directory`` durable (POSIX)."""
    if not hasattr(os, 'O_DIRECTORY'):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path, suffix=''):
    """Write ``path`` through a temporary file, so that ``path`` is never
    left partial: the block writes the temporary file whose name it is
    given; on leaving the block the file is synced and renamed over
    ``path`` (``os.replace`` is atomic on POSIX and Windows).

    An error in the block, or a failing write (a full disk), leaves the
    previous ``path`` (or none) and no temporary file; a killed process
    may leave a temporary file, which :func:`remove_stale_tmp` removes.
    Writers of one ``path`` at the same time each write their own
    temporary file: ``path`` ends up as one of them, whole. ``path``'s
    folder is created.

    Args:
        path (str | Path): The final file name.
        suffix (str): The temporary name ends with it too, for writers
            that look at the extension (AOTInductor's ``.pt2``).
            Default: ''.

    Yields:
        str: The temporary file's name, in ``path``'s folder (it exists,
        empty).

    Example:
        >>> with atomic_output('work_dirs/x/model.onnx', '.onnx') as tmp:
        ...     torch.onnx.export(model, (x, ), tmp)
    """
    path = osp.abspath(os.fspath(path))
    directory = osp.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=directory,
        prefix=f'.{osp.basename(path)}.',
        suffix='.tmp' + suffix,
    )
    os.close(fd)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # mkstemp creates the file 0600; give it what open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _sync_dir(directory)


def atomic_write(data, path):
    """Write ``data`` to ``path`` so that ``path`` is never left partial
    (:func:`atomic_output`).

    Args:
        data (bytes): The content.
        path (str | Path): The final file name.

    Example:
        >>> atomic_write(b'hello', 'work_dirs/x/epoch_1.pth')
    """
    with atomic_output(path) as tmp, open(tmp, 'wb') as f:
        f.write(data)


def atomic_save(obj, path):
    """``torch.save(obj, path)`` through :func:`atomic_output`: a failed
    or concurrent save never leaves a partial ``path``.

    Raises:
        OSError: A write failed (``ENOSPC``, ``EFBIG``), as the OS said.

    Example:
        >>> atomic_save(dict(state_dict=model.state_dict()), 'out/c.pth')
    """
    import torch

    with atomic_output(path) as tmp, open(tmp, 'wb') as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            # torch's writer wraps a failing write (a full disk) in an
            # "enforce fail ... unexpected pos" that does not say so
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise


def remove_stale_tmp(directory):
    """Remove the temporary files :func:`atomic_write` left in
    ``directory`` when its process was killed.

    Call it only while no other process writes there (``tools/train.py``
    holds the work dir's lock).

    Args:
        directory (str): A checkpoint directory; a missing one is fine.

    Returns:
        list[str]: The names removed.

    Example:
        >>> remove_stale_tmp('work_dirs/demo')
        ['.epoch_2.pth.k2j4_x9a.tmp']
    """
    if not osp.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        path = osp.join(directory, name)
        if _TMP.fullmatch(name) and osp.isfile(path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed.append(name)
    return removed


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose ``put`` is :func:`atomic_write`.

    Selected with ``backend_args=dict(backend='atomic_local')`` once
    :func:`install` registered it; :class:`SafeCheckpointHook` does so.

    Example:
        >>> default_hooks = dict(checkpoint=dict(
        ...     type='CheckpointHook',
        ...     backend_args=dict(backend='atomic_local')))
    """

    def put(self, obj, filepath):
        atomic_write(obj, filepath)

    def put_text(self, obj, filepath, encoding='utf-8'):
        atomic_write(obj.encode(encoding), filepath)


class AtomicDumpResults(DumpResults):
    """mmengine's ``DumpResults`` (the predictions of a test run pickled
    to ``out_file_path``), written with :func:`atomic_write`: a full disk
    or two runs dumping to one file never leave a partial pickle.

    Registered as ``'AtomicDumpResults'`` by :func:`install`;
    :func:`mmevo.apis.dump_results` (``--out``) uses it.

    Example:
        >>> test_evaluator = [dict(type='CocoMetric'), dict(
        ...     type='AtomicDumpResults', out_file_path='preds.pkl')]
    """

    def compute_metrics(self, results):
        atomic_write(dump(results, file_format='pkl'), self.out_file_path)
        print_log(
            f'Results has been saved to {self.out_file_path}.',
            logger='current',
        )
        return {}


def install():
    """Register the ``atomic_local`` file backend and the
    ``AtomicDumpResults`` metric in mmengine's root registry, which
    mmdet's and mmseg's fall back to (idempotent).

    Raises:
        RuntimeError: Another backend or metric already has that name.

    Example:
        >>> install()
        >>> from mmengine.fileio import get_file_backend
        >>> get_file_backend('x', backend_args=dict(backend='atomic_local'))
    """
    check_mmengine(
        'atomic checkpoint backend',
        [
            (LocalBackend, 'put'),
            (LocalBackend, 'put_text'),
            (DumpResults, 'compute_metrics'),
        ],
    )
    metric = METRICS.get(DUMP_RESULTS)
    if metric is None:
        METRICS.register_module(DUMP_RESULTS, module=AtomicDumpResults)
    elif metric is not AtomicDumpResults:
        raise RuntimeError(
            f'metric {DUMP_RESULTS!r} is already registered as '
            f'{metric.__module__}.{metric.__name__}'
        )
    registered = backends.get(BACKEND)
    if registered is AtomicLocalBackend:
        return
    if registered is not None:
        raise RuntimeError(
            f'file backend {BACKEND!r} is already registered as '
            f'{registered.__module__}.{registered.__name__}'
        )
    register_backend(BACKEND, AtomicLocalBackend)
