"""The work-dir lock: a second holder is refused with the first one's pid,
host and start time; a killed holder (kill -9) does not leave it held, nor
does a forked child (a dataloader worker) that outlives the release. (Two
``tools/train.py`` runs: tests/tools/test_work_dir_lock.py.)"""

import multiprocessing
import os
import signal
import socket
import subprocess
import sys

import pytest

from mmevo.apis import LOCK_FILE, WorkDirBusyError, lock_work_dir

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

HOLD = """
import sys, time
from mmevo.apis.workdir import lock_work_dir
lock = lock_work_dir(sys.argv[1])
print('locked', flush=True)
time.sleep(600)
"""


def hold_lock(work_dir):
    """A process that holds ``work_dir``'s lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, '-c', HOLD, str(work_dir)],
        env=dict(os.environ, PYTHONPATH=REPO),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == 'locked'
    return proc


@pytest.mark.slow
def test_a_live_holder_is_named_and_a_killed_one_frees_it(tmp_path):
    holder = hold_lock(tmp_path / 'w')
    try:
        with pytest.raises(WorkDirBusyError) as info:
            lock_work_dir(str(tmp_path / 'w'))
        message = str(info.value)
        assert '\n' not in message
        assert message.startswith(
            f"work dir '{tmp_path / 'w'}' is in use by another training run "
            f'(pid {holder.pid} on {socket.gethostname()}, started '
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the dead run's lock file is still there, its lock is not
    assert (tmp_path / 'w' / LOCK_FILE).exists()
    with lock_work_dir(str(tmp_path / 'w')) as lock:
        with open(lock.path) as f:
            assert f.read().startswith(f'pid {os.getpid()} on ')
    # released: taken again at once
    lock_work_dir(str(tmp_path / 'w')).release()


def _wait(started, done):
    started.set()  # (the fork handlers ran before the target)
    done.wait(60)


def test_a_forked_child_does_not_hold_the_lock(tmp_path):
    """A persistent dataloader worker forked while the run held the lock
    kept it held after the run released it."""
    context = multiprocessing.get_context('fork')
    started, done = context.Event(), context.Event()
    lock = lock_work_dir(str(tmp_path / 'w'))
    child = context.Process(target=_wait, args=(started, done))
    child.start()
    try:
        assert started.wait(60)
        lock.release()
        lock_work_dir(str(tmp_path / 'w')).release()
    finally:
        done.set()
        child.join(60)
