"""Fix: mmengine 0.10.7 does not checkpoint the random streams.

mmengine 0.10.7 checkpoints the model, the optimizer, the schedulers and the
seed, but not the state of the random number generators. A resumed run
re-seeds them, so random augmentation (``RandomFlip``, ...) draws other
numbers than the uninterrupted run did. :class:`RandomStateHook` saves and
restores every stream an epoch-based training loop uses:

* the main process's python ``random``, numpy and torch CPU (and CUDA)
  generators, of every rank. The restore happens where the uninterrupted
  run would go on: before the epoch's ``iter(dataloader)`` when that draws
  the workers' base seed from torch's generator (no workers, or workers
  started anew each epoch), after it when persistent workers were started
  only once (they do not draw again);
* the sampler's seed (its shuffling uses ``seed + epoch``);
* the dataloader workers' ``random``, numpy and torch generators, when the
  workers are persistent: a worker started once (seeded by mmengine's
  ``worker_init_fn`` from the seed, rank and worker id) carries its streams
  from epoch to epoch, and a resumed run starts a fresh one. Each batch
  brings its worker's states back (collated in the worker), and the
  resumed run's workers start from the saved ones. Workers started anew
  each epoch need nothing: they are seeded afresh in both runs.

It only reads generator states during a run, so it does not change the
trajectory of a run that is not resumed. :func:`install` registers it in
mmengine; delete this module when mmengine's checkpoints hold the streams.
"""

import random
from functools import partial

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop
from torch.utils.data import get_worker_info

from ._version import check_mmengine

# the key under which a worker's batch carries the worker's states
_WORKER_KEY = '_mmevo_worker_rng'


