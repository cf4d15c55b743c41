"""Fused local attention: correlation, window softmax and aggregation in
one op.

Local self-attention (SASA's :class:`~mmevo.layers.LocalSelfAttention`,
ACmix's attention branch) computes, per head g and output pixel (i, j), the
logits of the K x K key window around it, a softmax over them, and the
weighted sum of the value window. Unfused, the (B, G, K, K, H_out, W_out)
logits and weights are written (and saved for the backward), K*K*G / C_v
times the output's size. ``mmevo::fused_local_attention`` walks each
pixel's taps once with an online softmax (running max, sum and weighted
value sum) and returns the output and each pixel's log-sum-exp ``lse``;
its backward recomputes the logits tap by tap, ``P = exp(logit - lse)``,
as flash attention does, so nothing of size K*K*H*W is written or saved.

Two operators, registered like the other ``torch.ops.mmevo`` ones (schema
and CPU kernel in C++, ``csrc/fused_attention.cpp``, when the extension is
built; Python checks the arguments on every device, picks the backend, and
adds the fake kernels and autograd):

* ``mmevo::fused_local_attention(query, key, value, rel_embed, rel_bias,
  groups, kernel_size, stride, padding, dilation, padding_mode) -> (out,
  lse)``;
* ``mmevo::fused_local_attention_backward(grad, out, lse, <the same>) ->
  (grad_query, grad_key, grad_value, grad_rel_embed, grad_rel_bias)``,
  the last two of shape (0,) when rel_embed / rel_bias is None.

``lse`` is (B, G, H_out, W_out) in float32 (float64 for float64 inputs).
query, key and value are (B, C, H, W) maps or grouped views of them, (B,
G, C / G, H, W); the gradients take the shapes of the inputs.
Backends: the C++ kernel (CPU); on the Triton backend, with
``MMEVO_FUSED_TRITON=1``, the fused Triton kernels of
``mmevo.ops.triton_fused_attention`` when that module exists; elsewhere the
unfused composition on the backend's window primitives, which writes the
weights. A backward with ``create_graph=True`` runs that composition's
differentiable ops, so derivatives of every order exist.
"""

import importlib.util
import os

import torch

from . import backends, cpp_backend, dispatch, library
from .checks import (
    Window,
    check_int,
    check_pair,
    check_tensor,
    map_size,
    size_of,
)
from .evolution import _autocast

SCHEMAS = {
    'fused_local_attention': (
        '(Tensor query, Tensor key, Tensor value, Tensor? rel_embed, '
        'Tensor? rel_bias, int groups, int kernel_size, int stride, '
        'int padding, int dilation, str padding_mode) -> (Tensor, Tensor)'
    ),
    'fused_local_attention_backward': (
        '(Tensor grad, Tensor out, Tensor lse, Tensor query, Tensor key, '
        'Tensor value, Tensor? rel_embed, Tensor? rel_bias, int groups, '
        'int kernel_size, int stride, int padding, int dilation, '
        'str padding_mode) -> (Tensor, Tensor, Tensor, Tensor, Tensor)'
    ),
}

if not cpp_backend.available():  # else the extension defined them
    for _name, _schema in SCHEMAS.items():
        library.LIB.define(_name + _schema)

#: the module of the fused Triton kernels (written separately; optional)
TRITON_MODULE = 'mmevo.ops.triton_fused_attention'

#: the forms of query, key and value: as such, or grouped
FORMS = {
    'query': ('(B, C, H_out, W_out)', '(B, G, C / G, H_out, W_out)'),
    'key': ('(B, C, H, W)', '(B, G, C / G, H, W)'),
    'value': ('(B, C_v, H, W)', '(B, G, C_v / G, H, W)'),
}


