"""The Triton kernels of the fused local attention
(:mod:`.triton_fused_attention` tunes and launches them): correlation,
window softmax and aggregation in one pass, the (B, G, K, K, H_out, W_out)
logits and weights never written, forward or backward.

A program owns one (batch, head) over a tile of ``BLOCK_P`` pixels, with
all the head's channels (``BLOCK_D`` of query / key, ``BLOCK_DV`` of value,
C/G and C_v/G rounded up to powers of 2) in registers. Three kernels, each
deterministic (no atomics; a fixed loop order):

* ``forward``: output pixels; per tap the logit ``q . (k + r) + bias``,
  an online softmax (running max and sum) and the running weighted value
  sum; stores ``out`` and the log-sum-exp ``lse``.
* ``grad_query``: output pixels (a strip of tiles per program); stores
  ``D = rowsum(grad * out)``, then per tap recomputes ``P = exp(logit -
  lse)`` and ``dlogit = P (grad . v - D)``, gathers ``grad_q += dlogit (k
  + r)``, and adds ``dlogit q`` and ``dlogit`` to the program's own
  partial sums of grad_rel_embed and grad_rel_bias (summed over programs
  afterwards, in a fixed order).
* ``grad_kv``: grad_key and grad_value as gathers over a tile of *key*
  pixels (as the unfused ``aggregate_transpose`` kernel): for each tap,
  the query pixel whose window reads this pixel there, its P and dlogit
  recomputed. Under reflect padding the tile is one of the padded map's
  (the key read at the reflected pixel), folded onto the map afterwards
  (:func:`mmevo.ops.reflect.fold_reflect`).

Loads are converted to fp32 (fp64 stays fp64) and results are stored in
their buffers' dtype. A head's base offset is int64, offsets within a head
int32 (int64 address tiles of channels x pixels spill).
"""

import triton
import triton.language as tl


@triton.jit
def _reflect(x, size):
    """numpy 'reflect' of ``x`` into ``[0, size)``, folded as often as
    needed (as :func:`mmevo.ops.torch_backend.reflect_positions`)."""
    period = tl.maximum(2 * (size - 1), 1)
    r = x % period
    # C's remainder keeps the dividend's sign (the interpreter's does not)
    r = tl.where(r < 0, r + period, r)
    return tl.where(r >= size, period - r, r)


