"""ACmix (Pan et al., CVPR 2022): attention + shift-conv on shared q/k/v."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmevo.ops import (
    check_int,
    cpp_backend,
    fused_local_attention,
    local_attention_weights,
)
from mmevo.ops.library import output_layout
from mmevo.registry import MODELS

from .base import (
    EvolutionLayer,
    InitCfg,
    check_divisible,
    check_weight_size,
)
from .fastpath import (
    _SINGLE_MATMUL_PIXELS,
    cpu_fastpath_default,
    cpu_fastpath_scope,
    pointwise,
    takes_cpu_fastpath,
    takes_fused_cpu,
    takes_onednn_conv1x1,
)


def position_map(
    height: int, width: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Normalised coordinates (1, 2, H, W): channel 0 = column, 1 = row.

    ``torch.linspace(-1, 1, n)`` of the published code, written with
    ``arange`` so that an ONNX export keeps n symbolic (exporters fold a
    linspace to a constant).
    """

    def linspace(n):
        pos = torch.arange(n, dtype=dtype, device=device)
        # n = 1 gives [-1], as linspace does
        return pos / pos[-1:].clamp(min=1) * 2 - 1

    loc_w, loc_h = linspace(width), linspace(height)
    return torch.stack(
        [
            loc_w.view(1, -1).expand(height, width),
            loc_h.view(-1, 1).expand(height, width),
        ]
    ).unsqueeze(0)


def _rows_as_batch(x):
    """``x`` (B, C, H, W) as a channels_last (B * H, C, 1, W) view of its
    channels_last copy: a 1x1 convolution of it is the projection with the
    pixels as rows, and from 16 rows PyTorch runs it on oneDNN, forward and
    backward (weight gradient included), even on one thread (a 1x1 conv of
    a batch below 16 takes its native kernel there)."""
    B, C, H, W = x.shape
    rows = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    return rows.reshape(B * H, 1, W, C).permute(0, 3, 1, 2)


def _onednn_projection_grads(ctx, grad, x, weight):
    """The gradients of x, weight and bias of :class:`_Projection` on
    oneDNN: ``convolution_backward`` of the rows-as-batch convolution. x's
    channels_last copy is made again rather than kept (it would be a third
    of the buffer, per layer)."""
    B, C_in, H, W = x.shape
    C3 = weight.shape[0]
    g = grad.reshape(B * H, 1, W, C3).permute(0, 3, 1, 2)
    grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
        g,
        _rows_as_batch(x),
        weight.view(C3, C_in, 1, 1),
        [C3],
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        list(ctx.needs_input_grad[:3]),
    )
    if grad_x is not None:
        grad_x = grad_x.permute(0, 2, 3, 1).reshape(B, H, W, C_in)
        grad_x = grad_x.permute(0, 3, 1, 2)
    if grad_w is not None:
        grad_w = grad_w.view(C3, C_in)
    return grad_x, grad_w, grad_b