def check_map(name: str, t: torch.Tensor, groups: int) -> tuple:
    """``t`` (query, key or value) as (B, C, H, W) or grouped, (B, G, C /
    G, H, W) with G = ``groups``; returns its (B, C, H, W)."""
    flat, grouped = FORMS[name]
    if isinstance(t, torch.Tensor) and t.dim() == 5:
        check_tensor(name, t, 5, grouped)
        if t.shape[1] != groups:
            raise ValueError(
                f'{name} must be {flat} or {grouped} with G = groups = '
                f'{groups}, got {tuple(t.shape)}'
            )
        return (t.shape[0], t.shape[1] * t.shape[2], *t.shape[3:])
    check_tensor(name, t, 4, f'{flat} or {grouped}')
    return tuple(t.shape)


def _flat(t):
    """A grouped map as (B, C, H, W): a view where the strides allow."""
    return t.flatten(1, 2) if t.dim() == 5 else t


def _channels(t):
    """The channel count of a map, grouped or not."""
    return t.shape[1] * t.shape[2] if t.dim() == 5 else t.shape[1]


def _out_layout(value):
    return (
        library.output_layout(value)
        if value.dim() == 4
        else torch.contiguous_format
    )


def check_fused_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rel_embed: torch.Tensor | None,
    rel_bias: torch.Tensor | None,
    groups: int,
    kernel_size: int,
    stride: int,
    padding: int,
    dilation: int,
    padding_mode: str,
) -> tuple[int, int]:
    """Every relation of the fused local attention's (resolved) arguments;
    returns (H_out, W_out).

    Raises a TypeError (a wrong type or dtype) or ValueError (a wrong value
    or shape) naming the argument.

    Example:
        >>> q, k = torch.randn(2, 32, 5, 6), torch.randn(2, 32, 9, 11)
        >>> v = torch.randn(2, 16, 9, 11)
        >>> check_fused_local_attention(q, k, v, None, None, 4, 3, 2, 1, 1,
        ...                             'zeros')
        (5, 6)
    """
    check_int('groups', groups, 1)
    shape_q, shape_k, shape_v = (
        check_map(name, t, groups)
        for name, t in (('query', query), ('key', key), ('value', value))
    )
    check_pair('query', query, 'key', key)
    check_pair('query', query, 'value', value)
    if rel_embed is not None:
        check_tensor('rel_embed', rel_embed, 3, '(C, K, K)')
        check_pair('query', query, 'rel_embed', rel_embed)
    if rel_bias is not None:
        check_tensor('rel_bias', rel_bias, 3, '(G, K, K)')
        check_pair('query', query, 'rel_bias', rel_bias)
    window = Window.resolve(
        kernel_size, stride, padding, dilation, padding_mode
    )
    B, C = size_of(shape_k[0]), size_of(shape_k[1])
    Cv, K = size_of(shape_v[1]), kernel_size
    if C % groups:
        raise ValueError(
            f'key channels ({C}) must be divisible by groups={groups}'
        )
    if Cv % groups:
        raise ValueError(
            f'value channels ({Cv}) must be divisible by groups={groups}'
        )
    if (shape_v[0], *shape_v[2:]) != (shape_k[0], *shape_k[2:]):
        raise ValueError(
            f'value must be (B, C_v, H, W) with the B, H, W of key '
            f'{tuple(key.shape)}, got {tuple(value.shape)}'
        )
    Ho, Wo = (
        map_size(name, size_of(n), window)
        for name, n in zip(
            ('key height', 'key width'), shape_k[2:], strict=True
        )
    )
    if shape_q != (B, C, Ho, Wo):
        raise ValueError(
            f'query must be (B, C, H_out, W_out) = {(B, C, Ho, Wo)} for key '
            f'{tuple(key.shape)} and the window {window}, got '
            f'{tuple(query.shape)}'
        )
    if rel_embed is not None and tuple(rel_embed.shape) != (C, K, K):
        raise ValueError(
            f'rel_embed must be (C, K, K) = {(C, K, K)}, got '
            f'{tuple(rel_embed.shape)}'
        )
    if rel_bias is not None and tuple(rel_bias.shape) != (groups, K, K):
        raise ValueError(
            f'rel_bias must be (G, K, K) = {(groups, K, K)}, got '
            f'{tuple(rel_bias.shape)}'
        )
    return Ho, Wo


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the log-sum-exp (and of the accumulation)."""
    return torch.promote_types(dtype, torch.float32)


def _check_backward(grad, out, lse, query, key, value, *args):
    Ho, Wo = check_fused_local_attention(query, key, value, *args)
    expected = (value.shape[0], _channels(value), Ho, Wo)
    for name, t in (('grad', grad), ('out', out)):
        check_tensor(name, t, 4, '(B, C_v, H_out, W_out)')
        check_pair('query', query, name, t)
        if tuple(t.shape) != expected:
            raise ValueError(
                f'{name} must be (B, C_v, H_out, W_out) = {expected}, got '
                f'{tuple(t.shape)}'
            )
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f'lse must be a Tensor, got {type(lse).__name__}')
    if lse.dtype != lse_dtype(query.dtype):
        raise TypeError(
            f'lse must be {lse_dtype(query.dtype)} for {query.dtype} inputs, '
            f'got {lse.dtype}'
        )
    expected = (value.shape[0], args[2], Ho, Wo)
    if tuple(lse.shape) != expected or lse.device != query.device:
        raise ValueError(
            f'lse must be (B, G, H_out, W_out) = {expected} on '
            f'{query.device}, got {tuple(lse.shape)} on {lse.device}'
        )
    return Ho, Wo


# ------------------------------------------------ the unfused composition
def _rel_logits(query, rel_embed, groups):
    """q . r per head and tap: (B, G, K, K, H_out, W_out)."""
    B, C, Ho, Wo = query.shape
    K = rel_embed.shape[-1]
    return torch.einsum(
        'bgdhw,gduv->bguvhw',
        query.reshape(B, groups, C // groups, Ho, Wo),
        rel_embed.reshape(groups, C // groups, K, K),
    )


def _with_rel(logits, query, rel_embed, rel_bias, groups):
    """``logits`` plus the relative terms, in the dtype of ``logits``."""
    dt = logits.dtype
    if rel_embed is not None:
        logits = logits + _rel_logits(query.to(dt), rel_embed.to(dt), groups)
    if rel_bias is not None:
        logits = logits + rel_bias.to(dt)[None, :, :, :, None, None]
    return logits


def fused_local_attention_reference(
    query, key, value, rel_embed, rel_bias, groups, window: Window
):
    """The stock composition (:func:`~mmevo.ops.local_correlation`, the
    relative terms, :func:`~mmevo.ops.window_softmax`,
    :func:`~mmevo.ops.evolution_aggregate`), differentiable to any order;
    ``window`` resolved."""
    query, key, value = _flat(query), _flat(key), _flat(value)
    logits = library.OPS['local_correlation'](
        query, key, groups, window.kernel_size, *window.scalars()
    )
    logits = _with_rel(logits, query, rel_embed, rel_bias, groups)
    weights = logits.flatten(2, 3).softmax(2).view_as(logits)
    return library.OPS['evolution_aggregate'](
        value, weights, *window.scalars()
    )


def _acc_logits(query, key, rel_embed, rel_bias, groups, window):
    """The logits on the thread's backend, in the accumulation dtype."""
    logits = dispatch.correlation(query, key, groups, window)
    logits = logits.to(lse_dtype(query.dtype))
    return _with_rel(logits, query, rel_embed, rel_bias, groups)


