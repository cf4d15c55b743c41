"""The Triton kernels of the window primitives, their tile configs and
tiling (launched by :mod:`mmevo.ops.triton_backend`).

Three output-stationary kernels, one per primitive, zero padding only (reflect
padding is made explicit by :mod:`mmevo.ops.library`). A program owns every
channel of one group (in ``BLOCK_C`` chunks) over a strip of ``rows`` map rows
and up to ``BLOCK_W`` columns, swept in tiles of ``BLOCK_P`` positions; each
operand element a program needs is then fetched from DRAM about once, the
K*K taps and the halo rows coming from cache (the model and its check:
``tools/analysis/kernels/traffic.py``):

* ``aggregate``: Y = A(X, W) over a strip of output positions, looping over
  the taps; the kernel row of a tile is loaded for all its channels;
* ``aggregate_transpose``: grad_X = At(G, W) as a gather over a strip of
  *input* positions, visiting every (tap, output position) that reads it;
* ``correlate``: Corr(Q, X) over a strip of output positions, all K*K taps,
  each a sum over the group's channels.

Consecutive programs are neighbouring column blocks, then strips, of one
(batch, group), so the halo they share is still in L2. Every output element is
computed by one program with a fixed loop order: the kernels are deterministic
and use no atomics. Loads are converted to fp32 (fp64 stays fp64) and the sum
is stored in the input dtype. Tile sizes are autotuned per layer (channels,
groups, K, stride, dilation, column block), not per map size; one fixed tile
under the interpreter, which is slow. :func:`fixed_config` picks one by hand.
"""

import math
import os

import triton
import triton.language as tl

_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
# Widest column block: wider maps are split into blocks of this many columns.
MAX_BLOCK_W = 64


# The autotuned tiles on CUDA; BLOCK_P >= MAX_BLOCK_W: a tile holds at
# least one row of a column block.
GPU_CONFIGS = [
    triton.Config({'BLOCK_C': bc, 'BLOCK_P': bp}, num_warps=nw)
    for bc, bp, nw in [
        (8, 128, 4),
        (16, 64, 4),
        (16, 128, 4),
        (16, 256, 8),
        (32, 64, 4),
        (32, 128, 8),
        (4, 256, 4),
        (1, 512, 4),
    ]
]
# One tile under the interpreter, which is slow.
CONFIGS = (
    [triton.Config({'BLOCK_C': 16, 'BLOCK_P': 128}, num_warps=4)]
    if _INTERPRET
    else GPU_CONFIGS
)
# Tuned once per layer type, not per map size: detection inputs vary in size,
# and re-tuning at every new size would cost more than it gains. TILE is
# fixed_config's choice (-1: autotuned), keyed so that it is never cached as
# the autotuned choice.
_KEY = ['C', 'G', 'K', 'stride', 'dilation', 'BLOCK_W', 'TILE']


def _prune(configs, named_args, **kwargs):
    """The autotuner's candidates: only the fixed config when one is set."""
    tile = {**named_args, **kwargs}['TILE']
    return configs if tile < 0 else [configs[tile]]


def _autotune(fn):
    return triton.autotune(
        configs=CONFIGS,
        key=_KEY,
        prune_configs_by={'early_config_prune': _prune},
    )(triton.jit(fn))


def block_w(width):
    """Columns of a program's block for maps ``width`` wide: the width
    rounded up to a power of 2, at most :data:`MAX_BLOCK_W`."""
    return min(triton.next_power_of_2(width), MAX_BLOCK_W)


def strip_rows(kernel_size, stride, dilation, transpose=False):
    """Rows of a program's strip (before rounding up to whole tiles): enough
    that the window's halo rows add at most half to the rows read.

    Args:
        kernel_size, stride, dilation (int): the window.
        transpose (bool): strips of input rows (``aggregate_transpose``)
            instead of output rows.

    Returns:
        int: >= 1.

    Example:
        >>> strip_rows(7, 1, 1)
        12
    """
    span = (kernel_size - 1) * dilation
    halo = span if transpose else (span + 1 - stride) / stride
    return max(1, math.ceil(2 * halo))


