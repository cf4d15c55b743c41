"""Fixtures of the whole suite: the device the GPU-path tests run on.

Tests marked ``cuda`` run the Triton kernels: on CUDA tensors when there is
a GPU (``tools/analysis/gpu_check.sh`` runs ``pytest -m cuda`` there), else
on CPU tensors through Triton's interpreter. Triton decides whether a kernel
is interpreted when the kernel is decorated, and torch >= 2.14 imports
triton while importing ``torch._dynamo`` (which mmengine and mmevo's ops
pull in), so ``TRITON_INTERPRET=1`` is set here, before any test module is
collected.

Under pytest-xdist (``make test`` runs a worker per core) each worker
takes its share of the cores: ``torch.set_num_threads`` and the
``OMP_NUM_THREADS`` of the processes it starts are capped at cores /
workers (a test that needs more threads sets them itself). Tests that keep
both cores busy by themselves (a process pool, a two-process training)
share one worker: ``@pytest.mark.xdist_group('two_cores')``; the slow
tests are handed out first.
"""

import logging
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

# xdist's workers: as many as cores, so one OpenMP thread each (two on two
# cores only oversubscribe them, and wait for each other)
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if WORKERS > 1:
    share = max(1, len(os.sched_getaffinity(0)) // WORKERS)
    if torch.get_num_threads() > share:
        torch.set_num_threads(share)
        os.environ['OMP_NUM_THREADS'] = str(share)


# mmevo's modules registered for the whole suite, whatever a test module
# imports first; the mmengine fixes stay off unless a test turns them on.
import mmevo  # noqa: E402

mmevo.register_all_modules(install_fixes=False)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # an xdist worker's collection is the order the tests are handed out
    # in: the slow ones first, so that the run ends on short tests rather
    # than on one worker's training while the other has nothing left
    if hasattr(config, 'workerinput'):
        items.sort(key=lambda item: item.get_closest_marker('slow') is None)


@pytest.fixture(params=[1, 2], ids=['1_thread', '2_threads'])
def threads(request):
    """Runs the test with 1 and with 2 torch threads (PyTorch picks some
    CPU kernels by the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture
def onednn_conv1x1(monkeypatch):
    """The wide float32 1x1 convolutions on oneDNN whatever the host
    (``MMEVO_CONV1X1``; by default oneDNN on AMD CPUs only)."""
    monkeypatch.setenv('MMEVO_CONV1X1', 'onednn')


@pytest.fixture
def device():
    """``cuda`` on a GPU, else ``cpu`` (Triton kernels interpreted)."""
    return torch.device('cuda' if CUDA else 'cpu')


@pytest.fixture(autouse=True)
def _live_log_stream():
    """mmengine's current logger writes to the ``sys.stdout`` it found when
    it was made; made under an earlier test's ``capsys``, that stream is
    closed now, and the next ``print_log`` (``init_default_scope``'s note
    on a scope change, say) prints a logging error into this test's
    output. Such a handler is pointed at the live ``sys.stdout``."""
    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()
    for handler in logger.handlers:
        if type(handler) is logging.StreamHandler and handler.stream.closed:
            handler.stream = sys.stdout
    yield
