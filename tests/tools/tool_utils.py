"""Helpers of the tool tests: the demo configs and the ``tools/*.py``
scripts imported as modules (so runs happen in-process). The data set
fixtures are in ``conftest.py``."""

import importlib.util
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_DET = osp.join(
    REPO,
    'configs',
    'demo',
    'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py',
)
DEMO_SEG = osp.join(
    REPO,
    'configs',
    'demo',
    'fpn_rednet26-tiny_1xb8-500iter_synthetic-cityscapes-128x256.py',
)


def load_tool(name):
    """``tools/<name>.py`` as a module (its ``main(argv)`` runs a job);
    ``name`` may name a subfolder, e.g. 'deployment/onnx_test'."""
    spec = importlib.util.spec_from_file_location(
        f'mmevo_tool_{osp.basename(name)}',
        osp.join(REPO, 'tools', f'{name}.py'),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
