"""mmevo's configs build through each library's own entry point, whether
``import mmevo`` comes before the library or after it.

Each case runs in a fresh interpreter (registration is per process), with
the entry point given nothing but the config file: its
``custom_imports=dict(imports=['mmevo.models'])`` registers mmevo's modules.
None of these processes turns on mmevo's mmengine fixes.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETINANET = 'configs/rednet/retinanet_rednet50_fpn_1x_coco.py'
SEG = 'configs/rednet/fpn_rednet50_4xb2-80k_cityscapes-512x1024.py'
CLS = 'configs/rednet/rednet26_64xb32-warmup-coslr_in1k.py'
SWIN_CLS = 'configs/elsa_swin/elsa-swin-tiny_8xb128_in1k.py'
DEMO = 'configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py'

# (library imported, code building the model from the config `CFG`)
ENTRY_POINTS = {
    'mmdet.apis.init_detector': (
        'mmdet.apis',
        RETINANET,
        "model = mmdet.apis.init_detector(CFG, None, device='cpu')",
    ),
    'mmseg.apis.init_model': (
        'mmseg.apis',
        SEG,
        "model = mmseg.apis.init_model(CFG, None, device='cpu')",
    ),
    'mmpretrain.apis.get_model': (
        'mmpretrain.apis',
        CLS,
        'model = mmpretrain.apis.get_model(CFG)',
    ),
    'mmpretrain.apis.init_model': (
        'mmpretrain.apis',
        SWIN_CLS,
        "model = mmpretrain.apis.init_model(CFG, device='cpu')",
    ),
    'Runner.from_cfg': (
        'mmengine.runner',
        DEMO,
        'cfg = mmengine.config.Config.fromfile(CFG)\n'
        'cfg.work_dir = WORK_DIR\n'
        'model = mmengine.runner.Runner.from_cfg(cfg).model',
    ),
    'MODELS.build': (
        'mmengine.registry',
        SEG,
        'cfg = mmengine.config.Config.fromfile(CFG)\n'
        'mmengine.registry.init_default_scope(cfg.default_scope)\n'
        'model = mmengine.registry.MODELS.build(cfg.model)',
    ),
}


def _run(code):
    out = subprocess.run(
        [sys.executable, '-c', code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1'),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    'mmevo_first', [True, False], ids=['mmevo-first', 'mmevo-last']
)
@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
def test_entry_point_builds_mmevo_config_in_either_order(
    entry, mmevo_first, tmp_path
):
    """Slow: a fresh interpreter per case, which imports the OpenMMLab
    stack (5-10 s) and builds a RedNet-50 or Swin-T model."""
    library, config, build = ENTRY_POINTS[entry]
    imports = ['import mmevo', f'import mmengine.config, {library}']
    if not mmevo_first:
        imports.reverse()
    code = '\n'.join(
        [
            'import json, mmengine',
            *imports,
            f'CFG = {config!r}',
            f'WORK_DIR = {str(tmp_path)!r}',
            build,
            'from mmengine.fileio.backends import backends',
            'print(json.dumps({',
            "    'backbone': type(model.backbone).__name__,",
            "    'fixes_on': 'atomic_local' in backends,",
            '}))',
        ]
    )
    out = _run(code)
    assert out['backbone'] in {'RedNet', 'ELSASwinTransformer'}
    assert not out['fixes_on']


def test_import_mmevo_ops_imports_no_openmmlab_library_and_patches_nothing():
    out = _run(
        """
import json, sys
import torch
before = [repr(g) for g in torch.serialization.get_safe_globals()]
import mmevo.ops
print(json.dumps({
    'loaded': sorted({m.split('.')[0] for m in sys.modules}
                     & {'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain'}),
    'changed': [repr(g) for g in torch.serialization.get_safe_globals()]
               != before,
}))
"""
    )
    assert out == {'loaded': [], 'changed': False}


def test_importing_mmevo_models_turns_on_no_fix():
    """Registration is an import; the mmengine fixes are not: mmengine's
    checkpoint hook, file backends and torch's allowlist stay as they
    were until a tool or ``build_runner`` turns them on."""
    out = _run(
        """
import json
import torch
from mmengine.fileio.backends import backends
from mmengine.registry import HOOKS, MODELS
import mmevo.models
print(json.dumps({
    'registered': 'RedNet' in MODELS.module_dict,
    # mmevo's allowlist of mmengine's checkpoint types (torch's own
    # imports add DTensor types to it)
    'allowlist': any('HistoryBuffer' in repr(g)
                     for g in torch.serialization.get_safe_globals()),
    'backend': 'atomic_local' in backends,
    'hook': 'SafeCheckpointHook' in HOOKS.module_dict,
}))
"""
    )
    assert out == {
        'registered': True,
        'allowlist': False,
        'backend': False,
        'hook': False,
    }
