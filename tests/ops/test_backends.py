"""Backend selection: a validated ``MMEVO_OPS_BACKEND``, a clear error for
``cpp`` without the extension, and the fallback of 'auto' from a failing
Triton kernel to PyTorch (failures injected)."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from mmevo.ops import (
    BACKENDS,
    backends,
    cpp_backend,
    evolution_aggregate,
    triton_backend,
    use_backend,
)
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@pytest.mark.slow
def test_a_typo_in_the_environment_variable_is_a_value_error():
    out = subprocess.run(
        [sys.executable, '-c', 'import mmevo.ops'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, MMEVO_OPS_BACKEND='tritn', PYTHONPATH=ROOT),
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('ValueError: MMEVO_OPS_BACKEND must be one of')
    assert all(repr(name) in last for name in BACKENDS)
    assert "'tritn'" in last


def test_an_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match=r"backend must be one of .*'cuda'"):
        with use_backend('cuda'):
            pass


def test_cpp_without_the_extension_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cpp_backend, 'available', lambda: False)
    with pytest.raises(ValueError, match=r'needs the C\+\+ extension'):
        with use_backend('cpp'):
            pass


def _cpu_tensors_on_triton(monkeypatch):
    """Route CPU tensors to Triton under 'auto' (its interpreter runs
    them), as CUDA tensors are routed."""
    monkeypatch.setattr(backends, '_auto', lambda t: 'triton')


def test_a_failing_triton_kernel_falls_back_once_with_one_warning(monkeypatch):
    _cpu_tensors_on_triton(monkeypatch)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError('PTX: out of resources\nsecond line')

    monkeypatch.setattr(triton_backend, 'aggregate', broken)
    torch.manual_seed(0)
    x = torch.randn(2, 8, 7, 9, dtype=torch.float64)
    w = torch.randn(2, 2, 3, 3, 7, 9, dtype=torch.float64)
    expected = aggregate_reference(x, w, Window(3, 1, 1, 1, 'zeros'))
    with pytest.warns(RuntimeWarning) as record:
        y = evolution_aggregate(x, w, padding=1)
    torch.testing.assert_close(y, expected)
    assert len(record) == 1
    message = str(record[0].message)
    for part in (
        'aggregate',
        '(2, 8, 7, 9)',
        'torch.float64',
        'RuntimeError: PTX: out of resources',
        'PyTorch backend',
    ):
        assert part in message
    # the same geometry: no retry and no second warning
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        torch.testing.assert_close(
            evolution_aggregate(x, w, padding=1), expected
        )
    assert len(calls) == 1
    # another geometry tries Triton again
    with pytest.warns(RuntimeWarning):
        evolution_aggregate(x[:1], w[:1], padding=1)
    assert len(calls) == 2


def test_a_forced_triton_backend_raises_its_errors(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError('launch failed')

    monkeypatch.setattr(triton_backend, 'aggregate', broken)
    x = torch.randn(1, 4, 5, 5)
    w = torch.randn(1, 1, 3, 3, 5, 5)
    with (
        use_backend('triton'),
        pytest.raises(RuntimeError, match='launch failed'),
    ):
        evolution_aggregate(x, w, padding=1)


def test_a_forced_triton_backend_on_cpu_tensors_is_one_line(monkeypatch):
    # without the interpreter Triton would fail deep in its launcher
    monkeypatch.delenv('TRITON_INTERPRET')
    x = torch.randn(1, 4, 5, 5)
    w = torch.randn(1, 1, 3, 3, 5, 5)
    with use_backend('triton'), pytest.raises(ValueError) as info:
        evolution_aggregate(x, w, padding=1)
    assert str(info.value) == (
        "backend 'triton' (MMEVO_OPS_BACKEND or use_backend) runs CUDA "
        "tensors, got cpu: use 'auto' or 'cpp' for CPU tensors, or set "
        'TRITON_INTERPRET=1 to interpret the Triton kernels'
    )
