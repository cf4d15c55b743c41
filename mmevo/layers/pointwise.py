"""1x1 convolutions as batched matmuls (the generation and projection convs)."""
import torch

# Below this many pixels per image, the weight gradient is one matmul over
# all B * H * W pixels (after a transpose of the small operands) instead of B
# matmuls summed: with K = H * W that short, the B products are ~2x slower.
_SINGLE_MATMUL_PIXELS = 100


def _forward(x, weight, bias):
    B, C, H, W = x.shape
    y = torch.bmm(weight.view(1, -1, C).expand(B, -1, -1),
                  x.reshape(B, C, H * W))
    if bias is not None:
        # In place: bmm's backward does not need y, and a second buffer the
        # size of a whole generated kernel costs more than the add.
        y.add_(bias.view(1, -1, 1))
    return y.view(B, -1, H, W)


class _Pointwise(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias):
        # The inputs themselves (not views made here): double backward
        # differentiates through them.
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _forward(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        B, C, H, W = x.shape
        HW = H * W
        # In the dtype the forward ran in (autocast's, if it was on).
        g3 = grad.reshape(B, -1, HW)
        x3 = x.reshape(B, C, HW).to(g3.dtype)
        w2 = weight.view(-1, C).to(g3.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.bmm(w2.t().expand(B, -1, -1), g3)
            grad_x = grad_x.view(B, C, H, W)
        with_b = ctx.has_bias and ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1]:
            if with_b:
                # A row of ones: the bias gradient comes out of the same
                # matmul instead of another pass over the (kernel-sized) grad.
                x3 = torch.cat([x3, x3.new_ones(B, 1, HW)], 1)
            if HW < _SINGLE_MATMUL_PIXELS:
                grad_wb = torch.mm(g3.transpose(0, 1).reshape(-1, B * HW),
                                   x3.transpose(0, 1).reshape(-1, B * HW).t())
            else:
                grad_wb = torch.bmm(g3, x3.transpose(1, 2)).sum(0)
            grad_w = grad_wb[:, :C].reshape_as(weight)
            if with_b:
                grad_b = grad_wb[:, C]
        elif with_b:
            grad_b = g3.sum((0, 2))
        return grad_x, grad_w, grad_b


def pointwise(x, weight, bias=None):
    """A 1x1, stride-1, ungrouped convolution as a batched matmul.

    The generation / projection convs of the evolution layers and the
    bottlenecks' reducing convs: there oneDNN's 1x1 convolution (above all
    its backward) is 1.5-10x slower on CPU than ``bmm``; ``bmm`` is also
    counted by jit-based FLOP counters. Differentiable to any order (the
    backward is made of matmuls).

    Args:
        x (Tensor): (B, C_in, H, W).
        weight (Tensor): (C_out, C_in, 1, 1), as ``nn.Conv2d`` holds it.
        bias (Tensor, optional): (C_out,).

    Returns:
        Tensor: (B, C_out, H, W), equal to ``F.conv2d(x, weight, bias)``.

    Example:
        >>> import torch
        >>> conv = torch.nn.Conv2d(8, 4, 1)
        >>> x = torch.randn(2, 8, 5, 3)
        >>> y = pointwise(x, conv.weight, conv.bias)
        >>> torch.allclose(y, conv(x), atol=1e-6)
        True
    """
    if torch.jit.is_tracing():
        # FLOP counters trace the forward: leave them a plain bmm node.
        return _forward(x, weight, bias)
    return _Pointwise.apply(x, weight, bias)
