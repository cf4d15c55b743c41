"""Triton kernels of the window primitives (CUDA; CPU tensors under
``TRITON_INTERPRET=1``).

Three output-stationary kernels, one per primitive, zero padding only (reflect
padding is made explicit by :mod:`mmevo.ops.library`):

* ``aggregate``: Y = A(X, W); a program owns a (channels x output positions)
  tile of one group and loops over the K*K taps, loading each kernel row once
  for all the tile's channels;
* ``aggregate_transpose``: grad_X = At(G, W) as a gather: a program owns a tile
  of *input* positions and visits every (tap, output position) that reads it;
* ``correlate``: Corr(Q, X); a program owns one tap (u, v) of one group and a
  block of output positions, and sums over the group's channels.

Every output element is computed by one program with a fixed loop order: the
kernels are deterministic and use no atomics. Loads are converted to fp32 (fp64
stays fp64) and the sum is stored in the input dtype. Tile sizes are autotuned
per layer (channels, groups, K, stride, dilation), not per map size; one fixed
tile under the interpreter, which is slow.
"""
import contextlib
import os

import torch
import triton
import triton.language as tl

from .torch_backend import window_softmax

_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'


def _configs():
    if _INTERPRET:
        return [triton.Config({'BLOCK_C': 16, 'BLOCK_P': 128}, num_warps=4)]
    return [
        triton.Config({
            'BLOCK_C': bc,
            'BLOCK_P': bp
        }, num_warps=nw)
        for bc, bp, nw in [(8, 128,
                            4), (16, 64,
                                 4), (16, 128,
                                      4), (16, 256,
                                           8), (32, 64,
                                                4), (32, 128,
                                                     8), (4, 256,
                                                          4), (1, 512, 4)]
    ]


CONFIGS = _configs()
# Tuned once per layer type, not per map size: detection inputs vary in size,
# and re-tuning at every new size would cost more than it gains.
_KEY = ['C', 'G', 'K', 'stride', 'dilation']


