"""Two tools/train.py runs on one work dir: the second stops in one line
naming the first (pid, host, start time) before it writes anything, and
once the first is killed (kill -9) the work dir is free again."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from mmevo.apis import LOCK_FILE, lock_work_dir

from tool_utils import DEMO_DET, REPO

pytestmark = pytest.mark.slow

# the demo detector on tiny_coco, no validation, long enough to be killed
CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
train_cfg = dict(max_epochs=1000)
val_dataloader = None
val_cfg = None
val_evaluator = None
"""


def _train(cfg, work_dir, **kwargs):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('RANK', 'SLURM_PROCID')
    }
    return subprocess.Popen(
        [
            sys.executable,
            os.path.join(REPO, 'tools', 'train.py'),
            cfg,
            '--work-dir',
            work_dir,
        ],
        env=dict(env, PYTHONPATH=REPO, OMP_NUM_THREADS='1'),
        text=True,
        **kwargs,
    )


def test_second_run_on_a_live_work_dir_is_refused(tiny_coco, tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(CONFIG.format(base=DEMO_DET, root=tiny_coco))
    work_dir = str(tmp_path / 'work')
    first = _train(
        str(cfg),
        work_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = os.path.join(work_dir, LOCK_FILE)
        deadline = time.monotonic() + 240
        while not (
            os.path.exists(lock) and open(lock).read().startswith('pid')
        ):
            assert first.poll() is None, 'the first run ended'
            assert time.monotonic() < deadline, 'the first run never locked'
            time.sleep(0.2)
        second = _train(
            str(cfg), work_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        _out, err = second.communicate(timeout=300)
        assert second.returncode == 1, err[-3000:]
        assert 'Traceback' not in err
        assert err.count('\n') == 1 and err.startswith(
            f"error: work dir '{work_dir}' is in use by another training run "
            f'(pid {first.pid} on {socket.gethostname()}, started '
        )
        assert first.poll() is None  # the first run goes on
        # the second built no runner: one log dir (the first run's)
        assert (
            len(
                [
                    n
                    for n in os.listdir(work_dir)
                    if os.path.isdir(os.path.join(work_dir, n))
                ]
            )
            <= 1
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # a killed run does not leave the work dir locked
    lock_work_dir(work_dir).release()
