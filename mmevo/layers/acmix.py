"""ACmix (Pan et al., CVPR 2022): attention + shift-conv on shared q/k/v."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmevo.ops import local_correlation
from mmevo.registry import MODELS
from .base import EvolutionLayer, check_divisible, check_int
from .involution import pointwise


def position_map(height, width, dtype, device):
    """Normalised coordinates (1, 2, H, W): channel 0 = column, 1 = row."""
    loc_w = torch.linspace(-1.0, 1.0, width, dtype=dtype, device=device)
    loc_h = torch.linspace(-1.0, 1.0, height, dtype=dtype, device=device)
    return torch.stack([loc_w.view(1, -1).expand(height, width),
                        loc_h.view(-1, 1).expand(height, width)]).unsqueeze(0)


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
            self.dep_conv.weight.copy_(
                shift.repeat(self.out_planes, 1, 1, 1))

    def init_weights(self):
        """mmengine init; the rates and shift kernels win over a parent's
        generic conv initialisation unless this layer has its own init_cfg."""
        super().init_weights()
        if self.init_cfg is None:
            self.reset_parameters()

    def _attention_inputs(self, x, v_scale=None):
        """Query (B, C, ceil(H / s), ceil(W / s)), key and value (B, C, H, W).

        The query is only needed at the output pixels (the window centres),
        so with stride s it is projected from those alone. Constants are
        folded into the small projection weights instead of passes over the
        maps: the query is scaled by ``head_dim**-0.5``, the key has ``pe``
        subtracted (its bias is ``b - pe`` per pixel) and the value is scaled
        by ``v_scale`` (``rate1`` in :meth:`forward`). Matmuls: oneDNN's 1x1
        conv backward is many times slower at these widths.
        """
        self.check_input(x, self.in_planes)
        B, _, H, W = x.shape
        scale, s = self.head_dim**-0.5, self.stride
        query = pointwise(x[:, :, ::s, ::s], self.conv1.weight * scale,
                          self.conv1.bias * scale)
        pe = pointwise(position_map(H, W, x.dtype, x.device),
                       self.conv_p.weight, self.conv_p.bias)
        key_bias = (self.conv2.bias.view(self.head, -1, 1) -
                    pe.view(1, self.head_dim, -1))
        key = torch.baddbmm(
            key_bias.view(1, self.out_planes, H * W),
            self.conv2.weight.view(1, self.out_planes, -1).expand(B, -1, -1),
            x.reshape(B, self.in_planes, H * W)).view(B, -1, H, W)
        w_v, b_v = self.conv3.weight, self.conv3.bias
        if v_scale is not None:
            w_v, b_v = w_v * v_scale, b_v * v_scale
        return query, key, pointwise(x, w_v, b_v)

    def window_input(self, x):
        """Reflection made explicit here (padding 0 for the ops), so the
        backward of the window ops reuses this padded map instead of padding
        again. Maps not larger than the padding (repeated reflection) are
        left to the ops."""
        p = self.padding
        if 0 < p < min(x.shape[-2:]):
            return F.pad(x, (p, ) * 4, mode='reflect'), 0, 'zeros'
        return x, p, self.padding_mode

    def _attention(self, query, key):
        """Softmax over the window of ``query . key(n)`` (already scaled and
        shifted by ``pe``, see :meth:`_attention_inputs`); reflection of
        (k - pe) is reflection of each, as it is linear."""
        key, padding, mode = self.window_input(key)
        logits = local_correlation(query, key, self.head,
                                   self.kernel_size, self.stride, padding,
                                   self.dilation, mode)
        return logits.flatten(2, 3).softmax(2).view_as(logits)

    def _conv_path(self, x):
        """``rate2 * dep_conv(fc(q, k, v heads))``, (B, C, H_out, W_out).

        ``fc`` mixes the 3 * head q/k/v heads of each (channel, pixel); as
        the projections are linear, ``rate2 * fc`` is folded into them, so
        one matmul maps x to the ``dep_conv`` input, written channel-major
        (head_dim, kc^2) in channels_last memory: no q/k/v transposes, and
        oneDNN's grouped ``dep_conv`` backward is ~15x faster on that layout
        than on NCHW.
        """
        B, _, H, W = x.shape
        k2, d = self.kernel_conv**2, self.head_dim
        fc = (self.fc.weight.view(k2, 3, self.head) * self.rate2).unbind(1)
        convs = (self.conv1, self.conv2, self.conv3)
        # fc over the heads of the stacked q/k/v weights, as three matmuls on
        # the weights as they are stored (no concatenated or permuted copy
        # of them): (k2, head_dim * in_planes) and (k2, head_dim).
        weight = sum(torch.mm(f, c.weight.view(self.head, -1))
                     for f, c in zip(fc, convs))
        bias = sum(torch.mm(f, c.bias.view(self.head, -1))
                   for f, c in zip(fc, convs))
        # Rows in dep_conv's (head_dim, k2) channel order, in_planes inner.
        weight = weight.view(k2, d, -1).transpose(0, 1).reshape(d * k2, -1)
        pixels = x.reshape(B, self.in_planes, H * W).transpose(1, 2)
        mixed = torch.baddbmm(bias.t().flatten(), pixels,
                              weight.t().expand(B, -1, -1))
        return self.dep_conv(mixed.view(B, H, W, -1).permute(0, 3, 1, 2))

    def generate(self, x):
        """Return ``(v, attention)``; attention (B, head, K, K, Ho, Wo)."""
        query, key, v = self._attention_inputs(x)
        return v, self._attention(query, key)

    def forward(self, x):
        """rate1 * attention path + rate2 * convolution path.

        Args:
            x (Tensor): (B, in_planes, H, W).

        Returns:
            Tensor: (B, out_planes, ceil(H / s), ceil(W / s)).
        """
        query, key, v = self._attention_inputs(x, self.rate1)
        out_att = self.aggregate(v, self._attention(query, key))
        # out_att first: the sum takes its NCHW layout, the rest of the
        # network's, not the channels_last one of the convolution path.
        return out_att + self._conv_path(x)
