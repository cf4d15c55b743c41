"""The C++ runner of deploy/cpp, built with the machine's cmake and g++
against the torch wheel's libtorch, runs the demo backbone's AOTInductor
package without Python: its outputs are PyTorch's.

The package calls mmevo's operators (``torch.ops.mmevo.*``): the runner
loads mmevo's op library (``mmevo/_ext*.so``, the C++ kernels registered
with ``TORCH_LIBRARY``) with ``--ops-library``. Reflect-padded layers run
on the backbone's first features, so reflect padding runs in C++ too."""

import importlib.util
import os.path as osp
import subprocess

import numpy as np
import pytest
import torch
import torch.utils
from mmengine.config import Config

from mmevo.deploy import AotiModel, TensorOutputs, export_aoti
from mmevo.layers import EvolutionConv, LocalSelfAttention
from mmevo.registry import MODELS

OPS_LIBRARY = importlib.util.find_spec('mmevo._ext')
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        OPS_LIBRARY is None, reason="mmevo's C++ extension is not built"
    ),
    # one worker builds the runner and the package (minutes) for both tests
    pytest.mark.xdist_group('aoti_cpp'),
]

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(
    REPO,
    'configs',
    'demo',
    'retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py',
)
SHAPE = (1, 3, 64, 96)


class WithReflect(torch.nn.Module):
    """The backbone's features, and two reflect-padded layers on the
    first of them (8 x 12 at ``SHAPE``)."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.attention = LocalSelfAttention(
            128,
            kernel_size=5,
            num_heads=4,
            padding_mode='reflect',
            rel_pos_bias=True,
        )
        self.conv = EvolutionConv(
            128, 3, groups=4, dilation=2, padding_mode='reflect'
        )

    def forward(self, x):
        feats = self.backbone(x)
        return (*feats, self.conv(self.attention(feats[0])))


def run(cmd, **kwargs):
    out = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, **kwargs
    )
    assert out.returncode == 0, f'{cmd}:\n{out.stdout}\n{out.stderr}'
    return out.stdout


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    """deploy/cpp built (about a minute)."""
    build = tmp_path_factory.mktemp('aoti_runner')
    run(
        [
            'cmake',
            '-S',
            osp.join(REPO, 'deploy', 'cpp'),
            '-B',
            build,
            f'-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}',
            '-DCMAKE_BUILD_TYPE=Release',
        ]
    )
    run(['cmake', '--build', build])
    return build / 'aoti_runner'


@pytest.fixture(scope='module')
def package(tmp_path_factory):
    """The demo backbone (RedNet-26, a quarter wide) with the reflect
    layers, and its package (mmevo's operators kept)."""
    tmp = tmp_path_factory.mktemp('aoti_cpp')
    torch.manual_seed(0)
    backbone = MODELS.build(Config.fromfile(DEMO).model.backbone)
    backbone.init_weights()
    backbone.eval()  # mmdet's ResNet.train returns None: no chaining
    model = TensorOutputs(WithReflect(backbone).eval(), lambda m, x: m(x))
    path = str(tmp / 'backbone.pt2')
    export_aoti(model, torch.randn(*SHAPE), path, dynamic=False)
    return model, path, tmp


def test_cpp_runner_equals_pytorch(runner, package):
    model, path, tmp = package
    x = torch.randn(*SHAPE)
    x.numpy().tofile(tmp / 'x.bin')
    printed = run(
        [
            runner,
            path,
            '--shape',
            *SHAPE,
            '--input',
            tmp / 'x.bin',
            '--output-prefix',
            tmp / 'out',
            '--threads',
            2,
            '--ops-library',
            OPS_LIBRARY.origin,
        ]
    )
    with torch.no_grad():
        expected = model(x)
    python = AotiModel(path)(x)
    assert printed.count('output ') == len(expected) == 4
    for i, ref in enumerate(expected):
        assert f'output {i}: shape {list(ref.shape)}'.replace(
            ', ', ','
        ) in printed.replace(', ', ',')
        out = torch.from_numpy(
            np.fromfile(tmp / f'out{i}.bin', np.float32)
        ).view(ref.shape)
        err = (out - ref).abs().max() / ref.abs().max()
        assert err <= 1e-4, (i, float(err))
        # the same program as the Python-loaded package
        torch.testing.assert_close(out, python[i], rtol=1e-5, atol=1e-5)


def test_cpp_runner_errors_are_one_line(runner, package, tmp_path):
    _, path, _ = package
    cases = [
        (
            [path, '--shape', *SHAPE, '--ops-library', tmp_path / 'none.so'],
            'cannot load',
        ),
        ([path], 'usage: aoti_runner'),
        ([path, '--shape', *SHAPE, '--input', path], 'must hold'),
        # mmevo's operators unregistered
        ([path, '--shape', *SHAPE], 'mmevo'),
    ]
    for args, message in cases:
        out = subprocess.run(
            [str(a) for a in [runner, *args]], capture_output=True, text=True
        )
        assert out.returncode != 0
        assert out.stderr.startswith('error: ') and message in out.stderr
