"""The evolution ops decomposed into standard operators: for ONNX, and for
AOTInductor packages without mmevo's operators.

While a model is exported to ONNX (``torch.onnx.is_in_onnx_export()``, True
under both the dynamo and the TorchScript exporter), the public entries of
:mod:`mmevo.ops.evolution` run these functions instead of the
``torch.ops.mmevo`` operators, so the ONNX graph holds only standard
operators (Pad, Gather, Slice, Concat, Mul, ReduceSum, Add, Softmax) and
needs no custom domain. Sizes stay symbolic (never ``int()``), so one
export serves every input size. Not on ``torch.compiler.is_exporting()``:
a plain ``torch.export`` (e.g. for AOTInductor) keeps the fast
``torch.ops.mmevo`` operators, which it can trace (they have fake
kernels); :data:`DECOMPOSITIONS` replaces them in an exported program
(``inline_ops`` of :func:`mmevo.deploy.aoti.export_program`).

Reflect padding is a Gather of numpy-style reflected indices computed in the
graph, exact for any padding on any map size (1 included), as the eager ops.
"""

import torch
import torch.nn.functional as F

from .checks import Window


def symbolic_reflect_index(x, dim, padding):
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
        return F.pad(x, (padding,) * 4)
    return x.index_select(
        2, symbolic_reflect_index(x, 2, padding)
    ).index_select(3, symbolic_reflect_index(x, 3, padding))


def row_windows(xp, groups, window: Window):
    """The rows under each kernel row: (B, G, C // G, K, H_out, W_p) from
    the padded map ``xp`` (B, C, H_p, W_p), K row slices and one Concat.

    The K^2 windows are never one tensor (a Concat K times this one's size,
    which cost onnxruntime more than the window sum itself):
    :func:`window_sums` takes the kernel's columns one by one.
    """
    kernel_size, stride, dilation = (
        window.kernel_size,
        window.stride,
        window.dilation,
    )
    span = dilation * (kernel_size - 1)
    # Stride-1 windows (a slice of length size - span fits, provably for
    # torch.export, whatever the size), subsampled by an open-ended strided
    # slice: exact lengths, not min(...) expressions it cannot equate with
    # the kernel's H_out and W_out.
    rows = xp.shape[-2] - span
    x = xp.unflatten(1, (groups, -1)).unsqueeze(3)
    x = torch.cat(
        [
            x[..., u * dilation : u * dilation + rows, :]
            for u in range(kernel_size)
        ],
        3,
    )
    return x[..., ::stride, :]


def window_sums(rows, operands, dim, window: Window):
    """Per kernel column v, ``(windows_v * operands[v]).sum(dim)``: the
    windows' pixels in column v (a (B, G, C // G, K, H_out, W_out) view of
    :func:`row_windows`' ``rows``) times an operand broadcast to them.

    The operand moves instead of the windows: zero-padded to its column
    offset, it multiplies the rows as they are, and the sum (``dim``
    reduced, several times smaller) is sliced back. Strided columns come
    from one strided slice per column phase (v * dilation % stride), taken
    once for all the columns in it. Slicing every column's windows instead
    moved K times the map per column: about 1.5x the time of RedNet-50 in
    onnxruntime.
    """
    stride, dilation = window.stride, window.dilation
    span = dilation * (len(operands) - 1)
    # W_out from the rows' width: with the operand's width, the TorchScript
    # export of a strided query failed at other sizes
    width = (rows.shape[-1] - span - 1) // stride + 1
    phases, sums = {}, []
    for v, operand in enumerate(operands):
        shift, phase = divmod(v * dilation, stride)
        if phase not in phases:
            phases[phase] = rows[..., phase::stride] if stride > 1 else rows
        columns = phases[phase]
        right = columns.shape[-1] - width - shift
        product = columns * F.pad(operand, (shift, right))
        sums.append(product.sum(dim)[..., shift : shift + width])
    return sums


def aggregate(input, kernel, window: Window):
    """:func:`mmevo.ops.evolution_aggregate` (the window resolved).

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 2, 3, 3, 5, 5)
        >>> aggregate(x, w, Window(3, 1, 1, 1, 'reflect')).shape
        torch.Size([1, 4, 5, 5])
    """
    groups, kernel_size = int(kernel.shape[1]), window.kernel_size
    xp = pad(input, window.padding, window.padding_mode)
    rows = row_windows(xp, groups, window)
    # (B, G, 1, K, H_out, W_out): the kernel's column v
    columns = [kernel[:, :, None, :, v] for v in range(kernel_size)]
    sums = window_sums(rows, columns, 3, window)
    out = sums[0]
    for column_sum in sums[1:]:
        out = out + column_sum
    return out.flatten(1, 2)


def correlation(query, key, groups, window: Window, softmax=False):
    """:func:`mmevo.ops.local_correlation` (the window resolved); with
    ``softmax``, :func:`mmevo.ops.local_attention_weights`.

    Example:
        >>> q, k = torch.randn(1, 4, 3, 3), torch.randn(1, 4, 5, 5)
        >>> correlation(q, k, 2, Window(3, 2, 1)).shape
        torch.Size([1, 2, 3, 3, 3, 3])
    """
    K = window.kernel_size
    xp = pad(key, window.padding, window.padding_mode)
    rows = row_windows(xp, groups, window)
    q = query.unflatten(1, (groups, -1)).unsqueeze(3)
    logits = torch.stack(window_sums(rows, [q] * K, 2, window), 3)
    if softmax:
        logits = logits.flatten(2, 3).softmax(2).unflatten(2, (K, K))
    return logits


def _aggregate_op(input, kernel, *window):
    return aggregate(input, kernel, Window(int(kernel.shape[2]), *window))


def _correlation_op(softmax):
    def correlation_op(query, key, groups, kernel_size, *window):
        return correlation(
            query, key, groups, Window(kernel_size, *window), softmax
        )

    return correlation_op


#: ``ExportedProgram.run_decompositions`` table: the operators (called
#: with their schemas' arguments) to their decompositions
DECOMPOSITIONS = {
    torch.ops.mmevo.evolution_aggregate.default: _aggregate_op,
    torch.ops.mmevo.local_correlation.default: _correlation_op(False),
    torch.ops.mmevo.local_attention_weights.default: _correlation_op(True),
}
