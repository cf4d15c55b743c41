"""Fused involution on CUDA: the tiling, the tile configs, the autotuning
and the launches of the Triton kernels of :mod:`.triton_fused_kernels`
(forward, backward), which compute the involution kernel ``W = S z + b``
per tile in registers and never write it.

Both kernels cut the output map into the tiles of :func:`tile_shape`: as
many as keep each operand read at most :data:`HALO_FACTOR` times (the halo
of the neighbouring tiles) and the backward's partial sums of grad_S and
grad_b at most 1/:data:`PARTIAL_FRACTION` of the kernel map. The partials
are summed in a fixed order afterwards (:func:`fused_involution_backward`),
so a backward is bitwise repeatable. The tile configs are data,
:data:`GPU_CONFIGS` (the autotuned candidates on CUDA, the AOT matrix's);
under ``TRITON_INTERPRET=1`` one config each, :data:`CONFIGS`.
"""

import functools
import os

import torch
import triton
from torch.fx.experimental.symbolic_shapes import optimization_hint

from . import triton_fused_kernels as kernels

_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
# Widest z-channel block of the backward (wider C_r: several blocks, each
# recomputing dW).
MAX_BLOCK_R = 64
# The backward's widest (BLOCK_P x BLOCK_R) kernel-gradient tile (see
# span_configs).
MAX_SPAN_TILE = 1024
# The backward's partials: at most this fraction of the kernel map's size.
PARTIAL_FRACTION = 16
# Each operand read at most this many times its size (tile_shape).
HALO_FACTOR = 1.5


def _configs(rows, names, maxnreg=None):
    return [
        triton.Config(
            dict(zip(names, row[:-1], strict=True)),
            num_warps=row[-1],
            maxnreg=maxnreg,
        )
        for row in rows
    ]


# (BLOCK_C, BLOCK_P, num_warps) of the forward; (BLOCK_T: rows of the
# kernel map per step, BLOCK_P, BLOCK_C, BLOCK_Q: grad_x's channels and
# positions per step, num_warps) of the backward, whose BLOCK_R is C_r's
# (see block_r). tl.dot needs every side >= 16.
_BACKWARD = ('BLOCK_T', 'BLOCK_P', 'BLOCK_C', 'BLOCK_Q')
GPU_CONFIGS = {
    'forward': _configs(
        [(16, 64, 4), (16, 128, 4), (32, 64, 4), (8, 256, 4), (32, 128, 8)],
        ('BLOCK_C', 'BLOCK_P'),
    ),
    # ptxas left to itself gives the backward 128 (8 warps) or 80 (4)
    # registers and spills; given the most, it takes what it needs
    'backward': _configs(
        [(16, 16, 16, 128, 8), (16, 32, 16, 128, 8), (16, 16, 16, 64, 4)],
        _BACKWARD,
        maxnreg=255,
    ),
}
# One tile under the interpreter, which is slow; small, so that the tests'
# tiny maps have several sub-tiles and masked edges.
INTERPRET_CONFIGS = {
    'forward': _configs([(4, 16, 4)], ('BLOCK_C', 'BLOCK_P')),
    'backward': _configs([(16, 16, 4, 16, 4)], _BACKWARD),
}
CONFIGS = INTERPRET_CONFIGS if _INTERPRET else GPU_CONFIGS
# Tuned per layer type, not per map size (detection inputs vary in size).
_KEY = ['C', 'Cr', 'G', 'K', 'stride', 'dilation']


def span_configs(block_r, fp64=False, configs=None):
    """Positions in ``configs`` (default ``GPU_CONFIGS['backward']``) of
    the backward's tiles run with z-channel block ``block_r``: those of at
    most :data:`MAX_SPAN_TILE` (BLOCK_P x BLOCK_R) elements (wider ones
    spill on sm_100), on 4 warps for fp64 and 8 for the other dtypes
    (each spills on sm_80 / sm_90 on the other count).

    Example:
        >>> span_configs(64), span_configs(16, fp64=True)
        ([0], [2])
    """
    configs = GPU_CONFIGS['backward'] if configs is None else configs
    return [
        k
        for k, c in enumerate(configs)
        if c.kwargs['BLOCK_P'] * block_r <= MAX_SPAN_TILE
        and (c.num_warps == 4) == fp64
    ]


