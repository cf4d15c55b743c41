// The three window primitives of the evolution ops, for one instruction set.
//
// Included several times by evolution.cpp, each time inside its own namespace
// under a different `#pragma GCC target`, so one portable binary runs the
// widest vector loops the CPU has. No #include here on purpose: headers must
// not be compiled for the target.
//
// Layouts (all contiguous, NCHW, but for aggregate_forward_nhwc at the end):
// x (B, C, H, W); w (B, G, K, K, Ho, Wo); y / grad_y / query (B, C, Ho, Wo).
// Zero padding only: reflect padding is turned into an explicit padded input
// before the kernels run.
//
// kVecBytes (the vector width) is defined by the includer for each target.
//
// Scheme: a task owns a tile of kRows rows (output rows; input rows for the
// transpose) of one (b, g), with a block of channels, and writes it whole:
// deterministic, no atomics, the same bits for any thread count. It first
// copies the rows it needs into zero-padded buffers in the accumulation
// type, split by column phase when the stride is > 1, so that every window
// tap is a contiguous, always-valid slice. The hot loops (tile_row,
// correlate_tile) keep a register tile of sums over the contiguous column
// axis: kCh channels x kRows rows (kCRows rows x kUs window rows for the
// correlation). Neighbouring rows share input rows, so each loaded input
// vector feeds up to kRows rows and each loaded kernel vector kCh channels:
// under half a load per FMA. The tile fills the register file: 32 vectors
// with AVX-512, 16 below.

constexpr int64_t kRows = kVecBytes == 64 ? 6 : 2;
constexpr int64_t kCh = 4, kUs = 4;
constexpr int64_t kCRows = kVecBytes == 64 ? 4 : 2;  // rows of a correlation tile
constexpr int64_t kTileChannels = 16;  // channels of a forward / transpose task

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// s in every lane. Not vec{} + s: -0 + 0 is +0, so the compiler keeps that
// add (a scalar add, then a broadcast from a register), while s - 0 is s
// and folds to one broadcast load, which an FMA can take as its operand.
template <typename vec, typename A>
__attribute__((always_inline)) inline vec splat(A s) {
  return s - vec{};
}

// Vector loads and stores of any alignment (memcpy: also a store that may
// alias anything, so pointers read from memory are reloaded after it).
template <typename A, typename vec>
inline vec load_v(const A* p) {
  vec v;
  std::memcpy(&v, p, sizeof(vec));
  return v;
}

template <typename A, typename vec>
inline void store_v(A* p, vec v) {
  std::memcpy(p, &v, sizeof(vec));
}

template <typename A, typename vec>
inline void add_v(A* p, vec v) {
  store_v<A, vec>(p, load_v<A, vec>(p) + v);
}

// One stage of an in-register transpose: swaps bit S of the vector index
// (a holds the vectors without it, b those with it) with bit S of the lane.
template <int S, typename vec, size_t... L>
__attribute__((always_inline)) inline void swap_bit(vec& a, vec& b, std::index_sequence<L...>) {
  constexpr size_t V = sizeof...(L);
  const vec lo = __builtin_shufflevector(a, b, ((L & S) ? V + L - S : L)...);
  const vec hi = __builtin_shufflevector(a, b, ((L & S) ? V + L : L + S)...);
  a = lo;
  b = hi;
}

template <int S, typename vec, int V>
__attribute__((always_inline)) inline void transpose_stage(vec (&r)[V]) {
  if constexpr (S < V)
    for (int i = 0; i < V; ++i)
      if (!(i & S)) swap_bit<S, vec>(r[i], r[i + S], std::make_index_sequence<V>{});
}

// r[i][l] becomes r[l][i], V vectors of V lanes: log2 V stages of V
// shuffles.
template <typename vec, int V>
__attribute__((always_inline)) inline void transpose(vec (&r)[V]) {
  static_assert(V <= 16, "vectors of at most 16 lanes");
  transpose_stage<8>(r);
  transpose_stage<4>(r);
  transpose_stage<2>(r);
  transpose_stage<1>(r);
}

// Column phases of a buffered input row of length s * L: buffer column
// ph * L + m holds input column m * s + ph - p (zero outside [0, W)), so tap
// v of the output columns [j, j + V) is the slice at offset(v) + j.
struct RowPhases {
  int64_t s, p, L;
  std::vector<int64_t> lo, hi;  // per phase, the m inside the map

  RowPhases(int64_t s_, int64_t p_, int64_t W, int64_t L_)
      : s(s_), p(p_), L(L_), lo(s_), hi(s_) {
    for (int64_t ph = 0; ph < s; ++ph) {
      lo[ph] = std::min(L, std::max<int64_t>(0, ceil_div(p - ph, s)));
      hi[ph] = std::max(lo[ph], std::min(L, ceil_div(W + p - ph, s)));
    }
  }

