"""ACmix (Pan et al., CVPR 2022): attention + shift-conv on shared q/k/v."""
import torch
import torch.nn as nn

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

    def _qkv(self, x):
        self.check_input(x, self.in_planes)
        # Matmuls: oneDNN's 1x1 conv backward is many times slower at these
        # widths. One per projection, so q, k, v are each contiguous.
        return tuple(pointwise(x, c.weight, c.bias)
                     for c in (self.conv1, self.conv2, self.conv3))

    def _attention(self, q, k):
        B, C, H, W = q.shape
        s = self.stride
        pe = self.conv_p(position_map(H, W, q.dtype, q.device))
        # q . (k(n) - pe(n)) = one correlation of q with the key shifted by
        # pe; reflection of (k - pe) is reflection of each (it is linear).
        key = (k.view(B, self.head, self.head_dim, H, W) - pe.unsqueeze(1))
        query = q[:, :, ::s, ::s] * self.head_dim**-0.5
        logits = local_correlation(query, key.view(B, C, H, W), self.head,
                                   self.kernel_size, s, self.padding,
                                   self.dilation, self.padding_mode)
        return logits.flatten(2, 3).softmax(2).view_as(logits)

    def _mix_heads(self, q, k, v):
        """``fc`` over the 3 * head q/k/v heads at every (channel, pixel).

        Returns (B, head_dim * kc^2, H, W), channel-major as ``dep_conv``
        groups it, in channels_last memory: one matmul over all (pixel,
        channel) rows writes that layout directly, and oneDNN's grouped
        ``dep_conv`` backward is ~15x faster on it than on NCHW (where
        computing both of its gradients at once is pathologically slow).
        """
        B, _, H, W = q.shape
        d, k2 = self.head_dim, self.kernel_conv**2
        # (B, HW, head_dim, 3 * head): the q, k, v heads of each channel.
        heads = torch.cat(
            [t.view(B, self.head, d, H * W).permute(0, 3, 2, 1)
             for t in (q, k, v)], 3)
        mixed = torch.matmul(heads.view(-1, 3 * self.head),
                             self.fc.weight.view(k2, 3 * self.head).t())
        return mixed.view(B, H, W, d * k2).permute(0, 3, 1, 2)

    def generate(self, x):
        """Return ``(v, attention)``; attention (B, head, K, K, Ho, Wo)."""
        q, k, v = self._qkv(x)
        return v, self._attention(q, k)

    def forward(self, x):
        """rate1 * attention path + rate2 * convolution path.

        Args:
            x (Tensor): (B, in_planes, H, W).

        Returns:
            Tensor: (B, out_planes, ceil(H / s), ceil(W / s)).
        """
        q, k, v = self._qkv(x)
        out_att = self.aggregate(v, self._attention(q, k))
        # Back to NCHW, the layout of the rest of the network.
        out_conv = self.dep_conv(self._mix_heads(q, k, v)).contiguous()
        return self.rate1 * out_att + self.rate2 * out_conv