@triton.jit
def _strip(Hs, Ws, ROWS, BLOCK_W: tl.constexpr, BLOCK_P: tl.constexpr):
    """This program's (b * G + g), first row, tiles, row in tile and column
    (map of Hs x Ws positions, strips of ROWS rows rounded up to tiles)."""
    n_sub = tl.cdiv(ROWS, BLOCK_P // BLOCK_W)
    n_cb = tl.cdiv(Ws, BLOCK_W)
    n_strip = tl.cdiv(Hs, n_sub * (BLOCK_P // BLOCK_W))
    pid = tl.program_id(0)
    t = pid // n_cb
    lane = tl.arange(0, BLOCK_P)
    col = (pid % n_cb) * BLOCK_W + lane % BLOCK_W
    row0 = (t % n_strip) * n_sub * (BLOCK_P // BLOCK_W)
    return t // n_strip, row0, n_sub, lane // BLOCK_W, col


@_autotune
def _aggregate_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    C,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    ROWS,
    TILE,
    IS_FP64: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    bg, row0, n_sub, r, j = _strip(Ho, Wo, ROWS, BLOCK_W, BLOCK_P)
    g = bg % G
    b = bg // G
    w_base = w_ptr + bg.to(tl.int64) * K * K * P
    for s in range(n_sub):
        i = row0 + s * (BLOCK_P // BLOCK_W) + r
        p_mask = (i < Ho) & (j < Wo)
        pos = i * Wo + j
        for c0 in range(0, Cg, BLOCK_C):
            cl = c0 + tl.arange(0, BLOCK_C)
            c_mask = cl < Cg
            chan = (b * C + g * Cg + cl).to(tl.int64)
            x_rows = x_ptr + chan[:, None] * H * W
            acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
            for u in range(K):
                row = i * stride - padding + u * dilation
                r_ok = p_mask & (row >= 0) & (row < H)
                for v in range(K):
                    col = j * stride - padding + v * dilation
                    ok = r_ok & (col >= 0) & (col < W)
                    wv = tl.load(
                        w_base + (u * K + v) * P + pos, mask=p_mask, other=0.0
                    )
                    xv = tl.load(
                        x_rows + (row * W + col)[None, :],
                        mask=c_mask[:, None] & ok[None, :],
                        other=0.0,
                    )
                    acc += wv.to(acc_t)[None, :] * xv.to(acc_t)
            tl.store(
                y_ptr + chan[:, None] * P + pos[None, :],
                acc.to(y_ptr.dtype.element_ty),
                mask=c_mask[:, None] & p_mask[None, :],
            )


@_autotune
def _transpose_kernel(
    g_ptr,
    w_ptr,
    x_ptr,
    C,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    ROWS,
    TILE,
    IS_FP64: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    # A strip of input positions (h, col).
    bg, row0, n_sub, r, col = _strip(H, W, ROWS, BLOCK_W, BLOCK_P)
    g = bg % G
    b = bg // G
    w_base = w_ptr + bg.to(tl.int64) * K * K * P
    for s in range(n_sub):
        h = row0 + s * (BLOCK_P // BLOCK_W) + r
        p_mask = (h < H) & (col < W)
        for c0 in range(0, Cg, BLOCK_C):
            cl = c0 + tl.arange(0, BLOCK_C)
            c_mask = cl < Cg
            chan = (b * C + g * Cg + cl).to(tl.int64)
            g_rows = g_ptr + chan[:, None] * P
            acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
            for u in range(K):
                # Output row i whose tap u lands on h:
                # i * stride = h + padding - u * dilation.
                ti = h + padding - u * dilation
                i = ti // stride
                r_ok = p_mask & (ti >= 0) & (ti % stride == 0) & (i < Ho)
                for v in range(K):
                    tj = col + padding - v * dilation
                    j = tj // stride
                    ok = r_ok & (tj >= 0) & (tj % stride == 0) & (j < Wo)
                    wv = tl.load(
                        w_base + (u * K + v) * P + i * Wo + j,
                        mask=ok,
                        other=0.0,
                    )
                    gv = tl.load(
                        g_rows + (i * Wo + j)[None, :],
                        mask=c_mask[:, None] & ok[None, :],
                        other=0.0,
                    )
                    acc += wv.to(acc_t)[None, :] * gv.to(acc_t)
            tl.store(
                x_ptr + chan[:, None] * H * W + (h * W + col)[None, :],
                acc.to(x_ptr.dtype.element_ty),
                mask=c_mask[:, None] & p_mask[None, :],
            )


@_autotune
def _correlate_kernel(
    q_ptr,
    x_ptr,
    out_ptr,
    C,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    ROWS,
    TILE,
    IS_FP64: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    bg, row0, n_sub, r, j = _strip(Ho, Wo, ROWS, BLOCK_W, BLOCK_P)
    g = bg % G
    b = bg // G
    out_base = out_ptr + bg.to(tl.int64) * K * K * P
    for s in range(n_sub):
        i = row0 + s * (BLOCK_P // BLOCK_W) + r
        p_mask = (i < Ho) & (j < Wo)
        pos = i * Wo + j
        # One loop over the taps: a nest of four loops spills on sm_80.
        for uv in range(K * K):
            row = i * stride - padding + (uv // K) * dilation
            col = j * stride - padding + (uv % K) * dilation
            ok = p_mask & (row >= 0) & (row < H) & (col >= 0) & (col < W)
            acc = tl.zeros([BLOCK_P], dtype=acc_t)
            # Channel by channel, BLOCK_C loads in flight: a sum across the
            # lanes of a (channels x positions) tile spills on sm_80.
            for c0 in range(0, Cg, BLOCK_C):
                for cc in tl.static_range(BLOCK_C):
                    c_ok = c0 + cc < Cg
                    chan = (b * C + g * Cg + c0 + cc).to(tl.int64)
                    # The query row is re-read for every tap, from cache.
                    qv = tl.load(
                        q_ptr + chan * P + pos, mask=p_mask & c_ok, other=0.0
                    )
                    xv = tl.load(
                        x_ptr + chan * H * W + row * W + col,
                        mask=ok & c_ok,
                        other=0.0,
                    )
                    acc += qv.to(acc_t) * xv.to(acc_t)
            tl.store(
                out_base + uv * P + pos,
                acc.to(out_ptr.dtype.element_ty),
                mask=p_mask,
            )


KERNELS = {
    'aggregate': _aggregate_kernel,
    'aggregate_transpose': _transpose_kernel,
    'correlate': _correlate_kernel,
}
