"""ACmix (Pan et al., CVPR 2022): attention + shift-conv on shared q/k/v."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmevo.ops import check_int, cpu_fastpath, local_attention_weights
from mmevo.registry import MODELS
from .base import EvolutionLayer, check_divisible


def position_map(height, width, dtype, device):
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
    return torch.stack([
        loc_w.view(1, -1).expand(height, width),
        loc_h.view(-1, 1).expand(height, width)
    ]).unsqueeze(0)


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

    def __init__(self,
                 in_planes,
                 out_planes,
                 kernel_att=7,
                 head=4,
                 kernel_conv=3,
                 stride=1,
                 dilation=1,
                 init_cfg=None):
        # "same" padding of an odd window, the published
        # (dilation * (kernel_att - 1) + 1) // 2 for every odd kernel_att.
        super().__init__(kernel_att, stride, None, dilation, 'reflect',
                         init_cfg)
        check_int('in_planes', in_planes)
        check_int('out_planes', out_planes)
        check_int('head', head)
        check_int('kernel_conv', kernel_conv)
        check_divisible('out_planes', out_planes, 'head', head)
        if kernel_conv % 2 == 0:
            raise ValueError(f'kernel_conv must be odd, got {kernel_conv}')
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
            bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        """rate1 = rate2 = 0.5; ``dep_conv`` as shift kernels (published)."""
        nn.init.constant_(self.rate1, 0.5)
        nn.init.constant_(self.rate2, 0.5)
        kc = self.kernel_conv
        shift = torch.zeros(kc * kc, kc, kc)
        for t in range(kc * kc):
            shift[t, t // kc, t % kc] = 1.
        with torch.no_grad():
            self.dep_conv.weight.copy_(shift.repeat(self.out_planes, 1, 1, 1))

    def init_weights(self):
        """mmengine init; the rates and shift kernels win over a parent's
        generic conv initialisation unless this layer has its own init_cfg."""
        super().init_weights()
        if self.init_cfg is None:
            self.reset_parameters()

    def _positions(self, x):
        """The normalised coordinates of ``x``'s map, ``conv_p``'s input."""
        return position_map(*x.shape[-2:], x.dtype, x.device)

    def _fast_inputs(self, x):
        """Query, key, value and conv path input (CPU fast path)."""
        pe = cpu_fastpath.conv1x1(self.conv_p, self._positions(x))
        return cpu_fastpath.acmix_inputs(self, x, pe)

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
        B, C, H, W = q.shape
        heads = [t.view(B, self.head, self.head_dim, H * W) for t in (q, k, v)]
        f_all = self.fc(torch.cat(heads, 1))
        f_conv = f_all.permute(0, 2, 1,
                               3).reshape(B,
                                          self.head_dim * self.kernel_conv**2,
                                          H, W)
        return self.dep_conv(f_conv)

    def window_input(self, x):
        """Reflection made explicit here (padding 0 for the ops), so the
        backward of the window ops reuses this padded map instead of padding
        again. Maps not larger than the padding (repeated reflection) are
        left to the ops, and so is every map under an export (ONNX or
        torch.export), where the size is symbolic and the ops pad any size."""
        p = self.padding
        exporting = (torch.onnx.is_in_onnx_export()
                     or torch.compiler.is_exporting())
        if not exporting and 0 < p < min(x.shape[-2:]):
            return F.pad(x, (p, ) * 4, mode='reflect'), 0, 'zeros'
        return x, p, self.padding_mode

    def _attention(self, query, key):
        """Softmax over the window of ``query . key(n)`` (already scaled and
        shifted by ``pe``, see :meth:`_query_key`); reflection of (k - pe)
        is reflection of each, as it is linear."""
        key, padding, mode = self.window_input(key)
        return local_attention_weights(query, key, self.head, self.kernel_size,
                                       self.stride, padding, self.dilation,
                                       mode)

    def generate(self, x):
        """Return ``(v, attention)``; attention (B, head, K, K, Ho, Wo)."""
        self.check_input(x, self.in_planes)
        if cpu_fastpath.enabled(x):
            query, key, value, _ = self._fast_inputs(x)
        else:
            q, k, value = self.conv1(x), self.conv2(x), self.conv3(x)
            pe = self.conv_p(self._positions(x))
            query, key = self._query_key(q, k, pe)
        return value, self._attention(query, key)

    def forward(self, x):
        """rate1 * attention path + rate2 * convolution path.

        On CPU in eager mode the projections, the conv path and the mix run
        fused (:func:`mmevo.ops.cpu_fastpath.acmix_inputs`); elsewhere the
        published graph runs, each conv called as a module.

        Args:
            x (Tensor): (B, in_planes, H, W).

        Returns:
            Tensor: (B, out_planes, ceil(H / s), ceil(W / s)).
        """
        self.check_input(x, self.in_planes)
        if cpu_fastpath.enabled(x):
            query, key, value, conv_input = self._fast_inputs(x)
            out_att = self.aggregate(value, self._attention(query, key))
            return cpu_fastpath.acmix_output(self, out_att, conv_input)
        q, k, v = self.conv1(x), self.conv2(x), self.conv3(x)
        query, key = self._query_key(q, k, self.conv_p(self._positions(x)))
        out_att = self.aggregate(v, self._attention(query, key))
        return self.rate1 * out_att + self.rate2 * self._conv_path(q, k, v)
