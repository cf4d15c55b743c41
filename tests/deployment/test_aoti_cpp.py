"""The C++ runner of deploy/cpp, built with the machine's cmake and g++
against the torch wheel's libtorch, runs the demo backbone's AOTInductor
package without Python: its outputs are PyTorch's.

The package inlines the evolution ops (standard operators) until mmevo's
C++ kernels register as ``TORCH_LIBRARY`` operators; the runner then loads
that library with ``--ops-library``."""
import os.path as osp
import subprocess

import numpy as np
import pytest
import torch
import torch.utils
from mmengine.config import Config

from mmevo.deploy import AotiModel, TensorOutputs, export_aoti
from mmevo.registry import MODELS

pytestmark = pytest.mark.slow

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(REPO, 'configs', 'demo',
                'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py')
SHAPE = (1, 3, 64, 96)


def run(cmd, **kwargs):
    out = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert out.returncode == 0, f'{cmd}:\n{out.stdout}\n{out.stderr}'
    return out.stdout


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    """deploy/cpp built (about a minute)."""
    build = tmp_path_factory.mktemp('aoti_runner')
    run([
        'cmake', '-S',
        osp.join(REPO, 'deploy', 'cpp'), '-B', build,
        f'-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}',
        '-DCMAKE_BUILD_TYPE=Release'
    ])
    run(['cmake', '--build', build])
    return build / 'aoti_runner'


@pytest.fixture(scope='module')
def package(tmp_path_factory):
    """The demo backbone (RedNet-26, a quarter wide) and its package."""
    tmp = tmp_path_factory.mktemp('aoti_cpp')
    torch.manual_seed(0)
    backbone = MODELS.build(Config.fromfile(DEMO).model.backbone)
    backbone.init_weights()
    backbone.eval()  # mmdet's ResNet.train returns None: no chaining
    model = TensorOutputs(backbone, lambda m, x: m(x))
    path = str(tmp / 'backbone.pt2')
    export_aoti(
        model, torch.randn(*SHAPE), path, dynamic=False, inline_ops=True)
    return model, path, tmp


def test_cpp_runner_equals_pytorch(runner, package):
    model, path, tmp = package
    x = torch.randn(*SHAPE)
    x.numpy().tofile(tmp / 'x.bin')
    printed = run([
        runner, path, '--shape', *SHAPE, '--input', tmp / 'x.bin',
        '--output-prefix', tmp / 'out', '--threads', 2
    ])
    with torch.no_grad():
        expected = model(x)
    python = AotiModel(path)(x)
    assert printed.count('output ') == len(expected) == 3
    for i, ref in enumerate(expected):
        assert f'output {i}: shape {list(ref.shape)}'.replace(
            ', ', ',') in printed.replace(', ', ',')
        out = torch.from_numpy(np.fromfile(tmp / f'out{i}.bin',
                                           np.float32)).view(ref.shape)
        err = (out - ref).abs().max() / ref.abs().max()
        assert err <= 1e-4, (i, float(err))
        # the same program as the Python-loaded package
        torch.testing.assert_close(out, python[i], rtol=1e-5, atol=1e-5)


def test_cpp_runner_errors_are_one_line(runner, package, tmp_path):
    _, path, _ = package
    cases = [
        ([path, '--shape', *SHAPE, '--ops-library', tmp_path / 'none.so'],
         'cannot load'),
        ([path], 'usage: aoti_runner'),
        ([path, '--shape', *SHAPE, '--input', path], 'must hold'),
    ]
    for args, message in cases:
        out = subprocess.run([str(a) for a in [runner, *args]],
                             capture_output=True,
                             text=True)
        assert out.returncode != 0
        assert out.stderr.startswith('error: ') and message in out.stderr
