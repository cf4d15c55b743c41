// The fused local attention kernels, for one instruction set.
//
// Included by fused_attention.cpp inside a namespace per `#pragma GCC
// target`, after evolution_kernels.h (vexp, round_up, store_lanes), like
// fused_involution_kernels.h. No #include here on purpose.
//
// Vectors run along the output columns j (V lanes of one output row), as
// in evolution_kernels.h: a task buffers the key and value rows its windows
// read in the accumulation type A, split by column phase when the stride is
// > 1 (buffer column ph * L + m holds input column m * s + ph - p), so that
// window tap v of the columns [j, j + V) is the contiguous slice at
// offset(v) + j. The buffers are filled through index maps (AttnMaps) that
// hold the reflected pixel, or -1 for a zero: both padding modes, and any
// input strides (channels-last included), read the same way.
//
// Taps are taken in chunks of up to kTaps of one window row: the chunk's
// logits stay in registers while the group's channels stream past, then
// the online softmax folds the chunk in (one rescale of the running sums
// per chunk, not per tap).

constexpr int64_t kTaps = 8;      // taps of a chunk (one window row's)
constexpr int64_t kAttnRows = 8;  // output rows of a forward task

template <typename A, typename vec>
inline vec vmax(vec a, vec b) {
  return a > b ? a : b;
}

// Pixels to channel rows: dst[ch * ds + e] = channel ch of pixel e, for e <
// n and ch < nc, where px(e) points at pixel e's channels (sc apart) or is
// null for a zero pixel. Where the channels are contiguous and need no
// conversion, tiles of V pixels by V channels are transposed in
// registers (log2 V shuffles an element) rather than moved one at a time,
// which took a third of the fused forward at ACmix's 16 channels a head: its
// attention ops in ACmix-ResNet-50 took 0.93x (forward) and 0.98x
// (backward) the time with one thread, 0.85x and 0.87x with two.
template <typename T, typename A, typename PX>
inline void pixels_to_rows(A* __restrict__ dst, int64_t ds, int64_t nc, int64_t sc, int64_t n,
                           PX px) {
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int V = kVecBytes / sizeof(A);
  const bool tiles = std::is_same_v<T, A> && sc == 1;
  const int64_t nct = tiles ? nc / V * V : 0, nt = tiles ? n / V * V : 0;
  if constexpr (std::is_same_v<T, A>)
    for (int64_t e0 = 0; e0 < nt; e0 += V) {
      const A* p[V];
      for (int k = 0; k < V; ++k) p[k] = px(e0 + k);
      for (int64_t c0 = 0; c0 < nct; c0 += V) {
        vec r[V];
        for (int k = 0; k < V; ++k) r[k] = p[k] ? load_v<A, vec>(p[k] + c0) : vec{};
        transpose(r);
        for (int ch = 0; ch < V; ++ch) store_v<A, vec>(dst + (c0 + ch) * ds + e0, r[ch]);
      }
    }
  // The channels and pixels past whole tiles, one at a time.
  for (int64_t e = 0; e < n; ++e) {
    const T* pe = px(e);
    for (int64_t ch = e < nt ? nct : 0; ch < nc; ++ch)
      dst[ch * ds + e] = pe ? static_cast<A>(pe[ch * sc]) : A(0);
  }
}

// The source index of each buffered row and phase column, -1 for a zero.
struct AttnMaps {
  int64_t L, Lrow, s;
  std::vector<int64_t> cols;    // (s * L): input column of buffer column
  std::vector<int64_t> m0, m1;  // (s): each phase's run of plain columns

  AttnMaps(const AttnShape& a, int64_t Wv)
      : L(Wv + (a.K - 1) * a.d / a.s), Lrow(a.s * L), s(a.s), cols(a.s * L), m0(a.s), m1(a.s) {
    for (int64_t ph = 0; ph < a.s; ++ph) {
      // Buffer columns ph * L + m, m in [m0, m1), read input columns
      // m * s + ph - p in [0, W): no padding, no reflection.
      m0[ph] = std::min(L, ceil_div(std::max<int64_t>(0, a.p - ph), a.s));
      m1[ph] = std::max(m0[ph], std::min(L, ceil_div(a.W + a.p - ph, a.s)));
      for (int64_t m = 0; m < L; ++m)
        cols[ph * L + m] = source_index(m * a.s + ph - a.p, a.W, a.reflect);
    }
  }

  // Buffer column of window column v (dilation d) for output column 0.
  int64_t offset(int64_t v, const AttnShape& a) const {
    return (v * a.d) % a.s * L + (v * a.d) / a.s;
  }

