"""Fused local attention on CUDA: the tile configs, the autotuning and the
launches of the Triton kernels of :mod:`.triton_fused_attention_kernels`
(forward, grad_query, grad_kv), which correlate, softmax over the K x K
window and aggregate in one pass with an online softmax, and never write
the attention map or its logits, forward or backward.

:func:`forward` and :func:`backward` are the contract of
``mmevo.ops.fused_attention`` (arguments checked there, B >= 1 and
C >= 1). grad_query's programs keep partial sums of grad_rel_embed and
grad_rel_bias, summed in a fixed order afterwards, so a backward is
bitwise repeatable; :func:`embed_strips` keeps the partials at most
1/:data:`PARTIAL_FRACTION` of the attention map. Reflect padding is read
in the kernels (reflected indices); grad_key and grad_value are then
gathered on the padded map and folded onto the map
(:func:`~mmevo.ops.reflect.fold_reflect`, deterministic).

The tile configs are data, :data:`GPU_CONFIGS` (the candidates on CUDA
and the AOT matrix's), pruned to the widest tile that holds a head's
channels without spilling (:func:`head_configs`); under
``TRITON_INTERPRET=1`` one small tile, :data:`CONFIGS`.
"""

import os

import torch
import triton
from torch.fx.experimental.symbolic_shapes import optimization_hint

from . import triton_fused_attention_kernels as kernels
from .reflect import fold_reflect

_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
# grad_query's partials: at most this fraction of the attention map's size.
PARTIAL_FRACTION = 16


# Elements of a (head channels x pixels) tile per thread: the widest tiles
# of at most this many are run (more spill on sm_80 / sm_90 / sm_100).
MAX_PER_THREAD = 8
# (BLOCK_P, num_warps) of the three kernels: pixels of a tile, whose head
# channels (BLOCK_D x BLOCK_P, BLOCK_DV x BLOCK_P) sit in registers. The
# narrowest holds fp64 heads of 128 channels (grad_query spilled at 16
# pixels).
GPU_CONFIGS = [
    triton.Config({'BLOCK_P': bp}, num_warps=nw)
    for bp, nw in [(64, 4), (32, 4), (16, 4), (16, 8), (8, 8)]
]
# One small tile under the interpreter, which is slow: the tests' tiny
# maps have several tiles and masked edges.
INTERPRET_CONFIGS = [triton.Config({'BLOCK_P': 16}, num_warps=4)]
CONFIGS = INTERPRET_CONFIGS if _INTERPRET else GPU_CONFIGS
# Tuned per layer type, not per map size (detection inputs vary in size).
_KEY = ['C', 'Cv', 'G', 'K', 'stride', 'dilation']


def per_thread(config, block_d):
    """Elements of a ``block_d`` x BLOCK_P tile per thread of ``config``."""
    return block_d * config.kwargs['BLOCK_P'] / (32 * config.num_warps)


def head_configs(block_d, fp64=False, configs=None):
    """Positions in ``configs`` (default :data:`GPU_CONFIGS`) of the tiles
    run for heads of ``block_d`` channels (C/G and C_v/G rounded up to
    powers of 2, the wider): the widest of at most
    :data:`MAX_PER_THREAD` elements per thread (else the narrowest), an
    fp64 element counting twice.

    Example:
        >>> head_configs(16), head_configs(64), head_configs(256)
        ([0], [2], [4])
        >>> head_configs(16, fp64=True)
        [1]
    """
    configs = GPU_CONFIGS if configs is None else configs
    words = 2 * block_d if fp64 else block_d
    width = [per_thread(c, words) for c in configs]
    fits = [w for w in width if w <= MAX_PER_THREAD]
    best = max(fits) if fits else min(width)
    return [k for k, w in enumerate(width) if w == best]


