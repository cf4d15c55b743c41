"""What each mmevo subpackage pulls in (see ``mmevo/__init__.py``).

Each check runs in a fresh interpreter; a ``sys.meta_path`` finder makes the
named packages unimportable, as if they were not installed.
"""
import json
import os
import subprocess
import sys

import pytest

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
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ops_needs_only_torch():
    """(torch itself may import triton later, when an op first runs.)"""
    loaded = run_blocked(('mmdet', 'mmseg', 'mmcv', 'mmengine'), '''
import json
import torch
import mmevo.ops
loaded = sorted({m.split('.')[0] for m in sys.modules})
x = torch.randn(1, 4, 5, 5)
y = mmevo.ops.evolution_aggregate(x, torch.randn(1, 2, 3, 3, 5, 5))
assert y.shape == x.shape
print(json.dumps(loaded))
''')
    assert 'mmevo' in loaded and 'torch' in loaded
    assert set(HEAVY) & set(loaded) == set()


def test_layers_need_no_mmdet_or_mmseg():
    loaded = run_blocked(('mmdet', 'mmseg'), '''
import json
import torch
from mmevo.layers import ACmix, Involution
x = torch.randn(2, 16, 7, 6, requires_grad=True)
for layer in (Involution(16, 3, 2), ACmix(16, 16, 5, 2, stride=2)):
    y = layer(x)
    assert y.shape == (2, 16, 4, 3), y.shape
    y.sum().backward()
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))
''')
    assert 'mmengine' in loaded and 'mmcv' in loaded
    assert 'mmdet' not in loaded and 'mmseg' not in loaded


def test_import_mmevo_registers_everything():
    names = run_blocked((), '''
import json
import mmevo
from mmengine.registry import MODELS
names = ['RedNet', 'ACmixResNet', 'InvolutionFPN', 'InvolutionRPNHead',
         'InvolutionFCNMaskHead', 'Involution', 'ACmix', 'ELSA',
         'LocalSelfAttention', 'DynamicFilter', 'EvolutionConv']
print(json.dumps([n for n in names if MODELS.get(n) is None]
                 + [m for m in ('layers', 'models', 'datasets')
                    if not hasattr(mmevo, m)]))
''')
    assert names == []


@pytest.mark.parametrize('blocked', [('mmdet', ), ('mmcv', )])
def test_without_a_dependency_only_its_subpackages_are_skipped(blocked):
    present = run_blocked(
        blocked, '''
import json
import mmevo
print(json.dumps([m for m in ('ops', 'layers', 'models')
                  if hasattr(mmevo, m)]))
''')
    expected = {'mmdet': ['ops', 'layers'], 'mmcv': ['ops']}[blocked[0]]
    assert present == expected


def test_a_broken_installed_package_still_raises():
    """mmdet is found but fails to import: the error is not swallowed."""
    out = subprocess.run([
        sys.executable, '-c', '''
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
'''
    ],
                         cwd=ROOT,
                         capture_output=True,
                         text=True,
                         timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode != 0
    assert 'mmdet is broken' in out.stderr