  int64_t offset(int64_t v, int64_t d) const { return (v * d) % s * L + (v * d) / s; }

  template <typename T, typename A>
  void load(A* __restrict__ dst, const T* __restrict__ src) const {
    for (int64_t ph = 0; ph < s; ++ph, dst += L) {
      const T* from = src + ph - p;
      std::fill(dst, dst + lo[ph], A(0));
      if (s == 1) {
        for (int64_t m = lo[ph]; m < hi[ph]; ++m) dst[m] = static_cast<A>(from[m]);
      } else {
        for (int64_t m = lo[ph]; m < hi[ph]; ++m) dst[m] = static_cast<A>(from[m * s]);
      }
      std::fill(dst + hi[ph], dst + L, A(0));
    }
  }
};

// dst[j] = src[j - shift] for j < n, zero where that is outside [0, len).
template <typename T, typename A>
inline void load_shifted(A* __restrict__ dst, const T* __restrict__ src, int64_t len,
                         int64_t shift, int64_t n) {
  const int64_t lo = std::min(n, shift), hi = std::max(lo, std::min(n, len + shift));
  std::fill(dst, dst + lo, A(0));
  for (int64_t j = lo; j < hi; ++j) dst[j] = static_cast<A>(src[j - shift]);
  std::fill(dst + hi, dst + n, A(0));
}

// dst[j * step] = lane j of v, converted to T, for j < n.
template <typename T, typename A, typename vec>
inline void store_lanes(T* __restrict__ dst, const vec& v, int64_t n, int64_t step = 1) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  if (std::is_same_v<T, A> && n == V && step == 1) {
    std::memcpy(dst, &v, sizeof(vec));
    return;
  }
  A tmp[V];
  std::memcpy(tmp, &v, sizeof(vec));
  for (int64_t j = 0; j < n; ++j) dst[j * step] = static_cast<T>(tmp[j]);
}

// acc[k][n] += b[n][boff[q]] * a[k][aoff[q]] for the taps q < nt and every
// tile row n with a kernel row b[n] (null: no tap there). a = kCh channel
// rows of the shifted operand.
template <typename A, typename vec>
__attribute__((always_inline)) inline void tile_row(
    vec (&acc)[kCh][kRows], const A* const* a, const A* const* b, const int64_t* aoff,
    const int64_t* boff, int64_t nt) {
  constexpr int64_t VB = sizeof(vec);
  for (int64_t q = 0; q < nt; ++q) {
    vec xv[kCh];
#pragma GCC unroll 4
    for (int k = 0; k < kCh; ++k) std::memcpy(&xv[k], a[k] + aoff[q], VB);
#pragma GCC unroll 8
    for (int n = 0; n < kRows; ++n) {
      if (!b[n]) continue;
      vec wv;
      std::memcpy(&wv, b[n] + boff[q], VB);
#pragma GCC unroll 4
      for (int k = 0; k < kCh; ++k) acc[k][n] += wv * xv[k];
    }
  }
}

// u_of[rr * kRows + n]: the window row u through which buffered row rr meets
// tile row n < rows, u * d = first + n * sn - rr * sr, or -1 if none.
inline void tile_taps(int64_t* u_of, int64_t R, int64_t rows, int64_t span, int64_t d,
                      int64_t first, int64_t sn, int64_t sr) {
  for (int64_t rr = 0; rr < R; ++rr)
    for (int64_t n = 0; n < kRows; ++n) {
      const int64_t ud = first + n * sn - rr * sr;
      u_of[rr * kRows + n] = n < rows && ud >= 0 && ud <= span && ud % d == 0 ? ud / d : -1;
    }
}

// acc += the window rows rr in [rlo, rhi) of a tile: channel k's row rr of
// the shifted operand at a + k*as_c + rr*as_r, tile row n's kernel rows at
// w + n*ws_n + u*ws_u for u = u_of[rr][n] (see tile_taps).
template <typename A, typename vec>
inline void tile_rows(vec (&acc)[kCh][kRows], const A* a0, int64_t as_c, int64_t as_r,
                      const A* w0, int64_t ws_n, int64_t ws_u, const int64_t* u_of,
                      int64_t rlo, int64_t rhi, const int64_t* aoff, const int64_t* boff,
                      int64_t nt) {
  for (int64_t rr = rlo; rr < rhi; ++rr) {
    const A* a[kCh];
    const A* wr[kRows];
    for (int k = 0; k < kCh; ++k) a[k] = a0 + k * as_c + rr * as_r;
    for (int n = 0; n < kRows; ++n) {
      const int64_t u = u_of[rr * kRows + n];
      wr[n] = u < 0 ? nullptr : w0 + n * ws_n + u * ws_u;
    }
    tile_row<A, vec>(acc, a, wr, aoff, boff, nt);
  }
}

