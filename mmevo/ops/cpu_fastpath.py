"""CPU fast paths: the CPU-only rewrites of the model graph, behind one switch.

The layers and backbones are written as the published (stock) graph: mmdet's
``ResNet.forward`` and ``Bottleneck.forward``, their convolutions called as
modules (so forward hooks, ``print(model)``, FLOP counters and
``torch.compile`` see them). On CPU, oneDNN runs some of those modules
1.5-10x slower than an equivalent formulation (``docs/benchmarks.md``); the
rewrites here compute the same numbers and gradients faster. A module takes
its fast path only when :func:`enabled` holds for its input:

* the input is a CPU tensor (any other device, ``meta`` included, runs the
  stock graph);
* nothing is tracing, scripting, exporting or compiling: the rewrites were
  measured in eager mode only, and tools that look at the graph must see the
  stock one;
* the switch is on: environment variable ``MMEVO_CPU_FASTPATH`` ('1', the
  default, or '0'), overridden per thread by :func:`use`.

``tests/ops/test_cpu_fastpath.py`` checks every rewrite against the stock
path, values and gradients. Only torch is imported here: the functions take
the modules they speed up and read their attributes.
"""
import contextlib
import os
import threading

import torch
import torch.nn.functional as F
from torch import nn

ENV_VAR = 'MMEVO_CPU_FASTPATH'


def _env_default():
    value = os.environ.get(ENV_VAR, '1')
    if value not in ('0', '1'):
        raise ValueError(f"{ENV_VAR} must be '0' or '1', got {value!r}")
    return value == '1'


class _State(threading.local):
    """The switch, per thread (each thread starts from the environment)."""

    def __init__(self):
        self.on = _env_default()


_state = _State()


def is_on():
    """Whether the switch is on in this thread (see :func:`use`)."""
    return _state.on


@contextlib.contextmanager
def use(on):
    """Turn the CPU fast paths on or off in this thread, inside the block.

    Args:
        on (bool): True takes the fast paths where :func:`enabled` allows,
            False always runs the stock graph.

    Example:
        >>> import torch
        >>> from mmevo.ops import cpu_fastpath
        >>> with cpu_fastpath.use(False):
        ...     cpu_fastpath.enabled(torch.zeros(1))
        False
    """
    if not isinstance(on, bool):
        raise TypeError(f'on must be a bool, got {type(on).__name__}')
    old, _state.on = _state.on, on
    try:
        yield
    finally:
        _state.on = old


def _capturing():
    """Whether a tracer, scripter, exporter or compiler is running."""
    exporting = getattr(torch.compiler, 'is_exporting', None)
    return (torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()
            or (exporting is not None and exporting()))


def enabled(x):
    """Whether a module whose input is ``x`` takes its CPU fast path.

    Args:
        x (Tensor): the module's input.

    Returns:
        bool: ``x`` is on the CPU, nothing is tracing / scripting / exporting
        / compiling, and the switch is on.
    """
    return _state.on and x.device.type == 'cpu' and not _capturing()


# --- 1x1 convolutions as matmuls -------------------------------------------

# Below this many pixels per image, the weight gradient is one matmul over
# all B * H * W pixels (after a transpose of the small operands) instead of B
# matmuls summed: with K = H * W that short, the B products are ~2x slower.
_SINGLE_MATMUL_PIXELS = 100


def _pointwise_forward(x, weight, bias):
    B, C, H, W = x.shape
    C_out = weight.shape[0]
    y = torch.bmm(
        weight.view(1, C_out, C).expand(B, -1, -1), x.reshape(B, C, H * W))
    if bias is not None:
        # In place: bmm's backward does not need y, and a second buffer the
        # size of a whole generated kernel costs more than the add.
        y.add_(bias.view(1, -1, 1))
    return y.view(B, C_out, H, W)


