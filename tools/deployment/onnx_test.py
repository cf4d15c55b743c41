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

from mmevo import cli
from mmevo.apis.deploy import evaluate_exported
from mmevo.deploy import OnnxModel


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Evaluate an ONNX model with onnxruntime'
    )
    parser.add_argument('config', help='config file')
    parser.add_argument('model', help='the .onnx file')
    cli.add_evaluation_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    return evaluate_exported(parse_args(argv), OnnxModel, 'ONNX')


if __name__ == '__main__':
    main()
