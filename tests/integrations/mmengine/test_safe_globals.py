"""mmengine checkpoints load under torch's weights_only default (torch >=
2.6) once the allowlist is installed, and weights_only still refuses other
code; importing mmevo and its integrations installs nothing."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

from mmevo.integrations.mmengine import (
    WRITTEN_FOR,
    UpstreamVersionWarning,
    _version,
    install_all,
    safe_globals,
)

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
)


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
                classes=('a', 'b'), palette=[(1, 2, 3), (4, 5, 6)]
            ),
        ),
        state_dict=dict(w=torch.randn(3)),
        message_hub=hub.state_dict(),
        optimizer=dict(state={}, param_groups=[dict(lr=1e-3, params=[0])]),
        extra=dict(count=np.int64(3), arr=np.arange(4, dtype=np.uint8)),
    )


def test_mmengine_checkpoint_loads_weights_only(tmp_path):
    ckpt = _runner_like_checkpoint()
    path = tmp_path / 'ckpt.pth'
    torch.save(ckpt, path)
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        # without mmevo's allowlist the load fails (else this proves nothing)
        with pytest.raises(pickle.UnpicklingError, match='Weights only'):
            torch.load(path)
        safe_globals.install()
        loaded = torch.load(path)  # weights_only=True is the default
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(allowed)
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


@pytest.mark.parametrize(
    'obj',
    [
        _Payload(),
        # getattr is allowed only on HistoryBuffer's statistic methods
        HistoryBuffer.update,
        np.array([object()], dtype=object),
    ],
)
def test_other_globals_are_still_refused(tmp_path, obj):
    safe_globals.install()
    path = tmp_path / 'evil.pth'
    torch.save(dict(x=obj), path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)


# what importing changes: the allowlist, mmengine's registries, backends
STATE = """
import json, sys
import torch


# the allowlist less torch's own entries (torch adds some itself when a
# module of it is imported)
def others():
    return sorted(
        g for g in map(str, torch.serialization.get_safe_globals())
        if not g.startswith("<class 'torch.")
    )


safe_before = others()
# mmevo first: in a process already running mmengine, ``import mmevo`` is a
# config's custom_imports and turns the fixes on (test_package_imports.py)
import mmevo, mmevo.apis, mmevo.integrations.mmengine as fixes
import mmdet.models, mmengine.runner, mmseg.models  # noqa: F401
from mmengine.fileio.backends import backends
from mmengine.registry import HOOKS, MODEL_WRAPPERS

OURS = {'RandomStateHook', 'SafeCheckpointHook', 'atomic_local'}


def state():
    return dict(
        safe=others(),
        hooks=sorted(HOOKS.module_dict), backends=sorted(backends),
        wrappers=sorted(MODEL_WRAPPERS.module_dict))


imported = state()
fixes.install_all()
installed = state()
print(json.dumps([
    imported['safe'] == safe_before
    and not OURS & set(imported['hooks'] + imported['backends']),
    imported == installed,
    sorted(set(installed['hooks']) - set(imported['hooks'])),
    sorted(set(installed['backends']) - set(imported['backends'])),
    len(installed['safe']) > len(imported['safe'])]))
"""


def test_importing_installs_nothing():
    out = subprocess.run(
        [sys.executable, '-c', STATE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    unchanged, same, hooks, backends, allowed = json.loads(
        out.stdout.strip().splitlines()[-1]
    )
    assert unchanged  # importing changed nothing ...
    assert not same  # ... install_all() did:
    assert hooks == ['RandomStateHook', 'SafeCheckpointHook']
    assert backends == ['atomic_local'] and allowed


def test_install_is_idempotent(recwarn):
    install_all()
    install_all()
    assert not [
        w for w in recwarn if issubclass(w.category, UpstreamVersionWarning)
    ]


def test_another_mmengine_version_warns_or_is_refused(monkeypatch):
    monkeypatch.setattr(_version.mmengine, '__version__', '0.99.0')
    with pytest.warns(
        UpstreamVersionWarning,
        match=f'written for mmengine {WRITTEN_FOR}, found 0.99.0',
    ):
        safe_globals.install()

    class Hook:
        pass

    with pytest.raises(
        RuntimeError, match=r'Hook\._save_checkpoint_with_step'
    ):
        _version.check_mmengine(
            'checkpoint hook', [(Hook, '_save_checkpoint_with_step')]
        )