  // nc buffer rows (Lrow each, channel stride ds in dst) = input row h of
  // nc planes of src (channel stride sc, strides sh, sw); zeros for a row
  // outside the map (zeros padding). Planes with contiguous rows are read
  // a row at a time, the plain run as one strided loop; channels-last ones
  // by pixels (pixels_to_rows), so that each cache line of the map is
  // fetched once rather than once per channel.
  template <typename T, typename A>
  void load(A* __restrict__ dst, int64_t ds, const T* __restrict__ src, int64_t sc, int64_t nc,
            int64_t h, int64_t sh, int64_t sw) const {
    if (h < 0) {
      for (int64_t ch = 0; ch < nc; ++ch) std::fill(dst + ch * ds, dst + ch * ds + Lrow, A(0));
      return;
    }
    const T* row = src + h * sh;
    if (sw <= sc || nc == 1) {
      const int64_t step = s * sw;
      for (int64_t ch = 0; ch < nc; ++ch) {
        A* d = dst + ch * ds;
        const T* r = row + ch * sc;
        for (int64_t ph = 0; ph < s; ++ph) {
          const int64_t base = ph * L, a0 = m0[ph], a1 = m1[ph];
          for (int64_t m = 0; m < a0; ++m) {
            const int64_t c = cols[base + m];
            d[base + m] = c < 0 ? A(0) : static_cast<A>(r[c * sw]);
          }
          if (a1 > a0) {
            const T* rp = r + cols[base + a0] * sw - a0 * step;
            if (step == 1)
              for (int64_t m = a0; m < a1; ++m) d[base + m] = static_cast<A>(rp[m]);
            else
              for (int64_t m = a0; m < a1; ++m) d[base + m] = static_cast<A>(rp[m * step]);
          }
          for (int64_t m = a1; m < L; ++m) {
            const int64_t c = cols[base + m];
            d[base + m] = c < 0 ? A(0) : static_cast<A>(r[c * sw]);
          }
        }
      }
      return;
    }
    // A pixel's channels span a few cache lines at most when they are
    // (nearly) contiguous: fetch those of the pixel kPrefetch columns
    // ahead, which the hardware prefetchers miss at a stride of the whole
    // pixel (1.5 KiB at 3 * 128 channels: 30-75% slower forward).
    const int64_t span = ((nc - 1) * sc + 1) * int64_t(sizeof(T));
    constexpr int64_t kPrefetch = 6;
    pixels_to_rows<T, A>(dst, ds, nc, sc, Lrow, [&](int64_t e) -> const T* {
      if (span <= 256 && e + kPrefetch < Lrow && cols[e + kPrefetch] >= 0) {
        const char* ahead = reinterpret_cast<const char*>(row + cols[e + kPrefetch] * sw);
        for (int64_t off = 0; off < span; off += 64) __builtin_prefetch(ahead + off);
      }
      return cols[e] < 0 ? nullptr : row + cols[e] * sw;
    });
  }

  // The transpose of load: row h of the plane dst (contiguous, width W)
  // += src, reflected columns folded onto their source, zeros dropped; the
  // plain run of each phase as one strided loop.
  template <typename A>
  void fold(A* __restrict__ dst, const A* __restrict__ src, int64_t h, int64_t W) const {
    if (h < 0) return;
    A* row = dst + h * W;
    for (int64_t ph = 0; ph < s; ++ph) {
      const int64_t base = ph * L, a0 = m0[ph], a1 = m1[ph];
      for (int64_t m = 0; m < a0; ++m)
        if (cols[base + m] >= 0) row[cols[base + m]] += src[base + m];
      if (a1 > a0) {
        A* rp = row + cols[base + a0] - a0 * s;
        if (s == 1)
          for (int64_t m = a0; m < a1; ++m) rp[m] += src[base + m];
        else
          for (int64_t m = a0; m < a1; ++m) rp[m * s] += src[base + m];
      }
      for (int64_t m = a1; m < L; ++m)
        if (cols[base + m] >= 0) row[cols[base + m]] += src[base + m];
    }
  }
};

// nc rows of dst (channel stride ds, Wv each, zeros past n) = n pixels of
// nc rows of src (channel stride sc, pixel stride sw), in load's order.
template <typename T, typename A>
inline void load_rows(A* __restrict__ dst, int64_t ds, const T* __restrict__ src, int64_t sc,
                      int64_t nc, int64_t sw, int64_t n, int64_t Wv) {
  if (sw <= sc || nc == 1) {
    for (int64_t ch = 0; ch < nc; ++ch) {
      A* d = dst + ch * ds;
      const T* r = src + ch * sc;
      if (sw == 1)
        for (int64_t j = 0; j < n; ++j) d[j] = static_cast<A>(r[j]);
      else
        for (int64_t j = 0; j < n; ++j) d[j] = static_cast<A>(r[j * sw]);
    }
  } else {
    pixels_to_rows<T, A>(dst, ds, nc, sc, n, [&](int64_t j) -> const T* { return src + j * sw; });
  }
  for (int64_t ch = 0; ch < nc; ++ch) std::fill(dst + ch * ds + n, dst + ch * ds + Wv, A(0));
}