def _unfused_forward(query, key, value, rel_embed, rel_bias, groups, window):
    logits = _acc_logits(query, key, rel_embed, rel_bias, groups, window)
    lse = logits.flatten(2, 3).logsumexp(2)
    weights = (logits - lse[:, :, None, None]).exp().to(value.dtype)
    return dispatch.aggregate(value, weights, window), lse


def _unfused_backward(
    grad, out, lse, query, key, value, rel_embed, rel_bias, groups, window
):
    B, C, Ho, Wo = query.shape
    H, W = key.shape[-2:]
    Cv, G, acc = value.shape[1], groups, lse.dtype
    logits = _acc_logits(query, key, rel_embed, rel_bias, G, window)
    P = (logits - lse[:, :, None, None]).exp()
    dP = dispatch.correlation(grad, value, G, window).to(acc)
    D = (grad.to(acc) * out.to(acc)).reshape(B, G, Cv // G, Ho, Wo).sum(2)
    ds = P * (dP - D[:, :, None, None])
    dt = query.dtype
    grad_q = dispatch.aggregate(key, ds.to(dt), window).to(acc)
    grad_r, grad_b = query.new_empty(0), query.new_empty(0)
    if rel_embed is not None:
        q5 = query.to(acc).reshape(B, G, C // G, Ho, Wo)
        r = rel_embed.to(acc).reshape(G, C // G, *rel_embed.shape[1:])
        grad_q = grad_q + torch.einsum('bguvhw,gduv->bgdhw', ds, r).reshape(
            grad_q.shape
        )
        grad_r = torch.einsum('bguvhw,bgdhw->gduv', ds, q5)
        grad_r = grad_r.reshape(rel_embed.shape).to(dt)
    if rel_bias is not None:
        grad_b = ds.sum((0, 4, 5)).to(dt)
    grad_k = dispatch.aggregate_transpose(query, ds.to(dt), H, W, window)
    grad_v = dispatch.aggregate_transpose(grad, P.to(dt), H, W, window)
    return grad_q.to(dt), grad_k, grad_v, grad_r, grad_b


def _cpu_kernel_fits(query, key, window):
    """Whether the C++ kernel's buffers stay within a few times the map.

    A task of the C++ CPU kernel buffers, per channel, the rows of the
    padded map its windows read: in the backward ``(H_out - 1) * s + span +
    1`` rows of ``s * W_out`` (rounded up to 16) ``+ span`` columns. Where
    padding and dilation are far larger than the map (windows of zeros,
    e.g. dilation 1000 on a 4x4 map: ~1 GB and ~1 s for 128 values), the
    stock composition runs instead: its attention map is then small. Other
    backends take every geometry."""
    if key.device.type != 'cpu' or backends.backend_name(key) != 'cpp':
        return True
    Ho, Wo = query.shape[-2:]
    H, W = key.shape[-2:]
    s, span = window.stride, (window.kernel_size - 1) * window.dilation
    rows = (Ho - 1) * s + span + 1
    cols = s * -(-Wo // 16) * 16 + span
    return rows * cols <= max(1 << 16, 4 * (H + 16) * (W + 16))


def _fused_triton(query):
    """Whether the fused Triton kernels run: the triton backend,
    ``MMEVO_FUSED_TRITON=1``, and the module of the kernels present."""
    return (
        os.environ.get('MMEVO_FUSED_TRITON') == '1'
        and backends.backend_name(query) == 'triton'
        and importlib.util.find_spec(TRITON_MODULE) is not None
    )


def _triton_module():
    return importlib.import_module(TRITON_MODULE)


def _python_forward(query, key, value, rel_embed, rel_bias, groups, *window):
    window = Window(*window)
    B, G = query.shape[0], groups
    Ho, Wo = query.shape[-2:]
    layout = _out_layout(value)
    query, key, value = _flat(query), _flat(key), _flat(value)
    if B == 0:
        return (
            value.new_empty(B, value.shape[1], Ho, Wo),
            query.new_empty(B, G, Ho, Wo, dtype=lse_dtype(query.dtype)),
        )
    if _fused_triton(query) and query.shape[1] and value.shape[1]:
        out, lse = _triton_module().forward(
            query, key, value, rel_embed, rel_bias, G, window
        )
    else:
        out, lse = _unfused_forward(
            query, key, value, rel_embed, rel_bias, G, window
        )
    return out.contiguous(memory_format=layout), lse.contiguous()


def _python_backward(
    grad, out, lse, query, key, value, rel_embed, rel_bias, groups, *window
):
    window = Window(*window)
    tensors = (grad, out, lse, query, key, value, rel_embed, rel_bias)
    if query.shape[0] == 0:
        grads = (torch.zeros_like(t) for t in (query, key, value))
        extra = (
            query.new_zeros(t.shape) if t is not None else query.new_empty(0)
            for t in (rel_embed, rel_bias)
        )
        return (*grads, *extra)
    shapes = (query.shape, key.shape, value.shape)
    tensors = (grad, out, lse, *map(_flat, tensors[3:6]), *tensors[6:])
    if _fused_triton(query) and tensors[3].shape[1] and tensors[5].shape[1]:
        grads = list(_triton_module().backward(*tensors, groups, window))
        for i in (3, 4):
            if grads[i] is None:
                grads[i] = query.new_empty(0)
    else:
        grads = list(_unfused_backward(*tensors, groups, window))
    for i, shape in enumerate(shapes):  # those of the inputs, grouped or not
        grads[i] = grads[i].reshape(shape)
    return tuple(g.contiguous() for g in grads)


_fused = dispatch.register(
    'fused_local_attention', check_fused_local_attention, _python_forward
)
_fused_backward = dispatch.register(
    'fused_local_attention_backward', _check_backward, _python_backward
)


@torch.library.register_fake('mmevo::fused_local_attention')
def _(query, key, value, rel_embed, rel_bias, groups, *window):
    Ho, Wo = check_fused_local_attention(
        query, key, value, rel_embed, rel_bias, groups, *window
    )
    B = query.shape[0]
    out = value.new_empty(B, _channels(value), Ho, Wo).contiguous(
        memory_format=_out_layout(value)
    )
    lse = query.new_empty(B, groups, Ho, Wo, dtype=lse_dtype(query.dtype))
    return out, lse


@torch.library.register_fake('mmevo::fused_local_attention_backward')
def _(grad, out, lse, query, key, value, rel_embed, rel_bias, *args):
    _check_backward(
        grad, out, lse, query, key, value, rel_embed, rel_bias, *args
    )
    return (
        query.new_empty(query.shape),
        key.new_empty(key.shape),
        value.new_empty(value.shape),
        query.new_empty(rel_embed.shape if rel_embed is not None else 0),
        query.new_empty(rel_bias.shape if rel_bias is not None else 0),
    )


def _setup(ctx, inputs, output):
    query, key, value, rel_embed, rel_bias = inputs[:5]
    out, lse = output
    ctx.save_for_backward(query, key, value, rel_embed, rel_bias, out, lse)
    ctx.args = inputs[5:]
    ctx.backend = backends.forced()


def _backward(ctx, grad, grad_lse):
    if torch.is_grad_enabled():  # create_graph: a double backward follows
        return _differentiable_backward(ctx, grad)
    query, key, value, rel_embed, rel_bias, out, lse = ctx.saved_tensors
    with backends.use_backend(ctx.backend):
        grads = _fused_backward(
            grad, out, lse, query, key, value, rel_embed, rel_bias, *ctx.args
        )
    grads = [
        g if need and t is not None else None
        for g, need, t in zip(
            grads,
            ctx.needs_input_grad,
            (query, key, value, rel_embed, rel_bias),
            strict=False,
        )
    ]
    return (*grads,) + (None,) * 6


def _differentiable_backward(ctx, grad):
    """The gradients as a graph (``create_graph=True``): the stock
    composition recomputed from the saved inputs and differentiated, so the
    gradients are functions of ``grad`` and the saved tensors alone (the
    gradient of ``lse``, an auxiliary output, is not followed)."""
    query, key, value, rel_embed, rel_bias, *_ = ctx.saved_tensors
    inputs = (query, key, value, rel_embed, rel_bias)
    wanted = [
        i
        for i, (t, need) in enumerate(
            zip(inputs, ctx.needs_input_grad, strict=False)
        )
        if need and t is not None
    ]
    window = Window(*ctx.args[1:])
    with backends.use_backend(ctx.backend):
        out = fused_local_attention_reference(*inputs, ctx.args[0], window)
        found = torch.autograd.grad(
            out,
            [inputs[i] for i in wanted],
            grad,
            create_graph=True,
            allow_unused=True,
        )
    grads = [None] * 5
    for i, g in zip(wanted, found, strict=True):
        grads[i] = torch.zeros_like(inputs[i]) if g is None else g
    return (*grads,) + (None,) * 6


torch.library.register_autograd(
    _fused, _backward, setup_context=_setup, lib=library.LIB
)


def fused_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    groups: int,
    kernel_size: int,
    stride: int = 1,
    padding: int | None = None,
    dilation: int = 1,
    padding_mode: str = 'zeros',
    rel_embed: torch.Tensor | None = None,
    rel_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Local self-attention over K x K windows, the weights never written.

    With ``pos(i, u) = i*s - p + u*d`` (columns alike) and ``g(c) = c //
    (C / G)``: ``logit[b, g, u, v, i, j] = sum_{c in g} q[b, c, i, j] *
    (key[b, c, pos(i, u), pos(j, v)] + rel_embed[c, u, v]) + rel_bias[g,
    u, v]``, ``A = softmax`` over the K*K taps (padded ones included), and
    ``out[b, c', i, j] = sum_{u, v} A[b, g(c'), u, v, i, j] * value[b, c',
    pos(i, u), pos(j, v)]``. Equal to ``evolution_aggregate(value,
    window_softmax(local_correlation(query, key, ...) + <rel terms>),
    ...)``, but the logits and weights are never written, forward or
    backward, and the backward saves the inputs, the output and a per-pixel
    log-sum-exp only.

    query, key and value may each also be given grouped, (B, G, C / G, H,
    W): a view of any strides, which the C++ kernel reads in place (ACmix
    reads its heads so from the channels-last projection that its
    convolution path also takes). Other backends copy such a view to (B,
    C, H, W) where it is not one.

    Args:
        query (Tensor): (B, C, H_out, W_out), already scaled and taken at
            the window centres; B and C may be 0.
        key (Tensor): (B, C, H, W).
        value (Tensor): (B, C_v, H, W), C_v divisible by G; C_v may be 0.
        groups (int): G, the heads, dividing C and C_v.
        kernel_size (int): K, the window size.
        stride (int): window step. Default: 1.
        padding (int | None): on every side; None is "same", ``dilation *
            (K - 1) // 2`` (K odd). Default: None.
        dilation (int): spacing of the window taps. Default: 1.
        padding_mode (str): 'zeros' (key and value read 0 outside the map)
            or 'reflect' (numpy-style, also for paddings not smaller than
            the map). Default: 'zeros'.
        rel_embed (Tensor | None): (C, K, K), a per-offset key embedding
            (SASA's relative embedding). Default: None.
        rel_bias (Tensor | None): (G, K, K), a per-head, per-offset logit
            bias. Default: None.

    Returns:
        Tensor: (B, C_v, H_out, W_out), the dtype of ``query`` (under
        autocast, the autocast dtype, to which every tensor is cast);
        channels-last when ``value`` is (B, C_v, H, W) channels-last (and
        not also contiguous).

    Example:
        >>> q, k = torch.randn(2, 32, 9, 11), torch.randn(2, 32, 9, 11)
        >>> v = torch.randn(2, 32, 9, 11)
        >>> rel = torch.randn(32, 7, 7)
        >>> y = fused_local_attention(q, k, v, groups=2, kernel_size=7,
        ...                           rel_embed=rel)
        >>> y.shape
        torch.Size([2, 32, 9, 11])
    """
    check_int('groups', groups, 1)  # before the schema's int64 cast
    for name, t in (('query', query), ('key', key), ('value', value)):
        check_map(name, t, groups)
    window = Window.resolve(
        kernel_size, stride, padding, dilation, padding_mode
    )
    query, key = _autocast(query, key)
    query, value = _autocast(query, value)
    if rel_embed is not None:
        check_tensor('rel_embed', rel_embed, 3, '(C, K, K)')
        query, rel_embed = _autocast(query, rel_embed)
    if rel_bias is not None:
        check_tensor('rel_bias', rel_bias, 3, '(G, K, K)')
        query, rel_bias = _autocast(query, rel_bias)
    args = (rel_embed, rel_bias, groups, kernel_size, *window.scalars())
    if not _cpu_kernel_fits(query, key, window):
        check_fused_local_attention(query, key, value, *args)
        return fused_local_attention_reference(
            query, key, value, rel_embed, rel_bias, groups, window
        )
    out, _ = _fused(query, key, value, *args)
    return out
