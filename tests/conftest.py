"""Fixtures of the whole suite: the device the GPU-path tests run on.

Tests marked ``cuda`` run the Triton kernels: on CUDA tensors when there is
a GPU (``tools/analysis/gpu_check.sh`` runs ``pytest -m cuda`` there), else
on CPU tensors through Triton's interpreter. Triton decides whether a kernel
is interpreted when the kernel is decorated, and torch >= 2.14 imports
triton while importing ``torch._dynamo`` (which mmengine and mmevo's ops
pull in), so ``TRITON_INTERPRET=1`` is set here, before any test module is
collected.
"""

import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    assert (
        'triton' not in sys.modules
        or os.environ.get('TRITON_INTERPRET') == '1'
    ), 'triton was imported before TRITON_INTERPRET=1 could be set'
    os.environ['TRITON_INTERPRET'] = '1'


# mmevo's modules registered for the whole suite, whatever a test module
# imports first; the mmengine fixes stay off unless a test turns them on.
import mmevo  # noqa: E402

mmevo.register_all_modules(install_fixes=False)


@pytest.fixture
def device():
    """``cuda`` on a GPU, else ``cpu`` (Triton kernels interpreted)."""
    return torch.device('cuda' if CUDA else 'cpu')
