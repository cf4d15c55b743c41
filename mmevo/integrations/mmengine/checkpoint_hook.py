"""Fix: mmengine 0.10.7's ``CheckpointHook`` can lose every checkpoint.

With ``max_keep_ckpts`` set, ``CheckpointHook._save_checkpoint_with_step``
deletes the oldest checkpoint *before* it writes the new one, and writes
``last_checkpoint`` in place: a crash or a full disk in between (with
``max_keep_ckpts=1``, the demo configs' setting) leaves no checkpoint, or a
``last_checkpoint`` naming a deleted file. :class:`SafeCheckpointHook`
writes the new checkpoint (atomically, synced) first, then points
``last_checkpoint`` at it atomically, and only then removes the old one;
at the start of training it removes the temporary files a killed save left.

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

    def __init__(self, *args, backend_args=None, file_client_args=None,
                 out_dir=None, **kwargs):
        if backend_args is None and file_client_args is None \
                and '://' not in str(out_dir or ''):
            backend_args = dict(backend=atomic_backend.BACKEND)
        super().__init__(
            *args,
            backend_args=backend_args,
            file_client_args=file_client_args,
            out_dir=out_dir,
            **kwargs)

    def _is_local(self):
        return self.backend_args is not None and self.backend_args.get(
            'backend') == atomic_backend.BACKEND

    def before_train(self, runner):
        super().before_train(runner)
        if is_main_process() and self._is_local():
            for directory in {self.out_dir, runner.work_dir}:
                for name in atomic_backend.remove_stale_tmp(directory):
                    runner.logger.info(
                        f'removed {name}, left by a save that was killed')

    def _save_checkpoint_with_step(self, runner, step, meta):
        # the upstream bookkeeping, but the stale step is only removed once
        # the new checkpoint and the pointer to it are on disk
        stale = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                stale = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir,
                                                     ckpt_filename)
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
            **self.args)
        if not is_main_process():
            return
        pointer = osp.join(runner.work_dir, 'last_checkpoint')
        atomic_backend.atomic_write(self.last_ckpt.encode(), pointer)
        if stale is None or stale == step:
            return
        path = self.file_backend.join_path(self.out_dir,
                                           self.filename_tmpl.format(stale))
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # deepspeed's checkpoints
            self.file_backend.rmtree(path)


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
    if hook is not None and hook.get('type') in ('CheckpointHook',
                                                 CheckpointHook):
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
    check_mmengine('checkpoint hook',
                   [(CheckpointHook, '_save_checkpoint_with_step')])
    atomic_backend.install()
    if HOOKS.module_dict.get(NAME) is not SafeCheckpointHook:
        HOOKS.register_module(NAME, module=SafeCheckpointHook)
