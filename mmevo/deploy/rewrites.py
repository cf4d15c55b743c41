"""Module forwards rewritten for the length of an export, on the model's
own module instances.

Some stock forwards hold the example's sizes in the graph: Python ints the
exporters freeze, or ops they export for static sizes only. While
exporting, :func:`export_rewrites` runs those modules as the same numbers on
symbolic sizes: ``nn.AdaptiveAvgPool2d`` as :func:`adaptive_avg_pool2d`
and mmseg's ``Upsample`` by its scale factor (:mod:`mmevo.deploy.mmseg`),
so Semantic FPN and UPerNet (pyramid pooling) export with dynamic H and W.
A CPU package also computes each ``Involution`` as one fused operator
(:func:`fused_involution`). Only the instances inside the exported model
change, and only until the export ends; their classes, and every other
model, keep the stock forward.
"""

import contextlib
import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _pair


def adaptive_avg_pool2d(x, output_size):
    """``F.adaptive_avg_pool2d(x, output_size)`` in standard operators on
    the symbolic input size, for a graph that serves every size.

    PyTorch's bins (row ``i`` of ``o`` averages rows ``floor(i * H / o)``
    to ``ceil((i + 1) * H / o)``, overlapping when ``H`` is not a multiple
    of ``o``, repeated when ``H < o``) as 0/1 matrices built in the graph
    from ``arange`` of the input size: two MatMuls sum the bins, one Div
    by the bin areas averages them. The exporters' own adaptive pooling
    needs the example's sizes: the TorchScript one refuses dynamic ones,
    the dynamo one keeps the example's bins (wrong numbers at other sizes).

    Args:
        x (Tensor): (B, C, H, W) or (C, H, W).
        output_size (int | tuple[int | None, int | None]): the output's
            (h, w); ``None`` keeps the input's size.

    Returns:
        Tensor: (B, C, h, w) or (C, h, w).

    Example:
        >>> x = torch.randn(1, 8, 13, 7)
        >>> torch.allclose(adaptive_avg_pool2d(x, 6),
        ...                F.adaptive_avg_pool2d(x, 6), atol=1e-6)
        True
    """
    out_h, out_w = _pair(output_size)
    if not all(
        o is None or (isinstance(o, int) and o >= 1) for o in (out_h, out_w)
    ):
        raise ValueError(
            f'output_size must be a positive int, None or a '
            f'pair of them, got {output_size!r}'
        )
    sums, area = x, 1
    if out_h is not None:
        rows, counts = _bins(x.shape[-2], out_h, x)
        sums, area = rows @ sums, counts[:, None]
    if out_w is not None:
        cols, counts = _bins(x.shape[-1], out_w, x)
        sums, area = sums @ cols.transpose(0, 1), area * counts
    return sums / area


