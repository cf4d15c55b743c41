"""mmengine checkpoints load under torch's weights_only default (torch >=
2.6) after ``import mmevo``, and weights_only still refuses other code; they
are written atomically, a corrupt one is found before it is resumed from,
and a state dict is compared with a model key by key."""
import contextlib
import errno
import os
import pickle
import random
import resource
import signal

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import save_checkpoint

import mmevo  # noqa: F401  (registers the safe globals)
from mmevo.engine import (checkpoint_error, find_resumable_checkpoint,
                          get_rng_state, set_rng_state, state_dict_mismatch)


def _runner_like_checkpoint():
    """What ``Runner.save_checkpoint`` writes besides tensors."""
    hub = MessageHub.get_instance('test_checkpoint_safe_globals')
    hub.update_scalar('train/loss', 0.5)
    hub.update_scalar('train/lr', np.float64(1e-3))
    hub.update_scalar('val/coco/bbox_mAP', np.float32(0.25))
    hub.update_info('iter', 7)
    return dict(
        meta=dict(
            epoch=1,
            iter=7,
            seed=0,
            dataset_meta=dict(
                classes=('a', 'b'), palette=[(1, 2, 3), (4, 5, 6)])),
        state_dict=dict(w=torch.randn(3)),
        message_hub=hub.state_dict(),
        optimizer=dict(state={}, param_groups=[dict(lr=1e-3, params=[0])]),
        extra=dict(count=np.int64(3), arr=np.arange(4, dtype=np.uint8)))


def test_mmengine_checkpoint_loads_weights_only(tmp_path):
    ckpt = _runner_like_checkpoint()
    path = tmp_path / 'ckpt.pth'
    torch.save(ckpt, path)
    # without mmevo's allowlist the load fails (else this proves nothing)
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        with pytest.raises(pickle.UnpicklingError, match='Weights only'):
            torch.load(path)
    finally:
        torch.serialization.add_safe_globals(allowed)
    loaded = torch.load(path)  # weights_only=True is the default
    buf = loaded['message_hub']['log_scalars']['train/lr']
    assert isinstance(buf, HistoryBuffer)
    assert buf.mean() == pytest.approx(1e-3)
    assert buf.statistics('current') == pytest.approx(1e-3)
    assert loaded['extra']['count'] == 3
    assert loaded['extra']['arr'].dtype == np.uint8
    assert torch.equal(loaded['state_dict']['w'], ckpt['state_dict']['w'])


class _Payload:

    def __reduce__(self):
        return (print, ('arbitrary code ran', ))


@pytest.mark.parametrize(
    'obj',
    [
        _Payload(),
        # getattr is allowed only on HistoryBuffer's statistic methods
        HistoryBuffer.update,
        np.array([object()], dtype=object),
    ])
def test_other_globals_are_still_refused(tmp_path, obj):
    path = tmp_path / 'evil.pth'
    torch.save(dict(x=obj), path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)


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
    # as the CheckpointHook saves with tools/train.py's backend_args
    args = dict(backend_args=dict(backend='atomic_local'))
    first = dict(w=torch.arange(10.))
    save_checkpoint(first, str(tmp_path / 'epoch_1.pth'), **args)
    # over the previous file and under a new name: both fail halfway
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        with _file_size_limit(100_000), pytest.raises(OSError) as info:
            save_checkpoint(
                dict(w=torch.zeros(100_000)), str(tmp_path / name), **args)
        assert info.value.errno == errno.EFBIG
    # no partial file under the final name, no temporary file left
    assert os.listdir(tmp_path) == ['epoch_1.pth']
    assert torch.equal(torch.load(tmp_path / 'epoch_1.pth')['w'], first['w'])


def _ckpt(path, step):
    torch.save(dict(meta=dict(epoch=step), state_dict={}), path)


def test_auto_resume_skips_corrupt_checkpoints(tmp_path):
    for step in (1, 2, 3):
        _ckpt(tmp_path / f'epoch_{step}.pth', step)
    (tmp_path / 'epoch_3.pth').write_bytes(
        (tmp_path / 'epoch_3.pth').read_bytes()[:500])
    (tmp_path / 'epoch_2.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_3.pth'))
    with pytest.warns(UserWarning) as record:
        found = find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'epoch_1.pth')
    assert [str(w.message).split(':')[0] for w in record] == [
        f"cannot resume from '{tmp_path / 'epoch_3.pth'}'",
        f"cannot resume from '{tmp_path / 'epoch_2.pth'}'"
    ]
    assert checkpoint_error(found) is None
    # an empty last_checkpoint (a crash while mmengine wrote it) is skipped
    (tmp_path / 'last_checkpoint').write_text('')
    _ckpt(tmp_path / 'epoch_2.pth', 2)
    with pytest.warns(UserWarning, match='epoch_3.pth'):
        found = find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'epoch_2.pth')
    assert find_resumable_checkpoint(str(tmp_path / 'none')) is None


def test_state_dict_mismatch():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    assert state_dict_mismatch(model, dict(state_dict=state)) == ([], [], [])
    state.pop('module.1.running_var')
    state['module.0.weight'] = torch.zeros(4, 2)
    state['module.2.weight'] = torch.zeros(1)
    assert state_dict_mismatch(model, state) == (['1.running_var'], [
        '2.weight'
    ], ['0.weight (checkpoint (4, 2), model (4, 3))'])


def test_rng_state_round_trip(tmp_path):
    torch.save(dict(rng_state=get_rng_state()), tmp_path / 'rng.pth')
    state = torch.load(tmp_path / 'rng.pth')['rng_state']  # weights_only
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])