def _prune_span(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    kept = span_configs(args['BLOCK_R'], args['IS_FP64'], configs)
    # the interpreter's one config, whatever it is
    return [configs[k] for k in kept] or configs[:1]


def _autotune(name, fn, **kwargs):
    return triton.autotune(configs=CONFIGS[name], key=_KEY, **kwargs)(fn)


def block_r(reduced_channels):
    """The backward's z-channel block: C_r rounded up to a power of 2, from
    16 (``tl.dot``'s least) to :data:`MAX_BLOCK_R`."""
    return min(max(triton.next_power_of_2(reduced_channels), 16), MAX_BLOCK_R)


def halo_reads(n_out, n_in, tile, kernel_size, stride, dilation):
    """Along one axis cut in tiles of ``tile`` output lines: the input
    lines the tiles' windows read, and the output lines that the taps of
    their input tiles (``stride`` times theirs) come from, summed over the
    tiles, per line of each map: (x's, grad_y's) reads per element.
    Intervals: at least the lines the kernels load.

    Example:
        >>> halo_reads(56, 56, 14, 7, 1, 1)
        (1.3214285714285714, 1.3214285714285714)
    """
    span = (kernel_size - 1) * dilation
    pad = span // 2
    x = g = 0
    for r0 in range(0, n_out, tile):
        r1 = min(r0 + tile, n_out)
        x += min(n_in, stride * (r1 - 1) - pad + span + 1)
        x -= max(0, stride * r0 - pad)
        first = -(-(stride * r0 + pad - span) // stride)
        last = (min(stride * r1, n_in) - 1 + pad) // stride
        g += min(n_out - 1, last) - max(0, first) + 1
    return x / n_in, g / n_out


def _tilings(n_out, n_in, kernel_size, stride, dilation):
    """{tile: (tiles, :func:`halo_reads`)} of one axis."""
    out = {}
    for parts in range(1, n_out + 1):
        tile = -(-n_out // parts)
        if tile not in out:
            reads = halo_reads(
                n_out, n_in, tile, kernel_size, stride, dilation
            )
            out[tile] = (-(-n_out // tile), reads)
    return out


@functools.lru_cache(maxsize=1024)
def tile_shape(in_hw, out_hw, kernel_size, stride, dilation, reduced_channels):
    """(TILE_H, TILE_W) output positions of a program of both kernels: the
    most tiles (parallelism) with every operand read at most
    :data:`HALO_FACTOR` times (:func:`halo_reads`, x over its windows and
    grad_y and z over the taps' sources) and the backward's partials (a
    grad_S per tile) at most 1/:data:`PARTIAL_FRACTION` of the kernel map
    (one tile always qualifies); of those, the fewest reads, then the
    widest.

    Example:
        >>> tile_shape((56, 56), (56, 56), 7, 1, 1, 16)
        (19, 19)
    """
    most = max(
        1,
        out_hw[0] * out_hw[1] // (PARTIAL_FRACTION * max(reduced_channels, 1)),
    )
    window = (kernel_size, stride, dilation)
    best = None
    for th, (nh, (xh, gh)) in _tilings(out_hw[0], in_hw[0], *window).items():
        for tw, (nw, (xw, gw)) in _tilings(
            out_hw[1], in_hw[1], *window
        ).items():
            reads = max(xh * xw, gh * gw)
            fits = nh * nw <= most and reads <= HALO_FACTOR
            key = (fits, nh * nw, -reads, tw)
            if best is None or key > best[0]:
                best = key, (th, tw)
    return best[1]


KERNELS = {
    'forward': _autotune('forward', kernels.forward_kernel),
    # the partials are accumulated: zeroed again before each timed run
    'backward': _autotune(
        'backward',
        kernels.backward_kernel,
        reset_to_zero=['gs_ptr', 'gb_ptr'],
        prune_configs_by={'early_config_prune': _prune_span},
    ),
}


def _window(input, z, kernel_size, stride, dilation, groups, tile):
    """The scalar arguments shared by the two kernels, and the tile count
    of one batch."""
    _B, C, H, W = input.shape
    Cr, Ho, Wo = z.shape[1:]
    if tile is None:
        hint = tuple(int(optimization_hint(n)) for n in (H, W, Ho, Wo))
        tile = tile_shape(
            hint[:2], hint[2:], kernel_size, stride, dilation, Cr
        )
    padding = dilation * (kernel_size - 1) // 2
    scalars = (C, Cr, H, W, groups, Ho, Wo, kernel_size, stride, padding)
    tiles = triton.cdiv(Ho, tile[0]) * triton.cdiv(Wo, tile[1])
    return (*scalars, dilation, *tile), tiles


def _consts(input, span_bias):
    return dict(
        HAS_BIAS=span_bias is not None, IS_FP64=input.dtype == torch.float64
    )


def _check_tile(tile):
    if tile is not None and not (
        len(tile) == 2 and all(isinstance(n, int) and n >= 1 for n in tile)
    ):
        raise ValueError(
            f'tile must be (rows, columns) of ints >= 1, got {tile!r}'
        )


def fused_involution_forward(
    input,
    z,
    span_weight,
    span_bias,
    kernel_size,
    stride,
    dilation,
    groups,
    tile=None,
):
    """The fused involution's output (arguments as
    :func:`mmevo.ops.fused_involution`'s, checked by the caller): NCHW,
    the dtype of ``input``.

    Args:
        tile (tuple[int, int], optional): (rows, columns) of output
            positions per program; default :func:`tile_shape`'s.

    Example:
        >>> x, z = torch.randn(2, 8, 5, 7), torch.randn(2, 4, 5, 7)
        >>> s, b = torch.randn(2 * 9, 4, 1, 1), torch.randn(2 * 9)
        >>> fused_involution_forward(x, z, s, b, 3, 1, 1, 2).shape
        torch.Size([2, 8, 5, 7])
    """
    _check_tile(tile)
    input, z, span_weight = (t.contiguous() for t in (input, z, span_weight))
    bias = span_weight if span_bias is None else span_bias.contiguous()
    B, C = input.shape[:2]
    Ho, Wo = z.shape[2:]
    y = input.new_empty(B, C, Ho, Wo)
    if y.numel() == 0:
        return y.zero_()
    scalars, tiles = _window(
        input, z, kernel_size, stride, dilation, groups, tile
    )

    def grid(meta):
        return (
            B * groups * triton.cdiv(C // groups, meta['BLOCK_C']) * tiles,
        )

    KERNELS['forward'][grid](
        input, z, span_weight, bias, y, *scalars, **_consts(input, span_bias)
    )
    return y


def fused_involution_backward(
    grad,
    input,
    z,
    span_weight,
    span_bias,
    kernel_size,
    stride,
    dilation,
    groups,
    tile=None,
):
    """(grad_input, grad_z, grad_span_weight, grad_span_bias) of the fused
    involution, from ``grad`` (B, C, H_out, W_out) and the saved ``input``
    and ``z``; each grad in its argument's dtype (grad_span_bias in
    ``span_weight``'s, also without a bias). One launch: a program per
    (batch, tile) computes its tile's grad_z, grad_x and partials of
    grad_S and grad_b.

    Args:
        tile (tuple[int, int], optional): as
            :func:`fused_involution_forward`'s.

    Example:
        >>> x, z = torch.randn(2, 8, 5, 7), torch.randn(2, 4, 3, 4)
        >>> s, gy = torch.randn(9, 4, 1, 1), torch.randn(2, 8, 3, 4)
        >>> [g.shape[0] for g in fused_involution_backward(
        ...     gy, x, z, s, None, 3, 2, 1, 1)]
        [2, 2, 9, 9]
    """
    _check_tile(tile)
    grad, input, z, span_weight = (
        t.contiguous() for t in (grad, input, z, span_weight)
    )
    bias = span_weight if span_bias is None else span_bias.contiguous()
    B, C = input.shape[:2]
    Cr, Ho, Wo = z.shape[1:]
    rows = span_weight.shape[0]
    acc = torch.promote_types(input.dtype, torch.float32)
    # every element is written by the kernel
    gx, gz = torch.empty_like(input), torch.empty_like(z)
    if B == 0 or C == 0 or Ho * Wo == 0:
        return (
            gx.zero_(),
            gz.zero_(),
            *_span_grads(
                span_weight.new_zeros(1, rows, Cr, dtype=acc),
                span_weight.new_zeros(1, rows, dtype=acc),
                span_weight,
            ),
        )
    scalars, tiles = _window(
        input, z, kernel_size, stride, dilation, groups, tile
    )
    # a grad_S and a grad_b per program, in fp32 at least
    gs = span_weight.new_zeros(B * tiles, rows, Cr, dtype=acc)
    gb = span_weight.new_zeros(B * tiles, rows, dtype=acc)
    KERNELS['backward'][(B * tiles,)](
        grad,
        input,
        z,
        span_weight,
        bias,
        gx,
        gz,
        gs,
        gb,
        *scalars,
        **_consts(input, span_bias),
        BLOCK_R=block_r(Cr),
    )
    return gx, gz, *_span_grads(gs, gb, span_weight)


def _span_grads(gs, gb, span_weight):
    """grad_S (G*K*K, C_r, 1, 1) and grad_b (G*K*K,) from the programs'
    partial sums, summed in a fixed order."""
    dtype = span_weight.dtype
    return gs.sum(0).to(dtype).reshape(span_weight.shape), gb.sum(0).to(dtype)


# The backward's z-channel blocks that the AOT matrix compiles: RedNet's
# C_r (C / 4 of 64 to 512 channels) rounded up, and the widest.
AOT_BLOCK_R = (16, 32, 64)
_POINTERS = {'forward': 5, 'backward': 9}
# Pointers in the dtype of the tensors (the rest: the backward's partials,
# in fp32 at least).
_DTYPED = {'forward': 5, 'backward': 7}


def aot_jobs(dtypes=('fp32', 'fp16', 'bf16', 'fp64')):
    """Every (kernel, dtype, config, block_r) compiled on CUDA: the rows
    the AOT matrix lists (times its targets), arguments of
    :func:`aot_source`.

    Example:
        >>> len(aot_jobs(['fp16']))
        10
    """
    jobs = []
    for kernel in KERNELS:
        for dtype in dtypes:
            if kernel != 'backward':
                jobs += [
                    dict(kernel=kernel, dtype=dtype, config=k, block_r=None)
                    for k in range(len(GPU_CONFIGS[kernel]))
                ]
                continue
            jobs += [
                dict(kernel=kernel, dtype=dtype, config=k, block_r=br)
                for br in AOT_BLOCK_R
                for k in span_configs(br, dtype == 'fp64')
            ]
    return jobs


def aot_source(kernel, dtype, config, has_bias=True, block_r=None):
    """What ``triton.compile`` takes for one compile of a kernel on CUDA:
    ``(ASTSource, options)``, for the AOT matrix (no GPU needed).

    Args:
        kernel (str): a key of :data:`KERNELS`.
        dtype (str): 'fp32', 'fp16', 'bf16' or 'fp64'.
        config (int): position in ``GPU_CONFIGS[kernel]`` (for the
            backward, one of ``span_configs(block_r, dtype == 'fp64')``).
        has_bias (bool): the span convolution has a bias.
        block_r (int, optional): the backward's ``BLOCK_R``, one of
            :data:`AOT_BLOCK_R` (default the widest).

    Example:
        >>> src, options = aot_source('forward', 'fp16', 0)
        >>> options['num_warps']
        4
    """
    from triton.compiler import ASTSource

    if kernel not in KERNELS:
        raise ValueError(
            f'kernel must be one of {list(KERNELS)}, got {kernel}'
        )
    fn = KERNELS[kernel].fn
    conf = GPU_CONFIGS[kernel][config]
    consts = dict(IS_FP64=dtype == 'fp64', HAS_BIAS=has_bias, **conf.kwargs)
    if kernel == 'backward':
        consts['BLOCK_R'] = block_r or MAX_BLOCK_R
        if config not in span_configs(consts['BLOCK_R'], dtype == 'fp64'):
            raise ValueError(
                f'backward config {config} is not run with block_r='
                f'{consts["BLOCK_R"]} (see span_configs)'
            )
    acc = 'fp64' if dtype == 'fp64' else 'fp32'
    names = fn.arg_names
    sig = {n: 'constexpr' if n in consts else 'i32' for n in names}
    for k, n in enumerate(names[: _POINTERS[kernel]]):
        sig[n] = f'*{dtype if k < _DTYPED[kernel] else acc}'
    options = dict(num_warps=conf.num_warps, num_stages=conf.num_stages)
    if conf.maxnreg is not None:
        options['maxnreg'] = conf.maxnreg
    return ASTSource(fn, sig, consts), options