// Y[b, c, i, :] = sum_{u, v} w[b, g, u, v, i, :] * x[b, c, i*s-p+u*d, :*s-p+v*d].
// Task: (b, g, block of <= 16 channels, kRows output rows); buffered input
// row rr (input row i0*s - p + rr) feeds output row i0 + n through window row
// u = (rr - n*s) / d. The tile's kernel rows are copied into a buffer whose
// row stride is an odd number of vectors: in place they lie K*K planes
// apart, often a multiple of 4 KiB, which maps them onto a few cache sets.
template <typename T>
void aggregate_forward(const T* __restrict__ x, const T* __restrict__ w,
                       T* __restrict__ y, const Geometry& g) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = g.C / g.G, CB = std::min(Cg, kTileChannels);
  const int64_t nCB = ceil_div(Cg, CB), nIB = ceil_div(g.Ho, kRows);
  const int64_t span = (g.K - 1) * g.d, R = (kRows - 1) * g.s + span + 1;
  const int64_t Wv = round_up(g.Wo, V), L = Wv + span / g.s, Lrow = g.s * L;
  const int64_t Ws = Wv / V % 2 ? Wv : Wv + V;
  const int64_t plane = g.Ho * g.Wo, KK = g.K * g.K;
  const RowPhases phases(g.s, g.p, g.W, L);
  std::vector<int64_t> aoff(g.K), boff(g.K);
  for (int64_t v = 0; v < g.K; ++v) aoff[v] = phases.offset(v, g.d), boff[v] = v * Ws;
  const int64_t grain = grain_for(CB * kRows * KK * g.Wo);
  at::parallel_for(0, g.B * g.G * nCB * nIB, grain, [&](int64_t begin, int64_t end) {
    // Channel slots past the block's last channel are computed and dropped;
    // kernel row columns [Wo, Ws) are never written and stay zero.
    std::vector<A> xb(round_up(CB, kCh) * R * Lrow), wb(kRows * KK * Ws);
    std::vector<int64_t> u_of(R * kRows);
    int64_t taps_rows = 0;  // the tile height u_of was made for
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ib = t % nIB, cb = (t / nIB) % nCB, bg = t / nIB / nCB;
      const int64_t b = bg / g.G, grp = bg % g.G;
      const int64_t i0 = ib * kRows, ni = std::min(kRows, g.Ho - i0);
      const int64_t c0 = grp * Cg + cb * CB, nc = std::min(CB, Cg - cb * CB);
      // Input rows inside the map; the others only meet zero padding.
      const int64_t r0 = i0 * g.s - g.p;
      const int64_t rlo = std::max<int64_t>(0, -r0);
      const int64_t rhi = std::min((ni - 1) * g.s + span + 1, g.H - r0);
      for (int64_t cc = 0; cc < nc; ++cc)
        for (int64_t rr = rlo; rr < rhi; ++rr)
          phases.load(xb.data() + (cc * R + rr) * Lrow,
                      x + ((b * g.C + c0 + cc) * g.H + r0 + rr) * g.W);
      for (int64_t uv = 0; uv < KK; ++uv) {
        const T* src = w + (bg * KK + uv) * plane + i0 * g.Wo;
        for (int64_t n = 0; n < ni; ++n, src += g.Wo) {
          A* dst = wb.data() + (n * KK + uv) * Ws;
          if constexpr (std::is_same_v<T, A>) std::memcpy(dst, src, g.Wo * sizeof(A));
          else for (int64_t j = 0; j < g.Wo; ++j) dst[j] = static_cast<A>(src[j]);
        }
      }
      if (ni != taps_rows) tile_taps(u_of.data(), R, taps_rows = ni, span, g.d, 0, -g.s, -1);
      for (int64_t jv = 0; jv < Wv; jv += V) {
        const int64_t nj = std::min(V, g.Wo - jv);
        for (int64_t c4 = 0; c4 < nc; c4 += kCh) {
          vec acc[kCh][kRows] = {};
          tile_rows<A, vec>(acc, xb.data() + c4 * R * Lrow + jv, R * Lrow, Lrow, wb.data() + jv,
                            KK * Ws, g.K * Ws, u_of.data(), rlo, rhi, aoff.data(), boff.data(),
                            g.K);
          for (int64_t k = 0; k < std::min(kCh, nc - c4); ++k)
            for (int64_t n = 0; n < ni; ++n)
              store_lanes<T, A>(y + ((b * g.C + c0 + c4 + k) * g.Ho + i0 + n) * g.Wo + jv,
                                acc[k][n], nj);
        }
      }
    }
  });
}

