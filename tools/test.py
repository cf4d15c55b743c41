"""Test (evaluate) a checkpoint of a detector or a segmentor with mmevo.

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library's
registries build it; the metric is the config's ``test_evaluator``. A
checkpoint whose keys or shapes do not fit the model is refused (exit status
1, the keys listed) unless ``--allow-partial`` is given.

Example:
    python tools/test.py CONFIG work_dirs/demo/epoch_20.pth --out preds.pkl
    tools/dist_test.sh CONFIG CHECKPOINT 2 --out results.pkl
"""
import argparse
import os
import os.path as osp
import warnings

# mmengine imports pkg_resources, which setuptools < 70 (needed by mmcv's
# build) flags as deprecated on every start: noise, not a problem of the run
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

# tools/_cli.py (the tool's folder is on the path of a script)
from _cli import (add_evaluation_args, check_checkpoint_fits, dump_results,
                  exit_if_data_missing, fail, load_config)
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmevo  # noqa: F401  (registers mmevo's modules in mmengine)
from mmevo.engine import checkpoint_error, setup_cpu_distributed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    add_evaluation_args(parser)
    parser.add_argument(
        '--allow-partial',
        action='store_true',
        help='evaluate a checkpoint even if keys are missing, unexpected or '
        'of another shape (those weights keep their initialisation)')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        parser.error(f'--out must be a .pkl file, got {args.out}')
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    if '://' not in args.checkpoint:
        if not osp.isfile(args.checkpoint):
            fail(f"checkpoint '{args.checkpoint}' does not exist")
        reason = checkpoint_error(args.checkpoint)
        if reason is not None:
            fail(f"checkpoint '{args.checkpoint}' cannot be loaded: {reason}")
    cfg.load_from = args.checkpoint
    if args.out is not None:
        dump_results(cfg, args.out)
    exit_if_data_missing(cfg, ['test_dataloader'])
    setup_cpu_distributed(cfg, args.launcher)
    runner = (
        Runner.from_cfg(cfg)
        if 'runner_type' not in cfg else RUNNERS.build(cfg))
    if not args.allow_partial:
        check_checkpoint_fits(runner.model, args.checkpoint,
                              'evaluate it anyway with --allow-partial')
    return runner.test()


if __name__ == '__main__':
    main()