// The buffer offset of tap t of a chunk whose taps are at off[0..NT):
// UNIT (stride and dilation 1), consecutive columns, so that the loads
// take constant displacements instead of NT offset registers.
template <bool UNIT>
__attribute__((always_inline)) inline int64_t tap_at(const int64_t* off, int t) {
  return UNIT ? off[0] + t : off[t];
}

// The logits of NT taps of window row u for the columns [jv, jv + V) of
// one output row: lg[t] = init[t] + sum_c q[c] * k[c, tap t]. q: Cg rows
// at qb + c * qs; k: the buffered row of window row u at kb, channel
// stride ks, tap t at koff[t]; init (vectors, or null for zeros): the
// taps' q . r + bias (rel_logits).
template <typename A, typename vec, bool UNIT, int NT>
__attribute__((always_inline)) inline void chunk_logits(
    vec (&lg)[kTaps], const A* qb, int64_t qs, const A* kb, int64_t ks, const int64_t* koff,
    int64_t Cg, const A* init) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  for (int t = 0; t < NT; ++t) lg[t] = init ? load_v<A, vec>(init + t * V) : vec{};
  for (int64_t c = 0; c < Cg; ++c) {
    const vec qv = load_v<A, vec>(qb + c * qs);
    const A* kc = kb + c * ks;
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) lg[t] += qv * load_v<A, vec>(kc + tap_at<UNIT>(koff, t));
  }
}

// NT taps from tap0 of out (vectors) = bias + sum_c q[c] * r[c, tap]: rel
// (Cg, K*K) and bias (K*K) of the group, either null.
template <typename A, typename vec, int NT>
__attribute__((always_inline)) inline void rel_block(A* out, const A* qb, int64_t qs,
                                                     int64_t Cg, const A* rel, const A* bias,
                                                     int64_t KK, int64_t tap0) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  vec acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = splat<vec>(bias ? bias[tap0 + t] : A(0));
  if (rel)
    for (int64_t c = 0; c < Cg; ++c) {
      const vec qv = load_v<A, vec>(qb + c * qs);
      const A* rc = rel + c * KK + tap0;
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[t] += qv * rc[t];
    }
  for (int t = 0; t < NT; ++t) store_v<A, vec>(out + t * V, acc[t]);
}

// One chunk of the forward's online softmax: m, l the running max and sum,
// acc (Cvg vectors) the running weighted value sum, all per lane.
template <typename A, typename vec, bool UNIT, int NT>
__attribute__((always_inline)) inline void forward_chunk(
    vec& m, vec& l, A* __restrict__ acc, const A* qb, int64_t qs, const A* kb, const A* vb,
    int64_t ks, int64_t vs, const int64_t* off, int64_t Cg, int64_t Cvg, const A* init) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  vec lg[kTaps];
  chunk_logits<A, vec, UNIT, NT>(lg, qb, qs, kb, ks, off, Cg, init);
  vec mn = m;
  for (int t = 0; t < NT; ++t) mn = vmax<A, vec>(mn, lg[t]);
  const vec scale = vexp<A, vec>(m - mn);
  vec p[kTaps], sum = {};
  for (int t = 0; t < NT; ++t) sum += p[t] = vexp<A, vec>(lg[t] - mn);
  l = l * scale + sum;
  m = mn;
  int64_t o[NT];  // in locals, not reloaded after each store (backward_rows)
  for (int t = 0; t < NT; ++t) o[t] = tap_at<UNIT>(off, t);
  for (int64_t c = 0; c < Cvg; ++c) {
    const A* vc = vb + c * vs;
    vec a = load_v<A, vec>(acc + c * V) * scale;
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) a += p[t] * load_v<A, vec>(vc + o[t]);
    store_v<A, vec>(acc + c * V, a);
  }
}

// Dispatches a chunk template on its (run-time) number of taps, after
// the template arguments targs (parenthesised).
#define MMEVO_ATTN_TARGS(...) __VA_ARGS__
#define MMEVO_ATTN_CHUNK(fn, targs, nt, ...)                     \
  switch (nt) {                                                  \
    case 8: fn<MMEVO_ATTN_TARGS targs, 8>(__VA_ARGS__); break;   \
    case 7: fn<MMEVO_ATTN_TARGS targs, 7>(__VA_ARGS__); break;   \
    case 6: fn<MMEVO_ATTN_TARGS targs, 6>(__VA_ARGS__); break;   \
    case 5: fn<MMEVO_ATTN_TARGS targs, 5>(__VA_ARGS__); break;   \
    case 4: fn<MMEVO_ATTN_TARGS targs, 4>(__VA_ARGS__); break;   \
    case 3: fn<MMEVO_ATTN_TARGS targs, 3>(__VA_ARGS__); break;   \
    case 2: fn<MMEVO_ATTN_TARGS targs, 2>(__VA_ARGS__); break;   \
    default: fn<MMEVO_ATTN_TARGS targs, 1>(__VA_ARGS__);         \
  }

