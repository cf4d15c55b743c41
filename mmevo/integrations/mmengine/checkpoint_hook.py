"""Fix: mmengine 0.10.7's ``CheckpointHook`` can lose every checkpoint.

With ``max_keep_ckpts`` set, ``CheckpointHook._save_checkpoint_with_step``
deletes the oldest checkpoint *before* it writes the new one, and writes
``last_checkpoint`` in place: a crash or a full disk in between (with
``max_keep_ckpts=1``, the demo configs' setting) leaves no checkpoint, or a
``last_checkpoint`` naming a deleted file. ``_save_best_checkpoint`` does
the same to the previous best checkpoint. :class:`SafeCheckpointHook`
writes the new checkpoint (atomically, synced) first, then points
``last_checkpoint`` at it atomically, and only then removes the old one
(or the previous best); at the start of training it removes the temporary
files a killed save left.

It is a subclass registered under its own name; :func:`use_safe_hook` puts
it in a config in place of the default hook. Delete this module when
upstream saves before it deletes.
"""

import os.path as osp

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from . import atomic_backend
from ._version import check_mmengine

NAME = 'SafeCheckpointHook'


class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` that writes before it deletes.

    Takes ``CheckpointHook``'s arguments. Without ``backend_args`` (and a
    local ``out_dir``) it writes through the ``atomic_local`` backend, so a
    checkpoint is complete or absent.

    Example:
        >>> default_hooks = dict(checkpoint=dict(
        ...     type='SafeCheckpointHook', interval=1, max_keep_ckpts=1))
    """

    def __init__(
        self,
        *args,
        backend_args=None,
        file_client_args=None,
        out_dir=None,
        **kwargs,
    ):
        if (
            backend_args is None
            and file_client_args is None
            and '://' not in str(out_dir or '')
        ):
            backend_args = dict(backend=atomic_backend.BACKEND)
        super().__init__(
            *args,
            backend_args=backend_args,
            file_client_args=file_client_args,
            out_dir=out_dir,
            **kwargs,
        )

    def _is_local(self):
        return (
            self.backend_args is not None
            and self.backend_args.get('backend') == atomic_backend.BACKEND
        )

    def before_train(self, runner):
        super().before_train(runner)
        if is_main_process() and self._is_local():
            for directory in {self.out_dir, runner.work_dir}:
                for name in atomic_backend.remove_stale_tmp(directory):
                    runner.logger.info(
                        f'removed {name}, left by a save that was killed'
                    )

    def _remove(self, path):
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # deepspeed's checkpoints
            self.file_backend.rmtree(path)

    def _save_checkpoint_with_step(self, runner, step, meta):
        # the upstream bookkeeping, but the stale step is only removed once
        # the new checkpoint and the pointer to it are on disk
        stale = None
        if self.max_keep_ckpts > 0 and not (
            self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step
        ):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                stale = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            # the new checkpoint still lists the stale step: if this process
            # is killed before it removes it, upstream's before_train trims
            # it when the run is resumed from the new checkpoint
            kept = list(self.keep_ckpt_ids)
            runner.message_hub.update_info(
                'keep_ckpt_ids', kept if stale is None else [stale, *kept]
            )
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(
            self.out_dir, ckpt_filename
        )
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args,
        )
        if stale is not None:
            runner.message_hub.update_info(
                'keep_ckpt_ids', list(self.keep_ckpt_ids)
            )
        if not is_main_process():
            return
        pointer = osp.join(runner.work_dir, 'last_checkpoint')
        atomic_backend.atomic_write(self.last_ckpt.encode(), pointer)
        if stale is not None and stale != step:
            self._remove(
                self.file_backend.join_path(
                    self.out_dir, self.filename_tmpl.format(stale)
                )
            )

    def _save_best_checkpoint(self, runner, metrics):
        # upstream's, except that the previous best checkpoint is removed
        # after the new one is written, not before
        if not self.save_best:
            return
        step = runner.epoch if self.by_epoch else runner.iter
        unit = 'epoch' if self.by_epoch else 'iter'
        ckpt_filename = self.filename_tmpl.format(step)
        meta = dict(epoch=runner.epoch, iter=runner.iter)
        if 'auto' in self.key_indicators:
            self._init_rule(self.rules, [next(iter(metrics.keys()))])
        single = len(self.key_indicators) == 1
        updated = False
        for key_indicator, rule in zip(
            self.key_indicators, self.rules, strict=True
        ):
            key_score = metrics[key_indicator]
            if single:
                score_key, path_key = 'best_score', 'best_ckpt'
                previous = self.best_ckpt_path
            else:
                score_key = f'best_score_{key_indicator}'
                path_key = f'best_ckpt_{key_indicator}'
                previous = self.best_ckpt_path_dict[key_indicator]
            best_score = runner.message_hub.runtime_info.get(
                score_key, self.init_value_map[rule]
            )
            if key_score is None or not self.is_better_than[key_indicator](
                key_score, best_score
            ):
                continue
            updated = True
            runner.message_hub.update_info(score_key, key_score)
            best_ckpt_name = f'best_{key_indicator}_{ckpt_filename}'.replace(
                '/', '_'
            )
            path = self.file_backend.join_path(self.out_dir, best_ckpt_name)
            if single:
                self.best_ckpt_path = path
            else:
                self.best_ckpt_path_dict[key_indicator] = path
            runner.message_hub.update_info(path_key, path)
            runner.save_checkpoint(
                self.out_dir,
                filename=best_ckpt_name,
                file_client_args=self.file_client_args,
                save_optimizer=False,
                save_param_scheduler=False,
                meta=meta,
                by_epoch=False,
                backend_args=self.backend_args,
            )
            runner.logger.info(
                f'The best checkpoint with {key_score:0.4f} {key_indicator} '
                f'at {step} {unit} is saved to {best_ckpt_name}.'
            )
            if previous and previous != path and is_main_process():
                self._remove(previous)
                runner.logger.info(
                    f'The previous best checkpoint {previous} is removed'
                )
        # as upstream: save the step's checkpoint again, so that it names
        # the new best checkpoint (which a resumed run then replaces)
        if updated and self.last_ckpt is not None:
            self._save_checkpoint_with_step(runner, step, meta)


def use_safe_hook(cfg):
    """Make ``cfg`` save with :class:`SafeCheckpointHook` (in place).

    mmengine's default ``CheckpointHook`` (named, or implied by a missing
    ``default_hooks.checkpoint``) becomes ``SafeCheckpointHook`` with the
    same arguments; another hook type, or ``checkpoint=None``, is left.

    Args:
        cfg (mmengine.Config): A training config.

    Example:
        >>> use_safe_hook(cfg)
        >>> cfg.default_hooks.checkpoint.type
        'SafeCheckpointHook'
    """
    if cfg.get('default_hooks') is None:
        cfg.default_hooks = dict()
    hooks = cfg.default_hooks
    if 'checkpoint' not in hooks:  # mmengine's default
        hooks.checkpoint = dict(type='CheckpointHook', interval=1)
    hook = hooks.checkpoint
    if hook is not None and hook.get('type') in (
        'CheckpointHook',
        CheckpointHook,
    ):
        hook['type'] = NAME


def install():
    """Register :class:`SafeCheckpointHook` (and the ``atomic_local``
    backend it writes with) in mmengine; idempotent.

    Example:
        >>> install()
        >>> from mmengine.registry import HOOKS
        >>> HOOKS.get('SafeCheckpointHook')
    """
    # the method this hook replaces, with its bookkeeping
    check_mmengine(
        'checkpoint hook',
        [
            (CheckpointHook, '_save_checkpoint_with_step'),
            (CheckpointHook, '_save_best_checkpoint'),
            (CheckpointHook, '_init_rule'),
        ],
    )
    atomic_backend.install()
    if HOOKS.module_dict.get(NAME) is not SafeCheckpointHook:
        HOOKS.register_module(NAME, module=SafeCheckpointHook)
