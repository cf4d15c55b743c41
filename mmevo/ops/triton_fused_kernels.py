"""The Triton kernels of the fused involution (:mod:`.triton_fused`
tunes and launches them): the involution kernel ``W = S z + b`` is computed
per tile in registers and never written, forward or backward.

Three kernels, each deterministic (no atomics; a fixed loop order):


* ``forward``: a program owns ``BLOCK_C`` channels of one (batch, group)
  over ``BLOCK_P`` consecutive output positions. Per tap it computes the
  tile's kernel row ``w = b + sum_r S[row, r] z[r, tile]`` (z from cache:
  the C_r rows of the tile are re-read for every tap) and adds
  ``w * x_window`` to the ``(BLOCK_C, BLOCK_P)`` accumulator.
* ``grad_input``: grad_x as a gather over a tile of ``BLOCK_P`` *input*
  positions (as the unfused ``aggregate_transpose`` kernel): for each tap,
  the output position that reads it, the kernel value there recomputed
  from z, times grad_y.
* ``grad_span``: a program owns ``BLOCK_R`` channels of z of one batch
  over a strip of tiles of ``BLOCK_P`` output positions. Per tile it forms
  ``dW = sum_c grad_y x_window`` for ``BLOCK_T`` rows of the kernel map
  (group-major taps, across groups) at a time, and contracts it at once
  with two ``tl.dot``: ``grad_z += S^T dW`` in registers (stored once per
  tile) and the program's own partial sums of ``grad_S += dW z^T`` (and
  ``grad_b += sum dW``), summed over programs afterwards
  (:func:`fused_involution_backward`). The partials are ``strips * C_r``
  per (batch, kernel row) against the kernel map's ``H_out * W_out``:
  :func:`span_strips` keeps them at most 1/:data:`PARTIAL_FRACTION` of
  it. fp32 products are three tf32 tensor-core products (``tf32x3``, fp32
  accuracy; fp32 FMA dots spill); C_r over :data:`MAX_BLOCK_R` takes
  several z-channel blocks, each recomputing dW.

Loads are converted to fp32 (fp64 stays fp64), and results are stored in
the input dtype. Offsets that can pass 2**31 (batch and channel bases, the
partials) are int64.
"""

import triton
import triton.language as tl


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
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    n_cb = tl.cdiv(Cg, BLOCK_C)
    n_pt = tl.cdiv(P, BLOCK_P)
    pid = tl.program_id(0)
    # neighbouring programs: neighbouring tiles of one channel block
    bg = pid // (n_cb * n_pt)
    cb = pid // n_pt % n_cb
    g = bg % G
    b = bg // G
    pos = (pid % n_pt) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = pos < P
    i = pos // Wo
    j = pos % Wo
    cl = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cl < Cg
    chan = b.to(tl.int64) * C + g * Cg + cl
    x_rows = x_ptr + chan[:, None] * H * W
    z_b = z_ptr + b.to(tl.int64) * Cr * P
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
def grad_input_kernel(
    gy_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    gx_ptr,
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
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    HW = H * W
    Cg = C // G
    n_cb = tl.cdiv(Cg, BLOCK_C)
    n_pt = tl.cdiv(HW, BLOCK_P)
    pid = tl.program_id(0)
    bg = pid // (n_cb * n_pt)
    cb = pid // n_pt % n_cb
    g = bg % G
    b = bg // G
    # a tile of input positions (h, col)
    q = (pid % n_pt) * BLOCK_P + tl.arange(0, BLOCK_P)
    q_mask = q < HW
    h = q // W
    col = q % W
    cl = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cl < Cg
    chan = b.to(tl.int64) * C + g * Cg + cl
    g_rows = gy_ptr + chan[:, None] * P
    z_b = z_ptr + b.to(tl.int64) * Cr * P
    acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=acc_t)
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
            BLOCK_P,
        )
        gv = tl.load(
            g_rows + pos[None, :],
            mask=c_mask[:, None] & ok[None, :],
            other=0.0,
        )
        acc += w[None, :] * gv.to(acc_t)
    tl.store(
        gx_ptr + chan[:, None] * HW + q[None, :],
        acc.to(gx_ptr.dtype.element_ty),
        mask=c_mask[:, None] & q_mask[None, :],
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
def grad_span_kernel(
    gy_ptr,
    x_ptr,
    z_ptr,
    s_ptr,
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
    STRIPS,
    IS_FP64: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    Cg = C // G
    KK = K * K
    n_rb = tl.maximum(tl.cdiv(Cr, BLOCK_R), 1)  # C_r = 0: grad_b still
    n_pt = tl.cdiv(P, BLOCK_P)
    per_strip = tl.cdiv(n_pt, STRIPS)
    pid = tl.program_id(0)
    rb = pid % n_rb
    strip = pid // n_rb % STRIPS
    b = pid // (n_rb * STRIPS)
    rr = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = rr < Cr
    z_off = b.to(tl.int64) * Cr * P
    z_b = z_ptr + z_off
    # this program's partials of grad_S (G*K*K, C_r) and grad_b (G*K*K,)
    part = b.to(tl.int64) * STRIPS + strip
    gs_part = gs_ptr + part * G * KK * Cr
    gb_part = gb_ptr + part * G * KK
    tt = tl.arange(0, BLOCK_T)
    for t in range(
        strip * per_strip, tl.minimum(n_pt, (strip + 1) * per_strip)
    ):
        pos = t * BLOCK_P + tl.arange(0, BLOCK_P)
        p_mask = pos < P
        i = pos // Wo
        j = pos % Wo
        # z^T of the tile, (BLOCK_P, BLOCK_R)
        zt = tl.load(
            z_b + rr[None, :] * P + pos[:, None],
            mask=p_mask[:, None] & r_mask[None, :],
            other=0.0,
        ).to(acc_t)
        gz = tl.zeros([BLOCK_R, BLOCK_P], dtype=acc_t)
        # BLOCK_T rows of the kernel map (group-major taps) at a time
        for t0 in range(0, G * KK, BLOCK_T):
            rows = t0 + tt
            t_mask = rows < G * KK
            g = rows // KK
            uv = rows % KK
            hh = i[None, :] * stride - padding + (uv // K)[:, None] * dilation
            ww = j[None, :] * stride - padding + (uv % K)[:, None] * dilation
            tp_mask = t_mask[:, None] & p_mask[None, :]
            ok = tp_mask & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
            win = hh * W + ww
            chan = b.to(tl.int64) * C + g * Cg
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
            if rb == 0:
                gb = tl.load(gb_part + rows, mask=t_mask, other=0.0)
                tl.store(gb_part + rows, gb + tl.sum(dw, 1), mask=t_mask)
        tl.store(
            gz_ptr + z_off + rr[:, None] * P + pos[None, :],
            gz.to(gz_ptr.dtype.element_ty),
            mask=r_mask[:, None] & p_mask[None, :],
        )
        # the next tile's read-modify-write of the partials sees this one's
        tl.debug_barrier()