@triton.jit
def _tap(i, j, uv, H, W, K, stride, padding, dilation, REFLECT: tl.constexpr):
    """Key pixel (flat) of output pixels (i, j) at tap uv, and whether it
    is read (zero padding: inside the map)."""
    hh = i * stride - padding + (uv // K) * dilation
    ww = j * stride - padding + (uv % K) * dilation
    if REFLECT:
        hh = _reflect(hh, H)
        ww = _reflect(ww, W)
    ok = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
    return hh * W + ww, ok


@triton.jit
def _logit(
    qv,
    kv,
    r_ptr,
    bias_ptr,
    chan_d,
    d_mask,
    g,
    uv,
    KK,
    HAS_EMBED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IS_FP64: tl.constexpr,
):
    """``(sum_c q (k + r), k + r)`` at tap uv, plus the head's bias."""
    acc_t = tl.float64 if IS_FP64 else tl.float32
    if HAS_EMBED:
        rv = tl.load(r_ptr + chan_d * KK + uv, mask=d_mask, other=0.0)
        kv = kv + rv.to(acc_t)[:, None]
    s = tl.sum(qv * kv, 0)
    if HAS_BIAS:
        s += tl.load(bias_ptr + g * KK + uv).to(acc_t)
    return s, kv


@triton.jit
def forward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    r_ptr,
    bias_ptr,
    out_ptr,
    lse_ptr,
    C,
    Cv,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    HAS_EMBED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    REFLECT: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    HW = H * W
    KK = K * K
    Cg = C // G
    Cvg = Cv // G
    n_pt = tl.cdiv(P, BLOCK_P)
    pid = tl.program_id(0)
    bg = pid // n_pt
    g = bg % G
    b = bg // G
    pos = (pid % n_pt) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = pos < P
    i = pos // Wo
    j = pos % Wo
    d = tl.arange(0, BLOCK_D)
    d_mask = d < Cg
    chan_d = g * Cg + d
    # the head's bases (int64); offsets within a head are int32, which
    # keeps the (channels x pixels) address tiles small
    head = b.to(tl.int64) * C + g * Cg
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < Cvg
    head_v = b.to(tl.int64) * Cv + g * Cvg
    qv = tl.load(
        q_ptr + head * P + d[:, None] * P + pos[None, :],
        mask=d_mask[:, None] & p_mask[None, :],
        other=0.0,
    ).to(acc_t)
    k_h = k_ptr + head * HW
    v_h = v_ptr + head_v * HW
    m = tl.full([BLOCK_P], float('-inf'), acc_t)
    total = tl.zeros([BLOCK_P], dtype=acc_t)
    acc = tl.zeros([BLOCK_DV, BLOCK_P], dtype=acc_t)
    for uv in range(KK):
        win, ok = _tap(i, j, uv, H, W, K, stride, padding, dilation, REFLECT)
        ok = ok & p_mask
        kv = tl.load(
            k_h + d[:, None] * HW + win[None, :],
            mask=d_mask[:, None] & ok[None, :],
            other=0.0,
        ).to(acc_t)
        s, _ = _logit(
            qv,
            kv,
            r_ptr,
            bias_ptr,
            chan_d,
            d_mask,
            g,
            uv,
            KK,
            HAS_EMBED,
            HAS_BIAS,
            IS_FP64,
        )
        m_new = tl.maximum(m, s)
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        total = total * alpha + p
        vv = tl.load(
            v_h + dv[:, None] * HW + win[None, :],
            mask=dv_mask[:, None] & ok[None, :],
            other=0.0,
        ).to(acc_t)
        acc = acc * alpha[None, :] + p[None, :] * vv
        m = m_new
    tl.store(
        out_ptr + head_v * P + dv[:, None] * P + pos[None, :],
        (acc / total[None, :]).to(out_ptr.dtype.element_ty),
        mask=dv_mask[:, None] & p_mask[None, :],
    )
    tl.store(
        lse_ptr + bg.to(tl.int64) * P + pos, m + tl.log(total), mask=p_mask
    )


@triton.jit
def grad_query_kernel(
    go_ptr,
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    r_ptr,
    bias_ptr,
    gq_ptr,
    lse_ptr,
    delta_ptr,
    gr_ptr,
    gbias_ptr,
    C,
    Cv,
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
    HAS_EMBED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    REFLECT: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    HW = H * W
    KK = K * K
    Cg = C // G
    Cvg = Cv // G
    n_pt = tl.cdiv(P, BLOCK_P)
    # STRIPS bounds the partials' rows (allocated for the least BLOCK_P)
    strips = tl.minimum(STRIPS, n_pt)
    per_strip = tl.cdiv(n_pt, strips)
    pid = tl.program_id(0)
    strip = pid % strips
    bg = pid // strips
    g = bg % G
    b = bg // G
    d = tl.arange(0, BLOCK_D)
    d_mask = d < Cg
    chan_d = g * Cg + d
    head = b.to(tl.int64) * C + g * Cg
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < Cvg
    head_v = b.to(tl.int64) * Cv + g * Cvg
    k_h = k_ptr + head * HW
    v_h = v_ptr + head_v * HW
    q_h = q_ptr + head * P
    go_h = go_ptr + head_v * P
    # this program's rows of the partials: (B, STRIPS, C | G, K*K)
    part = b.to(tl.int64) * STRIPS + strip
    gr_part = gr_ptr + (part * C + chan_d) * KK
    gb_part = gbias_ptr + (part * G + g) * KK
    for t in range(
        strip * per_strip, tl.minimum(n_pt, (strip + 1) * per_strip)
    ):
        pos = t * BLOCK_P + tl.arange(0, BLOCK_P)
        p_mask = pos < P
        i = pos // Wo
        j = pos % Wo
        dp_mask = d_mask[:, None] & p_mask[None, :]
        vp_mask = dv_mask[:, None] & p_mask[None, :]
        qv = tl.load(
            q_h + d[:, None] * P + pos[None, :], mask=dp_mask, other=0.0
        ).to(acc_t)
        gov = tl.load(
            go_h + dv[:, None] * P + pos[None, :],
            mask=vp_mask,
            other=0.0,
        ).to(acc_t)
        ov = tl.load(
            out_ptr + head_v * P + dv[:, None] * P + pos[None, :],
            mask=vp_mask,
            other=0.0,
        ).to(acc_t)
        delta = tl.sum(gov * ov, 0)
        tl.store(delta_ptr + bg.to(tl.int64) * P + pos, delta, mask=p_mask)
        lse = tl.load(
            lse_ptr + bg.to(tl.int64) * P + pos, mask=p_mask, other=0.0
        )
        gq = tl.zeros([BLOCK_D, BLOCK_P], dtype=acc_t)
        for uv in range(KK):
            win, ok = _tap(
                i, j, uv, H, W, K, stride, padding, dilation, REFLECT
            )
            ok = ok & p_mask
            kv = tl.load(
                k_h + d[:, None] * HW + win[None, :],
                mask=d_mask[:, None] & ok[None, :],
                other=0.0,
            ).to(acc_t)
            s, kr = _logit(
                qv,
                kv,
                r_ptr,
                bias_ptr,
                chan_d,
                d_mask,
                g,
                uv,
                KK,
                HAS_EMBED,
                HAS_BIAS,
                IS_FP64,
            )
            # pixels past the map: no weight (their partials stay exact)
            p = tl.where(p_mask, tl.exp(s - lse), 0.0)
            vv = tl.load(
                v_h + dv[:, None] * HW + win[None, :],
                mask=dv_mask[:, None] & ok[None, :],
                other=0.0,
            ).to(acc_t)
            ds = p * (tl.sum(gov * vv, 0) - delta)
            gq += ds[None, :] * kr
            if HAS_EMBED:
                gr = tl.load(gr_part + uv, mask=d_mask, other=0.0)
                gr += tl.sum(ds[None, :] * qv, 1)
                tl.store(gr_part + uv, gr, mask=d_mask)
            if HAS_BIAS:
                tl.store(gb_part + uv, tl.load(gb_part + uv) + tl.sum(ds, 0))
        tl.store(
            gq_ptr + head * P + d[:, None] * P + pos[None, :],
            gq.to(gq_ptr.dtype.element_ty),
            mask=dp_mask,
        )
        # the next tile's read-modify-write of the partials sees this one's
        tl.debug_barrier()


@triton.jit
def grad_kv_kernel(
    go_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    r_ptr,
    bias_ptr,
    gk_ptr,
    gv_ptr,
    lse_ptr,
    delta_ptr,
    C,
    Cv,
    H,
    W,
    G,
    Ho,
    Wo,
    K,
    stride,
    padding,
    dilation,
    HAS_EMBED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    REFLECT: tl.constexpr,
    IS_FP64: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    acc_t = tl.float64 if IS_FP64 else tl.float32
    P = Ho * Wo
    HW = H * W
    KK = K * K
    Cg = C // G
    Cvg = Cv // G
    # the pixels gathered to: the map's, or the reflect-padded map's
    if REFLECT:
        Ht = H + 2 * padding
        Wt = W + 2 * padding
        off = 0
    else:
        Ht = H
        Wt = W
        off = padding
    HWt = Ht * Wt
    n_pt = tl.cdiv(HWt, BLOCK_P)
    pid = tl.program_id(0)
    bg = pid // n_pt
    g = bg % G
    b = bg // G
    tpos = (pid % n_pt) * BLOCK_P + tl.arange(0, BLOCK_P)
    t_mask = tpos < HWt
    th = tpos // Wt
    tw = tpos % Wt
    if REFLECT:
        read = _reflect(th - padding, H) * W + _reflect(tw - padding, W)
    else:
        read = tpos
    d = tl.arange(0, BLOCK_D)
    d_mask = d < Cg
    chan_d = g * Cg + d
    head = b.to(tl.int64) * C + g * Cg
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < Cvg
    head_v = b.to(tl.int64) * Cv + g * Cvg
    kv = tl.load(
        k_ptr + head * HW + d[:, None] * HW + read[None, :],
        mask=d_mask[:, None] & t_mask[None, :],
        other=0.0,
    ).to(acc_t)
    vv = tl.load(
        v_ptr + head_v * HW + dv[:, None] * HW + read[None, :],
        mask=dv_mask[:, None] & t_mask[None, :],
        other=0.0,
    ).to(acc_t)
    q_h = q_ptr + head * P
    go_h = go_ptr + head_v * P
    bg_p = bg.to(tl.int64) * P
    gk = tl.zeros([BLOCK_D, BLOCK_P], dtype=acc_t)
    gv = tl.zeros([BLOCK_DV, BLOCK_P], dtype=acc_t)
    for uv in range(KK):
        # the output pixel whose tap uv reads this one:
        # i * stride = th + off - u * dilation
        ti = th + off - (uv // K) * dilation
        tj = tw + off - (uv % K) * dilation
        i = ti // stride
        j = tj // stride
        ok = t_mask & (ti >= 0) & (ti % stride == 0) & (i < Ho)
        ok = ok & (tj >= 0) & (tj % stride == 0) & (j < Wo)
        qpos = tl.where(ok, i * Wo + j, 0)
        qv = tl.load(
            q_h + d[:, None] * P + qpos[None, :],
            mask=d_mask[:, None] & ok[None, :],
            other=0.0,
        ).to(acc_t)
        s, _ = _logit(
            qv,
            kv,
            r_ptr,
            bias_ptr,
            chan_d,
            d_mask,
            g,
            uv,
            KK,
            HAS_EMBED,
            HAS_BIAS,
            IS_FP64,
        )
        lse = tl.load(lse_ptr + bg_p + qpos, mask=ok, other=0.0)
        p = tl.where(ok, tl.exp(s - lse), 0.0)
        gov = tl.load(
            go_h + dv[:, None] * P + qpos[None, :],
            mask=dv_mask[:, None] & ok[None, :],
            other=0.0,
        ).to(acc_t)
        delta = tl.load(delta_ptr + bg_p + qpos, mask=ok, other=0.0)
        ds = p * (tl.sum(gov * vv, 0) - delta)
        gk += ds[None, :] * qv
        gv += p[None, :] * gov
    tl.store(
        gk_ptr + head * HWt + d[:, None] * HWt + tpos[None, :],
        gk.to(gk_ptr.dtype.element_ty),
        mask=d_mask[:, None] & t_mask[None, :],
    )
    tl.store(
        gv_ptr + head_v * HWt + dv[:, None] * HWt + tpos[None, :],
        gv.to(gv_ptr.dtype.element_ty),
        mask=dv_mask[:, None] & t_mask[None, :],
    )
