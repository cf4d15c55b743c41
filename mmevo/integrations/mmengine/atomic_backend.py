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

from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio.backends import backends

from ._version import check_mmengine

BACKEND = 'atomic_local'
# what atomic_write's temporary files are called: '.<name>.<8 chars>.tmp'
_TMP = re.compile(r'\..+\.[a-z0-9_]{8}\.tmp')


def _sync_dir(directory):
    """Make a rename in ``directory`` durable (POSIX)."""
    if not hasattr(os, 'O_DIRECTORY'):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(data, path):
    """Write ``data`` to ``path`` so that ``path`` is never left partial.

    The bytes go to a temporary file in the same directory, which is synced
    and then renamed over ``path`` (``os.replace`` is atomic on POSIX and
    Windows). An error (a full disk) leaves the previous ``path`` (or none)
    and no temporary file; a killed process may leave a temporary file,
    which :func:`remove_stale_tmp` removes.

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
        dir=directory, prefix=f'.{osp.basename(path)}.', suffix='.tmp'
    )
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
    _sync_dir(directory)


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


def install():
    """Register the ``atomic_local`` file backend (idempotent).

    Raises:
        RuntimeError: Another backend already has that name.

    Example:
        >>> install()
        >>> from mmengine.fileio import get_file_backend
        >>> get_file_backend('x', backend_args=dict(backend='atomic_local'))
    """
    check_mmengine(
        'atomic checkpoint backend',
        [(LocalBackend, 'put'), (LocalBackend, 'put_text')],
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