// out (K*K vectors) = each tap's q . r + bias for one column vector, once
// per pixel rather than in every chunk's channel loop (each q load feeds
// a block of taps, r broadcast).
template <typename A, typename vec>
inline void rel_logits(A* out, const A* qb, int64_t qs, int64_t Cg, const A* rel,
                       const A* bias, int64_t KK) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  for (int64_t tap0 = 0; tap0 < KK; tap0 += kTaps) {
    const int64_t nt = std::min(kTaps, KK - tap0);
    MMEVO_ATTN_CHUNK(rel_block, (A, vec), nt, out + tap0 * V, qb, qs, Cg, rel, bias, KK, tap0)
  }
}

// rel (C, K, K) and bias (G, K, K) in A, or empty.
template <typename T, typename A>
std::vector<A> to_acc(const T* src, int64_t n) {
  std::vector<A> out(n);
  for (int64_t e = 0; e < n; ++e) out[e] = static_cast<A>(src[e]);
  return out;
}

// out (B, Cv, Ho, Wo) (strides so) and lse (B, G, Ho, Wo) contiguous in A.
// Task: (b, kAttnRows output rows, g), every channel of the group, the
// groups fastest: consecutive tasks read the same input rows (in a
// channels-last map, the same cache lines). A task writes its pixels whole
// (no races, the same bits for any thread count).
template <typename T>
void attention_forward(const T* __restrict__ q, GroupStrides sq, const T* __restrict__ k,
                       GroupStrides sk, const T* __restrict__ val, GroupStrides sv,
                       const T* __restrict__ rel, const T* __restrict__ bias,
                       T* __restrict__ out, GroupStrides so, at::opmath_type<T>* __restrict__ lse,
                       const AttnShape& a) {
  using A = at::opmath_type<T>;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = a.C / a.G, Cvg = a.Cv / a.G, KK = a.K * a.K;
  const int64_t Wv = round_up(a.Wo, V), span = (a.K - 1) * a.d;
  const int64_t R = (kAttnRows - 1) * a.s + span + 1, nIB = ceil_div(a.Ho, kAttnRows);
  const AttnMaps maps(a, Wv);
  const int64_t Lrow = maps.Lrow;
  std::vector<int64_t> off(a.K);
  for (int64_t v = 0; v < a.K; ++v) off[v] = maps.offset(v, a);
  const std::vector<A> ra = rel ? to_acc<T, A>(rel, a.C * KK) : std::vector<A>();
  const std::vector<A> ba = bias ? to_acc<T, A>(bias, a.G * KK) : std::vector<A>();
  const int64_t grain = grain_for(kAttnRows * KK * a.Wo * (Cg + Cvg + 1));
  at::parallel_for(0, a.B * a.G * nIB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> kb(Cg * R * Lrow), vb(Cvg * R * Lrow), qb(Cg * kAttnRows * Wv);
    std::vector<A> acc(std::max<int64_t>(1, Cvg) * V), qr(KK * V);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t grp = t % a.G, ib = t / a.G % nIB, b = t / a.G / nIB, bg = b * a.G + grp;
      const int64_t i0 = ib * kAttnRows, ni = std::min(kAttnRows, a.Ho - i0);
      const int64_t r0 = i0 * a.s - a.p, nr = (ni - 1) * a.s + span + 1;
      const A* rg = rel ? ra.data() + grp * Cg * KK : nullptr;
      const A* bgp = bias ? ba.data() + grp * KK : nullptr;
      const T* kp = k + b * sk.b + grp * sk.g;
      const T* vp = val + b * sv.b + grp * sv.g;
      for (int64_t rr = 0; rr < nr; ++rr) {
        const int64_t h = source_index(r0 + rr, a.H, a.reflect);
        maps.load(kb.data() + rr * Lrow, R * Lrow, kp, sk.c, Cg, h, sk.h, sk.w);
        maps.load(vb.data() + rr * Lrow, R * Lrow, vp, sv.c, Cvg, h, sv.h, sv.w);
      }
      const T* qp = q + b * sq.b + grp * sq.g;
      for (int64_t n = 0; n < ni; ++n)
        load_rows(qb.data() + n * Wv, kAttnRows * Wv, qp + (i0 + n) * sq.h, sq.c, Cg, sq.w, a.Wo,
                  Wv);
      auto rows = [&](auto unit) {
        constexpr bool kUnit = decltype(unit)::value;
        for (int64_t n = 0; n < ni; ++n)
          for (int64_t jv = 0; jv < Wv; jv += V) {
            vec m = vec{} - std::numeric_limits<A>::infinity(), l = {};
            std::fill(acc.begin(), acc.end(), A(0));
            const A* qn = qb.data() + n * Wv + jv;
            if (rg || bgp) rel_logits<A, vec>(qr.data(), qn, kAttnRows * Wv, Cg, rg, bgp, KK);
            for (int64_t u = 0; u < a.K; ++u) {
              const int64_t rr = n * a.s + u * a.d;
              const A* kr = kb.data() + rr * Lrow + jv;
              const A* vr = vb.data() + rr * Lrow + jv;
              for (int64_t v0 = 0; v0 < a.K; v0 += kTaps) {
                const int64_t nt = std::min(kTaps, a.K - v0), tap = u * a.K + v0;
                const A* init = rg || bgp ? qr.data() + tap * V : nullptr;
                MMEVO_ATTN_CHUNK(forward_chunk, (A, vec, kUnit), nt, m, l, acc.data(), qn,
                                 kAttnRows * Wv, kr, vr, R * Lrow, R * Lrow, off.data() + v0,
                                 Cg, Cvg, init)
              }
            }
            const int64_t i = i0 + n, nj = std::min(V, a.Wo - jv);
            const vec r = 1 / l;
            T* op = out + b * so.b + grp * Cvg * so.c + i * so.h + jv * so.w;
            for (int64_t c = 0; c < Cvg; ++c)
              store_lanes<T, A>(op + c * so.c, load_v<A, vec>(acc.data() + c * V) * r, nj, so.w);
            A* lp = lse + (bg * a.Ho + i) * a.Wo + jv;
            for (int64_t e = 0; e < nj; ++e) lp[e] = m[e] + std::log(l[e]);
          }
      };
      if (a.s == 1 && a.d == 1)
        rows(std::true_type{});
      else
        rows(std::false_type{});
    }
  });
}

