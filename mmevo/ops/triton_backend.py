"""The Triton backend of the window primitives (CUDA; CPU tensors under
``TRITON_INTERPRET=1``): the launches of the kernels of
:mod:`mmevo.ops.triton_kernels`, which describes them. Tile sizes are
autotuned per layer; :func:`fixed_config` picks one by hand.
"""

import contextlib

import torch
import triton
from torch._library.triton import wrap_triton
from torch._subclasses.fake_tensor import is_fake
from torch.fx.experimental.symbolic_shapes import optimization_hint

from .torch_backend import window_softmax
from .triton_kernels import CONFIGS, KERNELS, block_w, strip_rows

# fixed_config's choice (-1: autotuned), passed to the kernels as TILE.
_fixed = {'index': -1}


@contextlib.contextmanager
def fixed_config(index):
    """Run every kernel with tile config ``CONFIGS[index]``, not autotuned.

    For checks that must cover every tile config (each one masks its edge
    tiles differently) without the cost of autotuning every geometry. Set
    for every thread (autograd runs CUDA backwards on threads of its own);
    it goes through the autotuner's public ``prune_configs_by``.

    Args:
        index (int): position in :data:`CONFIGS`.

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 1, 3, 3, 5, 5)
        >>> with fixed_config(0):  # CUDA tensors, or TRITON_INTERPRET=1
        ...     y = aggregate(x, w, Window(3, padding=1))
    """
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f'index must be an int, got {index!r}')
    if not 0 <= index < len(CONFIGS):
        raise ValueError(f'index must be in [0, {len(CONFIGS)}), got {index}')
    saved, _fixed['index'] = _fixed['index'], index
    try:
        yield
    finally:
        _fixed['index'] = saved


def launch_args(a, groups, window, in_hw, out_hw, transpose=False):
    """The scalar arguments of a kernel launch after its three tensors, and
    its constexprs but the config's; shared with the AOT harness
    (``tools/analysis/kernels``).

    Traced with a symbolic map width (a dynamic-size export), the column
    block is the example's: a constexpr is fixed when the kernel compiles,
    and the kernel is correct for every width (it masks and splits
    columns), only tuned for the example's.
    """
    K, s, p, d = (
        window.kernel_size,
        window.stride,
        window.padding,
        window.dilation,
    )
    width = optimization_hint(in_hw[1] if transpose else out_hw[1])
    scalars = (
        a.shape[1],
        in_hw[0],
        in_hw[1],
        groups,
        out_hw[0],
        out_hw[1],
        K,
        s,
        p,
        d,
        strip_rows(K, s, d, transpose),
        _fixed['index'],
    )
    return scalars, dict(
        IS_FP64=a.dtype == torch.float64, BLOCK_W=block_w(width)
    )


def num_programs(batch, groups, map_hw, rows, bw, block_p):
    """The grid of a launch: (batch, group) x strips x column blocks."""
    tile_rows = block_p // bw
    strip = triton.cdiv(rows, tile_rows) * tile_rows
    return (
        batch
        * groups
        * triton.cdiv(map_hw[0], strip)
        * triton.cdiv(map_hw[1], bw)
    )


def _launch(kernel, a, b, out, groups, window, in_hw, out_hw):
    transpose = kernel is KERNELS['aggregate_transpose']
    scalars, consts = launch_args(a, groups, window, in_hw, out_hw, transpose)
    map_hw = in_hw if transpose else out_hw

    def grid(meta):
        return (
            num_programs(
                a.shape[0],
                groups,
                map_hw,
                scalars[10],
                consts['BLOCK_W'],
                meta['BLOCK_P'],
            ),
        )

    launcher(kernel, a)[grid](a, b, out, *scalars, **consts)
    return out


def launcher(kernel, a):
    """``kernel`` for a launch on tensors like ``a``: traced (fake tensors:
    ``torch.export``, Inductor), its launch is recorded as a graph node
    (``wrap_triton``) that Inductor compiles; else it launches."""
    return wrap_triton(kernel) if is_fake(a) else kernel


def aggregate(x, w, window):
    """Y = A(x, w), see :func:`mmevo.ops.torch_backend.aggregate` (zero
    padding)."""
    x, w = x.contiguous(), w.contiguous()
    B, C, H, W = x.shape
    G, _, _, Ho, Wo = w.shape[1:]
    y = x.new_empty(B, C, Ho, Wo)
    return _launch(KERNELS['aggregate'], x, w, y, G, window, (H, W), (Ho, Wo))


def aggregate_transpose(gy, w, in_hw, window):
    """grad_x = At(gy, w), see
    :func:`mmevo.ops.torch_backend.aggregate_transpose`."""
    gy, w = gy.contiguous(), w.contiguous()
    B, C, Ho, Wo = gy.shape
    G = w.shape[1]
    gx = gy.new_empty(B, C, *in_hw)
    return _launch(
        KERNELS['aggregate_transpose'],
        gy,
        w,
        gx,
        G,
        window,
        tuple(in_hw),
        (Ho, Wo),
    )


def correlate(q, x, groups, window, softmax=False):
    """out = Corr(q, x), see :func:`mmevo.ops.torch_backend.correlate`; the
    softmax (if asked) runs after the kernel, in fp32 at least."""
    q, x = q.contiguous(), x.contiguous()
    B, _C, Ho, Wo = q.shape
    K = window.kernel_size
    # Logits for the softmax stay in fp32: rounded to bf16 (fp16), a logit
    # of 8 is off by up to 0.03 (0.004), and so is its weight, relatively.
    acc = torch.promote_types(q.dtype, torch.float32)
    out = q.new_empty(
        B, groups, K, K, Ho, Wo, dtype=acc if softmax else q.dtype
    )
    out = _launch(
        KERNELS['correlate'],
        q,
        x,
        out,
        groups,
        window,
        tuple(x.shape[-2:]),
        (Ho, Wo),
    )
    if not softmax:
        return out
    return window_softmax(out).to(q.dtype)
