"""Train a detector or a segmentor (mmdet or mmseg config) with mmevo.

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library's
registries build it; ``import mmevo`` makes mmevo's modules visible to both.
On a machine without a GPU, distributed runs use gloo (see
``mmevo.engine.setup_cpu_distributed``) and SyncBN becomes BN.

Checkpoints are written atomically (``atomic_local`` backend) and hold the
random streams (``RandomStateHook``), so ``--resume`` continues bit-exactly;
``--resume`` without a path skips a corrupt latest checkpoint.

Example:
    python tools/train.py configs/rednet50_fpn_coco.py --work-dir work_dirs/x
    tools/dist_train.sh CONFIG 2 --resume
"""
import argparse
import os
import os.path as osp
import warnings

import torch

# mmengine imports pkg_resources, which setuptools < 70 (needed by mmcv's
# build) flags as deprecated on every start: noise, not a problem of the run
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

# tools/_cli.py (the tool's folder is on the path of a script)
from _cli import exit_if_data_missing, fail, load_config
from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmevo  # noqa: F401  (registers mmevo's modules in mmengine)
from mmevo.engine import (RandomStateHook, checkpoint_error,
                          find_resumable_checkpoint, setup_cpu_distributed)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='automatic mixed precision (GPU)')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the lr by the actual batch size (cfg.auto_scale_lr)')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this checkpoint, or, without a path, from the '
        'latest checkpoint in the work dir')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value (e.g. '
        'train_cfg.max_epochs=3 "model.backbone.depth=26")')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_cfg(args):
    """The config of ``args``, with the command-line overrides applied."""
    cfg = load_config(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        if not torch.cuda.is_available():
            fail('--amp needs a GPU (mmengine\'s AmpOptimWrapper runs on '
                 'CUDA/NPU/MLU only); train without --amp on CPU')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in \
                cfg.auto_scale_lr:
            fail('--auto-scale-lr needs cfg.auto_scale_lr with '
                 'base_batch_size')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        # the newest sound checkpoint (a crash may have left a corrupt one);
        # none: train from the start, as mmengine does
        cfg.load_from = find_resumable_checkpoint(cfg.work_dir)
        cfg.resume = cfg.load_from is not None
    elif args.resume is not None:
        if '://' not in args.resume:
            if not osp.isfile(args.resume):
                fail(f"--resume checkpoint '{args.resume}' does not exist "
                     '(--resume without a path takes the latest one of the '
                     'work dir)')
            reason = checkpoint_error(args.resume)
            if reason is not None:
                fail(f"--resume checkpoint '{args.resume}' cannot be "
                     f'loaded: {reason}')
        cfg.resume = True
        cfg.load_from = args.resume
    _write_checkpoints_atomically(cfg)
    return cfg


def _write_checkpoints_atomically(cfg):
    """Make the CheckpointHook write through mmevo's ``atomic_local``
    backend, unless the config chose a backend (or disabled the hook)."""
    hooks = cfg.setdefault('default_hooks', {})
    if 'checkpoint' not in hooks:  # mmengine's default hook
        hooks['checkpoint'] = dict(type='CheckpointHook', interval=1)
    ckpt = hooks['checkpoint']
    if ckpt is None or ckpt.get('backend_args') is not None \
            or ckpt.get('file_client_args') is not None \
            or '://' in str(ckpt.get('out_dir', '')):
        return
    ckpt['backend_args'] = dict(backend='atomic_local')


def main(argv=None):
    args = parse_args(argv)
    cfg = build_cfg(args)
    loaders = ['train_dataloader']
    if cfg.get('val_cfg'):
        loaders.append('val_dataloader')
    # resuming restores the weights: the ImageNet init is not needed then
    exit_if_data_missing(cfg, loaders, pretrained=not cfg.get('resume'))
    setup_cpu_distributed(cfg, args.launcher)
    runner = (
        Runner.from_cfg(cfg)
        if 'runner_type' not in cfg else RUNNERS.build(cfg))
    if not any(isinstance(h, RandomStateHook) for h in runner.hooks):
        runner.register_hook(RandomStateHook())
    runner.train()
    return runner


if __name__ == '__main__':
    main()
