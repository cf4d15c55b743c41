"""Test (evaluate) a checkpoint of a detector or a segmentor with mmevo.

The config's ``default_scope`` ('mmdet' or 'mmseg') decides which library's
registries build it; the metric is the config's ``test_evaluator``. A
checkpoint that cannot be loaded, or whose entries do not fit the model
(every key, a tensor of the same shape), is refused in one line (exit
status 1) unless ``--allow-partial`` is given. So is an ``--out`` that is
one of the inputs or cannot be written, before the evaluation; the
predictions are written to it atomically.

Example:
    python tools/test.py CONFIG work_dirs/demo/epoch_20.pth --out preds.pkl
    tools/dist_test.sh CONFIG CHECKPOINT 2 --out results.pkl
"""

import argparse
import os

from mmevo import apis, cli
from mmevo.integrations import mmengine as fixes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    cli.add_evaluation_args(parser)
    parser.add_argument(
        '--allow-partial',
        action='store_true',
        help='evaluate a checkpoint even if keys are missing, unexpected or '
        'of another shape (those weights keep their initialisation)',
    )
    cli.add_launcher_args(parser)
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        parser.error(f'--out must be a .pkl file, got {args.out}')
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main(argv=None):
    args = parse_args(argv)
    fixes.install_all()
    with apis.one_line_errors():
        cfg = apis.load_config(args.config, args.cfg_options, args.work_dir)
        cfg.launcher = args.launcher
        if args.out is not None:  # before the evaluation, not after it
            inputs = {'checkpoint': args.checkpoint, 'config': args.config}
            apis.dump_results(cfg, args.out, inputs)
        state = apis.read_checkpoint(args.checkpoint)
        cfg.load_from = args.checkpoint
        apis.check_data(cfg, 'test_dataloader')
        fixes.setup_cpu_distributed(cfg, args.launcher)
        runner = apis.build_runner(cfg)
        if not args.allow_partial:
            apis.check_checkpoint_fits(
                runner.model,
                state,
                'evaluate it anyway with --allow-partial',
                name=args.checkpoint,
            )
        del state
    return runner.test()


if __name__ == '__main__':
    main()