// grad_x = At(grad_y, w), as a gather: input pixel (h, col) collects
// w * grad_y at i = (h + p - u*d) / s, j = (col + p - v*d) / s wherever
// those divide exactly. Task: (b, g, block of <= 16 channels, kRows input
// rows). Columns are done by phase q = col mod s: col = m*s + q takes the
// taps v with q + p - v*d divisible by s, at j = m + t(v), t(v) = (q + p -
// v*d) / s, a shift of the m axis. Buffer column e holds j = e - S0 of
// grad_y and of the kernel rows (zero outside [0, Wo)), so tap v is the slice
// at t(v) + S0 of both.
template <typename T>
void aggregate_transpose(const T* __restrict__ gy, const T* __restrict__ w,
                         T* __restrict__ gx, const Geometry& g) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = g.C / g.G, CB = std::min(Cg, kTileChannels);
  const int64_t nCB = ceil_div(Cg, CB), nHB = ceil_div(g.H, kRows);
  const int64_t span = (g.K - 1) * g.d, S0 = span / g.s;
  const int64_t Mv = round_up(ceil_div(g.W, g.s), V);  // columns m of a phase
  const int64_t Le = Mv + S0 + (g.s - 1 + g.p) / g.s + 1;
  const int64_t R = (kRows - 1 + span) / g.s + 2;  // grad_y rows of a tile
  const int64_t plane = g.Ho * g.Wo, KK = g.K * g.K;
  // Taps of each column phase: ntap[q], and their offsets in the buffers.
  std::vector<int64_t> ntap(g.s, 0), aoff(g.s * g.K), boff(g.s * g.K);
  for (int64_t q = 0; q < g.s; ++q)
    for (int64_t v = 0; v < g.K; ++v) {
      const int64_t num = q + g.p - v * g.d;
      if (((num % g.s) + g.s) % g.s) continue;
      const int64_t k = q * g.K + ntap[q]++;
      aoff[k] = num / g.s + S0;
      boff[k] = v * Le + aoff[k];
    }
  const int64_t grain = grain_for(CB * kRows * KK * g.W / (g.s * g.s));
  at::parallel_for(0, g.B * g.G * nCB * nHB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> gb(round_up(CB, kCh) * R * Le), wb(kRows * KK * Le);
    std::vector<int64_t> u_of(R * kRows);
    int64_t taps_first = 0, taps_rows = 0;  // what u_of was made for
    for (int64_t t = begin; t < end; ++t) {
      const int64_t hb = t % nHB, cb = (t / nHB) % nCB, bg = t / nHB / nCB;
      const int64_t b = bg / g.G, grp = bg % g.G;
      const int64_t h0 = hb * kRows, nh = std::min(kRows, g.H - h0);
      const int64_t c0 = grp * Cg + cb * CB, nc = std::min(CB, Cg - cb * CB);
      // grad_y rows i = i_lo + rr; input row h0 + n meets them through
      // u*d = first + n - rr*s.
      const int64_t i_lo = ceil_div(h0 + g.p - span, g.s), first = h0 + g.p - i_lo * g.s;
      const int64_t rlo = std::max<int64_t>(0, -i_lo);
      const int64_t rhi = std::min({R, g.Ho - i_lo, (h0 + nh - 1 + g.p) / g.s - i_lo + 1});
      for (int64_t cc = 0; cc < nc; ++cc)
        for (int64_t rr = rlo; rr < rhi; ++rr)
          load_shifted(gb.data() + (cc * R + rr) * Le,
                       gy + ((b * g.C + c0 + cc) * g.Ho + i_lo + rr) * g.Wo, g.Wo, S0, Le);
      if (first != taps_first || nh != taps_rows) {
        tile_taps(u_of.data(), R, nh, span, g.d, first, 1, g.s);
        taps_first = first, taps_rows = nh;
      }
      for (int64_t rr = rlo; rr < rhi; ++rr)
        for (int64_t n = 0; n < nh; ++n) {
          const int64_t u = u_of[rr * kRows + n];
          if (u < 0) continue;
          for (int64_t v = 0; v < g.K; ++v)
            load_shifted(wb.data() + ((n * g.K + u) * g.K + v) * Le,
                         w + (bg * KK + u * g.K + v) * plane + (i_lo + rr) * g.Wo, g.Wo, S0,
                         Le);
        }
      for (int64_t jv = 0; jv < Mv; jv += V)
        for (int64_t c4 = 0; c4 < nc; c4 += kCh)
          for (int64_t q = 0; q < g.s; ++q) {
            vec acc[kCh][kRows] = {};
            tile_rows<A, vec>(acc, gb.data() + c4 * R * Le + jv, R * Le, Le, wb.data() + jv,
                              KK * Le, g.K * Le, u_of.data(), rlo, rhi, aoff.data() + q * g.K,
                              boff.data() + q * g.K, ntap[q]);
            // Columns jv*s + q, ... of this phase that are inside the map.
            const int64_t nj = std::min(V, ceil_div(g.W - q, g.s) - jv);
            if (nj <= 0) continue;
            for (int64_t k = 0; k < std::min(kCh, nc - c4); ++k)
              for (int64_t n = 0; n < nh; ++n)
                store_lanes<T, A>(
                    gx + ((b * g.C + c0 + c4 + k) * g.H + h0 + n) * g.W + jv * g.s + q,
                    acc[k][n], nj, g.s);
          }
    }
  });
}

