"""The Triton kernels of the fused involution (:mod:`.triton_fused`
tunes and launches them): the involution kernel ``W = S z + b`` is computed
per tile in registers and never written, forward or backward.

Both kernels cut the output map into tiles of ``TILE_H x TILE_W``
positions (:func:`.triton_fused.tile_shape`: as many as keep the halo of
the neighbouring tiles under half of every operand read), swept in
sub-tiles of ``BLOCK_P`` positions; the tile of *input* positions of an
output tile is ``stride`` times larger (clipped to the map), so the input
tiles partition the input map too. Each is deterministic (no atomics; a
fixed loop order):

* ``forward``: a program owns ``BLOCK_C`` channels of one (batch, group)
  over one tile. Per tap it computes the sub-tile's kernel row ``w = b +
  sum_r S[row, r] z[r, tile]`` (z from cache: the C_r rows of the sub-tile
  are re-read for every tap) and adds ``w * x_window`` to the ``(BLOCK_C,
  BLOCK_P)`` accumulator.
* ``backward``: a program owns every channel of one batch over one tile,
  so that each operand is read once plus its halo. First the kernel
  gradient: per output sub-tile it forms ``dW = sum_c grad_y x_window``
  for ``BLOCK_T`` rows of the kernel map (group-major taps, across groups)
  at a time, and contracts it at once with two ``tl.dot``: ``grad_z += S^T
  dW`` in registers (stored once per sub-tile) and the program's own
  partial sums of ``grad_S += dW z^T`` (and ``grad_b += sum dW``), summed
  over programs afterwards (:func:`.triton_fused.fused_involution_backward`;
  :func:`.triton_fused.tile_shape` keeps them at most
  1/:data:`.triton_fused.PARTIAL_FRACTION` of the kernel map). C_r over
  ``BLOCK_R`` takes several z-channel blocks in turn, each recomputing dW
  from the same cached grad_y and x. Then grad_x over the input tile, as a
  gather (as the unfused ``aggregate_transpose`` kernel): for each tap, the
  output position that reads it, the kernel value there recomputed from z,
  times grad_y, ``BLOCK_C`` channels by ``BLOCK_Q`` positions at a time.
  fp32 products are three tf32 tensor-core products (``tf32x3``, fp32
  accuracy; fp32 FMA dots spill).

Loads are converted to fp32 (fp64 stays fp64), and results are stored in
the input dtype. Offsets that can pass 2**31 (batch and channel bases, the
partials) are int64.
"""

import triton
import triton.language as tl


@triton.jit
def _program(Ho, Wo, TILE_H, TILE_W):
    """This program's (outer index, tile, tiles per tile row): programs
    ``pid = outer * tiles + tile``, neighbouring tiles next to each other
    (their shared halo still in L2)."""
    n_tw = tl.cdiv(Wo, TILE_W)
    n_t = tl.cdiv(Ho, TILE_H) * n_tw
    pid = tl.program_id(0)
    return pid // n_t, pid % n_t, n_tw


@triton.jit
def _tile(t, n_tw, rows, cols, lim_h, lim_w):
    """Origin and extent of tile ``t`` of ``rows x cols`` positions (row
    major, ``n_tw`` a tile row) of a ``lim_h x lim_w`` map: (h0, w0, cols
    in it, positions in it)."""
    h0 = t // n_tw * rows
    w0 = t % n_tw * cols
    width = tl.minimum(cols, lim_w - w0)
    return h0, w0, width, tl.minimum(rows, lim_h - h0) * width


@triton.jit
def _positions(h0, w0, width, n, q0, BLOCK: tl.constexpr):
    """Rows, columns and mask of the sub-tile of positions ``q0`` to ``q0 +
    BLOCK`` (row major) of a tile at (h0, w0), ``width`` wide, of ``n``
    positions."""
    q = q0 + tl.arange(0, BLOCK)
    return h0 + q // width, w0 + q % width, q < n


