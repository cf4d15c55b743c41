"""Fused involution on CUDA: the tile configs, the autotuning and the
launches of the Triton kernels of :mod:`.triton_fused_kernels` (forward,
grad_input, grad_span), which compute the involution kernel ``W = S z + b``
per tile in registers and never write it.

grad_span's programs keep partial sums of grad_S and grad_b, summed in a
fixed order afterwards (:func:`fused_involution_backward`), so a backward
is bitwise repeatable; :func:`span_strips` keeps the partials at most
1/:data:`PARTIAL_FRACTION` of the kernel map. The tile configs are data,
:data:`GPU_CONFIGS` (the autotuned candidates on CUDA, the AOT matrix's);
under ``TRITON_INTERPRET=1`` one config each, :data:`CONFIGS`.
"""

import os

import torch
import triton
from torch.fx.experimental.symbolic_shapes import optimization_hint

from . import triton_fused_kernels as kernels

_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
# Widest z-channel block of grad_span (wider C_r: several blocks, each
# recomputing dW).
MAX_BLOCK_R = 64
# grad_span's widest tile, BLOCK_P x BLOCK_R (see span_configs).
MAX_SPAN_TILE = 1024
# grad_span's partials: at most this fraction of the kernel map's size.
PARTIAL_FRACTION = 16


def _configs(rows, names):
    return [
        triton.Config(
            dict(zip(names, row[:-1], strict=True)), num_warps=row[-1]
        )
        for row in rows
    ]


# (BLOCK_C, BLOCK_P, num_warps) of forward and grad_input; (BLOCK_T: rows
# of the kernel map per step, BLOCK_P, num_warps) of grad_span, whose
# BLOCK_R is C_r's (see block_r). tl.dot needs every side >= 16.
GPU_CONFIGS = {
    'forward': _configs(
        [(16, 64, 4), (16, 128, 4), (32, 64, 4), (8, 256, 4), (32, 128, 8)],
        ('BLOCK_C', 'BLOCK_P'),
    ),
    'grad_input': _configs(
        [(16, 64, 4), (16, 128, 4), (32, 64, 4), (8, 256, 4), (32, 128, 8)],
        ('BLOCK_C', 'BLOCK_P'),
    ),
    'grad_span': _configs(
        [(16, 16, 8), (16, 32, 8), (16, 16, 4)], ('BLOCK_T', 'BLOCK_P')
    ),
}
# One tile under the interpreter, which is slow; small, so that the tests'
# tiny maps have several tiles and masked edges.
INTERPRET_CONFIGS = {
    'forward': _configs([(4, 16, 4)], ('BLOCK_C', 'BLOCK_P')),
    'grad_input': _configs([(4, 16, 4)], ('BLOCK_C', 'BLOCK_P')),
    'grad_span': _configs([(16, 16, 4)], ('BLOCK_T', 'BLOCK_P')),
}
CONFIGS = INTERPRET_CONFIGS if _INTERPRET else GPU_CONFIGS
# Tuned per layer type, not per map size (detection inputs vary in size).
_KEY = ['C', 'Cr', 'G', 'K', 'stride', 'dilation']


def span_configs(block_r, fp64=False, configs=None):
    """Positions in ``configs`` (default ``GPU_CONFIGS['grad_span']``) of
    the grad_span tiles run with z-channel block ``block_r``: those of at
    most :data:`MAX_SPAN_TILE` (BLOCK_P x BLOCK_R) elements (wider ones
    spill on sm_100), on 4 warps for fp64 and 8 for the other dtypes
    (each spills on sm_80 / sm_90 on the other count).

    Example:
        >>> span_configs(64), span_configs(16, fp64=True)
        ([0], [2])
    """
    configs = GPU_CONFIGS['grad_span'] if configs is None else configs
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
    """grad_span's z-channel block: C_r rounded up to a power of 2, from 16
    (``tl.dot``'s least) to :data:`MAX_BLOCK_R`."""
    return min(max(triton.next_power_of_2(reduced_channels), 16), MAX_BLOCK_R)


