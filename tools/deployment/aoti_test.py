"""Evaluate an AOTInductor package (``tools/deployment/pytorch2aoti.py``)
on the config's test set, scored by the config's own metric.

As ``onnx_test.py``: the package gives the raw head outputs (a two-stage
detector's graph ends in the detections), which the model built from the
config post-processes with its own heads, as ``tools/test.py`` does.

Example:
    python tools/deployment/aoti_test.py CONFIG work_dirs/demo/model.pt2
"""
import os.path as osp
import sys
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

from mmevo.deploy import AotiModel

# the ONNX evaluation beside this script (and tools/_cli.py it finds)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from onnx_test import evaluate, parse_args


def main(argv=None):
    args = parse_args(argv, 'AOTInductor package', '.pt2')
    return evaluate(args, AotiModel, 'AOTInductor')


if __name__ == '__main__':
    main()