// exp of every lane. fp32: Cephes' expf polynomial on the vector (~1 ulp
// for the arguments a softmax sees, x - max <= 0); fp64: std::exp per lane.
template <typename A, typename vec>
inline vec vexp(vec x) {
  if constexpr (std::is_same_v<A, float>) {
    typedef int32_t ivec __attribute__((vector_size(sizeof(vec))));
    x = x < -87.33654f ? vec{} - 87.33654f : x;
    x = x > 88.37626f ? vec{} + 88.37626f : x;
    const vec fx = x * 1.44269504088896341f + 0.5f;
    ivec n = __builtin_convertvector(fx, ivec);
    n += (__builtin_convertvector(n, vec) > fx);  // truncation -> floor
    const vec fn = __builtin_convertvector(n, vec);
    x = x - fn * 0.693359375f + fn * 2.12194440e-4f;
    vec y = ((((1.9875691500e-4f * x + 1.3981999507e-3f) * x + 8.3334519073e-3f) * x +
              4.1665795894e-2f) * x + 1.6666665459e-1f) * x + 5.0000001201e-1f;
    y = y * (x * x) + x + 1.0f;
    return y * (vec)((n + 127) << 23);
  } else {
    constexpr int kLanes = sizeof(vec) / sizeof(A);
    for (int j = 0; j < kLanes; ++j) x[j] = std::exp(x[j]);
    return x;
  }
}

// In place, for each lane: the n vectors at t + k * step (k < n) become
// their softmax over k.
template <typename A, typename vec>
inline void softmax_lanes(A* t, int64_t n, int64_t step) {
  constexpr int64_t VB = sizeof(vec);
  vec m, e, sum = {};
  std::memcpy(&m, t, VB);
  for (int64_t k = 1; k < n; ++k) {
    std::memcpy(&e, t + k * step, VB);
    m = e > m ? e : m;
  }
  for (int64_t k = 0; k < n; ++k) {
    std::memcpy(&e, t + k * step, VB);
    e = vexp<A, vec>(e - m);
    sum += e;
    std::memcpy(t + k * step, &e, VB);
  }
  const vec r = 1 / sum;
  for (int64_t k = 0; k < n; ++k) {
    std::memcpy(&e, t + k * step, VB);
    e *= r;
    std::memcpy(t + k * step, &e, VB);
  }
}

// One (v, block of NU window rows) of a correlation tile: acc[n][m] =
// sum_c q[c, n] * x[c, n*s + (u0 + m)*d] over the group's channels. UNIT:
// s == d == 1 is known at compile time, so the loads of rows shared by
// several (n, m) are merged.
template <typename A, typename vec, int NU, bool UNIT>
__attribute__((always_inline)) inline void correlate_tile(
    vec (&acc)[kCRows][kUs], const A* qb, int64_t qs, int64_t qs_c, const A* xb,
    int64_t xs_row, int64_t xs_c, int64_t nc, int64_t s_rt, int64_t d_rt) {
  constexpr int64_t VB = sizeof(vec);
  const int64_t s = UNIT ? 1 : s_rt, d = UNIT ? 1 : d_rt;
  for (int64_t c = 0; c < nc; ++c) {
    vec qv[kCRows];
#pragma GCC unroll 8
    for (int n = 0; n < kCRows; ++n) std::memcpy(&qv[n], qb + c * qs_c + n * qs, VB);
    const A* xc = xb + c * xs_c;
#pragma GCC unroll 4
    for (int m = 0; m < NU; ++m)
#pragma GCC unroll 8
      for (int n = 0; n < kCRows; ++n) {
        vec xv;
        std::memcpy(&xv, xc + (n * s + m * d) * xs_row, VB);
        acc[n][m] += qv[n] * xv;
      }
  }
}

