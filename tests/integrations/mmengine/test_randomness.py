"""RandomStateHook: 3 epochs straight and 2 epochs + resume give the same
weights when both the dataloader workers (python, numpy and torch draws in
``__getitem__``) and the main process (torch draws in the model) use random
numbers, with no worker, workers started each epoch, and a persistent
worker; and that the hook leaves a run that is not resumed as it was. The
demo detector's case is tests/tools/test_train_resume.py."""

import random

import numpy as np
import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmevo.integrations.mmengine import (
    RandomStateHook,
    get_rng_state,
    install_all,
    set_rng_state,
)

pytestmark = pytest.mark.slow

install_all()  # the config below names RandomStateHook


class _RandomData(Dataset):
    """Each sample holds one draw of each generator (made in the worker)."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return dict(
            x=torch.tensor(
                [
                    float(index),
                    np.random.rand(),
                    random.random(),
                    torch.rand(()).item(),
                ]
            )
        )


class _NoisyModel(BaseModel):
    """A linear model with random input noise (as dropout draws)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, mode='loss'):
        x = torch.stack(x)
        return dict(loss=self.linear(x + torch.rand_like(x)).pow(2).mean())


def _train(
    work_dir, epochs, workers, persistent, name, resume=None, hook=True
):
    torch.manual_seed(0)  # the model's initialisation
    runner = Runner(
        model=_NoisyModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=_RandomData(),
            sampler=dict(type='DefaultSampler', shuffle=True),
            collate_fn=dict(type='pseudo_collate'),
            batch_size=2,
            num_workers=workers,
            persistent_workers=persistent,
        ),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=1),
            logger=dict(type='LoggerHook', interval=100),
        ),
        custom_hooks=[dict(type='RandomStateHook')] if hook else [],
        randomness=dict(seed=0),
        resume=resume is not None,
        load_from=resume,
        experiment_name=name,
        visualizer=dict(type='Visualizer', name=name),
    )
    assert any(isinstance(h, RandomStateHook) for h in runner.hooks) == hook
    runner.train()
    return runner.model.linear.weight.detach().clone()


@pytest.mark.parametrize(
    'workers, persistent', [(0, False), (1, False), (1, True)]
)
def test_resume_continues_every_random_stream(tmp_path, workers, persistent):
    tag = f'rng_{workers}_{persistent}'
    straight = _train(tmp_path / 'a', 3, workers, persistent, f'{tag}_a')
    second = _train(tmp_path / 'b', 2, workers, persistent, f'{tag}_b')
    resumed = _train(
        tmp_path / 'b',
        3,
        workers,
        persistent,
        f'{tag}_c',
        resume=str(tmp_path / 'b' / 'epoch_2.pth'),
    )
    assert not torch.equal(second, straight)
    assert torch.equal(resumed, straight)
    # the hook only reads the streams: a run without it trains the same
    plain = _train(
        tmp_path / 'c', 3, workers, persistent, f'{tag}_d', hook=False
    )
    assert torch.equal(plain, straight)


def test_rng_state_round_trip(tmp_path):
    torch.save(dict(rng_state=get_rng_state()), tmp_path / 'rng.pth')
    state = torch.load(tmp_path / 'rng.pth')['rng_state']  # weights_only
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])
