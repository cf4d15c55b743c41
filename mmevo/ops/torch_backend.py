"""The window primitives in pure PyTorch, by shift-and-accumulate.

One strided slice of the (zero-padded) map per window offset, multiplied and
accumulated in place: no ``unfold`` copy of K^2 maps. This is the fastest
formulation without a compiled kernel, used as the fallback backend on devices
that have neither the C++ nor the Triton kernels, and as the "best pure
PyTorch" baseline of ``tools/analysis/benchmark_ops.py``.

All three take resolved arguments and zero padding (reflect padding is made
explicit by the caller); fp16/bf16 are computed in fp32.
"""
import torch


def _span(out_size, stride, offset):
    # Input positions offset, offset + s, ... of out_size window taps.
    return slice(offset, offset + stride * (out_size - 1) + 1, stride)


def _acc_dtype(t):
    return torch.float32 if t.dtype in (torch.float16,
                                        torch.bfloat16) else t.dtype


def aggregate(x, w, stride, padding, dilation):
    """Y = A(x, w): (B, C, H, W), (B, G, K, K, Ho, Wo) -> (B, C, Ho, Wo).

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
        >>> aggregate(x, w, 1, 1, 1).shape
        torch.Size([1, 4, 5, 5])
    """
    B, C = x.shape[:2]
    G, K, _, Ho, Wo = w.shape[1:]
    acc = _acc_dtype(x)
    xp = torch.nn.functional.pad(x.to(acc), [padding] * 4)
    wa = w.to(acc)
    out = xp.new_zeros(B, G, C // G, Ho, Wo)
    for u in range(K):
        for v in range(K):
            win = xp[:, :,
                     _span(Ho, stride, u * dilation),
                     _span(Wo, stride, v * dilation)]
            out.addcmul_(
                win.view(B, G, C // G, Ho, Wo), wa[:, :, u, v].unsqueeze(2))
    return out.view(B, C, Ho, Wo).to(x.dtype)


def aggregate_transpose(gy, w, in_hw, stride, padding, dilation):
    """grad_x = At(gy, w): the transpose of :func:`aggregate` in ``x``.

    Example:
        >>> gy, w = torch.randn(1, 4, 3, 3), torch.randn(1, 2, 3, 3, 3, 3)
        >>> aggregate_transpose(gy, w, (5, 5), 2, 1, 1).shape
        torch.Size([1, 4, 5, 5])
    """
    B, C, Ho, Wo = gy.shape
    G, K = w.shape[1:3]
    H, W = in_hw
    acc = _acc_dtype(gy)
    gxp = gy.new_zeros(
        B, G, C // G, H + 2 * padding, W + 2 * padding, dtype=acc)
    g = gy.to(acc).view(B, G, C // G, Ho, Wo)
    wa = w.to(acc)
    for u in range(K):
        for v in range(K):
            gxp[...,
                _span(Ho, stride, u * dilation),
                _span(Wo, stride, v * dilation)].addcmul_(
                    g, wa[:, :, u, v].unsqueeze(2))
    gx = gxp[..., padding:padding + H, padding:padding + W]
    return gx.reshape(B, C, H, W).to(gy.dtype)


def window_softmax(t):
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


def correlate(q,
              x,
              groups,
              kernel_size,
              stride,
              padding,
              dilation,
              softmax=False):
    """out = Corr(q, x): (B, C, Ho, Wo), (B, C, H, W) -> (B, G, K, K, Ho, Wo).

    With ``softmax``, normalised over each pixel's K x K window (in the
    accumulation dtype).

    Example:
        >>> q, x = torch.randn(1, 4, 5, 5), torch.randn(1, 4, 5, 5)
        >>> correlate(q, x, 2, 3, 1, 1, 1).shape
        torch.Size([1, 2, 3, 3, 5, 5])
    """
    B, C, Ho, Wo = q.shape
    K = kernel_size
    acc = _acc_dtype(q)
    xp = torch.nn.functional.pad(x.to(acc), [padding] * 4)
    qa = q.to(acc).view(B, groups, C // groups, Ho, Wo)
    out = q.new_empty(B, groups, K, K, Ho, Wo, dtype=acc)
    for u in range(K):
        for v in range(K):
            win = xp[:, :,
                     _span(Ho, stride, u * dilation),
                     _span(Wo, stride, v * dilation)]
            torch.sum(qa * win.view_as(qa), dim=2, out=out[:, :, u, v])
    if softmax:
        out = window_softmax(out)
    return out.to(q.dtype)