// out[b, g, u, v, i, :] = sum_{c in g} q[b, c, i, :] * x[b, c, i*s-p+u*d, :*s-p+v*d].
// Task: (b, g, kCTaskRows output rows) with all of the group's channels (the
// sum over them stays in one task: deterministic), computed kCRows rows at a
// time from one buffer (the window's extra rows are loaded once per task);
// per column vector, tap column v and block of kUs window rows u, the
// kCRows x kUs sums stay in registers over the channel loop.
//
// softmax: normalise each pixel's K*K sums with a softmax over the window
// before they are written (local attention weights), in the accumulation
// type, while they are still in L1.
template <typename T>
void correlate(const T* __restrict__ q, const T* __restrict__ x, T* __restrict__ out,
               const Geometry& g, bool softmax) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  constexpr int64_t kCTaskRows = 3 * kCRows;
  const int64_t Cg = g.C / g.G, nIB = ceil_div(g.Ho, kCTaskRows);
  const int64_t span = (g.K - 1) * g.d, R = (kCTaskRows - 1) * g.s + span + 1;
  const int64_t Wv = round_up(g.Wo, V), L = Wv + span / g.s, Lrow = g.s * L;
  const int64_t plane = g.Ho * g.Wo;
  const bool unit = g.s == 1 && g.d == 1;
  const RowPhases phases(g.s, g.p, g.W, L);
  std::vector<int64_t> voff(g.K);
  for (int64_t v = 0; v < g.K; ++v) voff[v] = phases.offset(v, g.d);
  const int64_t grain = grain_for(Cg * kCTaskRows * g.K * g.K * g.Wo);
  at::parallel_for(0, g.B * g.G * nIB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> xb(Cg * R * Lrow), qb(Cg * kCTaskRows * Wv);
    std::vector<A> ob(g.K * g.K * kCRows * V);  // a column vector's sums, (u, v, n)
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ib = t % nIB, bg = t / nIB, b = bg / g.G, grp = bg % g.G;
      const int64_t t0 = ib * kCTaskRows, nt = std::min(kCTaskRows, g.Ho - t0);
      const int64_t c0 = grp * Cg, r0 = t0 * g.s - g.p;
      // Rows outside the map (and query rows past Ho) are zero rows.
      for (int64_t c = 0; c < Cg; ++c) {
        for (int64_t rr = 0; rr < R; ++rr) {
          A* dst = xb.data() + (c * R + rr) * Lrow;
          if (r0 + rr < 0 || r0 + rr >= g.H) std::fill(dst, dst + Lrow, A(0));
          else phases.load(dst, x + ((b * g.C + c0 + c) * g.H + r0 + rr) * g.W);
        }
        for (int64_t n = 0; n < kCTaskRows; ++n) {
          A* dst = qb.data() + (c * kCTaskRows + n) * Wv;
          if (n >= nt) std::fill(dst, dst + Wv, A(0));
          else load_shifted(dst, q + ((b * g.C + c0 + c) * g.Ho + t0 + n) * g.Wo, g.Wo, 0, Wv);
        }
      }
      for (int64_t n0 = 0; n0 < nt; n0 += kCRows)
        for (int64_t jv = 0; jv < Wv; jv += V) {
          const int64_t i0 = t0 + n0, ni = std::min(kCRows, nt - n0);
          const int64_t nj = std::min(V, g.Wo - jv);
          for (int64_t v = 0; v < g.K; ++v)
            for (int64_t u0 = 0; u0 < g.K; u0 += kUs) {
              const int64_t nu = std::min(kUs, g.K - u0);
              vec acc[kCRows][kUs] = {};
              const A* xs = xb.data() + (n0 * g.s + u0 * g.d) * Lrow + jv + voff[v];
              const A* qs = qb.data() + n0 * Wv + jv;
#define MMEVO_CORR_TILE(NU)                                                                \
  (unit ? correlate_tile<A, vec, NU, true>(acc, qs, Wv, kCTaskRows * Wv, xs, Lrow, R * Lrow, \
                                           Cg, 1, 1)                                         \
        : correlate_tile<A, vec, NU, false>(acc, qs, Wv, kCTaskRows * Wv, xs, Lrow,          \
                                            R * Lrow, Cg, g.s, g.d))
              switch (nu) {
                case 4: MMEVO_CORR_TILE(4); break;
                case 3: MMEVO_CORR_TILE(3); break;
                case 2: MMEVO_CORR_TILE(2); break;
                default: MMEVO_CORR_TILE(1);
              }
#undef MMEVO_CORR_TILE
              for (int64_t m = 0; m < nu; ++m)
                for (int64_t n = 0; n < ni; ++n)
                  std::memcpy(ob.data() + (((u0 + m) * g.K + v) * kCRows + n) * V, &acc[n][m],
                              sizeof(vec));
            }
          for (int64_t n = 0; n < ni; ++n) {
            if (softmax) softmax_lanes<A, vec>(ob.data() + n * V, g.K * g.K, kCRows * V);
            for (int64_t uv = 0; uv < g.K * g.K; ++uv) {
              vec sums;
              std::memcpy(&sums, ob.data() + (uv * kCRows + n) * V, sizeof(vec));
              store_lanes<T, A>(out + (bg * g.K * g.K + uv) * plane + (i0 + n) * g.Wo + jv,
                                sums, nj);
            }
          }
        }
    }
  });
}

