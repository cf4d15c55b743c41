"""mmengine checkpoints load under torch's weights_only default (torch >=
2.6) after ``import mmevo``, and weights_only still refuses other code."""
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

import mmevo  # noqa: F401  (registers the safe globals)


def _runner_like_checkpoint():
    """What ``Runner.save_checkpoint`` writes besides tensors."""
    hub = MessageHub.get_instance('test_checkpoint_safe_globals')
    hub.update_scalar('train/loss', 0.5)
    hub.update_scalar('train/lr', np.float64(1e-3))
    hub.update_scalar('val/coco/bbox_mAP', np.float32(0.25))
    hub.update_info('iter', 7)
    return dict(
        meta=dict(epoch=1, iter=7, seed=0,
                  dataset_meta=dict(classes=('a', 'b'),
                                    palette=[(1, 2, 3), (4, 5, 6)])),
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
        return (print, ('arbitrary code ran',))


@pytest.mark.parametrize('obj', [
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