def get_rng_state():
    """The states of python's, numpy's and torch's global generators.

    Returns:
        dict: ``python``, ``numpy``, ``torch`` and, where CUDA is initialised,
        ``cuda`` (one state per device).

    Example:
        >>> state = get_rng_state()
        >>> a = torch.rand(2)
        >>> set_rng_state(state)
        >>> torch.equal(a, torch.rand(2))
        True
    """
    state = dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state(),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    """Restore generator states saved by :func:`get_rng_state`.

    Args:
        state (dict): What :func:`get_rng_state` returned. The CUDA states
            are restored when this process sees as many devices.
    """
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    cuda = state.get('cuda')
    if (
        cuda is not None
        and torch.cuda.is_available()
        and len(cuda) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(cuda)


class _CollateWithWorkerState:
    """``collate_fn`` that adds the worker's generator states to a dict
    batch (runs in the worker)."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, samples):
        batch = self.collate_fn(samples)
        info = get_worker_info()
        if info is not None and isinstance(batch, dict):
            batch[_WORKER_KEY] = (info.id, get_rng_state())
        return batch


class _WorkerInitWithState:
    """``worker_init_fn`` that seeds as before, then sets saved states."""

    def __init__(self, init_fn):
        self.init_fn = init_fn
        self.states = {}

    def __call__(self, worker_id):
        if self.init_fn is not None:
            self.init_fn(worker_id)
        if worker_id in self.states:
            set_rng_state(self.states[worker_id])


class RandomStateHook(Hook):
    """Save the random streams in checkpoints and restore them on resume.

    With it, N epochs straight and k epochs + ``--resume`` give bit-identical
    weights, with random augmentation and dataloader workers, as long as the
    number of ranks and workers stays the same and the computation itself is
    deterministic. ``tools/train.py`` adds it to the runner. Validation is not
    accounted for: creating its dataloader's iterator draws a seed from
    torch's generator at other points of a resumed run than of the
    uninterrupted one.

    Example:
        >>> runner = Runner.from_cfg(cfg)
        >>> runner.register_hook(RandomStateHook(), 'HIGHEST')
        >>> runner.train()
    """

    priority = 'HIGHEST'

    def __init__(self):
        self._workers = {}  # worker id -> states after its latest batch
        self._epoch_states = None  # every rank's, at the end of the epoch
        self._saved = None  # what the loaded checkpoint held
        self._main = None  # this rank's main-process states to restore
        self._restore_at = None  # 'epoch' or 'iter': when to restore

    def before_train(self, runner):
        loader = runner.train_dataloader
        persistent = loader.num_workers > 0 and loader.persistent_workers
        epoch_based = isinstance(runner.train_loop, EpochBasedTrainLoop)
        if loader.num_workers > 0 and not isinstance(
            loader.collate_fn, _CollateWithWorkerState
        ):
            loader.collate_fn = _CollateWithWorkerState(loader.collate_fn)
            loader.worker_init_fn = _WorkerInitWithState(loader.worker_init_fn)
        saved, self._saved = self._saved, None
        if saved is None or runner.iter == 0:  # loaded weights, no resume
            return
        if saved['world_size'] != get_world_size():
            print_log(
                f'resumed with {get_world_size()} processes, saved with '
                f'{saved["world_size"]}: the random streams are not '
                'restored, the resumed run is not bit-exact',
                logger='current',
                level='WARNING',
            )
            return
        mine = saved['ranks'][get_rank()]
        sampler = getattr(loader, 'sampler', None)
        if mine.get('sampler_seed') is not None:
            sampler.seed = mine['sampler_seed']
        init = loader.worker_init_fn
        if (
            isinstance(init, _WorkerInitWithState)
            and isinstance(init.init_fn, partial)
            and 'seed' in init.init_fn.keywords
        ):
            # mmengine built the worker seeding with this run's seed; the
            # checkpoint's is the one the saved run used
            init.init_fn = partial(
                init.init_fn.func,
                *init.init_fn.args,
                **dict(init.init_fn.keywords, seed=runner.seed),
            )
        if persistent and epoch_based:
            if len(mine['workers']) != loader.num_workers:
                print_log(
                    f'resumed with {loader.num_workers} dataloader workers, '
                    f'saved with {len(mine["workers"])}: their random '
                    'streams start afresh, the resumed run is not bit-exact',
                    logger='current',
                    level='WARNING',
                )
            else:
                init.states = dict(mine['workers'])
        self._main = mine['main']
        self._restore_at = (
            'epoch' if epoch_based and not persistent else 'iter'
        )

    def before_train_epoch(self, runner):
        if self._restore_at == 'epoch':
            set_rng_state(self._main)
            self._restore_at = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if isinstance(data_batch, dict) and _WORKER_KEY in data_batch:
            worker_id, state = data_batch.pop(_WORKER_KEY)
            self._workers[worker_id] = state
        if self._restore_at == 'iter':
            set_rng_state(self._main)
            self._restore_at = None
            init = runner.train_dataloader.worker_init_fn
            if isinstance(init, _WorkerInitWithState):
                init.states = {}  # the workers are started: used up

    def _rank_state(self, runner):
        sampler = getattr(runner.train_dataloader, 'sampler', None)
        return dict(
            main=get_rng_state(),
            workers=dict(self._workers),
            sampler_seed=getattr(sampler, 'seed', None),
        )

    def after_train_epoch(self, runner):
        # every rank, before the CheckpointHook (which saves on rank 0 only)
        self._epoch_states = (
            runner.epoch,
            all_gather_object(self._rank_state(runner)),
        )

    def before_save_checkpoint(self, runner, checkpoint):
        if (
            self._epoch_states is not None
            and self._epoch_states[0] == runner.epoch
        ):
            ranks = self._epoch_states[1]
        elif get_world_size() == 1:
            ranks = [self._rank_state(runner)]
        else:  # within an epoch, the other ranks' states are not at hand
            return
        checkpoint['rng_state'] = dict(
            world_size=get_world_size(), ranks=ranks
        )

    def after_load_checkpoint(self, runner, checkpoint):
        self._saved = checkpoint.get('rng_state')


def install():
    """Register :class:`RandomStateHook` in mmengine's ``HOOKS`` (so that a
    config's ``custom_hooks`` can name it); idempotent.

    Example:
        >>> install()
        >>> custom_hooks = [dict(type='RandomStateHook')]
    """
    check_mmengine('random-state hook')
    if HOOKS.module_dict.get('RandomStateHook') is not RandomStateHook:
        HOOKS.register_module(module=RandomStateHook)