// Y = A(x, w) channels-last: x (B, H, W, C) and y (B, Ho, Wo, C) dense, w
// of any strides ws (as a channels-last span convolution leaves it, each
// pixel's G*K*K taps contiguous), zero padding. Task: one output row. A
// register tile of up to kNhwcVecs vectors of channels, for one output
// pixel or a block of neighbours whose windows lie inside the map, sums
// the taps, each one kernel value (that of the vector's group and pixel)
// times a contiguous run of input channels. The pixel block keeps enough
// independent sums in flight to hide the FMA latency when a run has few
// vectors (the RedNet stem: 32 channels). When a group's channels are not
// whole vectors, each group runs on its own, its last channels scalar.
constexpr int kNhwcVecs = 4;

template <typename T, typename A, typename vec>
inline vec load_vec(const T* src) {
  vec v;
  if constexpr (std::is_same_v<T, A>) {
    std::memcpy(&v, src, sizeof(vec));
  } else {
    constexpr int64_t V = sizeof(vec) / sizeof(A);
    A tmp[V];
    for (int64_t l = 0; l < V; ++l) tmp[l] = static_cast<A>(src[l]);
    std::memcpy(&v, tmp, sizeof(vec));
  }
  return v;
}

// Pixel offsets of a block: pixel p's input, kernel and output start p times
// these past pixel 0's.
struct NhwcSteps {
  int64_t x, w, y;
};

// For pixels p < NP and vectors n < NV:
// y[p*st.y + n*V, ...+V) = sum_q w[p*st.w + wo[n] + ko[q]] * x[p*st.x + xo[q] + n*V, ...+V).
// The kernel's type TW is T, or A for a kernel computed in the
// accumulation type (the fused involution's).
template <int NV, int NP, typename T, typename TW, typename A, typename vec>
__attribute__((always_inline)) inline void nhwc_tile(
    const T* __restrict__ x, const TW* __restrict__ w, const int64_t* xo, const int64_t* ko,
    int64_t nt, const int64_t* wo, NhwcSteps st, T* __restrict__ y) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  vec acc[NP][NV] = {};
  for (int64_t q = 0; q < nt; ++q) {
    const T* xq = x + xo[q];
    const TW* wq = w + ko[q];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p)
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n)
        acc[p][n] += splat<vec>(static_cast<A>(wq[p * st.w + wo[n]])) *
                     load_vec<T, A, vec>(xq + p * st.x + n * V);
  }
  for (int p = 0; p < NP; ++p)
    for (int n = 0; n < NV; ++n) store_lanes<T, A>(y + p * st.y + n * V, acc[p][n], V);
}

template <int NP, typename T, typename TW, typename A, typename vec>
inline void nhwc_tile_nv(int64_t nv, const T* x, const TW* w, const int64_t* xo,
                         const int64_t* ko, int64_t nt, const int64_t* wo, NhwcSteps st,
                         T* y) {
  switch (nv) {
    case 4: nhwc_tile<4, NP, T, TW, A, vec>(x, w, xo, ko, nt, wo, st, y); break;
    case 3: nhwc_tile<3, NP, T, TW, A, vec>(x, w, xo, ko, nt, wo, st, y); break;
    case 2: nhwc_tile<2, NP, T, TW, A, vec>(x, w, xo, ko, nt, wo, st, y); break;
    default: nhwc_tile<1, NP, T, TW, A, vec>(x, w, xo, ko, nt, wo, st, y);
  }
}

// One task's view of a channels-last aggregation: the kernel's strides ws
// (B, G, K, K, Ho, Wo), how the channels run, and the window offsets.
template <typename T>
struct NhwcRows {
  using A = typename Acc<T>::type;
  static constexpr int64_t V = kVecBytes / sizeof(A);
  const Geometry& g;
  const int64_t* ws;
  int64_t Cg, KK, runs, run, Cv, NP;
  NhwcSteps st;
  std::vector<int64_t> xo, ko, rel_x, rel_k;

  NhwcRows(const Geometry& g_, const int64_t* ws_)
      : g(g_), ws(ws_), Cg(g.C / g.G), KK(g.K * g.K), xo(KK), ko(KK), rel_x(KK), rel_k(KK) {
    // Whole vectors of one group each: the channels as one run; otherwise
    // group by group, the vector part of each, then its last channels.
    const bool flat = Cg % V == 0;
    runs = flat ? 1 : g.G, run = flat ? g.C : Cg, Cv = run / V * V;
    // Pixels of an inner block: with short runs (the RedNet stem: 32
    // channels) one pixel's sums are too few to hide the FMA latency; 4 to
    // 8 in flight are. Longer runs keep one pixel (measured no faster).
    NP = Cv > kNhwcVecs * V ? 1 : Cv >= 3 * V ? 2 : 4;
    st = NhwcSteps{g.s * g.C, ws[5], g.C};
    for (int64_t u = 0; u < g.K; ++u)
      for (int64_t v = 0; v < g.K; ++v) {
        rel_x[u * g.K + v] = (u * g.d * g.W + v * g.d) * g.C;
        rel_k[u * g.K + v] = u * ws[2] + v * ws[3];
      }
  }