@triton.autotune(configs=CONFIGS, key=_KEY)
@triton.jit
def _aggregate_kernel(x_ptr, w_ptr, y_ptr, C, H, W, G, Ho, Wo, K, stride,
                      padding, dilation, IS_FP64: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    ncb = tl.cdiv(Cg, BLOCK_C)
    n_pb = tl.cdiv(P, BLOCK_P)
    pid_c = tl.program_id(0) // n_pb
    bg = pid_c // ncb  # b * G + g
    g = bg % G
    b = bg // G
    cl = (pid_c % ncb) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cl < Cg
    chan = (b * C + g * Cg + cl).to(tl.int64)
    pos = (tl.program_id(0) % n_pb) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = pos < P
    i = pos // Wo
    j = pos % Wo
    w_base = w_ptr + bg.to(tl.int64) * K * K * P
    x_rows = x_ptr + chan[:, None] * H * W
    acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
    for u in range(K):
        row = i * stride - padding + u * dilation
        r_ok = p_mask & (row >= 0) & (row < H)
        for v in range(K):
            col = j * stride - padding + v * dilation
            ok = r_ok & (col >= 0) & (col < W)
            wv = tl.load(w_base + (u * K + v) * P + pos, mask=p_mask, other=0.)
            xv = tl.load(
                x_rows + (row * W + col)[None, :],
                mask=c_mask[:, None] & ok[None, :],
                other=0.)
            acc += wv.to(acc_t)[None, :] * xv.to(acc_t)
    tl.store(
        y_ptr + chan[:, None] * P + pos[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=c_mask[:, None] & p_mask[None, :])


@triton.autotune(configs=CONFIGS, key=_KEY)
@triton.jit
def _transpose_kernel(g_ptr, w_ptr, x_ptr, C, H, W, G, Ho, Wo, K, stride,
                      padding, dilation, IS_FP64: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    ncb = tl.cdiv(Cg, BLOCK_C)
    n_pb = tl.cdiv(H * W, BLOCK_P)
    pid_c = tl.program_id(0) // n_pb
    bg = pid_c // ncb
    g = bg % G
    b = bg // G
    cl = (pid_c % ncb) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cl < Cg
    chan = (b * C + g * Cg + cl).to(tl.int64)
    pos = (tl.program_id(0) % n_pb) * BLOCK_P + tl.arange(
        0, BLOCK_P)  # input positions
    p_mask = pos < H * W
    h = pos // W
    col = pos % W
    w_base = w_ptr + bg.to(tl.int64) * K * K * P
    g_rows = g_ptr + chan[:, None] * P
    acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
    for u in range(K):
        # Output row i whose tap u lands on h:
        # i * stride = h + padding - u * dilation.
        ti = h + padding - u * dilation
        i = ti // stride
        r_ok = p_mask & (ti >= 0) & (ti % stride == 0) & (i < Ho)
        for v in range(K):
            tj = col + padding - v * dilation
            j = tj // stride
            ok = r_ok & (tj >= 0) & (tj % stride == 0) & (j < Wo)
            wv = tl.load(
                w_base + (u * K + v) * P + i * Wo + j, mask=ok, other=0.)
            gv = tl.load(
                g_rows + (i * Wo + j)[None, :],
                mask=c_mask[:, None] & ok[None, :],
                other=0.)
            acc += wv.to(acc_t)[None, :] * gv.to(acc_t)
    tl.store(
        x_ptr + chan[:, None] * H * W + pos[None, :],
        acc.to(x_ptr.dtype.element_ty),
        mask=c_mask[:, None] & p_mask[None, :])


@triton.autotune(configs=CONFIGS, key=_KEY)
@triton.jit
def _correlate_kernel(q_ptr, x_ptr, out_ptr, C, H, W, G, Ho, Wo, K, stride,
                      padding, dilation, IS_FP64: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    n_pb = tl.cdiv(P, BLOCK_P)
    pid_t = tl.program_id(0) // n_pb  # ((b * G + g) * K + u) * K + v
    uv = pid_t % (K * K)
    bg = pid_t // (K * K)
    u = uv // K
    v = uv % K
    g = bg % G
    b = bg // G
    pos = (tl.program_id(0) % n_pb) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = pos < P
    i = pos // Wo
    j = pos % Wo
    row = i * stride - padding + u * dilation
    col = j * stride - padding + v * dilation
    ok = p_mask & (row >= 0) & (row < H) & (col >= 0) & (col < W)
    acc = tl.zeros([BLOCK_P], dtype=acc_t)
    for c0 in range(0, Cg, BLOCK_C):
        cl = c0 + tl.arange(0, BLOCK_C)
        c_mask = cl < Cg
        chan = (b * C + g * Cg + cl).to(tl.int64)
        qv = tl.load(
            q_ptr + chan[:, None] * P + pos[None, :],
            mask=c_mask[:, None] & p_mask[None, :],
            other=0.)
        xv = tl.load(
            x_ptr + chan[:, None] * H * W + (row * W + col)[None, :],
            mask=c_mask[:, None] & ok[None, :],
            other=0.)
        acc += tl.sum(qv.to(acc_t) * xv.to(acc_t), axis=0)
    tl.store(
        out_ptr + pid_t.to(tl.int64) * P + pos,
        acc.to(out_ptr.dtype.element_ty),
        mask=p_mask)


_KERNELS = (_aggregate_kernel, _transpose_kernel, _correlate_kernel)


@contextlib.contextmanager
def fixed_config(index):
    """Run every kernel with tile config ``CONFIGS[index]``, not autotuned.

    For checks that must cover every tile config (each one masks its edge
    tiles differently) without the cost of autotuning every geometry.

    Args:
        index (int): position in :data:`CONFIGS`.

    Example:
        >>> x, w = torch.randn(1, 4, 5, 5), torch.randn(1, 1, 3, 3, 5, 5)
        >>> with fixed_config(0):  # CUDA tensors, or TRITON_INTERPRET=1
        ...     y = aggregate(x, w, 1, 1, 1)
    """
    if not 0 <= index < len(CONFIGS):
        raise ValueError(f'index must be in [0, {len(CONFIGS)}), got {index}')
    saved = [k.configs for k in _KERNELS]
    for k in _KERNELS:
        k.configs = [CONFIGS[index]]
    try:
        yield
    finally:
        for k, configs in zip(_KERNELS, saved):
            k.configs = configs


def _launch(kernel, a, b, out, groups, kernel_size, in_hw, out_hw, stride,
            padding, dilation, programs_1):
    """Launch ``kernel`` on position blocks x ``programs_1(meta)``, as a 1-D
    grid."""
    n_pos = (in_hw if kernel is _transpose_kernel else out_hw)
    n_pos = n_pos[0] * n_pos[1]

    def grid(meta):
        return (triton.cdiv(n_pos, meta['BLOCK_P']) * programs_1(meta), )

    kernel[grid](
        a,
        b,
        out,
        a.shape[1],
        in_hw[0],
        in_hw[1],
        groups,
        out_hw[0],
        out_hw[1],
        kernel_size,
        stride,
        padding,
        dilation,
        IS_FP64=a.dtype == torch.float64)
    return out


def aggregate(x, w, stride, padding, dilation):
    """Y = A(x, w), see :func:`mmevo.ops.torch_backend.aggregate`."""
    x, w = x.contiguous(), w.contiguous()
    B, C, H, W = x.shape
    G, K, _, Ho, Wo = w.shape[1:]
    y = x.new_empty(B, C, Ho, Wo)
    return _launch(_aggregate_kernel, x, w, y, G, K, (H, W), (Ho, Wo), stride,
                   padding, dilation,
                   lambda meta: B * G * triton.cdiv(C // G, meta['BLOCK_C']))


def aggregate_transpose(gy, w, in_hw, stride, padding, dilation):
    """grad_x = At(gy, w), see
    :func:`mmevo.ops.torch_backend.aggregate_transpose`."""
    gy, w = gy.contiguous(), w.contiguous()
    B, C, Ho, Wo = gy.shape
    G, K = w.shape[1:3]
    gx = gy.new_empty(B, C, *in_hw)
    return _launch(_transpose_kernel, gy, w, gx, G, K, tuple(in_hw), (Ho, Wo),
                   stride, padding, dilation,
                   lambda meta: B * G * triton.cdiv(C // G, meta['BLOCK_C']))


def correlate(q,
              x,
              groups,
              kernel_size,
              stride,
              padding,
              dilation,
              softmax=False):
    """out = Corr(q, x), see :func:`mmevo.ops.torch_backend.correlate`; the
    softmax (if asked) runs after the kernel, in fp32 at least."""
    q, x = q.contiguous(), x.contiguous()
    B, C, Ho, Wo = q.shape
    # Logits for the softmax stay in fp32: rounded to bf16 (fp16), a logit
    # of 8 is off by up to 0.03 (0.004), and so is its weight, relatively.
    acc = torch.promote_types(q.dtype, torch.float32)
    out = q.new_empty(
        B,
        groups,
        kernel_size,
        kernel_size,
        Ho,
        Wo,
        dtype=acc if softmax else q.dtype)
    out = _launch(_correlate_kernel, q, x, out, groups, kernel_size,
                  tuple(x.shape[-2:]), (Ho, Wo), stride, padding, dilation,
                  lambda meta: B * groups * kernel_size * kernel_size)
    if not softmax:
        return out
    return window_softmax(out).to(q.dtype)
