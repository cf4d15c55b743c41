"""The C++ operators without mmevo's Python: ``torch.ops.load_library`` of
the built extension in a process that imports only torch (as a libtorch
program or an AOTInductor runner would) makes every ``torch.ops.mmevo``
operator callable on CPU tensors, both padding modes included.

Checked against the plain PyTorch reference (``mmevo/ops/reference.py``,
loaded as a lone file) in float64: the tiled kernels, the explicit reflect
padding, and the direct formulation of strides, dilations and paddings much
larger than the map.
"""

import json
import os
import subprocess
import sys

import pytest

from mmevo.ops import cpp_backend

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

SCRIPT = r"""
import importlib.util
import json
import os
import sys

import torch

torch.ops.load_library(sys.argv[1])
def load(name):
    path = os.path.join(os.path.dirname(sys.argv[2]), name + '.py')
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref, Window = load('reference'), load('checks').Window
ops = torch.ops.mmevo
torch.manual_seed(0)
checked = 0
for B, C, G, H, W, K, s, p, d in json.loads(sys.argv[3]):
    Ho = (H + 2 * p - d * (K - 1) - 1) // s + 1
    Wo = (W + 2 * p - d * (K - 1) - 1) // s + 1
    x = torch.randn(B, C, H, W, dtype=torch.float64)
    w = torch.randn(B, G, K, K, Ho, Wo, dtype=torch.float64)
    q = torch.randn(B, C, Ho, Wo, dtype=torch.float64)
    gy = torch.randn(B, C, Ho, Wo, dtype=torch.float64)
    for mode in ('zeros', 'reflect'):
        window = (s, p, d, mode)
        xr = x.clone().requires_grad_()
        (gx_ref, ) = torch.autograd.grad(
            ref.aggregate_reference(xr, w, Window(K, *window)), xr, gy)
        pairs = [
            (ops.evolution_aggregate(x, w, *window),
             ref.aggregate_reference(x, w, Window(K, *window))),
            (ops.evolution_aggregate_transpose(gy, w, H, W, *window),
             gx_ref),
            (ops.local_correlation(q, x, G, K, *window),
             ref.correlation_reference(q, x, G, Window(K, *window))),
            (ops.local_attention_weights(q, x, G, K, *window),
             ref.attention_weights_reference(q, x, G, Window(K, *window))),
        ]
        for got, want in pairs:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
            checked += 1
        # fp32 through the same paths
        got = ops.evolution_aggregate(x.float(), w.float(), *window)
        torch.testing.assert_close(got.double(), pairs[0][1], rtol=1e-4,
                                   atol=1e-4)
assert ops.cpu_isa() in ('avx512', 'avx2', 'base')
print(json.dumps([checked, sorted(m for m in sys.modules
                                  if m.startswith('mmevo'))]))
"""

# (B, C, G, H, W, K, stride, padding, dilation)
GEOMETRIES = [
    (2, 16, 4, 7, 9, 3, 1, 1, 1),  # tiled, both paddings explicit
    (1, 12, 3, 9, 6, 5, 2, 2, 1),
    (1, 6, 6, 5, 7, 3, 3, 2, 2),
    (1, 20, 1, 17, 19, 7, 2, 0, 2),
    (2, 4, 1, 1, 1, 3, 1, 1, 1),  # 1 x 1 map, reflect is the pixel itself
    (1, 4, 2, 2, 3, 7, 1, 9, 3),  # reflect padding > map: re-reflection
    (1, 4, 4, 4, 4, 3, 100, 1, 1),  # stride >> map: direct
    (1, 4, 1, 4, 5, 3, 1, 300, 300),  # dilation and padding >> map
    (1, 8, 2, 6, 5, 3, 2, 150, 100),  # reflect direct, strided
    (1, 2, 1, 4, 4, 3, 2**31, 2**31, 1),  # int32 would wrap
    (1, 2, 2, 3, 2, 3, 1, 2**61, 2**61),  # int64 with room to spare
]


@pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)
def test_operators_from_the_library_alone():
    run = subprocess.run(
        [
            sys.executable,
            '-c',
            SCRIPT,
            cpp_backend.LIBRARY,
            os.path.join(ROOT, 'mmevo', 'ops', 'reference.py'),
            json.dumps(GEOMETRIES),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(cpp_backend.LIBRARY),
        env=dict(os.environ, PYTHONPATH='', OMP_NUM_THREADS='2'),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    checked, modules = json.loads(run.stdout.strip().splitlines()[-1])
    assert checked == 4 * 2 * len(GEOMETRIES)
    assert modules == []  # no mmevo Python module was imported
