"""Plain PyTorch reference of the evolution ops, readable as the formula.

``Y[b, c, i, j] = sum_{u, v} W[b, g(c), u, v, i, j]
* X[b, c, i*s - p + u*d, j*s - p + v*d]``

Written for clarity, not speed: one gather per window offset, any dtype
(float64 for tests). The compiled kernels are checked against these functions.
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # no import: C++ tests load this file alone
    from .checks import Window


def window_index(size, out_size, window: 'Window', device):
    """Input index and validity of every (window offset, output position).

    Returns:
        tuple[Tensor, Tensor]: ``index`` (K, out_size) long, always inside
        ``[0, size)``, and ``valid`` (K, out_size) bool, False where the
        position falls into zero padding.
    """
    u = torch.arange(window.kernel_size, device=device).view(-1, 1)
    i = torch.arange(out_size, device=device).view(1, -1)
    pos = i * window.stride - window.padding + u * window.dilation
    if window.padding_mode == 'zeros':
        valid = (pos >= 0) & (pos < size)
        return pos.clamp(0, size - 1), valid
    # 'reflect' as numpy's: mirror without repeating the edge, again and
    # again when the padding is not smaller than the map.
    if size == 1:
        return torch.zeros_like(pos), torch.ones_like(pos, dtype=torch.bool)
    period = 2 * (size - 1)
    pos = pos.remainder(period)
    pos = torch.where(pos >= size, period - pos, pos)
    return pos, torch.ones_like(pos, dtype=torch.bool)


def _windows(x, out_hw, window):
    """Yield ``(u, v, window)`` with window (B, C, H_out, W_out) = X at
    offset (u, v)."""
    H, W = x.shape[-2:]
    rows, rvalid = window_index(H, out_hw[0], window, x.device)
    cols, cvalid = window_index(W, out_hw[1], window, x.device)
    for u in range(window.kernel_size):
        for v in range(window.kernel_size):
            win = x[:, :, rows[u]][:, :, :, cols[v]]
            mask = rvalid[u].view(-1, 1) & cvalid[v].view(1, -1)
            # select, not multiply: a clamped index may fetch an Inf or NaN,
            # and zero padding must read 0 there, as a convolution does
            yield u, v, torch.where(mask, win, 0)


def aggregate_reference(input, kernel, window: 'Window'):
    """Reference of :func:`mmevo.ops.evolution_aggregate` (the window
    resolved, its ``kernel_size`` the kernel's K).

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
        >>> from mmevo.ops.checks import Window
        >>> aggregate_reference(x, w, Window(3, padding=1)).shape
        torch.Size([1, 4, 5, 5])
    """
    B, C = input.shape[:2]
    G = kernel.shape[1]
    out_hw = kernel.shape[-2:]
    out = input.new_zeros(B, G, C // G, *out_hw)
    for u, v, win in _windows(input, out_hw, window):
        out = out + kernel[:, :, u, v].unsqueeze(2) * win.view_as(out)
    return out.view(B, C, *out_hw)


def correlation_reference(query, key, groups, window: 'Window'):
    """Reference of :func:`mmevo.ops.local_correlation` (the window
    resolved)."""
    B, C, H_out, W_out = query.shape
    K = window.kernel_size
    q = query.view(B, groups, C // groups, H_out, W_out)
    out = query.new_zeros(B, groups, K, K, H_out, W_out)
    for u, v, win in _windows(key, (H_out, W_out), window):
        out[:, :, u, v] = (q * win.view_as(q)).sum(2)
    return out


def attention_weights_reference(query, key, groups, window: 'Window'):
    """Reference of :func:`mmevo.ops.local_attention_weights`: the softmax
    over each K x K window of :func:`correlation_reference`."""
    logits = correlation_reference(query, key, groups, window)
    B, G, K, _, H_out, W_out = logits.shape
    return torch.softmax(
        logits.reshape(B, G, K * K, H_out, W_out), dim=2
    ).reshape(logits.shape)


def span_kernel(z, span_weight, span_bias, kernel_size, groups):
    """The involution kernel ``S z + b`` (B, G, K, K, H_out, W_out): the
    span convolution's output in Involution's layout (group-major, then
    row-major taps)."""
    w = F.conv2d(z, span_weight, span_bias)
    K = kernel_size
    return w.view(w.shape[0], groups, K, K, *w.shape[-2:])