class _Pointwise(torch.autograd.Function):
    """oneDNN's 1x1 conv backward is 1.5-10x slower on CPU than bmm's."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # The inputs themselves (not views made here): double backward
        # differentiates through them.
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _pointwise_forward(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        B, C, H, W = x.shape
        C_out, HW = weight.shape[0], H * W
        # In the dtype the forward ran in (autocast's, if it was on).
        g3 = grad.reshape(B, C_out, HW)
        x3 = x.reshape(B, C, HW).to(g3.dtype)
        w2 = weight.view(C_out, C).to(g3.dtype)
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
            rows = x3.shape[1]
            if HW < _SINGLE_MATMUL_PIXELS:
                grad_wb = torch.mm(
                    g3.transpose(0, 1).reshape(C_out, B * HW),
                    x3.transpose(0, 1).reshape(rows, B * HW).t())
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

    oneDNN's CPU 1x1 convolution (above all its backward) is 1.5-10x slower
    than ``bmm`` at the sizes of the generation / projection convs and the
    bottlenecks' reducing convs. Differentiable to any order (the backward
    is made of matmuls).

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
    return _Pointwise.apply(x, weight, bias)


def _is_1x1(conv):
    """A plain, ungrouped, unpadded 1x1 ``nn.Conv2d`` (any stride)."""
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1)
            and conv.padding == (0, 0) and conv.dilation == (1, 1)
            and conv.groups == 1)


def conv1x1(module, x):
    """``module(x)``, a 1x1 stride-1 ``nn.Conv2d`` run by :func:`pointwise`.

    Also for an mmcv ``ConvModule`` in its default (conv, norm, act) order:
    its norm and activation follow. Any other module is called as is.
    """
    conv = getattr(module, 'conv', module)
    if not (_is_1x1(conv) and conv.stride == (1, 1)):
        return module(x)
    if conv is module:
        return pointwise(x, conv.weight, conv.bias)
    if (module.order != ('conv', 'norm', 'act') or module.with_spectral_norm
            or module.with_explicit_padding):
        return module(x)
    out = pointwise(x, conv.weight, conv.bias)
    if module.with_norm:
        out = module.norm(out)
    if module.with_activation:
        out = module.activate(out)
    return out


def subsampled_conv1x1(conv, x):
    """``conv(x)`` for a strided 1x1 ``nn.Conv2d``, run on ``x[::s, ::s]``:
    oneDNN's CPU backward of a strided 1x1 conv first copies its whole input
    (~2x slower)."""
    sh, sw = conv.stride
    return F.conv2d(x[:, :, ::sh, ::sw], conv.weight, conv.bias)


def _downsample(downsample, x):
    """A bottleneck's (1x1 conv, norm) shortcut, the conv subsampled."""
    if isinstance(downsample, nn.Sequential) and len(downsample) == 2:
        conv = downsample[0]
        if _is_1x1(conv) and conv.stride != (1, 1):
            return downsample[1](subsampled_conv1x1(conv, x))
    return downsample(x)


# --- ResNet stem and bottleneck ----------------------------------------------


class _ToContiguous(torch.autograd.Function):
    """``x.contiguous()`` for a channels_last ``x`` whose gradient goes back
    channels_last: max-pool's CPU backward follows the layout of its
    gradient and would otherwise copy its whole (4x larger) input to NCHW."""

    @staticmethod
    def forward(ctx, x):
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous(memory_format=torch.channels_last)


class _ToChannelsLast(torch.autograd.Function):
    """``x`` in channels_last, its gradient back in NCHW, so the ReLU and BN
    backward before it do not run on mixed layouts (~3x slower)."""

    @staticmethod
    def forward(ctx, x):
        return x.contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def bottleneck_forward(block, x):
    """mmdet's ``Bottleneck.forward`` (no plugins, no checkpointing) with
    ``conv1`` as a matmul (:func:`conv1x1`) and the strided downsample on
    the subsampled input (:func:`subsampled_conv1x1`).

    Args:
        block (mmdet Bottleneck): the block.
        x (Tensor): (B, C_in, H, W).

    Returns:
        Tensor: the block output, ``block(x)``.
    """
    out = block.relu(block.norm1(conv1x1(block.conv1, x)))
    out = block.relu(block.norm2(block.conv2(out)))
    out = block.norm3(block.conv3(out))
    if block.downsample is not None:
        x = _downsample(block.downsample, x)
    out += x
    return block.relu(out)


def resnet_forward(model, x):
    """mmdet's ``ResNet.forward`` with the stem's tail and the max-pool in
    channels_last: there oneDNN's NCHW conv, BN and max-pool (forward and
    backward) are 1.5-3x slower on CPU. The stages run NCHW, the layout of
    the mmevo ops, so the outputs are NCHW.

    Args:
        model (mmdet ResNet): the backbone; a deep stem must be a Sequential.
        x (Tensor): (B, in_channels, H, W).

    Returns:
        tuple[Tensor]: the outputs of the stages in ``out_indices``.
    """
    if model.deep_stem:
        *head, tail = model.stem
        for layer in head:
            x = layer(x)
        x = tail(_ToChannelsLast.apply(x))
    else:
        x = x.contiguous(memory_format=torch.channels_last)
        x = model.relu(model.norm1(model.conv1(x)))
    x = model.maxpool(x.contiguous(memory_format=torch.channels_last))
    x = _ToContiguous.apply(x)
    outs = []
    for i, layer_name in enumerate(model.res_layers):
        x = getattr(model, layer_name)(x)
        if i in model.out_indices:
            outs.append(x)
    return tuple(outs)


# --- ACmix -------------------------------------------------------------------


