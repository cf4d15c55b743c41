"""The C++ CPU kernels (the ``mmevo/_ext*.so`` library).

The library is not a Python module: it registers the ``torch.ops.mmevo``
operators and their CPU kernels with the dispatcher (``TORCH_LIBRARY`` in
``csrc/ops.cpp``), and is loaded here with ``torch.ops.load_library``. A C++
program (an AOTInductor runner, say) loads the same file with ``dlopen``
and calls the operators without Python; they validate their arguments and
handle both padding modes themselves. ``available()`` is False when the
extension was not built: :mod:`mmevo.ops.library` then defines the
operators in Python.

The kernels compute fp64 / fp32 / bf16 / fp16 natively (bf16 and fp16
accumulate in fp32) with the widest vector code the CPU has (AVX-512, AVX2
or a baseline; :func:`isa` says which). ``MMEVO_CPU_ISA=avx2`` or ``base``,
set before the library is loaded, selects a narrower one: the tests use it
to run every variant on one machine.
"""

import importlib.util

import torch

from .checks import Window


def _find() -> str | None:
    try:
        spec = importlib.util.find_spec('mmevo._ext')
    except ImportError:  # a finder that says it is not there
        return None
    return None if spec is None else spec.origin


#: The path of the loaded library, or None.
LIBRARY = _find()
if LIBRARY is not None:
    torch.ops.load_library(LIBRARY)

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def available() -> bool:
    """Whether the compiled extension was found and loaded."""
    return LIBRARY is not None


def isa() -> str:
    """The instruction set of the kernels: 'avx512', 'avx2' or 'base'."""
    return torch.ops.mmevo.cpu_isa()


def call(op: torch._ops.OpOverload, *args):
    """Run the C++ CPU kernel of ``op`` (skipping the Python selection of a
    backend, which runs first on every call)."""
    return op.redispatch(_CPU, *args)


# The backend primitives, as the other backends' (their window's padding
# mode is the kernels', which make reflect padding themselves).
def aggregate(
    x: torch.Tensor, w: torch.Tensor, window: Window
) -> torch.Tensor:
    """Y = A(x, w), see :func:`mmevo.ops.torch_backend.aggregate`."""
    return call(
        torch.ops.mmevo.evolution_aggregate.default, x, w, *window.scalars()
    )


def aggregate_transpose(
    gy: torch.Tensor,
    w: torch.Tensor,
    in_hw: tuple[int, int],
    window: Window,
) -> torch.Tensor:
    """grad_x = At(gy, w), see
    :func:`mmevo.ops.torch_backend.aggregate_transpose`."""
    return call(
        torch.ops.mmevo.evolution_aggregate_transpose.default,
        gy,
        w,
        *in_hw,
        *window.scalars(),
    )


def correlate(
    q: torch.Tensor,
    x: torch.Tensor,
    groups: int,
    window: Window,
    softmax: bool = False,
) -> torch.Tensor:
    """out = Corr(q, x), see :func:`mmevo.ops.torch_backend.correlate`; the
    softmax is fused: it runs on each tile's sums before they are
    written."""
    op = (
        torch.ops.mmevo.local_attention_weights
        if softmax
        else torch.ops.mmevo.local_correlation
    )
    return call(
        op.default, q, x, groups, window.kernel_size, *window.scalars()
    )