// One output row's part of a backward chunk: its q and grad_out (column
// vectors, channel stride V), lse and D; for the chunk's first tap, its
// logits' init (rel_logits, or null), rel_embed (or null) and the sums of
// grad_q, grad_rel_embed and grad_rel_bias (null when absent). (Not a
// template of vec: a class template argument drops its vector attribute.)
template <typename A>
struct BwdRow {
  const A* q;
  const A* gy;
  const A* init;
  const A* rel;
  const A* lse;  // the column vector's, V lanes
  const A* D;
  A* gq;
  A* grel;
  A* gbias;
};

// One chunk of the backward for NR output rows that read the same buffered
// key / value row (rows i and i + 1 through window rows u and u - 1 at
// stride and dilation 1): the chunk's P = exp(logit - lse) and dlogit = P *
// (dP - D) of each row, then every scatter and sum they feed. Each key and
// value load serves the NR rows, and each grad_key / grad_value vector is
// read and written once for them.
template <typename A, typename vec, bool UNIT, int NR, int NT>
__attribute__((always_inline)) inline void backward_rows(
    const BwdRow<A>* rows, const A* kb, const A* vb, int64_t ks, int64_t vs,
    const int64_t* off, int64_t Cg, int64_t Cvg, int64_t rs, A* __restrict__ gkb,
    A* __restrict__ gvb) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  // Pointers and offsets in locals: a vector store (memcpy) may alias any
  // memory, so those read through rows and off would be reloaded after
  // every store of the loops below (the backward took 1.1x the time).
  const A *q[NR], *gy[NR], *rel[NR];
  A *gq[NR], *grel[NR];
  int64_t o[NT];
  for (int t = 0; t < NT; ++t) o[t] = tap_at<UNIT>(off, t);
  for (int n = 0; n < NR; ++n)
    q[n] = rows[n].q, gy[n] = rows[n].gy, rel[n] = rows[n].rel, gq[n] = rows[n].gq,
    grel[n] = rows[n].grel;
  vec lg[NR][NT], dp[NR][NT] = {};
  for (int n = 0; n < NR; ++n)
    for (int t = 0; t < NT; ++t)
      lg[n][t] = rows[n].init ? load_v<A, vec>(rows[n].init + t * V) : vec{};
  for (int64_t c = 0; c < Cg; ++c) {
    vec qv[NR];
    for (int n = 0; n < NR; ++n) qv[n] = load_v<A, vec>(q[n] + c * V);
    const A* kc = kb + c * ks;
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const vec kv = load_v<A, vec>(kc + o[t]);
      for (int n = 0; n < NR; ++n) lg[n][t] += qv[n] * kv;
    }
  }
  for (int64_t c = 0; c < Cvg; ++c) {
    vec gv[NR];
    for (int n = 0; n < NR; ++n) gv[n] = load_v<A, vec>(gy[n] + c * V);
    const A* vc = vb + c * vs;
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const vec vv = load_v<A, vec>(vc + o[t]);
      for (int n = 0; n < NR; ++n) dp[n][t] += gv[n] * vv;
    }
  }
  vec (&p)[NR][NT] = lg, (&ds)[NR][NT] = dp;  // in place
  for (int n = 0; n < NR; ++n)
    for (int t = 0; t < NT; ++t) {
      p[n][t] = vexp<A, vec>(lg[n][t] - load_v<A, vec>(rows[n].lse));
      ds[n][t] = p[n][t] * (dp[n][t] - load_v<A, vec>(rows[n].D));
    }
  for (int n = 0; n < NR; ++n)
    if (rows[n].gbias)
      for (int t = 0; t < NT; ++t) add_v<A, vec>(rows[n].gbias + t * V, ds[n][t]);
  const bool with_rel = rel[0];  // every row or none
  for (int64_t c = 0; c < Cg; ++c) {
    const A* kc = kb + c * ks;
    vec g[NR];
    for (int n = 0; n < NR; ++n) g[n] = load_v<A, vec>(gq[n] + c * V);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const vec kv = load_v<A, vec>(kc + o[t]);
      for (int n = 0; n < NR; ++n)
        g[n] += ds[n][t] * (with_rel ? kv + rel[n][c * rs + t] : kv);
    }
    for (int n = 0; n < NR; ++n) store_v<A, vec>(gq[n] + c * V, g[n]);
    if (with_rel)
      for (int n = 0; n < NR; ++n) {
        const vec qv = load_v<A, vec>(q[n] + c * V);
        for (int t = 0; t < NT; ++t) add_v<A, vec>(grel[n] + (c * rs + t) * V, ds[n][t] * qv);
      }
  }
  // The scatters tap by tap, channels inner: the taps of one channel
  // overlap (stride 1), and a load of a vector just stored over part of it
  // stalls; a channel's next tap comes Cg stores later.
  for (int t = 0; t < NT; ++t) {
    for (int64_t c = 0; c < Cg; ++c) {
      vec sum = ds[0][t] * load_v<A, vec>(q[0] + c * V);
      for (int n = 1; n < NR; ++n) sum += ds[n][t] * load_v<A, vec>(q[n] + c * V);
      add_v<A, vec>(gkb + c * ks + o[t], sum);
    }
    for (int64_t c = 0; c < Cvg; ++c) {
      vec sum = p[0][t] * load_v<A, vec>(gy[0] + c * V);
      for (int n = 1; n < NR; ++n) sum += p[n][t] * load_v<A, vec>(gy[n] + c * V);
      add_v<A, vec>(gvb + c * vs + o[t], sum);
    }
  }
}

