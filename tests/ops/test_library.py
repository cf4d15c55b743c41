"""Backend selection: ``use_backend`` is per thread; a backward runs on the
backend of its forward, whichever thread runs it."""

import contextlib
import threading

import pytest
import torch

from mmevo.ops import evolution_aggregate, library
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference


def backend_module(name):
    with library.use_backend(name):
        return library.primitives(torch.empty(0))


def test_use_backend_is_per_thread():
    default = library.primitives(torch.empty(0))
    all_inside, done = threading.Barrier(4), threading.Barrier(4)
    seen, errors = {}, []

    def worker(name):
        try:
            with (
                library.use_backend(name) if name else contextlib.nullcontext()
            ):
                all_inside.wait(timeout=10)
                seen[name] = library.primitives(torch.empty(0))
                done.wait(timeout=10)
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(name,))
        for name in ('torch', 'cpp', None)
    ]
    for t in threads:
        t.start()
    with library.use_backend('torch'):
        all_inside.wait(timeout=10)
        # every thread is inside its block now
        seen['main'] = library.primitives(torch.empty(0))
        done.wait(timeout=10)
    for t in threads:
        t.join()
    assert not errors
    assert seen['torch'] is seen['main'] is backend_module('torch')
    assert seen['cpp'] is backend_module('cpp')
    assert seen['torch'] is not seen['cpp']
    # a thread forcing nothing has the process-wide default
    # (MMEVO_OPS_BACKEND), whatever the others force
    assert seen[None] is default
    assert library.primitives(torch.empty(0)) is default


def test_backward_runs_on_the_forward_backend(monkeypatch):
    torch_backend = backend_module('torch')
    calls = []
    original = torch_backend.aggregate_transpose

    def counting(*args, **kwargs):
        calls.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch_backend, 'aggregate_transpose', counting)
    x = torch.randn(1, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 2, 3, 3, 5, 6, dtype=torch.float64)
    with library.use_backend('torch'):
        y = evolution_aggregate(x, w)
    assert not calls
    # Outside the block, on a thread of another backend (as autograd's
    # device threads are on CUDA).
    backward = threading.Thread(target=y.sum().backward, name='backward')
    backward.start()
    backward.join()
    assert calls == ['backward']
    xr = x.detach().requires_grad_()
    aggregate_reference(xr, w, Window(3, 1, 1, 1, 'zeros')).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_unknown_backend():
    with pytest.raises(
        ValueError,
        match=r'backend must be one of .*, got '
        r"'cuda'",
    ):
        with library.use_backend('cuda'):
            pass
