"""The window primitives in pure PyTorch, one strided slice per window tap.

For each window offset, the outputs whose tap lands inside the map are
multiplied with a strided slice of the map and accumulated in place: no
``unfold`` copy of K^2 maps and no padded copy of the map, so memory and
time follow the input and output sizes, whatever the stride, dilation or
padding. This is the fastest formulation without a compiled kernel, used as
the fallback backend on devices that have neither the C++ nor the Triton
kernels, and as the "best pure PyTorch" baseline of
``tools/analysis/benchmark_ops.py``.

All three take a resolved :class:`~mmevo.ops.checks.Window`: zero padding,
or ``'reflect'``, numpy-style reflect padding read through reflected indices
(the caller usually pads explicitly instead, which is faster when the padded
map is small). fp16/bf16 are computed in fp32.
"""

import torch

from .checks import Window

_Reader = slice | torch.Tensor


def reflect_positions(pos: torch.Tensor, size: int) -> torch.Tensor:
    """numpy-style 'reflect' of the positions ``pos`` into ``[0, size)``
    (the edge is not repeated), folded again as often as needed."""
    if size == 1:
        return torch.zeros_like(pos)
    period = 2 * (size - 1)
    pos = pos.remainder(period)
    return torch.where(pos >= size, period - pos, pos)


def _tap(
    size, out_size, stride, offset, reflect, device
) -> tuple[slice, _Reader] | None:
    """The outputs one window tap reaches along one map dimension, and how
    to read the input under them, or None if it reaches none.

    The tap reads input position ``i * stride + offset`` for output ``i``.
    Zero padding: the outputs whose position lies inside ``[0, size)``, read
    as a strided slice; reflect: every output, read at reflected indices.
    """
    if reflect:
        pos = torch.arange(out_size, device=device) * stride + offset
        return slice(0, out_size), reflect_positions(pos, size)
    lo = max(0, -(offset // stride))  # ceil(-offset / stride)
    hi = min(out_size - 1, (size - 1 - offset) // stride)
    if hi < lo:
        return None
    first = lo * stride + offset
    # one output takes any step: a huge one would overflow the view's stride
    step = stride if hi > lo else 1
    return slice(lo, hi + 1), slice(first, first + (hi - lo) * step + 1, step)


def _read(t, dim, reader):
    if isinstance(reader, slice):
        return t[(slice(None),) * dim + (reader,)]
    return t.index_select(dim, reader)


def _taps(window, in_hw, out_hw, device):
    """Yield ``(u, v, rows, cols)``: the (output slice, input reader) of
    each dimension, for every window tap that reaches an output."""
    K, s, d, p = (
        window.kernel_size,
        window.stride,
        window.dilation,
        window.padding,
    )
    reflect = window.padding_mode == 'reflect'
    for u in range(K):
        rows = _tap(in_hw[0], out_hw[0], s, u * d - p, reflect, device)
        if rows is None:
            continue
        for v in range(K):
            cols = _tap(in_hw[1], out_hw[1], s, v * d - p, reflect, device)
            if cols is not None:
                yield u, v, rows, cols


def _acc_dtype(t):
    return (
        torch.float32
        if t.dtype in (torch.float16, torch.bfloat16)
        else t.dtype
    )


def aggregate(
    x: torch.Tensor, w: torch.Tensor, window: Window
) -> torch.Tensor:
    """Y = A(x, w): (B, C, H, W), (B, G, K, K, Ho, Wo) -> (B, C, Ho, Wo).

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
        >>> aggregate(x, w, Window(3, padding=1)).shape
        torch.Size([1, 4, 5, 5])
    """
    B, C, H, W = x.shape
    G, _, _, Ho, Wo = w.shape[1:]
    acc = _acc_dtype(x)
    x5 = x.to(acc).reshape(B, G, C // G, H, W)
    wa = w.to(acc)
    out = x5.new_zeros(B, G, C // G, Ho, Wo)
    for u, v, (ro, ri), (co, ci) in _taps(window, (H, W), (Ho, Wo), x.device):
        win = _read(_read(x5, 3, ri), 4, ci)
        out[..., ro, co].addcmul_(win, wa[:, :, u, v, ro, co].unsqueeze(2))
    return out.view(B, C, Ho, Wo).to(x.dtype)


def aggregate_transpose(
    gy: torch.Tensor,
    w: torch.Tensor,
    in_hw: tuple[int, int],
    window: Window,
) -> torch.Tensor:
    """grad_x = At(gy, w): the transpose of :func:`aggregate` in ``x``.

    Example:
        >>> gy, w = torch.randn(1, 4, 3, 3), torch.randn(1, 2, 3, 3, 3, 3)
        >>> aggregate_transpose(gy, w, (5, 5), Window(3, 2, 1)).shape
        torch.Size([1, 4, 5, 5])
    """
    B, C, Ho, Wo = gy.shape
    G = w.shape[1]
    H, W = in_hw
    reflect = window.padding_mode == 'reflect'
    acc = _acc_dtype(gy)
    g = gy.to(acc).reshape(B, G, C // G, Ho, Wo)
    wa = w.to(acc)
    gx = g.new_zeros(B, G, C // G, H, W)
    for u, v, (ro, ri), (co, ci) in _taps(window, (H, W), (Ho, Wo), gy.device):
        part = g[..., ro, co] * wa[:, :, u, v, ro, co].unsqueeze(2)
        if not reflect:
            gx[..., ri, ci].add_(part)
            continue
        rows = part.new_zeros(B, G, C // G, H, part.shape[-1])
        gx.index_add_(4, ci, rows.index_add_(3, ri, part))
    return gx.view(B, C, H, W).to(gy.dtype)


def window_softmax(t: torch.Tensor) -> torch.Tensor:
    """Softmax over each pixel's K x K window: the attention weights of
    local self-attention from their logits.

    Args:
        t (Tensor): logits (B, G, K, K, H_out, W_out).

    Returns:
        Tensor: same shape, summing to 1 over dims 2 and 3.

    Example:
        >>> w = window_softmax(torch.randn(2, 4, 3, 3, 5, 6))
        >>> torch.allclose(w.sum((2, 3)), torch.ones(2, 4, 5, 6))
        True
    """
    return t.flatten(2, 3).softmax(2).view_as(t)


def correlate(
    q: torch.Tensor,
    x: torch.Tensor,
    groups: int,
    window: Window,
    softmax: bool = False,
) -> torch.Tensor:
    """out = Corr(q, x): (B, C, Ho, Wo), (B, C, H, W) -> (B, G, K, K, Ho, Wo).

    With ``softmax``, normalised over each pixel's K x K window (in the
    accumulation dtype).

    Example:
        >>> q, x = torch.randn(1, 4, 5, 5), torch.randn(1, 4, 5, 5)
        >>> correlate(q, x, 2, Window(3, padding=1)).shape
        torch.Size([1, 2, 3, 3, 5, 5])
    """
    B, C, Ho, Wo = q.shape
    H, W = x.shape[-2:]
    K = window.kernel_size
    acc = _acc_dtype(q)
    x5 = x.to(acc).reshape(B, groups, C // groups, H, W)
    q5 = q.to(acc).reshape(B, groups, C // groups, Ho, Wo)
    out = q5.new_zeros(B, groups, K, K, Ho, Wo)
    for u, v, (ro, ri), (co, ci) in _taps(window, (H, W), (Ho, Wo), q.device):
        win = _read(_read(x5, 3, ri), 4, ci)
        out[:, :, u, v, ro, co] = (q5[..., ro, co] * win).sum(2)
    if softmax:
        out = window_softmax(out)
    return out.to(q.dtype)