class _Projection(torch.autograd.Function):
    """The fused q/k/v projection of ``x`` (B, C_in, H, W) as
    (B, H * W, 3C): the pixels as rows, i.e. channels_last, with no
    transpose pass (oneDNN's grouped backward is ~15x faster on it).

    ``weight`` (3C, C_in) and ``bias`` (3C,) hold the rows of q, k and v
    in the modules' order, ({q, k, v}, head, head_dim): a pixel's head is a
    contiguous vector for the attention, and the conv path's groups (a
    head_dim channel each) vectors along head_dim for
    :class:`_GroupConv`; the query rows come scaled (by ``head_dim**-0.5``,
    in ``weight`` and ``bias``). ``pe`` (1, head_dim, H, W) is subtracted
    from the key rows in place, taken as a constant: its gradient is
    :class:`_SplitProjection`'s. The backward keeps x alone, and takes the
    matmuls of the channels_last gradient as they are (no transpose); x's
    gradient goes back in x's layout, as the stock convolutions give it
    (the ReLU before the layer takes a mixed-layout backward 17x slower:
    2.1 against 0.12 ms at (4, 64, 56, 56), two threads).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, pe, head):
        B, C_in, H, W = x.shape
        C3 = weight.shape[0]
        hd = C3 // 3 // head
        ctx.onednn = takes_onednn_conv1x1(x, weight)
        if ctx.onednn:
            y = F.conv2d(_rows_as_batch(x), weight.view(C3, C_in, 1, 1), bias)
            buf = y.permute(0, 2, 3, 1).reshape(B, H * W, C3)
        else:
            buf = torch.baddbmm(
                bias,
                x.reshape(B, C_in, H * W).transpose(1, 2),
                weight.t().expand(B, -1, -1),
            )
        # pe in the rows' layout, repeated over the heads: a pixel's key
        # rows are one run of C channels, where a broadcast over the heads
        # steps head_dim at a time (2.47 against 0.28 ms at (4, 64, 56, 56),
        # head_dim 16, one thread; a broadcast of pe's NCHW view is slower).
        pe = pe.to(buf.dtype).permute(0, 2, 3, 1).reshape(1, H * W, hd)
        buf.view(B, H * W, 3, head * hd)[:, :, 1].sub_(pe.repeat(1, 1, head))
        ctx.save_for_backward(x, weight)
        return buf

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        B, P, C3 = grad.shape
        C_in = x.shape[1]
        # In the dtype the forward ran in (autocast's, if it was on).
        x3 = x.reshape(B, C_in, P).to(grad.dtype)
        weight = weight.to(grad.dtype)
        if ctx.onednn:
            grad_x, grad_w, grad_b = _onednn_projection_grads(
                ctx, grad, x, weight
            )
            if grad_x is not None:
                grad_x = grad_x.contiguous(memory_format=output_layout(x))
            return grad_x, grad_w, grad_b, None, None
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            w = weight.t().expand(B, -1, -1)
            grad_x = torch.bmm(w, grad.transpose(1, 2)).view(x.shape)
            grad_x = grad_x.contiguous(memory_format=output_layout(x))
        if ctx.needs_input_grad[1]:
            # One matmul over all pixels (copying x) where the B products
            # would be short, or larger than x.
            if P < max(_SINGLE_MATMUL_PIXELS, C3):
                x2 = x3.transpose(0, 1).reshape(C_in, B * P)
                grad_w = torch.mm(x2, grad.reshape(B * P, C3))
            else:
                grad_w = torch.bmm(x3, grad).sum(0)
            grad_w = grad_w.t()
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, 1))
        return grad_x, grad_w, grad_b, None, None


class _SplitProjection(torch.autograd.Function):
    """:class:`_Projection`'s buffer (B, H * W, 3C) -> the inputs of both
    ACmix paths, as views of it: the attention path's query (at stride s),
    key and value as grouped views (B, head, head_dim, ., .), and the conv
    path's channels-last (B, 3C, H, W) input (which undoes the scale and
    shift in its weights, see ``ACmix._forward_cpu``), so that the buffer
    is all the backward keeps of them. One node rather than slicing, so
    that the backward writes the four gradients into one buffer instead of
    summing zero-filled copies of it: the conv path's gradient, which
    :class:`_GroupConv` gives in the buffer's layout and nothing else
    holds, takes the other three in place (``mmevo::acmix_add_heads_``, a
    transposing add, 1.5-1.8x faster than strided ``add_``). ``pe`` is
    taken for its gradient alone.
    """

    @staticmethod
    def forward(ctx, buf, pe, head, stride, H, W):
        B, _, C3 = buf.shape
        rows = buf.view(B, H, W, 3, head, C3 // 3 // head)
        heads = rows.permute(0, 3, 4, 5, 1, 2)  # (B, 3, head, hd, H, W)
        ctx.geometry = (head, stride)
        return (
            heads[:, 0, ..., ::stride, ::stride],
            heads[:, 1],
            heads[:, 2],
            buf.view(B, H, W, C3).permute(0, 3, 1, 2),
        )

    @staticmethod
    def backward(ctx, g_query, g_key, g_value, g_conv):
        head, s = ctx.geometry
        B, C3, H, W = g_conv.shape
        grad = g_conv.permute(0, 2, 3, 1).contiguous()
        if cpp_backend.available() and not torch.is_grad_enabled():
            torch.ops.mmevo.acmix_add_heads_(
                grad.view(B, H, W, 3, C3 // 3),
                *(g.flatten(1, 2) for g in (g_query, g_key, g_value)),
                s,
            )
        else:  # create_graph (a double backward follows), or no C++
            hd = C3 // 3 // head
            rows = grad.view(B, H, W, 3, head, hd).permute(0, 3, 4, 5, 1, 2)
            rows[:, 0, ..., ::s, ::s].add_(g_query)
            rows[:, 1].add_(g_key)
            rows[:, 2].add_(g_value)
        # The conv path's share of pe's gradient, -sum(g_conv[k rows]), is
        # cancelled exactly by that of its correction (ACmix._forward_cpu),
        # so both are left out: in low precision their sum is noise.
        g_pe = g_key.sum((0, 1)).neg_()
        return (
            grad.view(B, H * W, C3),
            g_pe.unsqueeze(0),
            None,
            None,
            None,
            None,
        )


def _group_major(x, groups):
    """``x`` (B, J * G, H, W), group g in the channels j * G + g, as the
    (B, G * J, H, W) map (group g in g * J + j) that a grouped convolution
    reads; ``groups`` is G. A copy."""
    return x.unflatten(1, (-1, groups)).transpose(1, 2).flatten(1, 2)


class _GroupConv(torch.autograd.Function):
    """``F.conv2d(_group_major(x, groups), weight, None, stride, padding, 1,
    groups)``, the conv path's grouped convolution, read from the
    channels-last buffer in place, where the groups interleave
    (``mmevo::acmix_conv``, vectors along the groups): oneDNN runs these
    small groups (12 -> 4 channels) one at a time, in 1.1-2.1x the C++
    kernel's time forward and 1.25-2.05x forward + backward at
    ACmix-ResNet-50's layer shapes (``docs/benchmarks.md``). x's gradient
    comes back channels-last, the buffer's layout. A double backward takes
    the stock, differentiable formula.
    """

    @staticmethod
    def forward(ctx, x, weight, groups, stride, padding):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (groups, stride, padding)
        return torch.ops.mmevo.acmix_conv(x, weight, groups, stride, padding)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        groups, stride, padding = ctx.geometry
        mask = list(ctx.needs_input_grad[:2])
        if torch.is_grad_enabled():  # create_graph
            grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
                grad,
                _group_major(x, groups),
                weight,
                None,
                [stride] * 2,
                [padding] * 2,
                [1, 1],
                False,
                [0, 0],
                groups,
                [*mask, False],
            )
            if grad_x is not None:  # back to x's channel order
                grad_x = grad_x.unflatten(1, (groups, -1)).transpose(1, 2)
                grad_x = grad_x.flatten(1, 2)
        else:
            grad_x, grad_w = torch.ops.mmevo.acmix_conv_backward(
                grad, x, weight, groups, stride, padding, mask
            )
        return grad_x, grad_w, None, None, None


class _Mix(torch.autograd.Function):
    """``rate1 * out_att + out_conv + out_pe`` in one pass, in out_att's
    NCHW layout (that of the rest of the network): an elementwise op would
    take the channels_last layout of the conv path's output, its first
    operand; ``out_pe`` (1, C, H_out, W_out) is broadcast over the batch.
    The dtype is the stock sum's: under autocast, the float32 rates promote
    the half-precision paths."""

    @staticmethod
    def forward(ctx, out_att, out_conv, out_pe, rate1):
        ctx.save_for_backward(out_att, rate1)
        ctx.pe_dtype = out_pe.dtype
        out = torch.empty_like(
            out_att,
            dtype=torch.promote_types(out_att.dtype, rate1.dtype),
            memory_format=torch.contiguous_format,
        )
        return torch.addcmul(out_conv, out_att, rate1, out=out).add_(out_pe)

    @staticmethod
    def backward(ctx, grad):
        out_att, rate1 = ctx.saved_tensors
        grad = grad.contiguous()
        att = out_att.reshape(-1).to(grad.dtype)
        g_rate1 = torch.dot(grad.view(-1), att).view(1)
        g_pe = grad.sum(0, keepdim=True, dtype=ctx.pe_dtype)
        return grad * rate1, grad, g_pe, g_rate1


@MODELS.register_module()
class ACmix(EvolutionLayer):
    """ACmix: rate1 * local self-attention + rate2 * shift convolution.

    Both paths share the 1x1 projections ``conv1``/``conv2``/``conv3``
    (q, k, v, with bias). Attention path (the evolution kernel, G = head):
    logits of the query at (i, j) over its ``kernel_att`` window are
    ``scale * q(i, j) . (k(n) - pe(n))`` with ``pe = conv_p(coordinates)``,
    k, v and pe reflection-padded; softmax over the window; aggregate v. (The
    published logits also add ``q(i, j) . pe(i, j)``, constant over the
    window, so it cancels in the softmax.) Convolution path: ``fc`` mixes the
    3 * head (q, k, v) heads into kernel_conv**2 shifted copies, and the
    grouped ``dep_conv`` (no bias, shift-initialised) sums them. Parameter
    names and shapes are the published ones, so its checkpoints load.

    Unlike the published code this works on odd sizes with stride > 1 (all
    paths give ceil(H / s) x ceil(W / s)), on maps smaller than the
    reflection padding (numpy-style repeated reflection), and with dilation
    (the window taps are dilated; the published code only pads more).

    On CPU in eager mode, while ``use_cpu_fastpath`` is True (see
    :mod:`mmevo.layers.fastpath`), :meth:`forward` runs the same numbers
    fused (:meth:`_forward_cpu`): q, k and v as one matmul, ``fc`` folded
    into ``dep_conv``; and, unless a kernel hook must see the attention map
    (or autocast is on, or another backend is forced), the correlation,
    softmax and aggregation as one op,
    :func:`mmevo.ops.fused_local_attention` (C++, reflection included),
    which never writes the (B, head, K, K, H_out, W_out) map: faster at
    every ACmix-ResNet-50 stage, in less memory (``docs/benchmarks.md``).
    :meth:`generate` always runs the published graph.

    Args:
        in_planes (int): input channels.
        out_planes (int): output channels, divisible by ``head``.
        kernel_att (int): attention window, odd. Default: 7.
        head (int): attention heads. Default: 4.
        kernel_conv (int): convolution path kernel, odd. Default: 3.
        stride (int): stride of both paths. Default: 1.
        dilation (int): dilation of the attention window. Default: 1.
        init_cfg (dict | list[dict], optional): mmengine initialisation.

    Example:
        >>> import torch
        >>> from mmevo.registry import MODELS
        >>> layer = MODELS.build(dict(type='ACmix', in_planes=32,
        ...                           out_planes=32, stride=2))
        >>> layer(torch.randn(2, 32, 7, 3)).shape
        torch.Size([2, 32, 4, 2])
    """

    def __init__(
        self,
        in_planes: int,
        out_planes: int,
        kernel_att: int = 7,
        head: int = 4,
        kernel_conv: int = 3,
        stride: int = 1,
        dilation: int = 1,
        init_cfg: InitCfg = None,
    ) -> None:
        # "same" padding of an odd window, the published
        # (dilation * (kernel_att - 1) + 1) // 2 for every odd kernel_att.
        super().__init__(
            kernel_att, stride, None, dilation, 'reflect', init_cfg
        )
        check_int('in_planes', in_planes)
        check_int('out_planes', out_planes)
        check_int('head', head)
        check_int('kernel_conv', kernel_conv)
        check_divisible('out_planes', out_planes, 'head', head)
        if kernel_conv % 2 == 0:
            raise ValueError(f'kernel_conv must be odd, got {kernel_conv}')
        # dep_conv's weight, the largest that kernel_conv sizes
        shape = (out_planes, kernel_conv**2, kernel_conv, kernel_conv)
        check_weight_size('kernel_conv', kernel_conv, shape)
        self.in_planes = in_planes
        self.out_planes = out_planes
        self.head = head
        self.kernel_att = kernel_att
        self.kernel_conv = kernel_conv
        self.head_dim = out_planes // head
        self.rate1 = nn.Parameter(torch.empty(1))
        self.rate2 = nn.Parameter(torch.empty(1))
        self.conv1 = nn.Conv2d(in_planes, out_planes, 1)
        self.conv2 = nn.Conv2d(in_planes, out_planes, 1)
        self.conv3 = nn.Conv2d(in_planes, out_planes, 1)
        self.conv_p = nn.Conv2d(2, self.head_dim, 1)
        self.fc = nn.Conv2d(3 * head, kernel_conv**2, 1, bias=False)
        self.dep_conv = nn.Conv2d(
            kernel_conv**2 * self.head_dim,
            out_planes,
            kernel_conv,
            stride=stride,
            padding=kernel_conv // 2,
            groups=self.head_dim,
            bias=False,
        )
        self.reset_parameters()
        self.use_cpu_fastpath = cpu_fastpath_default()

    def reset_parameters(self) -> None:
        """rate1 = rate2 = 0.5; ``dep_conv`` as shift kernels (published)."""
        nn.init.constant_(self.rate1, 0.5)
        nn.init.constant_(self.rate2, 0.5)
        kc = self.kernel_conv
        shift = torch.zeros(kc * kc, kc, kc)
        for t in range(kc * kc):
            shift[t, t // kc, t % kc] = 1.0
        with torch.no_grad():
            self.dep_conv.weight.copy_(shift.repeat(self.out_planes, 1, 1, 1))

    def init_weights(self) -> None:
        """mmengine init; the rates and shift kernels win over a parent's
        generic conv initialisation unless this layer has its own init_cfg."""
        super().init_weights()
        if self.init_cfg is None:
            self.reset_parameters()

    def _positions(self, x):
        """The normalised coordinates of ``x``'s map, ``conv_p``'s input."""
        return position_map(*x.shape[-2:], x.dtype, x.device)

    def _query_key(self, q, k, pe):
        """The attention path's query (scaled by ``head_dim**-0.5``, with
        stride s kept at the output pixels, the window centres) and key
        minus ``pe``, from the projections q, k (B, out_planes, H, W)."""
        B, C, H, W = k.shape
        s = self.stride
        query = q[:, :, ::s, ::s] * self.head_dim**-0.5
        key = k.view(B, self.head, self.head_dim, H, W) - pe.unsqueeze(1)
        return query, key.view(B, C, H, W)

    def _conv_path(self, q, k, v):
        """``dep_conv(fc(q, k, v heads))``, (B, out_planes, H_out, W_out).

        ``fc`` mixes the 3 * head q/k/v heads with head_dim as a spatial
        axis; the mix of each (channel, pixel) is reshaped to kernel_conv**2
        channels of ``dep_conv``'s group for that channel (published).
        """
        B, _C, H, W = q.shape
        heads = [t.view(B, self.head, self.head_dim, H * W) for t in (q, k, v)]
        f_all = self.fc(torch.cat(heads, 1))
        f_conv = f_all.permute(0, 2, 1, 3).reshape(
            B, self.head_dim * self.kernel_conv**2, H, W
        )
        return self.dep_conv(f_conv)

    def window_input(self, x: torch.Tensor) -> tuple[torch.Tensor, int, str]:
        """Reflection made explicit here (padding 0 for the ops), so the
        backward of the window ops reuses this padded map instead of padding
        again. Maps not larger than the padding (repeated reflection) are
        left to the ops, and so is every map under an export (ONNX or
        torch.export), where the size is symbolic and the ops pad any size."""
        p = self.padding
        exporting = (
            torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()
        )
        if not exporting and 0 < p < min(x.shape[-2:]):
            return F.pad(x, (p,) * 4, mode='reflect'), 0, 'zeros'
        return x, p, self.padding_mode

    def _attention(self, query, key):
        """Softmax over the window of ``query . key(n)`` (already scaled and
        shifted by ``pe``, see :meth:`_query_key`); reflection of (k - pe)
        is reflection of each, as it is linear."""
        key, padding, mode = self.window_input(key)
        return local_attention_weights(
            query,
            key,
            self.head,
            self.kernel_size,
            self.stride,
            padding,
            self.dilation,
            mode,
        )

    def _attention_stock(self, x, q, k):
        """The published attention path's weights from the projections."""
        query, key = self._query_key(q, k, self.conv_p(self._positions(x)))
        return self._attention(query, key)

    def generate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(v, attention)``; attention (B, head, K, K, Ho, Wo)."""
        self.check_input(x, self.in_planes)
        q, k, v = self.conv1(x), self.conv2(x), self.conv3(x)
        return v, self._attention_stock(x, q, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """rate1 * attention path + rate2 * convolution path.

        The published graph, each conv called as a module; on CPU in eager
        mode the same numbers from :meth:`_forward_cpu`.

        Args:
            x (Tensor): (B, in_planes, H, W).

        Returns:
            Tensor: (B, out_planes, ceil(H / s), ceil(W / s)).
        """
        self.check_input(x, self.in_planes)
        if takes_cpu_fastpath(self, x):
            with cpu_fastpath_scope():
                return self._forward_cpu(x)
        q, k, v = self.conv1(x), self.conv2(x), self.conv3(x)
        out_att = self.aggregate(v, self._attention_stock(x, q, k))
        return self.rate1 * out_att + self.rate2 * self._conv_path(q, k, v)

    def _forward_cpu(self, x):
        """:meth:`forward` fused for oneDNN's CPU convolutions, whose 1x1
        and grouped backward passes are many times slower at these widths.

        q, k and v come from one ``baddbmm`` into a channels_last buffer
        (:class:`_Projection`, :class:`_SplitProjection`) of which the fused
        attention reads its heads in place; ``fc`` mixes the 3 * head heads
        of each (channel, pixel) and ``dep_conv`` is grouped by channel, so
        ``rate2 * fc`` folds into ``dep_conv``'s weights: one grouped
        convolution reads the buffer (:class:`_GroupConv`; ``F.conv2d`` of a
        group-major copy under autocast, which runs it in low precision, or
        without the C++ extension), and :class:`_Mix` adds the attention
        path.
        """
        _, C_in, H, W = x.shape
        pe = pointwise(
            self._positions(x), self.conv_p.weight, self.conv_p.bias
        )
        # The query scale folded into conv1's rows (and undone in the conv
        # path's weights below).
        q_scale = self.head_dim**-0.5
        convs = (self.conv1, self.conv2, self.conv3)
        weights = [c.weight.view(-1, C_in) for c in convs]
        biases = [c.bias for c in convs]
        weights[0], biases[0] = weights[0] * q_scale, biases[0] * q_scale
        buf = _Projection.apply(
            x, torch.cat(weights), torch.cat(biases), pe.detach(), self.head
        )
        query, key, value, conv_input = _SplitProjection.apply(
            buf, pe, self.head, self.stride, H, W
        )
        if takes_fused_cpu(self, x, self.conv1.weight.dtype):
            out_att = fused_local_attention(
                query,
                key,
                value,
                self.head,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                self.padding_mode,
            )
        else:
            query, key, value = (t.flatten(1, 2) for t in (query, key, value))
            out_att = self.aggregate(value, self._attention(query, key))
        fc = self.fc.weight.view(self.kernel_conv**2, -1) * self.rate2
        weight = torch.einsum('otuv,tj->ojuv', self.dep_conv.weight, fc)
        # conv_input holds q * q_scale and k - pe, both undone by linearity:
        # the query columns divided by q_scale, and the convolution of pe
        # (one map for all heads and images, so one small conv) added. The
        # conv path then does not depend on pe: no gradient flows to it
        # through either term (see _SplitProjection.backward).
        w_q, w_k, w_v = weight.split(self.head, 1)
        weight = torch.cat([w_q / q_scale, w_k, w_v], 1)
        conv = (self.stride, self.kernel_conv // 2, 1, self.head_dim)
        if cpp_backend.available() and not torch.is_autocast_enabled('cpu'):
            out_conv = _GroupConv.apply(
                conv_input, weight, self.head_dim, *conv[:2]
            )
        else:
            out_conv = F.conv2d(
                _group_major(conv_input, self.head_dim), weight, None, *conv
            )
        out_pe = F.conv2d(pe.detach(), w_k.sum(1, keepdim=True), None, *conv)
        return _Mix.apply(out_att, out_conv, out_pe, self.rate1)
