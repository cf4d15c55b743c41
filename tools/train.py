"""Train a detector or a segmentor (mmdet or mmseg config) with mmevo.

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library's
registries build it; ``import mmevo`` makes mmevo's modules visible to both.
On a machine without a GPU, distributed runs use gloo (see
``mmevo.engine.setup_cpu_distributed``) and SyncBN becomes BN.

Example:
    python tools/train.py configs/rednet50_fpn_coco.py --work-dir work_dirs/x
    tools/dist_train.sh CONFIG 2 --resume
"""
import argparse
import os
import os.path as osp
import sys
import warnings

import torch
# mmengine imports pkg_resources, which setuptools < 70 (needed by mmcv's
# build) flags as deprecated on every start: noise, not a problem of the run
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import mmevo  # noqa: F401,E402  (registers mmevo's modules in mmengine)
from mmevo.datasets import exit_if_data_missing  # noqa: E402
from mmevo.engine import setup_cpu_distributed  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='automatic mixed precision (GPU)')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the lr by the actual batch size (cfg.auto_scale_lr)')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from this checkpoint, or, without a path, from the '
        'latest checkpoint in the work dir')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, key=value (e.g. '
        'train_cfg.max_epochs=3 "model.backbone.depth=26")')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_cfg(args):
    """The config of ``args``, with the command-line overrides applied."""
    cfg = Config.fromfile(args.config)
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
            sys.exit('error: --amp needs a GPU (mmengine\'s AmpOptimWrapper '
                     'runs on CUDA/NPU/MLU only); train without --amp on CPU')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in \
                cfg.auto_scale_lr:
            sys.exit('error: --auto-scale-lr needs cfg.auto_scale_lr with '
                     'base_batch_size')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if '://' not in args.resume and not osp.isfile(args.resume):
            sys.exit(f"error: --resume checkpoint '{args.resume}' does not "
                     'exist (--resume without a path takes the latest one of '
                     'the work dir)')
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_cfg(args)
    loaders = ['train_dataloader']
    if cfg.get('val_cfg'):
        loaders.append('val_dataloader')
    # resuming restores the weights: the ImageNet init is not needed then
    exit_if_data_missing(cfg, loaders, pretrained=not cfg.get('resume'))
    setup_cpu_distributed(cfg, args.launcher)
    runner = (Runner.from_cfg(cfg)
              if 'runner_type' not in cfg else RUNNERS.build(cfg))
    runner.train()
    return runner


if __name__ == '__main__':
    main()
