"""One training run per work dir: an advisory lock (``fcntl.flock``).

The lock is held on an open file, so it ends with the process that holds it,
however that ends (a crash, ``kill -9``): a dead run never blocks the next.
A forked child (a dataloader worker) closes its copy of the file, so that it
does not hold the lock on after the run released it or died.
The file records who holds it, for the message of the run it stops.
"""

import contextlib
import fcntl
import os
import os.path as osp
import socket
import time

#: The lock file in the work dir.
LOCK_FILE = '.mmevo-train.lock'


class WorkDirBusyError(RuntimeError):
    """Another live process holds the work dir's lock (one-line message)."""


# the locks this process holds, which a forked child lets go of
_HELD = set()


class WorkDirLock:
    """A held work-dir lock; :meth:`release` (or the process's end) frees
    it. Returned by :func:`lock_work_dir`; a context manager."""

    def __init__(self, fd, path):
        self.fd = fd
        self.path = path
        _HELD.add(self)

    def release(self):
        _HELD.discard(self)
        if self.fd is not None:
            os.close(self.fd)  # closing the file ends the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _close_in_child():
    # a flock is held while any descriptor of the open file lives: without
    # this, a persistent dataloader worker kept the work dir locked after
    # the run ended (and after a kill -9, until the worker noticed)
    for lock in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd = None
    _HELD.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_close_in_child)


def lock_work_dir(work_dir):
    """Take ``work_dir``'s lock for this process, or raise.

    Args:
        work_dir (str): The run's work dir (created if missing).

    Returns:
        WorkDirLock: Hold on to it for the whole run.

    Raises:
        WorkDirBusyError: A live run holds it; the message names its pid,
            host and start time.

    Example:
        >>> with lock_work_dir('work_dirs/demo'):
        ...     runner.train()
    """
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held by another process
        owner = os.read(fd, 4096).decode(errors='replace').strip()
        os.close(fd)
        raise WorkDirBusyError(
            f"work dir '{work_dir}' is in use by another training run "
            f'({owner or "its owner is being written"}); wait for it to '
            'end or choose another --work-dir'
        ) from None
    started = time.strftime('%Y-%m-%d %H:%M:%S %Z')
    os.ftruncate(fd, 0)
    os.write(
        fd,
        f'pid {os.getpid()} on {socket.gethostname()}, started '
        f'{started}\n'.encode(),
    )
    return WorkDirLock(fd, path)
