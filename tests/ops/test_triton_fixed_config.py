"""``triton_backend.fixed_config`` reaches the autotuner without touching
the kernels' configs (run without ``TRITON_INTERPRET``, so the configs are
the CUDA ones, as on a GPU)."""

import json
import os
import subprocess
import sys

import pytest

# a fresh interpreter importing Triton compiled (this process may interpret)
pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
ENV = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
ENV['PYTHONPATH'] = REPO


SCRIPT = """
import json
import torch
from mmevo.ops import triton_backend as tb, triton_kernels as tk
from mmevo.ops.checks import Window
configs = tk.GPU_CONFIGS
before = list(configs)
x = torch.zeros(1, 4, 5, 5)
out = []
for index in (None, 3):
    if index is None:
        args = tb.launch_args(x, 1, Window(3, 1, 1), (5, 5), (5, 5))[0]
    else:
        with tb.fixed_config(index):
            args = tb.launch_args(x, 1, Window(3, 1, 1), (5, 5), (5, 5))[0]
    tile = args[-1]
    out.append([tile, [configs.index(c) for c in tk._prune(configs,
                                                           {'TILE': tile})]])
assert all(k.configs is configs for k in tk.KERNELS.values())
assert configs == before
for bad, error in ((len(configs), ValueError), (-1, ValueError),
                   ('0', TypeError)):
    try:
        with tb.fixed_config(bad):
            pass
    except error as e:
        assert 'index must' in str(e)
    else:
        raise AssertionError(f'fixed_config({bad!r}) did not raise')
print(json.dumps([len(configs), out]))
"""


def test_fixed_config_prunes_without_touching_the_configs():
    """fixed_config reaches the autotuner as the TILE key argument and its
    public early_config_prune; the kernels' configs stay as they are."""
    out = subprocess.run(
        [sys.executable, '-c', SCRIPT],
        env=ENV,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    n, (auto, fixed) = json.loads(out.stdout)
    assert auto == [-1, list(range(n))]
    assert fixed == [3, [3]]