template <typename A, typename vec, bool UNIT, int NT>
inline void backward_one(const BwdRow<A>* rows, const A* kb, const A* vb, int64_t ks,
                         int64_t vs, const int64_t* off, int64_t Cg, int64_t Cvg, int64_t rs,
                         A* gkb, A* gvb) {
  backward_rows<A, vec, UNIT, 1, NT>(rows, kb, vb, ks, vs, off, Cg, Cvg, rs, gkb, gvb);
}

template <typename A, typename vec, bool UNIT, int NT>
inline void backward_two(const BwdRow<A>* rows, const A* kb, const A* vb, int64_t ks,
                         int64_t vs, const int64_t* off, int64_t Cg, int64_t Cvg, int64_t rs,
                         A* gkb, A* gvb) {
  backward_rows<A, vec, UNIT, 2, NT>(rows, kb, vb, ks, vs, off, Cg, Cvg, rs, gkb, gvb);
}

// The backward (see the top of fused_attention.cpp). gq (B, C, Ho, Wo) in
// T, contiguous; gk (B, C, H, W) and gv (B, Cv, H, W) in A, contiguous and
// zero on entry; partial (B, G, Cg*K*K + K*K) in A: each task's sums of
// grad_rel_embed then grad_rel_bias. Task: one (b, g), which owns the
// group's channels of every gradient: its scatters into grad_key and
// grad_value go to buffered (padded) rows, each folded into the map once no
// later output row reads it, so there are no races and the bits do not
// depend on the thread count. The key, value and gradient rows live in a
// ring of the rows a pair of output rows reads (K + 1 at stride 1): 0.14
// MiB a task at ACmix-ResNet-50's stage 1, where buffers of the whole map
// took 1.1 MiB, a core's L2 or more. With two threads that layer's backward
// took 0.92x the time (7 of 8 alternating runs faster), with one as long.
template <typename T>
void attention_backward(const T* __restrict__ gy, GroupStrides sg, const T* __restrict__ out,
                        GroupStrides so, const at::opmath_type<T>* __restrict__ lse,
                        const T* __restrict__ q, GroupStrides sq, const T* __restrict__ k,
                        GroupStrides sk, const T* __restrict__ val, GroupStrides sv,
                        const T* __restrict__ rel, const T* __restrict__ bias,
                        T* __restrict__ gq, at::opmath_type<T>* __restrict__ gk,
                        at::opmath_type<T>* __restrict__ gv,
                        at::opmath_type<T>* __restrict__ partial, const AttnShape& a) {
  using A = at::opmath_type<T>;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = a.C / a.G, Cvg = a.Cv / a.G, KK = a.K * a.K;
  const int64_t Wv = round_up(a.Wo, V), span = (a.K - 1) * a.d;
  const int64_t R = (a.Ho - 1) * a.s + span + 1;  // the rows any window reads
  const int64_t RB = std::min(R, span + 1 + a.s);  // the ring's rows
  const AttnMaps maps(a, Wv);
  const int64_t Lrow = maps.Lrow, part = Cg * KK + KK;
  std::vector<int64_t> off(a.K);
  for (int64_t v = 0; v < a.K; ++v) off[v] = maps.offset(v, a);
  const std::vector<A> ra = rel ? to_acc<T, A>(rel, a.C * KK) : std::vector<A>();
  const std::vector<A> ba = bias ? to_acc<T, A>(bias, a.G * KK) : std::vector<A>();
  at::parallel_for(0, a.B * a.G, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> kb(Cg * RB * Lrow), vb(Cvg * RB * Lrow), gkb(Cg * RB * Lrow),
        gvb(Cvg * RB * Lrow);
    // Per output row of a pair: q, grad_out, D, lse rows; a column
    // vector's q and grad_out (channel stride V), grad_q sums and q . r.
    std::vector<A> qb[2], gyb[2], Db[2], lb[2], qv[2], gv_[2], gqb[2], qr[2];
    for (int n = 0; n < 2; ++n) {
      qb[n].resize(std::max<int64_t>(1, Cg) * Wv), gyb[n].resize(std::max<int64_t>(1, Cvg) * Wv);
      Db[n].resize(Wv), lb[n].resize(Wv), qr[n].resize(KK * V);
      qv[n].resize(std::max<int64_t>(1, Cg) * V), gv_[n].resize(std::max<int64_t>(1, Cvg) * V);
      gqb[n].resize(std::max<int64_t>(1, Cg) * V);
    }
    std::vector<A> grel(rel ? Cg * KK * V : 0), gbias(bias ? KK * V : 0);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / a.G, grp = bg % a.G;
      const A* rg = rel ? ra.data() + grp * Cg * KK : nullptr;
      const A* bgp = bias ? ba.data() + grp * KK : nullptr;
      const T* kp = k + b * sk.b + grp * sk.g;
      const T* vp = val + b * sv.b + grp * sv.g;
      // Buffered row rr (slot rr % RB): key and value in, zero gradients;
      // out, its gradients folded into grad_key and grad_value.
      auto load_row = [&](int64_t rr) {
        const int64_t h = source_index(rr - a.p, a.H, a.reflect), at = rr % RB * Lrow;
        maps.load(kb.data() + at, RB * Lrow, kp, sk.c, Cg, h, sk.h, sk.w);
        maps.load(vb.data() + at, RB * Lrow, vp, sv.c, Cvg, h, sv.h, sv.w);
        for (int64_t c = 0; c < Cg; ++c)
          std::fill_n(gkb.data() + c * RB * Lrow + at, Lrow, A(0));
        for (int64_t c = 0; c < Cvg; ++c)
          std::fill_n(gvb.data() + c * RB * Lrow + at, Lrow, A(0));
      };
      auto fold_row = [&](int64_t rr) {
        const int64_t h = source_index(rr - a.p, a.H, a.reflect), at = rr % RB * Lrow;
        for (int64_t c = 0; c < Cg; ++c)
          maps.fold(gk + (b * a.C + grp * Cg + c) * a.H * a.W, gkb.data() + c * RB * Lrow + at,
                    h, a.W);
        for (int64_t c = 0; c < Cvg; ++c)
          maps.fold(gv + (b * a.Cv + grp * Cvg + c) * a.H * a.W,
                    gvb.data() + c * RB * Lrow + at, h, a.W);
      };
      int64_t loaded = 0, folded = 0;  // rows [folded, loaded) in the ring
      std::fill(grel.begin(), grel.end(), A(0));
      std::fill(gbias.begin(), gbias.end(), A(0));
      // Rows in pairs at stride and dilation 1 (they share buffered rows).
      auto rows = [&](auto unit) {
        constexpr bool kUnit = decltype(unit)::value;
        for (int64_t i0 = 0, nr; i0 < a.Ho; i0 += nr) {
          nr = kUnit && i0 + 1 < a.Ho ? 2 : 1;
          // The rows [lo, hi) this pair reads; those before lo are done.
          const int64_t lo = i0 * a.s, hi = (i0 + nr - 1) * a.s + span + 1;
          for (; folded < lo; ++folded)
            if (folded < loaded) fold_row(folded);
          for (loaded = std::max(loaded, lo); loaded < hi; ++loaded) load_row(loaded);
          // The rows' q, grad_out, lse and D = sum_c grad_out * out; lanes
          // past Wo are zeros, so their dlogit and P * grad_out are zero.
          for (int64_t n = 0; n < nr; ++n) {
            const int64_t i = i0 + n;
            load_rows(qb[n].data(), Wv, q + b * sq.b + grp * sq.g + i * sq.h, sq.c, Cg, sq.w, a.Wo,
                      Wv);
            std::fill(Db[n].begin(), Db[n].end(), A(0));
            load_rows(gyb[n].data(), Wv, gy + b * sg.b + grp * Cvg * sg.c + i * sg.h, sg.c, Cvg,
                      sg.w, a.Wo, Wv);
            for (int64_t c = 0; c < Cvg; ++c) {
              const int64_t ch = grp * Cvg + c;
              const A* gr = gyb[n].data() + c * Wv;
              const T* orow = out + b * so.b + ch * so.c + i * so.h;
              for (int64_t j = 0; j < a.Wo; ++j)
                Db[n][j] += gr[j] * static_cast<A>(orow[j * so.w]);
            }
            load_rows(lb[n].data(), Wv, lse + (bg * a.Ho + i) * a.Wo, 0, 1, 1, a.Wo, Wv);
          }
          for (int64_t jv = 0; jv < Wv; jv += V) {
            BwdRow<A> row[2];
            for (int64_t n = 0; n < nr; ++n) {
              std::fill(gqb[n].begin(), gqb[n].end(), A(0));
              for (int64_t c = 0; c < Cg; ++c)
                std::memcpy(qv[n].data() + c * V, qb[n].data() + c * Wv + jv, sizeof(vec));
              for (int64_t c = 0; c < Cvg; ++c)
                std::memcpy(gv_[n].data() + c * V, gyb[n].data() + c * Wv + jv, sizeof(vec));
              if (rg || bgp) rel_logits<A, vec>(qr[n].data(), qv[n].data(), V, Cg, rg, bgp, KK);
              row[n] = BwdRow<A>{qv[n].data(), gv_[n].data(), nullptr, nullptr,
                                 lb[n].data() + jv, Db[n].data() + jv, gqb[n].data(),
                                 nullptr, nullptr};
            }
            // Buffered row rr = i0 * s + e * d; row n reads it through window
            // row u = e - n (pairs: s = d = 1).
            for (int64_t e = 0; e < a.K + nr - 1; ++e) {
              const int64_t rr = i0 * a.s + e * a.d;
              BwdRow<A> act[2];
              int64_t us[2], ns[2], na = 0;
              for (int64_t n = 0; n < nr; ++n)
                if (e - n >= 0 && e - n < a.K) act[na] = row[n], ns[na] = n, us[na++] = e - n;
              const int64_t at = rr % RB * Lrow + jv;
              const A* kr = kb.data() + at;
              const A* vr = vb.data() + at;
              A* gkr = gkb.data() + at;
              A* gvr = gvb.data() + at;
              for (int64_t v0 = 0; v0 < a.K; v0 += kTaps) {
                const int64_t nt = std::min(kTaps, a.K - v0);
                for (int64_t m = 0; m < na; ++m) {
                  const int64_t tap = us[m] * a.K + v0;
                  act[m].init = rg || bgp ? qr[ns[m]].data() + tap * V : nullptr;
                  act[m].rel = rg ? rg + tap : nullptr;
                  act[m].grel = rel ? grel.data() + tap * V : nullptr;
                  act[m].gbias = bias ? gbias.data() + tap * V : nullptr;
                }
                if (na == 2) {
                  MMEVO_ATTN_CHUNK(backward_two, (A, vec, kUnit), nt, act, kr, vr, RB * Lrow,
                                   RB * Lrow, off.data() + v0, Cg, Cvg, KK, gkr, gvr)
                } else {
                  MMEVO_ATTN_CHUNK(backward_one, (A, vec, kUnit), nt, act, kr, vr, RB * Lrow,
                                   RB * Lrow, off.data() + v0, Cg, Cvg, KK, gkr, gvr)
                }
              }
            }
            const int64_t nj = std::min(V, a.Wo - jv);
            for (int64_t n = 0; n < nr; ++n)
              for (int64_t c = 0; c < Cg; ++c)
                store_lanes<T, A>(gq + ((b * a.C + grp * Cg + c) * a.Ho + i0 + n) * a.Wo + jv,
                                  load_v<A, vec>(gqb[n].data() + c * V), nj);
          }
        }
      };
      if (a.s == 1 && a.d == 1)
        rows(std::true_type{});
      else
        rows(std::false_type{});
      for (; folded < loaded; ++folded) fold_row(folded);
      // The lanes of each sum in their order.
      A* sums = partial + bg * part;
      for (int64_t e = 0; e < (rel ? Cg * KK : 0); ++e)
        for (int64_t l = 0; l < V; ++l) sums[e] += grel[e * V + l];
      for (int64_t e = 0; e < (bias ? KK : 0); ++e)
        for (int64_t l = 0; l < V; ++l) sums[Cg * KK + e] += gbias[e * V + l];
    }
  });
}