  // Output row i of image b, columns [j0, j1), from x (B, H, W, C) into y
  // (B, Ho, Wo, C); w is the kernel of (b, i, j0), column j's (j - j0) *
  // ws[5] past it.
  template <typename TW>
  void row(const T* __restrict__ x, const TW* __restrict__ w, T* __restrict__ y, int64_t b,
           int64_t i, int64_t j0, int64_t j1) {
    typedef A vec __attribute__((vector_size(kVecBytes)));
    int64_t wo[kNhwcVecs];
    const int64_t h0 = i * g.s - g.p;
    const bool rows_in = h0 >= 0 && h0 + (g.K - 1) * g.d < g.H;
    for (int64_t j = j0, np; j < j1; j += np) {
      const int64_t w0 = j * g.s - g.p;
      const int64_t base = ((b * g.H + h0) * g.W + w0) * g.C;
      // The windows of pixels j .. j + n - 1 lie inside the map.
      const auto inside = [&](int64_t n) {
        return rows_in && w0 >= 0 && j + n <= j1 && w0 + (n - 1) * g.s + (g.K - 1) * g.d < g.W;
      };
      int64_t nt = 0;  // the taps inside the map
      np = inside(NP) ? NP : 1;
      if (np > 1 || inside(1)) {
        for (int64_t q = 0; q < KK; ++q) xo[q] = base + rel_x[q], ko[q] = rel_k[q];
        nt = KK;
      } else {
        for (int64_t u = 0; u < g.K; ++u) {
          if (h0 + u * g.d < 0 || h0 + u * g.d >= g.H) continue;
          for (int64_t v = 0; v < g.K; ++v) {
            if (w0 + v * g.d < 0 || w0 + v * g.d >= g.W) continue;
            xo[nt] = base + rel_x[u * g.K + v];
            ko[nt++] = rel_k[u * g.K + v];
          }
        }
      }
      const TW* wp = w + (j - j0) * ws[5];
      T* yp = y + ((b * g.Ho + i) * g.Wo + j) * g.C;
      for (int64_t r = 0; r < runs; ++r) {
        const int64_t c_r = r * run;  // the run's first channel
        for (int64_t c0 = 0; c0 < Cv; c0 += kNhwcVecs * V) {
          const int64_t nv = std::min<int64_t>(kNhwcVecs, (Cv - c0) / V);
          for (int64_t n = 0; n < nv; ++n) wo[n] = (c_r + c0 + n * V) / Cg * ws[1];
          const T* xc = x + c_r + c0;
          T* yc = yp + c_r + c0;
          if (np == 4)
            nhwc_tile_nv<4, T, TW, A, vec>(nv, xc, wp, xo.data(), ko.data(), nt, wo, st, yc);
          else if (np == 2)
            nhwc_tile_nv<2, T, TW, A, vec>(nv, xc, wp, xo.data(), ko.data(), nt, wo, st, yc);
          else
            nhwc_tile_nv<1, T, TW, A, vec>(nv, xc, wp, xo.data(), ko.data(), nt, wo, st, yc);
        }
        for (int64_t p = 0; p < np; ++p)
          for (int64_t c = c_r + Cv; c < c_r + run; ++c) {
            const TW* wc = wp + p * st.w + c / Cg * ws[1];
            const T* xp = x + p * st.x + c;
            A sum = 0;
            for (int64_t q = 0; q < nt; ++q)
              sum += static_cast<A>(wc[ko[q]]) * static_cast<A>(xp[xo[q]]);
            yp[p * st.y + c] = static_cast<T>(sum);
          }
      }
    }
  }
};

template <typename T>
void aggregate_forward_nhwc(const T* __restrict__ x, const T* __restrict__ w,
                            const int64_t* ws, T* __restrict__ y, const Geometry& g) {
  const int64_t grain = grain_for(g.Wo * g.K * g.K * g.C);
  at::parallel_for(0, g.B * g.Ho, grain, [&](int64_t begin, int64_t end) {
    NhwcRows<T> rows(g, ws);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / g.Ho, i = t % g.Ho;
      rows.row(x, w + b * ws[0] + i * ws[4], y, b, i, 0, g.Wo);
    }
  });
}
