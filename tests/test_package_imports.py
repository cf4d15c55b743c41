"""What ``import mmevo`` and each subpackage pull in, and what registers
mmevo's modules (see ``mmevo/__init__.py``).

Each check runs in a fresh interpreter; a ``sys.meta_path`` finder makes the
named packages unimportable, as if they were not installed.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BLOCKER = '''
import sys


class Blocker:
    """Not installed: finding the package or a submodule fails."""

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None


BLOCKED = set(sys.argv[1].split(',')) - {''}
sys.meta_path.insert(0, Blocker())
'''

HEAVY = ('mmdet', 'mmseg', 'mmcv', 'mmengine', 'triton')


def run_blocked(blocked, code):
    """Run ``code`` with ``blocked`` packages unimportable; its last stdout
    line parsed as JSON."""
    out = subprocess.run(
        [sys.executable, '-c', BLOCKER + code, ','.join(blocked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ops_needs_only_torch():
    """(torch itself may import triton later, when an op first runs.)"""
    loaded = run_blocked(
        ('mmdet', 'mmseg', 'mmcv', 'mmengine'),
        """
import json
import torch
import mmevo.ops
loaded = sorted({m.split('.')[0] for m in sys.modules})
x = torch.randn(1, 4, 5, 5)
y = mmevo.ops.evolution_aggregate(x, torch.randn(1, 2, 3, 3, 5, 5))
assert y.shape == x.shape
print(json.dumps(loaded))
""",
    )
    assert 'mmevo' in loaded and 'torch' in loaded
    assert set(HEAVY) & set(loaded) == set()


def test_layers_need_no_mmdet_or_mmseg():
    loaded = run_blocked(
        ('mmdet', 'mmseg'),
        """
import json
import torch
from mmevo.layers import ACmix, Involution
x = torch.randn(2, 16, 7, 6, requires_grad=True)
for layer in (Involution(16, 3, 2), ACmix(16, 16, 5, 2, stride=2)):
    y = layer(x)
    assert y.shape == (2, 16, 4, 3), y.shape
    y.sum().backward()
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))
""",
    )
    assert 'mmengine' in loaded and 'mmcv' in loaded
    assert 'mmdet' not in loaded and 'mmseg' not in loaded


NAMES = (
    'RedNet',
    'ACmixResNet',
    'ELSASwinTransformer',
    'ACmixSwinTransformer',
    'InvolutionFPN',
    'InvolutionRPNHead',
    'InvolutionFCNMaskHead',
    'Involution',
    'ACmix',
    'ELSA',
    'LocalSelfAttention',
    'DynamicFilter',
    'EvolutionConv',
)
UNREGISTERED = f"""
from mmengine.registry import MODELS
print(json.dumps([n for n in {NAMES!r} if MODELS.get(n) is None]))
"""


def test_import_mmevo_ops_imports_and_changes_nothing_else():
    """With everything installed: torch and mmevo's own modules only, and
    torch.serialization's allowlist untouched."""
    out = run_blocked(
        (),
        """
import json
import torch
before = [repr(g) for g in torch.serialization.get_safe_globals()]
import mmevo.ops
print(json.dumps({
    'loaded': sorted({m.split('.')[0] for m in sys.modules}),
    'changed': [repr(g) for g in torch.serialization.get_safe_globals()]
               != before,
}))
""",
    )
    assert (
        set(out['loaded'])
        & {'mmdet', 'mmseg', 'mmpretrain', 'mmcv', 'mmengine', 'cv2', 'onnx'}
        == set()
    )
    assert not out['changed']


def test_register_all_modules_registers_everything():
    missing = run_blocked(
        (),
        """
import json
import mmevo
assert 'mmengine' not in sys.modules
assert mmevo.register_all_modules() == ['layers', 'models', 'datasets']
"""
        + UNREGISTERED,
    )
    assert missing == []


@pytest.mark.parametrize('module', ['mmevo.models', 'mmevo'])
def test_custom_imports_of_a_config_registers_everything(tmp_path, module):
    """The documented entry, ``custom_imports=dict(imports=['mmevo.models'])``,
    and the one of configs written before it, ``imports=['mmevo']``."""
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f'custom_imports = dict(imports=[{module!r}])\n')
    missing = run_blocked(
        (),
        f"""
import json
from mmengine.config import Config
Config.fromfile({str(cfg)!r})
"""
        + UNREGISTERED,
    )
    assert missing == []


@pytest.mark.parametrize('blocked', [('mmdet',), ('mmcv',)])
def test_without_a_dependency_only_its_subpackages_are_skipped(blocked):
    present = run_blocked(
        blocked,
        """
import json
import mmevo
print(json.dumps(['ops'] + mmevo.register_all_modules()))
""",
    )
    expected = {
        'mmdet': ['ops', 'layers', 'datasets'],
        'mmcv': ['ops', 'datasets'],
    }[blocked[0]]
    assert present == expected


def test_a_broken_installed_package_still_raises():
    """mmdet is found but fails to import: the error is not swallowed."""
    out = subprocess.run(
        [
            sys.executable,
            '-c',
            """
import sys
from importlib.machinery import ModuleSpec


class Broken:
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError('mmdet is broken')


class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == 'mmdet':
            return ModuleSpec(name, Broken())
        return None


sys.meta_path.insert(0, Finder())
import mmevo
mmevo.register_all_modules()
""",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode != 0
    assert 'mmdet is broken' in out.stderr