def _prune(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    block_d = max(args['BLOCK_D'], args['BLOCK_DV'])
    kept = head_configs(block_d, args['IS_FP64'], configs)
    return [configs[k] for k in kept]


def _autotune(fn, **kwargs):
    return triton.autotune(
        configs=CONFIGS,
        key=_KEY,
        prune_configs_by={'early_config_prune': _prune},
        **kwargs,
    )(fn)


KERNELS = {
    'forward': _autotune(kernels.forward_kernel),
    # the partials are accumulated: zeroed again before each timed run
    'grad_query': _autotune(
        kernels.grad_query_kernel,
        reset_to_zero=['gr_ptr', 'gbias_ptr'],
    ),
    'grad_kv': _autotune(kernels.grad_kv_kernel),
}


def embed_strips(positions, head_channels, block_p):
    """Strips of grad_query's programs per (batch, head) over
    ``positions`` output pixels (tiles of ``block_p``): as many as keep
    the partials of grad_rel_embed (``head_channels`` per head and strip)
    at most 1/:data:`PARTIAL_FRACTION` of the attention map.

    Example:
        >>> embed_strips(56 * 56, 16, 16)
        12
    """
    tiles = triton.cdiv(positions, block_p)
    most = max(1, positions // (PARTIAL_FRACTION * head_channels))
    return max(1, min(tiles, most))


def _scalars(query, key, value, groups, window):
    C, Ho, Wo = query.shape[1:]
    H, W = key.shape[2:]
    return (
        C,
        value.shape[1],
        H,
        W,
        groups,
        Ho,
        Wo,
        window.kernel_size,
        window.stride,
        window.padding,
        window.dilation,
    )


def _consts(query, value, rel_embed, rel_bias, groups, window):
    C, Cv = query.shape[1], value.shape[1]
    return dict(
        HAS_EMBED=rel_embed is not None,
        HAS_BIAS=rel_bias is not None,
        REFLECT=window.reflects,
        IS_FP64=query.dtype == torch.float64,
        BLOCK_D=triton.next_power_of_2(C // groups),
        BLOCK_DV=triton.next_power_of_2(Cv // groups),
    )


def _contiguous(*tensors):
    return [None if t is None else t.contiguous() for t in tensors]


def _grid(n):
    return lambda meta: (n(meta),)


def forward(query, key, value, rel_embed, rel_bias, groups, window):
    """The fused local attention's output (B, C_v, H_out, W_out), in the
    query's dtype, and the log-sum-exp of each pixel's logits (B, G,
    H_out, W_out), in float32 (float64 for float64): the semantics of
    ``ATTN_SPEC.md`` (``mmevo.ops.fused_attention``), arguments checked.

    Args:
        query (Tensor): (B, C, H_out, W_out), scaled.
        key (Tensor): (B, C, H, W).
        value (Tensor): (B, C_v, H, W).
        rel_embed (Tensor | None): (C, K, K), added to the key per tap.
        rel_bias (Tensor | None): (G, K, K), added to the logits.
        groups (int): G, the heads.
        window (mmevo.ops.checks.Window): the window, resolved.

    Example:
        >>> from mmevo.ops.checks import Window
        >>> q, k = torch.randn(1, 4, 5, 5), torch.randn(1, 4, 5, 5)
        >>> out, lse = forward(q, k, k, None, None, 2, Window(3, 1, 1))
        >>> out.shape, lse.shape
        (torch.Size([1, 4, 5, 5]), torch.Size([1, 2, 5, 5]))
    """
    query, key, value, rel_embed, rel_bias = _contiguous(
        query, key, value, rel_embed, rel_bias
    )
    B, _, Ho, Wo = query.shape
    acc = torch.promote_types(query.dtype, torch.float32)
    out = query.new_empty(B, value.shape[1], Ho, Wo)
    lse = query.new_empty(B, groups, Ho, Wo, dtype=acc)
    if Ho * Wo == 0:
        return out, lse
    consts = _consts(query, value, rel_embed, rel_bias, groups, window)
    KERNELS['forward'][
        _grid(lambda meta: B * groups * triton.cdiv(Ho * Wo, meta['BLOCK_P']))
    ](
        query,
        key,
        value,
        query if rel_embed is None else rel_embed,
        query if rel_bias is None else rel_bias,
        out,
        lse,
        *_scalars(query, key, value, groups, window),
        **consts,
    )
    return out, lse


def backward(
    grad, out, lse, query, key, value, rel_embed, rel_bias, groups, window
):
    """(grad_query, grad_key, grad_value, grad_rel_embed, grad_rel_bias) of
    the fused local attention, from ``grad`` (B, C_v, H_out, W_out) and
    the saved ``out`` and ``lse`` of :func:`forward`; each grad in its
    argument's dtype, None for an absent rel_embed / rel_bias.
    Deterministic: no atomics, the partials summed in a fixed order.

    Example:
        >>> from mmevo.ops.checks import Window
        >>> q, k = torch.randn(1, 4, 3, 3), torch.randn(1, 4, 5, 5)
        >>> w, r = Window(3, 2, 1, 1, 'reflect'), torch.randn(4, 3, 3)
        >>> out, lse = forward(q, k, k, r, None, 2, w)
        >>> grads = backward(out, out, lse, q, k, k, r, None, 2, w)
        >>> [None if g is None else tuple(g.shape) for g in grads]
        [(1, 4, 3, 3), (1, 4, 5, 5), (1, 4, 5, 5), (4, 3, 3), None]
    """
    grad, out, lse, query, key, value, rel_embed, rel_bias = _contiguous(
        grad, out, lse, query, key, value, rel_embed, rel_bias
    )
    B, C, Ho, Wo = query.shape
    H, W = key.shape[2:]
    Cv = value.shape[1]
    K, p = window.kernel_size, window.padding
    acc = lse.dtype
    gq = torch.empty_like(query)
    if Ho * Wo == 0:
        gk, gv = torch.zeros_like(key), torch.zeros_like(value)
        return gq, gk, gv, *_rel_grads(None, None, rel_embed, rel_bias)
    consts = _consts(query, value, rel_embed, rel_bias, groups, window)
    scalars = _scalars(query, key, value, groups, window)
    r = query if rel_embed is None else rel_embed
    bias = query if rel_bias is None else rel_bias
    delta = torch.empty_like(lse)
    # the partials' buffers are allocated before the launch, so the strips
    # cannot depend on the autotuned BLOCK_P: sized for the smallest (a
    # larger tile takes fewer strips, the other rows stay zero)
    least = min(c.kwargs['BLOCK_P'] for c in CONFIGS)
    positions = optimization_hint(Ho * Wo)
    strips = (
        embed_strips(positions, C // groups, least)
        if rel_embed is not None
        else triton.cdiv(positions, least)
    )
    # the partials, in fp32 at least; a one-element stand-in when absent
    # (never the inputs: the autotuner zeroes them before each timed run)
    gr = lse.new_zeros(
        (B * strips, C, K * K) if rel_embed is not None else (1,)
    )
    gb = lse.new_zeros(
        (B * strips, groups, K * K) if rel_bias is not None else (1,)
    )

    def n_query(meta):
        tiles = triton.cdiv(Ho * Wo, meta['BLOCK_P'])
        return B * groups * min(strips, tiles)

    KERNELS['grad_query'][_grid(n_query)](
        grad,
        out,
        query,
        key,
        value,
        r,
        bias,
        gq,
        lse,
        delta,
        gr,
        gb,
        *scalars,
        strips,
        **consts,
    )
    # reflect: gathered on the padded map, folded onto the map after
    if window.reflects:
        Ht, Wt = H + 2 * p, W + 2 * p
        gk = key.new_empty(B, C, Ht, Wt, dtype=acc)
        gv = value.new_empty(B, Cv, Ht, Wt, dtype=acc)
    else:
        Ht, Wt = H, W
        gk, gv = torch.empty_like(key), torch.empty_like(value)

    def n_kv(meta):
        return B * groups * triton.cdiv(Ht * Wt, meta['BLOCK_P'])

    KERNELS['grad_kv'][_grid(n_kv)](
        grad,
        query,
        key,
        value,
        r,
        bias,
        gk,
        gv,
        lse,
        delta,
        *scalars,
        **consts,
    )
    if window.reflects:
        gk = fold_reflect(gk, p, H, W).to(key.dtype)
        gv = fold_reflect(gv, p, H, W).to(value.dtype)
    return gq, gk, gv, *_rel_grads(gr, gb, rel_embed, rel_bias)


def _rel_grads(gr, gb, rel_embed, rel_bias):
    """grad_rel_embed (C, K, K) and grad_rel_bias (G, K, K) from the
    programs' partial sums (None: no pixels), summed in a fixed order;
    None for an absent argument."""

    def total(part, like):
        if like is None:
            return None
        if part is None:
            return torch.zeros_like(like)
        return part.sum(0).to(like.dtype).reshape(like.shape)

    return total(gr, rel_embed), total(gb, rel_bias)


# Head channels (BLOCK_D = BLOCK_DV) that the AOT matrix compiles: SASA's
# and ACmix's heads, 16 to 128 channels, each config once. (fp64, left out
# of the matrix, spills 24 to 88 bytes in grad_query at 128.)
AOT_BLOCK_D = (16, 32, 64, 128)
# (pointers, of which the first are in the tensors' dtype; the rest: lse,
# D and the partials, in fp32 at least)
_POINTERS = {'forward': (7, 6), 'grad_query': (12, 8), 'grad_kv': (10, 8)}


def aot_jobs(dtypes=('fp32', 'fp16', 'bf16', 'fp64')):
    """Every (kernel, dtype, config, block_d) compiled on CUDA: the rows
    the AOT matrix lists (times its targets), arguments of
    :func:`aot_source`.

    Example:
        >>> len(aot_jobs(['fp16']))
        12
    """
    return [
        dict(kernel=kernel, dtype=dtype, config=k, block_d=bd)
        for kernel in KERNELS
        for dtype in dtypes
        for bd in AOT_BLOCK_D
        for k in head_configs(bd, dtype == 'fp64')
    ]


def aot_source(kernel, dtype, config, block_d=64, reflect=False):
    """What ``triton.compile`` takes for one compile of a kernel on CUDA:
    ``(ASTSource, options)``, for the AOT matrix (no GPU needed), with
    rel_embed and rel_bias and heads of ``block_d`` channels.

    Args:
        kernel (str): a key of :data:`KERNELS`.
        dtype (str): 'fp32', 'fp16', 'bf16' or 'fp64'.
        config (int): one of ``head_configs(block_d, dtype == 'fp64')``.
        block_d (int): the head channels (BLOCK_D = BLOCK_DV), a power
            of 2.
        reflect (bool): reflect padding instead of zeros (grad_kv's
            gradients are then fp32 buffers of the padded map).

    Example:
        >>> src, options = aot_source('forward', 'fp16', 2, block_d=64)
        >>> options['num_warps']
        4
    """
    from triton.compiler import ASTSource

    if kernel not in KERNELS:
        raise ValueError(
            f'kernel must be one of {list(KERNELS)}, got {kernel}'
        )
    if config not in head_configs(block_d, dtype == 'fp64'):
        raise ValueError(
            f'config {config} is not run with block_d={block_d} '
            '(see head_configs)'
        )
    fn = KERNELS[kernel].fn
    conf = GPU_CONFIGS[config]
    consts = dict(
        HAS_EMBED=True,
        HAS_BIAS=True,
        REFLECT=reflect,
        IS_FP64=dtype == 'fp64',
        BLOCK_D=block_d,
        BLOCK_DV=block_d,
        **conf.kwargs,
    )
    acc = 'fp64' if dtype == 'fp64' else 'fp32'
    names = fn.arg_names
    n_ptr, n_typed = _POINTERS[kernel]
    if kernel == 'grad_kv' and reflect:
        n_typed -= 2  # gk and gv: the padded map's, accumulated
    sig = {n: 'constexpr' if n in consts else 'i32' for n in names}
    for k, n in enumerate(names[:n_ptr]):
        sig[n] = f'*{dtype if k < n_typed else acc}'
    options = dict(num_warps=conf.num_warps, num_stages=conf.num_stages)
    return ASTSource(fn, sig, consts), options
