"""The evolution ops in standard ONNX operators, for ``torch.onnx.export``.

While a model is exported to ONNX (``torch.onnx.is_in_onnx_export()``, True
under both the dynamo and the TorchScript exporter), the public entries of
:mod:`mmevo.ops.evolution` run these functions instead of the
``torch.ops.mmevo`` operators, so the ONNX graph holds only standard
operators (Pad, Gather, Slice, Concat, Mul, ReduceSum, Softmax) and needs no
custom domain. Sizes stay symbolic (never ``int()``), so one export serves
every input size. Not on ``torch.compiler.is_exporting()``: a plain
``torch.export`` (e.g. for AOTInductor) keeps the fast ``torch.ops.mmevo``
operators, which it can trace (they have fake kernels).

Reflect padding is a Gather of numpy-style reflected indices computed in the
graph, exact for any padding on any map size (1 included), as the eager ops.
"""
import torch
import torch.nn.functional as F


def reflect_index(x, dim, padding):
    """Source index along ``dim`` of each of the ``size + 2 * padding``
    reflect-padded positions, as graph ops on the (symbolic) size.

    numpy 'reflect' (edge not repeated), folded as often as needed.
    """
    pos = torch.arange(-padding, x.shape[dim] + padding, device=x.device)
    # size - 1 as a tensor, under both exporters (a SymInt under dynamo, a
    # traced tensor under TorchScript); period 1 maps a 1-pixel map to 0.
    last = pos[-1:] - padding
    period = (2 * last).clamp(min=1)
    pos = pos.remainder(period)
    return torch.where(pos > last, period - pos, pos)


def pad(x, padding, padding_mode):
    """Pad the last two dims of ``x`` with zeros or numpy-style reflection."""
    if padding == 0:
        return x
    if padding_mode == 'zeros':
        return F.pad(x, (padding, ) * 4)
    return x.index_select(2, reflect_index(x, 2, padding)).index_select(
        3, reflect_index(x, 3, padding))


def unfold(xp, groups, kernel_size, stride, dilation):
    """The windows of the padded map ``xp`` (B, C, H_p, W_p) as one tensor
    (B, G, C // G, K, K, H_out, W_out).

    K row slices concatenated, then K column slices of that: 2K slices and
    two concats whatever K, rather than K^2 small ops per window op (which
    make the exported graph slow to optimise and to run).
    """
    span = dilation * (kernel_size - 1)
    # Stride-1 windows (a slice of length size - span fits, provably for
    # torch.export, whatever the size), subsampled by an open-ended strided
    # slice: exact lengths, not min(...) expressions it cannot equate with
    # the kernel's H_out and W_out.
    rows, cols = (n - span for n in xp.shape[-2:])
    offsets = [u * dilation for u in range(kernel_size)]
    x = xp.unflatten(1, (groups, -1)).unsqueeze(3)
    x = torch.cat([x[..., o:o + rows, :] for o in offsets], 3)
    x = x[..., ::stride, :].unsqueeze(4)
    return torch.cat([x[..., o:o + cols] for o in offsets], 4)[..., ::stride]


def aggregate(input, kernel, stride, padding, dilation, padding_mode):
    """:func:`mmevo.ops.evolution_aggregate` (arguments resolved).

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
        >>> aggregate(x, w, 1, 1, 1, 'reflect').shape
        torch.Size([1, 4, 5, 5])
    """
    groups, kernel_size = int(kernel.shape[1]), int(kernel.shape[2])
    windows = unfold(
        pad(input, padding, padding_mode), groups, kernel_size, stride,
        dilation)
    return (windows * kernel.unsqueeze(2)).sum((3, 4)).flatten(1, 2)


def correlation(query,
                key,
                groups,
                kernel_size,
                stride,
                padding,
                dilation,
                padding_mode,
                softmax=False):
    """:func:`mmevo.ops.local_correlation` (arguments resolved); with
    ``softmax``, :func:`mmevo.ops.local_attention_weights`.

    Example:
        >>> q, k = torch.randn(1, 4, 3, 3), torch.randn(1, 4, 5, 5)
        >>> correlation(q, k, 2, 3, 2, 1, 1, 'zeros').shape
        torch.Size([1, 2, 3, 3, 3, 3])
    """
    windows = unfold(
        pad(key, padding, padding_mode), groups, kernel_size, stride, dilation)
    q = query.unflatten(1, (groups, -1))[:, :, :, None, None]
    logits = (windows * q).sum(2)
    if softmax:
        logits = logits.flatten(2, 3).softmax(2).unflatten(
            2, (kernel_size, kernel_size))
    return logits