@triton.jit
def _span_row(
    z_b,
    s_row,
    bias_ptr,
    row,
    pos,
    ok,
    Cr,
    P,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """The kernel tap ``row`` at positions ``pos``: ``b[row] + sum_r
    S[row, r] z[r, pos]``."""
    acc_t = tl.float64 if IS_FP64 else tl.float32
    w = tl.zeros([BLOCK_P], dtype=acc_t)
    if HAS_BIAS:
        w += tl.load(bias_ptr + row).to(acc_t)
    for r in range(Cr):
        sv = tl.load(s_row + r).to(acc_t)
        zv = tl.load(z_b + r * P + pos, mask=ok, other=0.0)
        w += sv * zv.to(acc_t)
    return w


@triton.jit
def forward_kernel(
    x_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    y_ptr,
    C,
    Cr,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    TILE_H,
    TILE_W,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    n_cb = tl.cdiv(Cg, BLOCK_C)
    bgc, t, n_tw = _program(Ho, Wo, TILE_H, TILE_W)
    cb = bgc % n_cb
    g = bgc // n_cb % G
    b = bgc // (n_cb * G)
    i0, j0, width, n = _tile(t, n_tw, TILE_H, TILE_W, Ho, Wo)
    cl = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cl < Cg
    chan = b.to(tl.int64) * C + g * Cg + cl
    x_rows = x_ptr + chan[:, None] * H * W
    z_b = z_ptr + b.to(tl.int64) * Cr * P
    for q0 in range(0, n, BLOCK_P):
        i, j, p_mask = _positions(i0, j0, width, n, q0, BLOCK_P)
        pos = i * Wo + j
        acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
        # One loop over the taps (fewer nested loops, fewer live registers).
        for uv in range(K * K):
            row = g * K * K + uv
            w = _span_row(
                z_b,
                s_ptr + row * Cr,
                bias_ptr,
                row,
                pos,
                p_mask,
                Cr,
                P,
                HAS_BIAS,
                IS_FP64,
                BLOCK_P,
            )
            hh = i * stride - padding + (uv // K) * dilation
            ww = j * stride - padding + (uv % K) * dilation
            ok = p_mask & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
            xv = tl.load(
                x_rows + (hh * W + ww)[None, :],
                mask=c_mask[:, None] & ok[None, :],
                other=0.0,
            )
            acc += w[None, :] * xv.to(acc_t)
        tl.store(
            y_ptr + chan[:, None] * P + pos[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=c_mask[:, None] & p_mask[None, :],
        )


@triton.jit
def _dot(a, b, acc, IS_FP64: tl.constexpr):
    """``acc + a @ b`` to the accumulator's precision: fp64, or fp32 from
    three tf32 products on the tensor cores (fp32 FMA products spill)."""
    if IS_FP64:
        return tl.dot(a, b, acc, input_precision='ieee')
    else:
        return tl.dot(a, b, acc, input_precision='tf32x3')


@triton.jit
def _kernel_grads(
    gy_ptr,
    x_ptr,
    z_ptr,
    s_ptr,
    gz_ptr,
    gs_part,
    gb_part,
    b,
    i0,
    j0,
    width,
    n,
    C,
    Cr,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    IS_FP64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """grad_z of one output tile, and its share of grad_S and grad_b added
    to the program's partials."""
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    KK = K * K
    z_off = b.to(tl.int64) * Cr * P
    chan0 = b.to(tl.int64) * C
    tt = tl.arange(0, BLOCK_T)
    for q0 in range(0, n, BLOCK_P):
        i, j, p_mask = _positions(i0, j0, width, n, q0, BLOCK_P)
        pos = i * Wo + j
        # C_r = 0: one block all the same, for grad_b
        for r0 in range(0, tl.maximum(Cr, 1), BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            r_mask = rr < Cr
            # z^T of the sub-tile, (BLOCK_P, BLOCK_R)
            zt = tl.load(
                z_ptr + z_off + rr[None, :] * P + pos[:, None],
                mask=p_mask[:, None] & r_mask[None, :],
                other=0.0,
            ).to(acc_t)
            gz = tl.zeros([BLOCK_R, BLOCK_P], dtype=acc_t)
            # BLOCK_T rows of the kernel map (group-major taps) at a time
            for t0 in range(0, G * KK, BLOCK_T):
                rows = t0 + tt
                t_mask = rows < G * KK
                uv = rows % KK
                hh = (
                    i[None, :] * stride
                    - padding
                    + (uv // K)[:, None] * dilation
                )
                ww = (
                    j[None, :] * stride
                    - padding
                    + (uv % K)[:, None] * dilation
                )
                tp_mask = t_mask[:, None] & p_mask[None, :]
                ok = tp_mask & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
                win = hh * W + ww
                chan = chan0 + rows // KK * Cg
                # dW of the rows: sum over each row's group channels of
                # grad_y * x_window (grad_y re-read per row, from cache)
                dw = tl.zeros([BLOCK_T, BLOCK_P], dtype=acc_t)
                for cl in range(Cg):
                    gv = tl.load(
                        gy_ptr + (chan + cl)[:, None] * P + pos[None, :],
                        mask=tp_mask,
                        other=0.0,
                    )
                    xv = tl.load(
                        x_ptr + (chan + cl)[:, None] * H * W + win,
                        mask=ok,
                        other=0.0,
                    )
                    dw += gv.to(acc_t) * xv.to(acc_t)
                # contracted at once: grad_z += S^T dW, grad_S += dW z^T
                sv = tl.load(
                    s_ptr + rows[None, :] * Cr + rr[:, None],
                    mask=r_mask[:, None] & t_mask[None, :],
                    other=0.0,
                )
                gz = _dot(sv.to(acc_t), dw, gz, IS_FP64)
                off = rows[:, None] * Cr + rr[None, :]
                m = t_mask[:, None] & r_mask[None, :]
                gs = tl.load(gs_part + off, mask=m, other=0.0)
                gs = _dot(dw, zt, gs, IS_FP64)
                tl.store(gs_part + off, gs, mask=m)
                # grad_b even without a bias, as the op's backward gives it
                if r0 == 0:
                    gb = tl.load(gb_part + rows, mask=t_mask, other=0.0)
                    tl.store(gb_part + rows, gb + tl.sum(dw, 1), mask=t_mask)
            tl.store(
                gz_ptr + z_off + rr[:, None] * P + pos[None, :],
                gz.to(gz_ptr.dtype.element_ty),
                mask=r_mask[:, None] & p_mask[None, :],
            )
        # the next sub-tile's read-modify-write of the partials sees this
        # one's
        tl.debug_barrier()


@triton.jit
def _input_grad(
    gy_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    gx_ptr,
    b,
    h0,
    w0,
    width,
    n,
    C,
    Cr,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """grad_x of one input tile, every channel, as a gather."""
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    z_b = z_ptr + b.to(tl.int64) * Cr * P
    for q0 in range(0, n, BLOCK_Q):
        h, col, q_mask = _positions(h0, w0, width, n, q0, BLOCK_Q)
        # the groups in the inner loop: the sub-tile's z halo stays cached
        for g in range(G):
            for c0 in range(0, Cg, BLOCK_C):
                cl = c0 + tl.arange(0, BLOCK_C)
                c_mask = cl < Cg
                chan = b.to(tl.int64) * C + g * Cg + cl
                acc = tl.zeros([BLOCK_C, BLOCK_Q], dtype=acc_t)
                for uv in range(K * K):
                    # the output position whose tap uv lands on (h, col):
                    # i * stride = h + padding - u * dilation
                    ti = h + padding - (uv // K) * dilation
                    tj = col + padding - (uv % K) * dilation
                    i = ti // stride
                    j = tj // stride
                    ok = q_mask & (ti >= 0) & (ti % stride == 0) & (i < Ho)
                    ok = ok & (tj >= 0) & (tj % stride == 0) & (j < Wo)
                    pos = tl.where(ok, i * Wo + j, 0)
                    row = g * K * K + uv
                    w = _span_row(
                        z_b,
                        s_ptr + row * Cr,
                        bias_ptr,
                        row,
                        pos,
                        ok,
                        Cr,
                        P,
                        HAS_BIAS,
                        IS_FP64,
                        BLOCK_Q,
                    )
                    gv = tl.load(
                        gy_ptr + chan[:, None] * P + pos[None, :],
                        mask=c_mask[:, None] & ok[None, :],
                        other=0.0,
                    )
                    acc += w[None, :] * gv.to(acc_t)
                tl.store(
                    gx_ptr + chan[:, None] * H * W + (h * W + col)[None, :],
                    acc.to(gx_ptr.dtype.element_ty),
                    mask=c_mask[:, None] & q_mask[None, :],
                )


@triton.jit
def backward_kernel(
    gy_ptr,
    x_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    gx_ptr,
    gz_ptr,
    gs_ptr,
    gb_ptr,
    C,
    Cr,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    TILE_H,
    TILE_W,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    b, t, n_tw = _program(Ho, Wo, TILE_H, TILE_W)
    # this program's partials of grad_S (G*K*K, C_r) and grad_b (G*K*K,)
    part = tl.program_id(0).to(tl.int64)
    i0, j0, width, n = _tile(t, n_tw, TILE_H, TILE_W, Ho, Wo)
    _kernel_grads(
        gy_ptr,
        x_ptr,
        z_ptr,
        s_ptr,
        gz_ptr,
        gs_ptr + part * G * K * K * Cr,
        gb_ptr + part * G * K * K,
        b,
        i0,
        j0,
        width,
        n,
        C,
        Cr,
        H,
        W,
        G,
        Ho,
        Wo,
        K,
        stride,
        padding,
        dilation,
        IS_FP64,
        BLOCK_R,
        BLOCK_T,
        BLOCK_P,
    )
    # the input tile: stride times the output tile, the last one clipped
    h0, w0, width, n = _tile(t, n_tw, stride * TILE_H, stride * TILE_W, H, W)
    _input_grad(
        gy_ptr,
        z_ptr,
        s_ptr,
        bias_ptr,
        gx_ptr,
        b,
        h0,
        w0,
        width,
        n,
        C,
        Cr,
        H,
        W,
        G,
        Ho,
        Wo,
        K,
        stride,
        padding,
        dilation,
        HAS_BIAS,
        IS_FP64,
        BLOCK_C,
        BLOCK_Q,
    )
