"""Evaluate an ONNX detector or segmentor with onnxruntime on the config's
test set, scored by the config's own metric (``test_evaluator``).

The ONNX model (from ``tools/deployment/pytorch2onnx.py``) gives the raw
head outputs; the model built from the config turns them into predictions
with its own head's ``predict_by_feat`` (boxes, NMS, rescaling / logits
resized; a two-stage detector's graph ends in the detections, which its
mask head pastes into the image; :func:`mmevo.deploy.runtime_predict`),
exactly as ``tools/test.py`` does with the PyTorch model.

Example:
    python tools/deployment/onnx_test.py CONFIG work_dirs/demo/model.onnx
"""
import argparse
import os.path as osp
import sys
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmevo  # noqa: F401  (registers mmevo's modules in mmengine)
from mmevo.deploy import OnnxModel, runtime_predict

# tools/_cli.py, one folder up
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from _cli import (add_evaluation_args, dump_results, exit_if_data_missing,
                  fail, load_config)


def parse_args(argv=None, runtime='ONNX model', suffix='.onnx'):
    parser = argparse.ArgumentParser(
        description=f'Evaluate an exported model: the {runtime}')
    parser.add_argument('config', help='config file')
    parser.add_argument('model', help=f'the {suffix} file')
    add_evaluation_args(parser)
    return parser.parse_args(argv)


def evaluate(args, runtime, name):
    """``tools/test.py``'s run of ``args.config`` with the predictions of
    ``runtime(args.model)`` (``name`` in messages and the work dir)."""
    if not osp.isfile(args.model):
        fail(f"{name} model '{args.model}' does not exist")
    cfg = load_config(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs',
        osp.splitext(osp.basename(args.config))[0] + f'_{name.lower()}')
    cfg.load_from = None
    if args.out is not None:
        dump_results(cfg, args.out)
    exit_if_data_missing(cfg, ['test_dataloader'])
    runner = (
        Runner.from_cfg(cfg)
        if 'runner_type' not in cfg else RUNNERS.build(cfg))
    model = runner.model
    try:
        model.predict = runtime_predict(model, runtime(args.model))
    except ValueError as e:
        fail(str(e))
    return runner.test()


def main(argv=None):
    return evaluate(parse_args(argv), OnnxModel, 'ONNX')


if __name__ == '__main__':
    main()