def _bins(size, out, like):
    """(out, size) 0/1 matrix of the input rows in each of the ``out``
    adaptive pooling bins, and the bins' lengths."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode='floor')
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode='floor')
    pos = torch.arange(size, device=like.device)
    inside = (pos >= start[:, None]) & (pos < end[:, None])
    return inside.to(like.dtype), (end - start).to(like.dtype)


def _pool(module, x, stock):
    """``nn.AdaptiveAvgPool2d`` while exporting: :func:`adaptive_avg_pool2d`
    (e.g. mmseg's pyramid pooling, 2, 3 and 6 bins); 1 x 1 stays the stock
    global average, which exports for any size. The module, not mmseg's
    ``PPM``: every head that pools with it (PPM, PSPHead, ...) exports with
    dynamic sizes, and ``F.adaptive_avg_pool2d`` itself stays stock."""
    if _pair(module.output_size) == (1, 1):
        return stock(x)
    return adaptive_avg_pool2d(x, module.output_size)


def ceil_avg_pool2d(x, stride):
    """``F.avg_pool2d(x, stride, stride, ceil_mode=True)`` in operators
    whose output size is ``ceil(H / s)`` of the symbolic input size: zeros
    padded to a multiple of the stride, each window summed and divided by
    its pixels inside the input.

    AOTInductor lowers a ceil-mode pooling with the output size of the
    example's parity (torch 2.14: ``floor(H / s)`` at every size after an
    even example), which a package has no guard to check: at odd sizes a
    stride-2 involution read its kernel map past the end (NaN or 1e36 in
    the demo RetinaNet). ``torch.compile`` guards the same choice.

    Args:
        x (Tensor): (B, C, H, W) or (C, H, W).
        stride (int | tuple[int, int]): the windows' size and step.

    Returns:
        Tensor: (B, C, ceil(H / s), ceil(W / s)) or (C, ...).

    Raises:
        ValueError: ``stride`` is not a positive int or a pair of them, or
            ``x`` is not 3-D or 4-D.

    Example:
        >>> x = torch.randn(1, 8, 13, 7)
        >>> torch.allclose(ceil_avg_pool2d(x, 2),
        ...                F.avg_pool2d(x, 2, 2, ceil_mode=True))
        True
    """
    pair = _pair(stride)
    if len(pair) != 2 or not all(type(s) is int and s >= 1 for s in pair):
        raise ValueError(
            f'stride must be a positive int or a pair of them, got {stride!r}'
        )
    sh, sw = pair
    if x.dim() not in (3, 4):
        raise ValueError(
            f'x must be (B, C, H, W) or (C, H, W), got {tuple(x.shape)}'
        )
    h, w = x.shape[-2:]
    oh, ow = (h + sh - 1) // sh, (w + sw - 1) // sw
    padded = F.pad(x, (0, ow * sw - w, 0, oh * sh - h))
    sums = padded.unflatten(-1, (ow, sw)).unflatten(-3, (oh, sh))
    rows = (h - torch.arange(oh, device=x.device) * sh).clamp(max=sh)
    cols = (w - torch.arange(ow, device=x.device) * sw).clamp(max=sw)
    return sums.sum((-3, -1)) / (rows[:, None] * cols).to(x.dtype)


def _ceil_pool(module, x, stock):
    """``nn.AvgPool2d`` in a package: :func:`ceil_avg_pool2d` where it is
    a ceil-mode pooling of windows as large as the stride, unpadded (the
    involution's and ELSA's, ResNet-D's shortcut); any other, stock."""
    if (
        not module.ceil_mode
        or _pair(module.kernel_size) != _pair(module.stride)
        or _pair(module.padding) != (0, 0)
        or module.divisor_override
    ):
        return stock(x)
    return ceil_avg_pool2d(x, module.stride)


#: Rewrites only AOTInductor packages need (ONNX's AveragePool computes
#: its ceil-mode size at run time), for :func:`export_rewrites`' ``extra``.
AOTI_REWRITES = {nn.AvgPool2d: _ceil_pool}


def fused_involution(module, x, stock):
    """An ``Involution`` in a CPU package: its span convolution and
    aggregation as one ``mmevo::fused_involution``, whose C++ kernel reads
    the channels-last maps Inductor's convolutions leave in place and never
    writes the kernel map (:func:`export_program`'s ``fused_involution``).
    The same modules run before it (the pool and ``conv1``, its BN folded
    by freezing). A subclass (which may generate its kernel otherwise), a
    layer with a kernel hook and one with a hook on the span convolution
    that the op replaces keep the stock graph."""
    from mmevo.layers import Involution
    from mmevo.layers.fastpath import has_hooks

    if (
        type(module) is not Involution
        or module._kernel_hooks
        or has_hooks(module.conv2)
    ):
        return stock(x)
    module.check_input(x, module.channels)
    z = module.conv1(module.avgpool(x) if module.stride > 1 else x)
    span = module.conv2.conv
    return torch.ops.mmevo.fused_involution(
        x,
        z,
        span.weight,
        span.bias,
        module.kernel_size,
        module.stride,
        module.dilation,
        module.groups,
    )


def _rewrites():
    """``{class: rewrite(module, x, stock)}``. mmseg's only when mmseg is
    imported: a model holding its modules has imported it, and exporting
    any other model imports no mmseg."""
    rewrites = {nn.AdaptiveAvgPool2d: _pool}
    if 'mmseg.models.utils' in sys.modules:
        from .mmseg import REWRITES

        rewrites.update(REWRITES)
    return rewrites


@contextlib.contextmanager
def export_rewrites(model, extra=None):
    """Inside the block, the modules of ``model`` whose stock forward would
    hold the example's sizes run their rewrite (see the module docstring).

    The rewrite is set as the ``forward`` of each such instance (a subclass
    with a forward of its own keeps it) and removed on exit, also when the
    export fails: classes are never patched, so other models, other
    threads and the same model after the block run the stock forwards.

    Args:
        model (nn.Module): the model being exported.
        extra (dict, optional): more ``{class: rewrite(module, x,
            stock)}``, e.g. :data:`AOTI_REWRITES`. Default: None.

    Example:
        >>> with export_rewrites(model):
        ...     torch.onnx.export(model, (x, ), 'model.onnx')
    """
    rewrites = {**_rewrites(), **(extra or {})}
    patched = []
    try:
        for module in model.modules():
            rewrite = next(
                (
                    fn
                    for cls, fn in rewrites.items()
                    if isinstance(module, cls)
                    and type(module).forward is cls.forward
                ),
                None,
            )
            if rewrite is None:
                continue
            # an instance's own forward (a hook library's) is put back too
            own = vars(module).get('forward')
            module.forward = functools.partial(
                rewrite, module, stock=module.forward
            )
            patched.append((module, own))
        yield
    finally:
        for module, own in reversed(patched):
            del module.forward
            if own is not None:
                module.forward = own
