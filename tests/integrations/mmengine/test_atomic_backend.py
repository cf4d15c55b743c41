"""The ``atomic_local`` backend: a failed write leaves the previous file and
no temporary one; a killed write's temporary file is removed at the next
start."""

import contextlib
import errno
import os
import resource
import signal
import subprocess
import sys

import pytest
import torch
from mmengine.runner.checkpoint import save_checkpoint

from mmevo.integrations.mmengine import atomic_backend

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
)


@contextlib.contextmanager
def _file_size_limit(size):
    """Writes past ``size`` bytes fail (EFBIG), as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path):
    atomic_backend.install()
    args = dict(backend_args=dict(backend='atomic_local'))
    first = dict(w=torch.arange(10.0))
    save_checkpoint(first, str(tmp_path / 'epoch_1.pth'), **args)
    # over the previous file and under a new name: both fail halfway
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        with _file_size_limit(100_000), pytest.raises(OSError) as info:
            save_checkpoint(
                dict(w=torch.zeros(100_000)), str(tmp_path / name), **args
            )
        assert info.value.errno == errno.EFBIG
    # no partial file under the final name, no temporary file left
    assert os.listdir(tmp_path) == ['epoch_1.pth']
    assert torch.equal(torch.load(tmp_path / 'epoch_1.pth')['w'], first['w'])


# killed (SIGKILL) after the temporary file was created, before a byte of it
# was written: what kill -9 during a save leaves
_KILLED = """
import builtins, os, signal, sys
from mmevo.integrations.mmengine import atomic_backend
builtins.open = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
atomic_backend.atomic_write(b'x' * 1000, sys.argv[1])
"""


def test_a_killed_write_leaves_a_tmp_that_the_next_start_removes(tmp_path):
    (tmp_path / 'epoch_1.pth').write_bytes(b'sound')
    (tmp_path / 'notes.tmp').write_bytes(b'not ours')
    out = subprocess.run(
        [sys.executable, '-c', _KILLED, str(tmp_path / 'epoch_2.pth')],
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        timeout=300,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    left = sorted(set(os.listdir(tmp_path)) - {'epoch_1.pth', 'notes.tmp'})
    assert len(left) == 1 and left[0].startswith('.epoch_2.pth.')
    assert (tmp_path / left[0]).stat().st_size == 0
    assert atomic_backend.remove_stale_tmp(str(tmp_path)) == left
    assert sorted(os.listdir(tmp_path)) == ['epoch_1.pth', 'notes.tmp']
    assert atomic_backend.remove_stale_tmp(str(tmp_path / 'none')) == []


def test_another_backend_under_the_name_is_refused(monkeypatch):
    from mmengine.fileio.backends import LocalBackend, backends

    atomic_backend.install()
    atomic_backend.install()  # idempotent
    monkeypatch.setitem(backends, 'atomic_local', LocalBackend)
    with pytest.raises(RuntimeError, match='already registered'):
        atomic_backend.install()


def test_dumped_predictions_are_written_atomically(tmp_path):
    """What ``tools/test.py --out`` writes (``AtomicDumpResults``): the
    predictions whole, or the previous file when the write fails."""
    from mmengine.fileio import load
    from mmengine.registry import METRICS

    atomic_backend.install()
    out = tmp_path / 'preds.pkl'

    def dump(predictions):
        metric = METRICS.build(
            dict(type=atomic_backend.DUMP_RESULTS, out_file_path=str(out))
        )
        metric.process(None, predictions)
        return metric.compute_metrics(metric.results)

    first = [dict(scores=torch.arange(4.0))]
    assert dump(first) == {}
    assert torch.equal(load(str(out))[0]['scores'], first[0]['scores'])
    with _file_size_limit(100_000), pytest.raises(OSError) as info:
        dump([dict(scores=torch.zeros(100_000))])
    assert info.value.errno == errno.EFBIG
    assert os.listdir(tmp_path) == ['preds.pkl']
    assert torch.equal(load(str(out))[0]['scores'], first[0]['scores'])
