"""Train a detector or a segmentor (mmdet or mmseg config) with mmevo.

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library's
registries build it. mmevo's mmengine fixes are turned on
(``mmevo.integrations.mmengine.install_all``): checkpoints are written
before an old one is removed and atomically (``SafeCheckpointHook``) and
hold the random streams (``RandomStateHook``), so ``--resume`` continues
bit-exactly from the last sound checkpoint; on a machine without a GPU,
distributed runs use gloo and SyncBN becomes BN. One run at a time per work
dir.

Example:
    python tools/train.py configs/rednet50_fpn_coco.py --work-dir work_dirs/x
    tools/dist_train.sh CONFIG 2 --resume
"""

import argparse
import contextlib
import os

import torch

from mmevo import apis, cli
from mmevo.integrations import mmengine as fixes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='automatic mixed precision (GPU)'
    )
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the lr by the actual batch size (cfg.auto_scale_lr)',
    )
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this checkpoint, or, without a path, from the '
        'latest sound checkpoint in the work dir',
    )
    cli.add_cfg_options(parser)
    cli.add_launcher_args(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_cfg(args):
    """The config of ``args``, with the command-line overrides applied."""
    cfg = apis.load_config(args.config, args.cfg_options, args.work_dir)
    cfg.launcher = args.launcher
    if args.amp:
        if not torch.cuda.is_available():
            apis.fail(
                "--amp needs a GPU (mmengine's AmpOptimWrapper runs on "
                'CUDA/NPU/MLU only); train without --amp on CPU'
            )
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if (
            'auto_scale_lr' not in cfg
            or 'base_batch_size' not in cfg.auto_scale_lr
        ):
            apis.fail(
                '--auto-scale-lr needs cfg.auto_scale_lr with base_batch_size'
            )
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        # the newest sound checkpoint (a crash may have left a corrupt one);
        # none: train from the start, as mmengine does
        cfg.load_from = apis.find_resumable_checkpoint(cfg.work_dir)
        cfg.resume = cfg.load_from is not None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    fixes.use_safe_hook(cfg)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    fixes.install_all()
    with apis.one_line_errors(), contextlib.ExitStack() as stack:
        cfg = build_cfg(args)
        resume = cfg.get('resume') and cfg.load_from
        # an unloadable checkpoint: one line, before any work
        state = (
            apis.read_checkpoint(cfg.load_from, '--resume checkpoint')
            if resume
            else None
        )
        loaders = ['train_dataloader']
        if cfg.get('val_cfg'):
            loaders.append('val_dataloader')
        # resuming restores the weights: the ImageNet init is not needed then
        apis.check_data(cfg, loaders, pretrained=not cfg.get('resume'))
        if apis.launch_rank() == 0:
            stack.enter_context(apis.lock_work_dir(cfg.work_dir))
        fixes.setup_cpu_distributed(cfg, args.launcher)
        runner = apis.build_runner(cfg)
        if resume:
            apis.check_resume_fits(runner, state, cfg.load_from)
            del state
        if not any(isinstance(h, fixes.RandomStateHook) for h in runner.hooks):
            runner.register_hook(fixes.RandomStateHook())
        runner.train()
    return runner


if __name__ == '__main__':
    main()