def span_strips(positions, reduced_channels, block_p):
    """Strips of grad_span's programs over ``positions`` output positions
    (tiles of ``block_p``): as many as keep the partials of grad_S at most
    1/:data:`PARTIAL_FRACTION` of the kernel map.

    Example:
        >>> span_strips(56 * 56, 16, 64)
        12
    """
    tiles = triton.cdiv(positions, block_p)
    most = max(1, positions // (PARTIAL_FRACTION * max(reduced_channels, 1)))
    return max(1, min(tiles, most))


KERNELS = {
    'forward': _autotune('forward', kernels.forward_kernel),
    'grad_input': _autotune('grad_input', kernels.grad_input_kernel),
    # the partials are accumulated: zeroed again before each timed run
    'grad_span': _autotune(
        'grad_span',
        kernels.grad_span_kernel,
        reset_to_zero=['gs_ptr', 'gb_ptr'],
        prune_configs_by={'early_config_prune': _prune_span},
    ),
}


def _window(input, z, kernel_size, stride, dilation, groups):
    """The scalar arguments shared by the three kernels."""
    _B, C, H, W = input.shape
    Cr, Ho, Wo = z.shape[1:]
    padding = dilation * (kernel_size - 1) // 2
    return (
        C,
        Cr,
        H,
        W,
        groups,
        Ho,
        Wo,
        kernel_size,
        stride,
        padding,
        dilation,
    )


def _consts(input, span_bias):
    return dict(
        HAS_BIAS=span_bias is not None, IS_FP64=input.dtype == torch.float64
    )


def _grid(n):
    return lambda meta: (n(meta),)


def fused_involution_forward(
    input, z, span_weight, span_bias, kernel_size, stride, dilation, groups
):
    """The fused involution's output (arguments as
    :func:`mmevo.ops.fused_involution`'s, checked by the caller): NCHW,
    the dtype of ``input``.

    Example:
        >>> x, z = torch.randn(2, 8, 5, 7), torch.randn(2, 4, 5, 7)
        >>> s, b = torch.randn(2 * 9, 4, 1, 1), torch.randn(2 * 9)
        >>> fused_involution_forward(x, z, s, b, 3, 1, 1, 2).shape
        torch.Size([2, 8, 5, 7])
    """
    input, z, span_weight = (t.contiguous() for t in (input, z, span_weight))
    bias = span_weight if span_bias is None else span_bias.contiguous()
    B, C = input.shape[:2]
    Ho, Wo = z.shape[2:]
    y = input.new_empty(B, C, Ho, Wo)
    if y.numel() == 0:
        return y.zero_()

    def n(meta):
        return (
            B
            * groups
            * triton.cdiv(C // groups, meta['BLOCK_C'])
            * triton.cdiv(Ho * Wo, meta['BLOCK_P'])
        )

    KERNELS['forward'][_grid(n)](
        input,
        z,
        span_weight,
        bias,
        y,
        *_window(input, z, kernel_size, stride, dilation, groups),
        **_consts(input, span_bias),
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
):
    """(grad_input, grad_z, grad_span_weight, grad_span_bias) of the fused
    involution, from ``grad`` (B, C, H_out, W_out) and the saved ``input``
    and ``z``; each grad in its argument's dtype (grad_span_bias in
    ``span_weight``'s, also without a bias).

    Example:
        >>> x, z = torch.randn(2, 8, 5, 7), torch.randn(2, 4, 3, 4)
        >>> s, gy = torch.randn(9, 4, 1, 1), torch.randn(2, 8, 3, 4)
        >>> [g.shape[0] for g in fused_involution_backward(
        ...     gy, x, z, s, None, 3, 2, 1, 1)]
        [2, 2, 9, 9]
    """
    grad, input, z, span_weight = (
        t.contiguous() for t in (grad, input, z, span_weight)
    )
    bias = span_weight if span_bias is None else span_bias.contiguous()
    B, C, H, W = input.shape
    Cr, Ho, Wo = z.shape[1:]
    rows = span_weight.shape[0]
    acc = torch.promote_types(input.dtype, torch.float32)
    # every element is written by the kernels
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
    window = _window(input, z, kernel_size, stride, dilation, groups)
    consts = _consts(input, span_bias)

    def n_input(meta):
        return (
            B
            * groups
            * triton.cdiv(C // groups, meta['BLOCK_C'])
            * triton.cdiv(H * W, meta['BLOCK_P'])
        )

    KERNELS['grad_input'][_grid(n_input)](
        grad, z, span_weight, bias, gx, *window, **consts
    )
    # the partials' buffers are allocated before the launch, so the strips
    # cannot depend on the autotuned BLOCK_P: sized for the smallest (a
    # larger tile leaves the last strips empty)
    strips = span_strips(
        optimization_hint(Ho * Wo),
        Cr,
        min(c.kwargs['BLOCK_P'] for c in CONFIGS['grad_span']),
    )
    # a row of grad_S and one of grad_b per (batch, strip), in fp32 at least
    gs = span_weight.new_zeros(B * strips, rows, Cr, dtype=acc)
    gb = span_weight.new_zeros(B * strips, rows, dtype=acc)
    br = block_r(Cr)
    n_span = B * strips * max(1, triton.cdiv(Cr, br))
    KERNELS['grad_span'][_grid(lambda meta: n_span)](
        grad,
        input,
        z,
        span_weight,
        gz,
        gs,
        gb,
        *window,
        strips,
        IS_FP64=consts['IS_FP64'],
        BLOCK_R=br,
    )
    return gx, gz, *_span_grads(gs, gb, span_weight)


def _span_grads(gs, gb, span_weight):
    """grad_S (G*K*K, C_r, 1, 1) and grad_b (G*K*K,) from the programs'
    partial sums, summed in a fixed order."""
    dtype = span_weight.dtype
    return gs.sum(0).to(dtype).reshape(span_weight.shape), gb.sum(0).to(dtype)


# grad_span's z-channel blocks that the AOT matrix compiles: RedNet's C_r
# (C / 4 of 64 to 512 channels) rounded up, and the widest.
AOT_BLOCK_R = (16, 32, 64)
_POINTERS = {'forward': 5, 'grad_input': 5, 'grad_span': 7}
# Pointers in the dtype of the tensors (the rest: the grad_span partials,
# in fp32 at least).
_DTYPED = {'forward': 5, 'grad_input': 5, 'grad_span': 5}


def aot_jobs(dtypes=('fp32', 'fp16', 'bf16', 'fp64')):
    """Every (kernel, dtype, config, block_r) compiled on CUDA: the rows
    the AOT matrix lists (times its targets), arguments of
    :func:`aot_source`.

    Example:
        >>> len(aot_jobs(['fp16']))
        15
    """
    jobs = []
    for kernel in KERNELS:
        for dtype in dtypes:
            if kernel != 'grad_span':
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
        config (int): position in ``GPU_CONFIGS[kernel]`` (for grad_span,
            one of ``span_configs(block_r, dtype == 'fp64')``).
        has_bias (bool): the span convolution has a bias (forward and
            grad_input).
        block_r (int, optional): grad_span's ``BLOCK_R``, one of
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
    consts = dict(IS_FP64=dtype == 'fp64', **conf.kwargs)
    if kernel == 'grad_span':
        consts['BLOCK_R'] = block_r or MAX_BLOCK_R
        if config not in span_configs(consts['BLOCK_R'], dtype == 'fp64'):
            raise ValueError(
                f'grad_span config {config} is not run with block_r='
                f'{consts["BLOCK_R"]} (see span_configs)'
            )
    else:
        consts['HAS_BIAS'] = has_bias
    acc = 'fp64' if dtype == 'fp64' else 'fp32'
    names = fn.arg_names
    sig = {n: 'constexpr' if n in consts else 'i32' for n in names}
    for k, n in enumerate(names[: _POINTERS[kernel]]):
        sig[n] = f'*{dtype if k < _DTYPED[kernel] else acc}'
    options = dict(num_warps=conf.num_warps, num_stages=conf.num_stages)
    return ASTSource(fn, sig, consts), options
