"""Evaluate an AOTInductor package (``tools/deployment/pytorch2aoti.py``)
on the config's test set, scored by the config's own metric.

As ``onnx_test.py``: the package gives the raw head outputs (a two-stage
detector's graph ends in the detections), which the model built from the
config post-processes with its own heads, as ``tools/test.py`` does.

Example:
    python tools/deployment/aoti_test.py CONFIG work_dirs/demo/model.pt2
"""

import argparse

from mmevo import cli
from mmevo.apis.deploy import evaluate_exported
from mmevo.deploy import AotiModel


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Evaluate an AOTInductor package'
    )
    parser.add_argument('config', help='config file')
    parser.add_argument('model', help='the .pt2 file')
    cli.add_evaluation_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    return evaluate_exported(parse_args(argv), AotiModel, 'AOTInductor')


if __name__ == '__main__':
    main()