class _SplitProjection(torch.autograd.Function):
    """One fused q/k/v projection -> the inputs of both ACmix paths.

    ``proj`` (B, 3C, H, W) holds q, k and v with channels ordered
    (head_dim, {q, k, v}, head): the order in which the conv path's grouped
    convolution reads them, so its input is ``proj`` itself in channels_last
    memory (oneDNN's grouped backward is ~15x faster on it). The attention
    path gets head-major copies: the query (strided, times ``q_scale``), the
    key minus ``pe`` (1, head_dim, H, W) and the value. One node rather than
    slicing, so that the backward writes the four gradients into one buffer
    instead of summing zero-filled copies of ``proj``.
    """

    @staticmethod
    def forward(ctx, proj, pe, head, stride, q_scale):
        B, C3, H, W = proj.shape
        C, s = C3 // 3, stride
        hd = C // head
        rows = proj.view(B, hd, 3, head, H, W).permute(0, 2, 3, 1, 4, 5)
        # Copied into head-major buffers, then scaled / shifted in place (not
        # out=: under torch.compile an out= result takes the source's strides).
        query = proj.new_empty(B, head, hd, -(-H // s), -(-W // s))
        query.copy_(rows[:, 0, ..., ::s, ::s]).mul_(q_scale)
        key = proj.new_empty(B, head, hd, H, W)
        key.copy_(rows[:, 1]).sub_(pe)
        value = rows[:, 2].contiguous()
        conv_input = proj.view(B, C3, H * W).transpose(1, 2).contiguous()
        ctx.geometry = (head, s, q_scale)
        return (query.view(B, C, *query.shape[-2:]), key.view(B, C, H, W),
                value.view(B, C, H,
                           W), conv_input.view(B, H, W,
                                               C3).permute(0, 3, 1, 2))

    @staticmethod
    def backward(ctx, g_query, g_key, g_value, g_conv):
        head, s, q_scale = ctx.geometry
        B, C3, H, W = g_conv.shape
        hd = C3 // 3 // head
        grad = g_conv.permute(0, 2, 3, 1).reshape(B, H * W, C3)
        grad = grad.transpose(1, 2).contiguous()
        rows = grad.view(B, hd, 3, head, H, W).permute(0, 2, 3, 1, 4, 5)

        def heads(g):  # (B, C, h, w) -> (B, head, head_dim, h, w)
            return g.reshape(B, head, hd, *g.shape[-2:])

        rows[:, 0, ..., ::s, ::s].add_(heads(g_query), alpha=q_scale)
        rows[:, 1].add_(heads(g_key))
        g_pe = heads(g_key).sum((0, 1), keepdim=True).neg_()
        rows[:, 2].add_(heads(g_value))
        return grad.view(B, C3, H, W), g_pe[0], None, None, None


class _Mix(torch.autograd.Function):
    """``rate1 * out_att + out_conv`` in one pass, in out_att's NCHW layout
    (that of the rest of the network): an elementwise op would take the
    channels_last layout of the conv path's output, its first operand."""

    @staticmethod
    def forward(ctx, out_att, out_conv, rate1):
        ctx.save_for_backward(out_att, rate1)
        out = torch.empty_like(out_att, memory_format=torch.contiguous_format)
        return torch.addcmul(out_conv, out_att, rate1, out=out)

    @staticmethod
    def backward(ctx, grad):
        out_att, rate1 = ctx.saved_tensors
        grad = grad.contiguous()
        g_rate1 = torch.dot(grad.view(-1), out_att.reshape(-1)).view(1)
        return grad * rate1, grad, g_rate1


def acmix_inputs(layer, x, pe):
    """ACmix's query, key, value and conv path input from one matmul.

    oneDNN's 1x1 conv backward is many times slower at these widths than
    one ``baddbmm`` projecting q, k and v at once (see
    :class:`_SplitProjection` for the outputs).

    Args:
        layer (ACmix): the layer.
        x (Tensor): (B, in_planes, H, W).
        pe (Tensor): ``layer.conv_p`` of the position map, (1, head_dim, H,
            W).

    Returns:
        tuple[Tensor]: query (scaled, strided), key (minus ``pe``), value,
        and the conv path input (channels_last, channels (head_dim, {q, k,
        v}, head)).
    """
    B, C_in, H, W = x.shape
    convs = (layer.conv1, layer.conv2, layer.conv3)
    # Rows (head_dim, {q, k, v}, head): the grouping of dep_conv.
    weight = torch.stack([
        c.weight.view(layer.head, layer.head_dim, C_in) for c in convs
    ]).permute(2, 0, 1, 3)
    bias = torch.stack([
        c.bias.view(layer.head, layer.head_dim) for c in convs
    ]).permute(2, 0, 1)
    proj = torch.baddbmm(
        bias.reshape(-1, 1),
        weight.reshape(1, -1, C_in).expand(B, -1, -1),
        x.reshape(B, C_in, H * W))
    return _SplitProjection.apply(
        proj.view(B, 3 * layer.out_planes, H, W), pe.to(proj.dtype),
        layer.head, layer.stride, layer.head_dim**-0.5)


def acmix_output(layer, out_att, conv_input):
    """``rate1 * out_att + rate2 * dep_conv(fc(q, k, v))`` for ACmix.

    ``fc`` mixes the 3 * head heads of each (channel, pixel) and
    ``dep_conv`` is grouped by channel, so ``rate2 * fc`` folds into
    ``dep_conv``'s weights: one grouped convolution reads the projection
    (channels_last), and :class:`_Mix` adds the attention path.
    """
    fc = layer.fc.weight.view(layer.kernel_conv**2, -1) * layer.rate2
    weight = torch.einsum('otuv,tj->ojuv', layer.dep_conv.weight, fc)
    out_conv = F.conv2d(conv_input, weight, None, layer.stride,
                        layer.kernel_conv // 2, 1, layer.head_dim)
    return _Mix.apply(out_att, out_conv, layer.rate1)
