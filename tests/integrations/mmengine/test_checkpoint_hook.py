"""SafeCheckpointHook with ``max_keep_ckpts=1``: a full disk during a save
leaves the previous checkpoint and a ``last_checkpoint`` naming it (mmengine
0.10.7's CheckpointHook leaves neither), the old checkpoint is removed only
once the new one and the pointer are on disk, and resuming after the failure
is bit-exact. (The demo detector through tools/train.py, with kill -9:
tests/tools/test_train_crash.py.)"""

import errno
import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmevo.apis import checkpoint_error
from mmevo.integrations.mmengine import (
    AtomicLocalBackend,
    SafeCheckpointHook,
    install_all,
    use_safe_hook,
)

pytestmark = pytest.mark.slow

install_all()


class _Data(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return dict(x=torch.tensor([float(index), 1.0]))


class _Model(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, mode='loss'):
        x = torch.stack(x)
        if mode != 'loss':  # validation: _Rising ignores the outputs
            return list(self.linear(x))
        return dict(loss=self.linear(x + torch.rand_like(x)).pow(2).mean())


class _Rising(BaseMetric):
    """A score that is better at every validation."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def process(self, data_batch, data_samples):
        self.results.append(0)

    def compute_metrics(self, results):
        self.calls += 1
        return dict(score=float(self.calls))


def _runner(work_dir, epochs, hook, name, resume=None, save_best=False):
    torch.manual_seed(0)
    checkpoint = dict(type=hook, interval=1, max_keep_ckpts=1)
    val = dict()
    if save_best:
        checkpoint.update(save_best='score', rule='greater')
        val = dict(
            val_dataloader=dict(
                dataset=_Data(),
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='pseudo_collate'),
                batch_size=2,
                num_workers=0,
            ),
            val_evaluator=[_Rising()],
            val_cfg=dict(),
        )
    return Runner(
        model=_Model(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=_Data(),
            sampler=dict(type='DefaultSampler', shuffle=True),
            collate_fn=dict(type='pseudo_collate'),
            batch_size=2,
            num_workers=0,
        ),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        default_hooks=dict(
            checkpoint=checkpoint, logger=dict(type='LoggerHook', interval=100)
        ),
        custom_hooks=[dict(type='RandomStateHook')],
        randomness=dict(seed=0),
        resume=resume is not None,
        load_from=resume,
        experiment_name=name,
        visualizer=dict(type='Visualizer', name=name),
        **val,
    )


def _disk_full_at(epoch, monkeypatch):
    """The save of ``epoch``'s checkpoint fails with ENOSPC."""
    save = torch.save

    def failing(obj, *args, **kwargs):
        if isinstance(obj, dict) and obj.get('meta', {}).get('epoch') == epoch:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', failing)


def _pointer(work_dir):
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read()


def test_a_full_disk_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    straight = _runner(tmp_path / 'a', 3, 'SafeCheckpointHook', 'full_a')
    straight.train()
    # max_keep_ckpts=1: only the newest is left, and named
    assert sorted(os.listdir(tmp_path / 'a'))[-2:] == [
        'epoch_3.pth',
        'last_checkpoint',
    ]
    assert _pointer(tmp_path / 'a') == str(tmp_path / 'a' / 'epoch_3.pth')

    work = tmp_path / 'b'
    with monkeypatch.context() as patch:
        _disk_full_at(2, patch)
        with pytest.raises(OSError) as info:
            _runner(work, 3, 'SafeCheckpointHook', 'full_b').train()
    assert info.value.errno == errno.ENOSPC
    kept = str(work / 'epoch_1.pth')
    assert _pointer(work) == kept and checkpoint_error(kept) is None
    assert not [n for n in os.listdir(work) if n.endswith('.tmp')]

    resumed = _runner(work, 3, 'SafeCheckpointHook', 'full_c', resume=kept)
    resumed.train()
    assert resumed.iter == straight.iter == 6
    assert torch.equal(
        resumed.model.linear.weight, straight.model.linear.weight
    )
    assert torch.equal(resumed.model.linear.bias, straight.model.linear.bias)
    assert not (work / 'epoch_1.pth').exists()


def test_upstream_hook_still_loses_it(tmp_path, monkeypatch):
    """The bug SafeCheckpointHook exists for: when this fails, mmengine
    fixed it, and the hook can be deleted."""
    work = tmp_path / 'w'
    _disk_full_at(2, monkeypatch)
    with pytest.raises(OSError):
        _runner(work, 3, 'CheckpointHook', 'upstream').train()
    assert not [n for n in os.listdir(work) if n.endswith('.pth')]


def test_the_old_checkpoint_goes_after_the_new_one_is_named(
    tmp_path, monkeypatch
):
    work = tmp_path / 'w'
    seen = []
    remove = AtomicLocalBackend.remove

    def recording(self, path):
        seen.append(
            (osp.basename(path), sorted(os.listdir(work)), _pointer(work))
        )
        remove(self, path)

    monkeypatch.setattr(AtomicLocalBackend, 'remove', recording)
    _runner(work, 2, 'SafeCheckpointHook', 'order').train()
    assert len(seen) == 1
    removed, present, pointer = seen[0]
    assert removed == 'epoch_1.pth'
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(present)
    assert pointer == str(work / 'epoch_2.pth')


def _best_disk_full_at(epoch, monkeypatch):
    """The save of ``epoch``'s best checkpoint (which has no optimizer)
    fails with ENOSPC."""
    save = torch.save

    def failing(obj, *args, **kwargs):
        if (
            isinstance(obj, dict)
            and 'optimizer' not in obj
            and obj.get('meta', {}).get('epoch') == epoch
        ):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', failing)


def _best(work_dir):
    return sorted(n for n in os.listdir(work_dir) if n.startswith('best_'))


def test_a_full_disk_leaves_the_best_checkpoint(tmp_path, monkeypatch):
    work = tmp_path / 'a'
    _runner(work, 3, 'SafeCheckpointHook', 'best_a', save_best=True).train()
    assert _best(work) == ['best_score_epoch_3.pth']

    work = tmp_path / 'b'
    with monkeypatch.context() as patch:
        _best_disk_full_at(2, patch)
        with pytest.raises(OSError) as info:
            _runner(
                work, 3, 'SafeCheckpointHook', 'best_b', save_best=True
            ).train()
    assert info.value.errno == errno.ENOSPC
    assert _best(work) == ['best_score_epoch_1.pth']
    assert checkpoint_error(str(work / 'best_score_epoch_1.pth')) is None
    assert not [n for n in os.listdir(work) if n.endswith('.tmp')]


def test_upstream_hook_still_loses_the_best(tmp_path, monkeypatch):
    """mmengine 0.10.7 removes the previous best checkpoint before it
    writes the new one; when this fails, that was fixed upstream."""
    work = tmp_path / 'w'
    _best_disk_full_at(2, monkeypatch)
    with pytest.raises(OSError):
        _runner(work, 3, 'CheckpointHook', 'best_up', save_best=True).train()
    assert _best(work) == []


def test_a_kill_before_the_removal_is_trimmed_on_resume(tmp_path, monkeypatch):
    """Killed after epoch 2 is saved and named, before epoch 1 is removed:
    resuming from epoch 2 removes epoch 1 (max_keep_ckpts=1)."""
    work = tmp_path / 'w'

    class Killed(BaseException):
        pass

    def kill(self, path):
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(AtomicLocalBackend, 'remove', kill)
        with pytest.raises(Killed):
            _runner(work, 3, 'SafeCheckpointHook', 'trim_a').train()
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(os.listdir(work))
    assert _pointer(work) == str(work / 'epoch_2.pth')

    resumed = _runner(
        work, 3, 'SafeCheckpointHook', 'trim_b', resume=_pointer(work)
    )
    resumed.train()
    assert resumed.iter == 6
    assert sorted(n for n in os.listdir(work) if n.endswith('.pth')) == [
        'epoch_3.pth'
    ]


def test_stale_tmp_files_are_removed_at_the_start(tmp_path):
    work = tmp_path / 'w'
    work.mkdir()
    (work / '.epoch_2.pth.abcd1234.tmp').write_bytes(b'')
    (work / '.last_checkpoint.x_y_z_12.tmp').write_bytes(b'half')
    _runner(work, 1, 'SafeCheckpointHook', 'stale').train()
    assert not [n for n in os.listdir(work) if n.endswith('.tmp')]


def test_use_safe_hook_replaces_only_the_default():
    cfg = Config(dict())
    use_safe_hook(cfg)
    assert cfg.default_hooks.checkpoint == dict(
        type='SafeCheckpointHook', interval=1
    )
    cfg = Config(
        dict(
            default_hooks=dict(
                checkpoint=dict(
                    type='CheckpointHook', interval=2, max_keep_ckpts=1
                )
            )
        )
    )
    use_safe_hook(cfg)
    assert cfg.default_hooks.checkpoint == dict(
        type='SafeCheckpointHook', interval=2, max_keep_ckpts=1
    )
    for other in (None, dict(type='MyCheckpointHook')):
        cfg = Config(dict(default_hooks=dict(checkpoint=other)))
        use_safe_hook(cfg)
        assert cfg.default_hooks.checkpoint == other


def test_a_remote_or_chosen_backend_is_kept():
    assert SafeCheckpointHook().backend_args == dict(backend='atomic_local')
    assert SafeCheckpointHook(out_dir='s3://bucket/x').backend_args is None
    chosen = dict(backend='local')
    assert SafeCheckpointHook(backend_args=chosen).backend_args == chosen
