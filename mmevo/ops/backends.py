"""Which backend runs the evolution ops: selection, forcing, fallback.

The backend of a call is the thread's: ``MMEVO_OPS_BACKEND`` (every thread,
checked at import) until :func:`use_backend` forces another in one thread.
``'auto'`` runs the C++ kernels on CPU, Triton on CUDA and PyTorch
elsewhere; under ``'auto'``, a Triton kernel that fails to compile, autotune
or launch for a geometry is reported once (a ``RuntimeWarning`` naming the
primitive, shapes, dtype and error) and that geometry runs on PyTorch from
then on, without retrying.
"""

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import is_fake

from . import cpp_backend, torch_backend

BACKENDS = ('auto', 'cpp', 'triton', 'torch')


def _check_backend(name, what):
    if name not in BACKENDS:
        raise ValueError(f'{what} must be one of {BACKENDS}, got {name!r}')
    if name == 'cpp' and not cpp_backend.available():
        raise ValueError(
            f"{what}='cpp' needs the C++ extension, which is not built "
            f'(python setup.py build_ext --inplace, or pip install .); '
            f"'auto' or 'torch' run without it"
        )
    return name


class _ForcedBackend(threading.local):
    """The backend of this thread: ``MMEVO_OPS_BACKEND`` (read and checked
    at import) until :func:`use_backend` changes it, for this thread
    only."""

    name = _check_backend(
        os.environ.get('MMEVO_OPS_BACKEND', 'auto'), 'MMEVO_OPS_BACKEND'
    )


_forced = _ForcedBackend()


def forced() -> str:
    """The backend this thread forces ('auto' if none)."""
    return _forced.name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend for the ops this thread runs inside the block.

    Other threads keep theirs. The backward of an op runs on the backend of
    its forward, wherever it runs (autograd runs CUDA backwards on threads
    of its own). A forced backend raises its errors; only ``'auto'`` falls
    back from a failing Triton kernel to PyTorch.

    Args:
        name (str): one of 'auto', 'cpp' (CPU tensors; needs the built
            extension), 'triton', 'torch'.

    Example:
        >>> with use_backend('torch'):  # the pure PyTorch formulation
        ...     y = evolution_aggregate(x, w)
    """
    _check_backend(name, 'backend')
    old, _forced.name = _forced.name, name
    try:
        yield
    finally:
        _forced.name = old


def _triton_available():
    try:
        importlib.import_module('triton')
    except ImportError:
        return False
    return True


def _auto(t):
    """The backend 'auto' picks for tensors like ``t``."""
    if t.device.type == 'cpu' and cpp_backend.available():
        return 'cpp'
    if t.device.type == 'cuda' and _triton_available():
        return 'triton'
    return 'torch'


def backend_name(t):
    name = _forced.name
    if name == 'auto':
        return _auto(t)
    if name == 'cpp' and t.device.type != 'cpu':
        raise ValueError(f"backend 'cpp' runs CPU tensors, got {t.device}")
    if (
        name == 'triton'
        and t.device.type != 'cuda'
        and os.environ.get('TRITON_INTERPRET') != '1'
        and not is_fake(t)  # a trace (of a CUDA export) launches nothing
    ):
        # else Triton fails deep in its launcher ("0 active drivers")
        raise ValueError(
            f"backend 'triton' (MMEVO_OPS_BACKEND or use_backend) runs CUDA "
            f"tensors, got {t.device}: use 'auto' or 'cpp' for CPU tensors, "
            'or set TRITON_INTERPRET=1 to interpret the Triton kernels'
        )
    return name


def _module(name):
    if name == 'cpp':
        return cpp_backend
    if name == 'triton':
        return importlib.import_module('mmevo.ops.triton_backend')
    return torch_backend


def primitives(t: torch.Tensor):
    """The backend module (aggregate / aggregate_transpose / correlate)
    for ``t``."""
    return _module(backend_name(t))


# Geometries whose Triton kernel failed under 'auto': they run on PyTorch.
_triton_failed = set()


def run(t, primitive, *args, **kwargs):
    """``primitive`` of the backend for ``t`` on ``args``; under 'auto', a
    failing Triton kernel falls back to PyTorch for that geometry."""
    name = backend_name(t)
    if name != 'triton' or _forced.name != 'auto':
        return getattr(_module(name), primitive)(*args, **kwargs)
    key = (
        primitive,
        t.device.type,
        t.dtype,
        *tuple(
            tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args
        ),
        *tuple(sorted(kwargs.items())),
    )
    if key not in _triton_failed:
        try:
            return getattr(_module('triton'), primitive)(*args, **kwargs)
        except Exception as error:  # compile, autotune or launch
            _triton_failed.add(key)
            shapes = [
                tuple(a.shape) for a in args if isinstance(a, torch.Tensor)
            ]
            message = str(error).strip().splitlines()
            warnings.warn(
                f'mmevo: the Triton kernel of {primitive} failed for shapes '
                f'{shapes}, {t.dtype} ({type(error).__name__}: '
                f'{message[0] if message else ""}); this geometry runs on '
                f'the PyTorch backend from now on',
                RuntimeWarning,
                stacklevel=2,
            )
    return getattr(torch_backend, primitive)(*args, **kwargs)
