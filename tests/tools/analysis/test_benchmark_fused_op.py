"""tools/analysis/benchmark_fused_op.py: what it measures, on the Triton
kernels interpreted on CPU tensors (``TRITON_INTERPRET=1``, set by
``tests/conftest.py``); its timings need CUDA (``make gpu-check``)."""

import os
import subprocess
import sys

import pytest
import torch

from tools.analysis import benchmark_fused_op

pytestmark = pytest.mark.skipif(
    os.environ.get('TRITON_INTERPRET') != '1', reason='interpreted Triton'
)


def test_both_variants_run_and_the_switch_is_left_as_found(monkeypatch):
    monkeypatch.delenv('MMEVO_FUSED_TRITON', raising=False)
    result = benchmark_fused_op.measure(
        1, 4, 6, 2, torch.device('cpu'), torch.float32, repeat=1
    )
    assert set(result) == {'fused', 'unfused'}
    for ms, mib in result.values():
        assert ms > 0 and mib > 0
    # the unfused composition writes the kernel map, the fused kernels not
    assert result['fused'][1] < result['unfused'][1]


def test_cpu_is_a_usage_error():
    proc = subprocess.run(
        [
            sys.executable,
            'tools/analysis/benchmark_fused_op.py',
            '--device',
            'cpu',
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert '--device: the Triton kernels run on CUDA, got cpu' in proc.stderr
