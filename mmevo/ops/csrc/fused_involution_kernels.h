// The fused involution kernels for one instruction set.
//
// Included by fused_involution.cpp inside a namespace per `#pragma GCC
// target`, after evolution_kernels.h, whose input row buffers (RowPhases),
// register tiles (tile_rows, correlate_tile) and constants they reuse. No
// #include here on purpose.
//
// Layouts (contiguous NCHW): x (B, C, H, W); z (B, Cr, Ho, Wo); S (G*K*K,
// Cr) and bias (G*K*K), the span convolution's, group-major then row-major
// taps; y, grad_y (B, C, Ho, Wo). Zero padding p.
//
// A task computes its tile's kernel W = S z + bias into a buffer of K*K
// planes (tap k, then tile row n, then column j; plane stride PL, rows Wv
// apart, so a plane is one run of pixel vectors) and uses it from cache: the
// kernel map is never written. The forward aggregates with it as
// aggregate_forward does. The backward recomputes it and, per tile of kFB
// output rows, takes the kernel gradient dW = Corr(grad_y, x) into a buffer
// of the same layout and contracts it at once: grad_S += dW z^T, grad_bias
// += sum dW, grad_z += S^T dW, while grad_x += the scatter of W * grad_y.
// The small matrix products run on register tiles of kMK taps (or z
// channels) by kMP pixel vectors; S and bias are broadcast.

constexpr int64_t kFB = kCRows;  // output rows of a backward tile
constexpr int64_t kMK = 4;       // taps (or z channels) of a product tile
constexpr int64_t kMP = kVecBytes == 64 ? 4 : 2;  // pixel vectors of one
constexpr int64_t kMR = kVecBytes == 64 ? 4 : 2;  // z channels of a grad_S one
constexpr int64_t kFusedTasks = 32;  // backward tasks wanted: strips x batch
constexpr int64_t kMaxSlots = 64;    // grad_S partial sums, at most
constexpr int64_t kMinSlots = 4;     // and at least, where the tasks allow

// out[k][p0 + p] = bias[k] + sum_{r < Cr} S[k][r] * z[r][p0 + p] for k < nk
// (a multiple of kMK) and the NQ pixel vectors from p0.
template <int NQ, typename A, typename vec>
__attribute__((always_inline)) inline void span_block(A* __restrict__ out, int64_t os,
                                                      const A* __restrict__ S, int64_t Cs,
                                                      const A* __restrict__ bias,
                                                      const A* __restrict__ z, int64_t zs,
                                                      int64_t Cr, int64_t nk, int64_t p0) {
  constexpr int64_t V = sizeof(vec) / sizeof(A), VB = sizeof(vec);
  for (int64_t k0 = 0; k0 < nk; k0 += kMK) {
    vec acc[kMK][NQ];
#pragma GCC unroll 4
    for (int k = 0; k < kMK; ++k)
      for (int q = 0; q < NQ; ++q) acc[k][q] = splat<vec>(bias[k0 + k]);
    for (int64_t r = 0; r < Cr; ++r) {
      vec zv[NQ];
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) std::memcpy(&zv[q], z + r * zs + p0 + q * V, VB);
#pragma GCC unroll 4
      for (int k = 0; k < kMK; ++k) {
        const vec sv = splat<vec>(S[(k0 + k) * Cs + r]);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; ++q) acc[k][q] += sv * zv[q];
      }
    }
    for (int k = 0; k < kMK; ++k)
      for (int q = 0; q < NQ; ++q) std::memcpy(out + (k0 + k) * os + p0 + q * V, &acc[k][q], VB);
  }
}

// f.template operator()<NQ>(p0) over the pixels p < np (whole vectors): on
// blocks of NQ = kMP vectors, then on the tail of fewer.
template <typename A, typename vec, typename F>
inline void pixel_blocks(int64_t np, F&& f) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  int64_t p0 = 0;
  for (; p0 + kMP * V <= np; p0 += kMP * V) f.template operator()<kMP>(p0);
  switch ((np - p0) / V) {
    case 3: if constexpr (kMP > 3) f.template operator()<3>(p0); break;
    case 2: if constexpr (kMP > 2) f.template operator()<2>(p0); break;
    case 1: f.template operator()<1>(p0); break;
    default: break;
  }
}

// out[k][p] = bias[k] + sum_{r < Cr} S[k][r] * z[r][p] for k < nk (a
// multiple of kMK) and pixels p < np (whole vectors; a tile's valid rows
// only, not the buffer's padded plane): S rows Cs apart, z rows zs apart,
// out planes os apart.
template <typename A, typename vec>
void span_tile(A* __restrict__ out, int64_t os, const A* __restrict__ S, int64_t Cs,
               const A* __restrict__ bias, const A* __restrict__ z, int64_t zs, int64_t Cr,
               int64_t nk, int64_t np) {
  pixel_blocks<A, vec>(np, [&]<int NQ>(int64_t p0) {
    span_block<NQ, A, vec>(out, os, S, Cs, bias, z, zs, Cr, nk, p0);
  });
}

// gz[r][p0 + p] += sum_{k < nk} S[k][r] * dw[k][p0 + p] for r < Cp (a
// multiple of kMK) and the NQ pixel vectors from p0.
template <int NQ, typename A, typename vec>
__attribute__((always_inline)) inline void span_transpose_block(
    A* __restrict__ gz, int64_t gs, const A* __restrict__ S, int64_t Cs,
    const A* __restrict__ dw, int64_t ds, int64_t Cp, int64_t nk, int64_t p0) {
  constexpr int64_t V = sizeof(vec) / sizeof(A), VB = sizeof(vec);
  for (int64_t r0 = 0; r0 < Cp; r0 += kMK) {
    vec acc[kMK][NQ];
    for (int r = 0; r < kMK; ++r)
      for (int q = 0; q < NQ; ++q) std::memcpy(&acc[r][q], gz + (r0 + r) * gs + p0 + q * V, VB);
    for (int64_t k = 0; k < nk; ++k) {
      vec dv[NQ];
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) std::memcpy(&dv[q], dw + k * ds + p0 + q * V, VB);
#pragma GCC unroll 4
      for (int r = 0; r < kMK; ++r) {
        const vec sv = splat<vec>(S[k * Cs + r0 + r]);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; ++q) acc[r][q] += sv * dv[q];
      }
    }
    for (int r = 0; r < kMK; ++r)
      for (int q = 0; q < NQ; ++q) std::memcpy(gz + (r0 + r) * gs + p0 + q * V, &acc[r][q], VB);
  }
}

// gz[r][p] += sum_{k < nk} S[k][r] * dw[k][p] for r < Cp (a multiple of
// kMK) and p < np (whole vectors): the transpose of span_tile in z.
template <typename A, typename vec>
void span_transpose_tile(A* __restrict__ gz, int64_t gs, const A* __restrict__ S, int64_t Cs,
                         const A* __restrict__ dw, int64_t ds, int64_t Cp, int64_t nk,
                         int64_t np) {
  pixel_blocks<A, vec>(np, [&]<int NQ>(int64_t p0) {
    span_transpose_block<NQ, A, vec>(gz, gs, S, Cs, dw, ds, Cp, nk, p0);
  });
}

// Lane sums: the vector gs[k][r] += dw[k][:] * z[r][:] (k < nk, r < Cp,
// multiples of kMK and kMR) and gb[k] += dw[k][:], over np pixels (whole
// vectors); gs and gb hold a vector per (k, r) and per k.
template <typename A, typename vec>
inline void add_vec(A* dst, const vec& v) {
  vec t;
  std::memcpy(&t, dst, sizeof(vec));
  t += v;
  std::memcpy(dst, &t, sizeof(vec));
}

template <typename A, typename vec>
void weight_grad_tile(A* __restrict__ gs, A* __restrict__ gb, const A* __restrict__ dw,
                      int64_t ds, const A* __restrict__ z, int64_t zs, int64_t Cp, int64_t nk,
                      int64_t np) {
  constexpr int64_t V = sizeof(vec) / sizeof(A), VB = sizeof(vec);
  for (int64_t k0 = 0; k0 < nk; k0 += kMK) {
    for (int64_t r0 = 0; r0 < Cp; r0 += kMR) {
      vec acc[kMK][kMR] = {};
      for (int64_t p = 0; p < np; p += V) {
        vec dv[kMK], zv[kMR];
#pragma GCC unroll 4
        for (int k = 0; k < kMK; ++k) std::memcpy(&dv[k], dw + (k0 + k) * ds + p, VB);
#pragma GCC unroll 4
        for (int r = 0; r < kMR; ++r) std::memcpy(&zv[r], z + (r0 + r) * zs + p, VB);
#pragma GCC unroll 4
        for (int k = 0; k < kMK; ++k)
#pragma GCC unroll 4
          for (int r = 0; r < kMR; ++r) acc[k][r] += dv[k] * zv[r];
      }
      for (int k = 0; k < kMK; ++k)
        for (int r = 0; r < kMR; ++r) add_vec<A, vec>(gs + ((k0 + k) * Cp + r0 + r) * V, acc[k][r]);
    }
    for (int k = 0; k < kMK; ++k) {
      vec sum = {};
      for (int64_t p = 0; p < np; p += V) {
        vec dv;
        std::memcpy(&dv, dw + (k0 + k) * ds + p, VB);
        sum += dv;
      }
      add_vec<A, vec>(gb + (k0 + k) * V, sum);
    }
  }
}

// a[k] += sum_n b[n] * gv[k][n] over the tile rows n of MASK (a bit each),
// for the kCh gradient rows a[k]: the transpose of tile_row (one tap),
// scattering kCh channels' products. The mask known at compile time, no
// row is tested in the loop.
template <int MASK, typename A, typename vec>
__attribute__((always_inline)) inline void scatter_masked(A* const* a, const A* const* b,
                                                          const vec (&gv)[kCh][kFB]) {
  constexpr int64_t VB = sizeof(vec);
  vec wv[kFB] = {};
#pragma GCC unroll 8
  for (int n = 0; n < kFB; ++n)
    if (MASK >> n & 1) std::memcpy(&wv[n], b[n], VB);
#pragma GCC unroll 4
  for (int k = 0; k < kCh; ++k) {
    vec t;
    std::memcpy(&t, a[k], VB);
#pragma GCC unroll 8
    for (int n = 0; n < kFB; ++n)
      if (MASK >> n & 1) t += wv[n] * gv[k][n];
    std::memcpy(a[k], &t, VB);
  }
}

template <typename A, typename vec>
__attribute__((always_inline)) inline void scatter_row(A* const* a, const A* const* b,
                                                       int64_t mask,
                                                       const vec (&gv)[kCh][kFB]) {
  static_assert(kFB <= 4, "a mask of at most 4 rows");
  switch (mask) {
#define MMEVO_SCATTER(M)                                                      \
  case M:                                                                     \
    if constexpr (M < (1 << kFB)) scatter_masked<M, A, vec>(a, b, gv);        \
    break;
    MMEVO_SCATTER(1) MMEVO_SCATTER(2) MMEVO_SCATTER(3) MMEVO_SCATTER(4) MMEVO_SCATTER(5)
    MMEVO_SCATTER(6) MMEVO_SCATTER(7) MMEVO_SCATTER(8) MMEVO_SCATTER(9) MMEVO_SCATTER(10)
    MMEVO_SCATTER(11) MMEVO_SCATTER(12) MMEVO_SCATTER(13) MMEVO_SCATTER(14)
    MMEVO_SCATTER(15)
#undef MMEVO_SCATTER
    default: break;
  }
}

// dW of a backward tile: dw[(u*K + v)*PL + n*Wv + j] = sum_c y[c][n][j] *
// x[c][n*s + u*d][j + voff[v]] for its kFB rows n and Wv columns j, y rows
// Wv and channels ys apart, x rows xr and channels xc apart. Plain values,
// not a lambda's captures: the vector stores (memcpy) may alias anything in
// memory, so captured sizes would be reloaded after each one.
template <typename A, typename vec>
void correlate_block(A* __restrict__ dw, int64_t PL, const A* __restrict__ y, int64_t Wv,
                     int64_t ys, const A* __restrict__ x, int64_t xr, int64_t xc, int64_t Cg,
                     int64_t K, int64_t s, int64_t d, const int64_t* __restrict__ voff) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  const bool unit = s == 1 && d == 1;
  for (int64_t jv = 0; jv < Wv; jv += V)
    for (int64_t v = 0; v < K; ++v)
      for (int64_t u0 = 0; u0 < K; u0 += kUs) {
        const int64_t nu = std::min(kUs, K - u0);
        vec acc[kCRows][kUs] = {};
        const A* xq = x + u0 * d * xr + jv + voff[v];
        const A* yq = y + jv;
#define MMEVO_FUSED_TILE(NU)                                                         \
  (unit ? correlate_tile<A, vec, NU, true>(acc, yq, Wv, ys, xq, xr, xc, Cg, 1, 1) \
        : correlate_tile<A, vec, NU, false>(acc, yq, Wv, ys, xq, xr, xc, Cg, s, d))
        switch (nu) {
          case 4: MMEVO_FUSED_TILE(4); break;
          case 3: MMEVO_FUSED_TILE(3); break;
          case 2: MMEVO_FUSED_TILE(2); break;
          default: MMEVO_FUSED_TILE(1);
        }
#undef MMEVO_FUSED_TILE
        A* out = dw + (u0 * K + v) * PL + jv;
        for (int64_t m = 0; m < nu; ++m, out += K * PL)
#pragma GCC unroll 4
          for (int n = 0; n < kFB; ++n) std::memcpy(out + n * Wv, &acc[n][m], sizeof(vec));
      }
}

// grad_x of a backward tile, tap column by tap column: gx[c][rr][j +
// voff[v]] += sum_n w[wrow[rr][n] + v*PL][j] * y[c][n][j] over the rows n
// of mask[rr], for the buffered input rows rr in [rlo, rhi) (rows Lrow and
// channels gc apart in gx). A gradient row is read again only after many
// other stores (an overlapping store just before stalls the load).
template <typename A, typename vec>
void scatter_block(A* __restrict__ gx, int64_t gc, int64_t Lrow, const A* __restrict__ w,
                   int64_t PL, const A* __restrict__ y, int64_t Wv, int64_t ys, int64_t Cg,
                   int64_t K, const int64_t* __restrict__ voff, const int64_t* __restrict__ wrow,
                   const int64_t* __restrict__ mask, int64_t rlo, int64_t rhi) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  for (int64_t v = 0; v < K; ++v)
    for (int64_t jv = 0; jv < Wv; jv += V)
      for (int64_t c4 = 0; c4 < Cg; c4 += kCh) {
        vec gv[kCh][kFB];
        for (int k = 0; k < kCh; ++k)
          for (int n = 0; n < kFB; ++n)
            std::memcpy(&gv[k][n], y + (c4 + k) * ys + n * Wv + jv, sizeof(vec));
        const A* wv = w + v * PL + jv;
        A* g0 = gx + c4 * gc + jv + voff[v];
        for (int64_t rr = rlo; rr < rhi; ++rr) {
          A* a[kCh];
          const A* wr[kFB];
          for (int k = 0; k < kCh; ++k) a[k] = g0 + k * gc + rr * Lrow;
          for (int n = 0; n < kFB; ++n) wr[n] = wv + wrow[rr * kFB + n];
          scatter_row<A, vec>(a, wr, mask[rr], gv);
        }
      }
}

// dst[j] += src[j], j < n.
template <typename A>
inline void add_row(A* __restrict__ dst, const A* __restrict__ src, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
}

// S (and bias, zeros if null) of every group in A, each group's K*K tap rows
// padded to KKp and its Cr columns to Cp with zeros: sa[(grp*KKp + k)*Cp + r].
template <typename T, typename A>
void load_span(std::vector<A>& sa, std::vector<A>& ba, const T* S, const T* bias, int64_t G,
               int64_t KK, int64_t KKp, int64_t Cr, int64_t Cp) {
  sa.assign(G * KKp * Cp, A(0));
  ba.assign(G * KKp, A(0));
  for (int64_t grp = 0; grp < G; ++grp)
    for (int64_t k = 0; k < KK; ++k) {
      for (int64_t r = 0; r < Cr; ++r)
        sa[(grp * KKp + k) * Cp + r] = static_cast<A>(S[(grp * KK + k) * Cr + r]);
      if (bias) ba[grp * KKp + k] = static_cast<A>(bias[grp * KK + k]);
    }
}

// Rows [i0, i0 + ni) of z into zb (row n of channel r at r*zs + n*Wv), zero
// past Wo; rows ni.. of the buffer stay as they are (zero from the start).
template <typename T, typename A>
void load_z_rows(A* zb, int64_t zs, const T* z, int64_t Cr, int64_t Ho, int64_t Wo,
                 int64_t Wv, int64_t i0, int64_t ni, int64_t nrows) {
  for (int64_t r = 0; r < Cr; ++r)
    for (int64_t n = 0; n < nrows; ++n) {
      A* dst = zb + r * zs + n * Wv;
      if (n < ni) load_shifted(dst, z + (r * Ho + i0 + n) * Wo, Wo, 0, Wv);
      else std::fill(dst, dst + Wv, A(0));
    }
}

// Y = the involution of x with the kernel S z + bias, never written. Task:
// (b, a tile of <= kRows output rows, g), every channel of the group in
// blocks of <= 16: the tile's kernel is computed once, then
// aggregate_forward's loop runs on it.
template <typename T>
void fused_forward(const T* __restrict__ x, const T* __restrict__ z, const T* __restrict__ S,
                   const T* __restrict__ bias, T* __restrict__ y, const Geometry& g,
                   int64_t Cr) {
  using A = at::opmath_type<T>;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = g.C / g.G, CB = std::min(Cg, kTileChannels);
  const int64_t nCB = ceil_div(Cg, CB), nIB = ceil_div(g.Ho, kRows);
  const int64_t span = (g.K - 1) * g.d, R = (kRows - 1) * g.s + span + 1;
  const int64_t Wv = round_up(g.Wo, V), L = Wv + span / g.s, Lrow = g.s * L;
  const int64_t KK = g.K * g.K, KKp = round_up(KK, kMK), PL = round_up(kRows * Wv, kMP * V);
  const RowPhases phases(g.s, g.p, g.W, L);
  std::vector<A> sa, ba;
  load_span(sa, ba, S, bias, g.G, KK, KKp, Cr, Cr);
  std::vector<int64_t> aoff(g.K), boff(g.K);
  for (int64_t v = 0; v < g.K; ++v) aoff[v] = phases.offset(v, g.d), boff[v] = v * PL;
  const int64_t grain = grain_for(kRows * KK * g.Wo * (Cg + Cr));
  at::parallel_for(0, g.B * g.G * nIB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> xb(round_up(CB, kCh) * R * Lrow), zb(Cr * PL, A(0)), wb(KKp * PL);
    std::vector<int64_t> u_of(R * kRows);
    int64_t taps_rows = 0;  // the tile height u_of was made for
    int64_t z_tile = -1;    // the (b, row tile) whose z rows zb holds
    for (int64_t t = begin; t < end; ++t) {
      // Groups fastest: a run of tasks shares its z rows, loaded once.
      // Tiles of as even heights as nIB allows (at most kRows): with the
      // groups fastest, a thread's share is whole tiles of every group,
      // and 6 + 6 + 2 rows (14²) would leave one thread 2/3 of them.
      const int64_t grp = t % g.G, bi = t / g.G, ib = bi % nIB, b = bi / nIB;
      const int64_t i0 = ib * g.Ho / nIB, ni = (ib + 1) * g.Ho / nIB - i0;
      if (bi != z_tile)
        load_z_rows(zb.data(), PL, z + b * Cr * g.Ho * g.Wo, Cr, g.Ho, g.Wo, Wv, i0, ni, kRows);
      z_tile = bi;
      span_tile<A, vec>(wb.data(), PL, sa.data() + grp * KKp * Cr, Cr, ba.data() + grp * KKp,
                        zb.data(), PL, Cr, KKp, ni * Wv);
      const int64_t r0 = i0 * g.s - g.p;
      const int64_t rlo = std::max<int64_t>(0, -r0);
      const int64_t rhi = std::min((ni - 1) * g.s + span + 1, g.H - r0);
      if (ni != taps_rows) tile_taps(u_of.data(), R, taps_rows = ni, span, g.d, 0, -g.s, -1);
      for (int64_t cb = 0; cb < nCB; ++cb) {
        const int64_t c0 = grp * Cg + cb * CB, nc = std::min(CB, Cg - cb * CB);
        for (int64_t cc = 0; cc < nc; ++cc)
          for (int64_t rr = rlo; rr < rhi; ++rr)
            phases.load(xb.data() + (cc * R + rr) * Lrow,
                        x + ((b * g.C + c0 + cc) * g.H + r0 + rr) * g.W);
        for (int64_t jv = 0; jv < Wv; jv += V) {
          const int64_t nj = std::min(V, g.Wo - jv);
          for (int64_t c4 = 0; c4 < nc; c4 += kCh) {
            vec acc[kCh][kRows] = {};
            tile_rows<A, vec>(acc, xb.data() + c4 * R * Lrow + jv, R * Lrow, Lrow,
                              wb.data() + jv, Wv, g.K * PL, u_of.data(), rlo, rhi, aoff.data(),
                              boff.data(), g.K);
            for (int64_t k = 0; k < std::min(kCh, nc - c4); ++k)
              for (int64_t n = 0; n < ni; ++n)
                store_lanes<T, A>(y + ((b * g.C + c0 + c4 + k) * g.Ho + i0 + n) * g.Wo + jv,
                                  acc[k][n], nj);
          }
        }
      }
    }
  });
}

// wb[p * Np + k0 + n * V + l] = bv[k] + sum_r St[r * Np + k] * z[r * zs1 +
// p * zs3] (k = k0 + n * V + l) for the NP pixels p and NK tap vectors n.
template <int NP, int NK, typename T, typename A, typename vec>
__attribute__((always_inline)) inline void span_pixel_block(
    A* __restrict__ wb, int64_t Np, const A* __restrict__ St, const A* __restrict__ bv,
    const T* __restrict__ z, int64_t zs1, int64_t zs3, int64_t Cr, int64_t k0) {
  constexpr int64_t V = sizeof(vec) / sizeof(A), VB = sizeof(vec);
  vec acc[NP][NK];
#pragma GCC unroll 4
  for (int n = 0; n < NK; ++n) {
    vec b;
    std::memcpy(&b, bv + k0 + n * V, VB);
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[p][n] = b;
  }
  for (int64_t r = 0; r < Cr; ++r) {
    vec sv[NK];
#pragma GCC unroll 4
    for (int n = 0; n < NK; ++n) std::memcpy(&sv[n], St + r * Np + k0 + n * V, VB);
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const vec zv = splat<vec>(static_cast<A>(z[r * zs1 + p * zs3]));
#pragma GCC unroll 4
      for (int n = 0; n < NK; ++n) acc[p][n] += zv * sv[n];
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int n = 0; n < NK; ++n) std::memcpy(wb + p * Np + k0 + n * V, &acc[p][n], VB);
}

// span_pixel_block over the nj pixels (4 at a time, then one by one), for
// the NK tap vectors from k0.
template <int NK, typename T, typename A, typename vec>
void span_pixel_taps(A* wb, int64_t Np, const A* St, const A* bv, const T* z, int64_t zs1,
                     int64_t zs3, int64_t Cr, int64_t nj, int64_t k0) {
  int64_t j = 0;
  for (; j + 4 <= nj; j += 4)
    span_pixel_block<4, NK, T, A, vec>(wb + j * Np, Np, St, bv, z + j * zs3, zs1, zs3, Cr, k0);
  for (; j < nj; ++j)
    span_pixel_block<1, NK, T, A, vec>(wb + j * Np, Np, St, bv, z + j * zs3, zs1, zs3, Cr, k0);
}

// The kernels of nj pixels of an output row, in the accumulation type:
// wb[j * Np + k] = bias[k] + sum_r S[k][r] * z[r][j] for the G*K*K taps k
// (St: S transposed, (Cr, Np), zero past G*K*K; bv the bias likewise), z of
// any strides zs (its row's first pixel). Register tiles of 4 pixels x
// kMK tap vectors, a z value broadcast per pixel; the taps outer, so that
// a block's columns of St (Cr x kMK vectors) stay in L1 while the pixels
// pass (all of St is 800 KiB at RedNet-50's stage 4).
template <typename T, typename A, typename vec>
void span_pixels(A* wb, int64_t Np, const A* St, const A* bv, const T* z, const int64_t* zs,
                 int64_t Cr, int64_t nj) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  for (int64_t k0 = 0; k0 < Np; k0 += kMK * V) {
    switch (std::min<int64_t>(kMK, (Np - k0) / V)) {
      case 4: span_pixel_taps<4, T, A, vec>(wb, Np, St, bv, z, zs[1], zs[3], Cr, nj, k0); break;
      case 3: span_pixel_taps<3, T, A, vec>(wb, Np, St, bv, z, zs[1], zs[3], Cr, nj, k0); break;
      case 2: span_pixel_taps<2, T, A, vec>(wb, Np, St, bv, z, zs[1], zs[3], Cr, nj, k0); break;
      default: span_pixel_taps<1, T, A, vec>(wb, Np, St, bv, z, zs[1], zs[3], Cr, nj, k0);
    }
  }
}

// Y = the involution of x with the kernel S z + bias, channels-last: x (B,
// H, W, C) and y (B, Ho, Wo, C) dense, z of any strides zs (B, Cr, Ho, Wo).
// Task: one output row, in blocks of columns whose kernels (all G*K*K taps
// of a pixel, contiguous) fit a small buffer; aggregate_forward_nhwc's row
// loop aggregates them from there. The kernel is never written to memory.
template <typename T>
void fused_forward_nhwc(const T* __restrict__ x, const T* __restrict__ z, const int64_t* zs,
                        const T* __restrict__ S, const T* __restrict__ bias,
                        T* __restrict__ y, const Geometry& g, int64_t Cr) {
  using A = at::opmath_type<T>;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t KK = g.K * g.K, GKK = g.G * KK, Np = round_up(GKK, V);
  std::vector<A> St(Cr * Np, A(0)), bv(Np, A(0));
  for (int64_t k = 0; k < GKK; ++k) {
    for (int64_t r = 0; r < Cr; ++r) St[r * Np + k] = static_cast<A>(S[k * Cr + r]);
    if (bias) bv[k] = static_cast<A>(bias[k]);
  }
  // Columns of a block: their kernels in about 32 KiB (L1), 4 at least.
  const int64_t cols =
      std::min(g.Wo, round_up(std::max<int64_t>(1, 8192 / Np), 4));
  // The kernel's strides in the buffer, as aggregate_forward_nhwc takes them.
  const int64_t ws[6] = {0, KK, g.K, 1, 0, Np};
  const int64_t grain = grain_for(g.Wo * KK * (g.C + g.G * Cr));
  at::parallel_for(0, g.B * g.Ho, grain, [&](int64_t begin, int64_t end) {
    NhwcRows<T> rows(g, ws);
    std::vector<A> wb(cols * Np);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / g.Ho, i = t % g.Ho;
      for (int64_t j0 = 0; j0 < g.Wo; j0 += cols) {
        const int64_t nj = std::min(cols, g.Wo - j0);
        span_pixels<T, A, vec>(wb.data(), Np, St.data(), bv.data(),
                               z + b * zs[0] + i * zs[2] + j0 * zs[3], zs, Cr, nj);
        rows.row(x, wb.data(), y, b, i, j0, j0 + nj);
      }
    }
  });
}

// How the backward splits its work, from the shapes alone (so the sums, and
// their bits, do not depend on the thread count): each image's output rows
// in `nstrips` strips of `rows` (a multiple of kFB, and tall enough that an
// input row is reached from two strips at most), the b-major list of
// (b, strip) tasks cut into `nslots` runs, each summing its own grad_S:
// at most kMaxSlots, their partial sums no larger than x unless that leaves
// fewer than kMinSlots runs, and a power of two. A run is one thread's
// (1 or 3 runs left the backward at RedNet-50's 7² and 14² serial or 2:1
// between two threads), and 2, 4, 8 ... threads get equal shares.
struct FusedPlan {
  int64_t rows, nstrips, nslots;

  FusedPlan(const Geometry& g, int64_t Cr) {
    const int64_t span = (g.K - 1) * g.d;
    const int64_t wanted = ceil_div(g.Ho, ceil_div(kFusedTasks, g.B));
    rows = round_up(std::max({wanted, ceil_div(span + 1, g.s), kFB}), kFB);
    nstrips = ceil_div(g.Ho, rows);
    const int64_t partial = g.G * g.K * g.K * (Cr + 1);
    const int64_t fit = g.B * g.C * g.H * g.W / partial;
    nslots = std::min({g.B * nstrips, kMaxSlots, std::max(fit, kMinSlots)});
    while (nslots & (nslots - 1)) nslots &= nslots - 1;  // the power of two below
  }
};

// A strip's gradient row src (the phase layout of RowPhases) into the input
// row dst: added (a row another strip also reaches) or stored. Stored rows
// get zeros at columns no tap reaches (`uncovered`: very large strides).
template <typename A>
inline void flush_row(A* __restrict__ dst, const A* __restrict__ src, const RowPhases& ph,
                      int64_t W, bool add, bool uncovered) {
  if (!add && uncovered) std::fill(dst, dst + W, A(0));
  dst -= ph.p;
  for (int64_t q = 0; q < ph.s; ++q, src += ph.L) {
    const int64_t lo = ph.lo[q], hi = ph.hi[q];
    A* d = dst + q;
    if (ph.s == 1) {
      if (add) for (int64_t m = lo; m < hi; ++m) d[m] += src[m];
      else for (int64_t m = lo; m < hi; ++m) d[m] = src[m];
    } else if (add) {
      for (int64_t m = lo; m < hi; ++m) d[m * ph.s] += src[m];
    } else {
      for (int64_t m = lo; m < hi; ++m) d[m * ph.s] = src[m];
    }
  }
}

// The backward, see the top of the file. gx (B, C, H, W) in A receives
// grad_x (no need to zero it); gz (B, Cr, Ho, Wo) grad_z; partial (nslots,
// G*K*K * Cr + G*K*K) in A, zero on entry, each run's sums of grad_S then
// grad_bias. A task (b, strip) buffers the strip's z rows once, and per
// group its x and grad_y rows and its input rows' gradients, then walks its
// tiles. The even strips write their rows first, the odd ones then add
// where they share rows with them (strips two apart share none) and store
// elsewhere; rows no strip reaches are zeroed by the strip above them.
template <typename T>
void fused_backward(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ z,
                    const T* __restrict__ S, const T* __restrict__ bias,
                    at::opmath_type<T>* __restrict__ gx, T* __restrict__ gz,
                    at::opmath_type<T>* __restrict__ partial, const Geometry& g, int64_t Cr,
                    const FusedPlan& plan) {
  using A = at::opmath_type<T>;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Cg = g.C / g.G, Cg4 = round_up(Cg, kCh), SR = plan.rows;
  const int64_t span = (g.K - 1) * g.d, R = (kFB - 1) * g.s + span + 1;
  const int64_t Wv = round_up(g.Wo, V), L = Wv + span / g.s, Lrow = g.s * L;
  const int64_t KK = g.K * g.K, KKp = round_up(KK, kMK), Cp = round_up(Cr, kMK);
  const int64_t PL = round_up(kFB * Wv, kMP * V), P = g.Ho * g.Wo;
  const int64_t XR = (SR - 1) * g.s + span + 1;  // input rows of a strip
  const int64_t GZ = SR * Wv + PL;               // a z row of a strip, padded
  const int64_t ntasks = g.B * plan.nstrips, part = g.G * KK * (Cr + 1);
  const RowPhases phases(g.s, g.p, g.W, L);
  bool uncovered = false;  // input columns that no tap reaches
  for (int64_t q = 0; q < g.s; ++q)
    uncovered |= phases.hi[q] < std::max<int64_t>(0, ceil_div(g.W + g.p - q, g.s));
  std::vector<A> sa, ba;
  load_span(sa, ba, S, bias, g.G, KK, KKp, Cr, Cp);
  std::vector<int64_t> voff(g.K);
  for (int64_t v = 0; v < g.K; ++v) voff[v] = phases.offset(v, g.d);

  struct Buffers {
    std::vector<A> xs, ys, zs, wb, dwb, gxs, gzs, gsv, gbv;
    std::vector<int64_t> u_of, mask, wrow;
  };
  const auto strip = [&](int64_t b, int64_t st, A* sums, Buffers& buf) {
    const int64_t i_a = st * SR, i_b = std::min(g.Ho, i_a + SR), nrows = i_b - i_a;
    const int64_t h_a = i_a * g.s - g.p;  // the input row of buffer row 0
    const int64_t reach = (nrows - 1) * g.s + span + 1;  // buffer rows in use
    A* const zs = buf.zs.data();
    load_z_rows(zs, GZ, z + b * Cr * P, Cr, g.Ho, g.Wo, Wv, i_a, nrows, SR);
    std::fill(buf.gzs.begin(), buf.gzs.end(), A(0));
    for (int64_t grp = 0; grp < g.G; ++grp) {
      const A* sg = sa.data() + grp * KKp * Cp;
      const int64_t c0 = grp * Cg;
      for (int64_t c = 0; c < Cg; ++c) {
        const int64_t ch = b * g.C + c0 + c;
        for (int64_t n = 0; n < SR; ++n) {
          A* dst = buf.ys.data() + (c * SR + n) * Wv;
          if (n < nrows) load_shifted(dst, gy + (ch * g.Ho + i_a + n) * g.Wo, g.Wo, 0, Wv);
          else std::fill(dst, dst + Wv, A(0));
        }
        for (int64_t rr = 0; rr < XR; ++rr) {
          A* dst = buf.xs.data() + (c * XR + rr) * Lrow;
          const int64_t h = h_a + rr;
          if (rr >= reach || h < 0 || h >= g.H) std::fill(dst, dst + Lrow, A(0));
          else phases.load(dst, x + (ch * g.H + h) * g.W);
        }
      }
      std::fill(buf.gxs.begin(), buf.gxs.end(), A(0));
      std::fill(buf.gsv.begin(), buf.gsv.end(), A(0));
      std::fill(buf.gbv.begin(), buf.gbv.end(), A(0));
      for (int64_t i0 = i_a; i0 < i_b; i0 += kFB) {
        const int64_t ni = std::min(kFB, i_b - i0), off = i0 - i_a;
        const A* zt = zs + off * Wv;
        // The tile's rows only: rows past the strip have no gradient.
        const int64_t np = ni * Wv;
        span_tile<A, vec>(buf.wb.data(), PL, sg, Cp, ba.data() + grp * KKp, zt, GZ, Cr, KKp, np);
        // dW of the tile's kFB rows (zero on rows past the strip, whose
        // grad_y is zero), every tap summed over the group's channels.
        const A* xt = buf.xs.data() + off * g.s * Lrow;
        const A* yt = buf.ys.data() + off * Wv;
        correlate_block<A, vec>(buf.dwb.data(), PL, yt, Wv, SR * Wv, xt, Lrow, XR * Lrow, Cg, g.K,
                                g.s, g.d, voff.data());
        weight_grad_tile<A, vec>(buf.gsv.data(), buf.gbv.data(), buf.dwb.data(), PL, zt, GZ, Cp,
                                 KKp, np);
        span_transpose_tile<A, vec>(buf.gzs.data() + off * Wv, GZ, sg, Cp, buf.dwb.data(), PL,
                                    Cp, KKp, np);
        // grad_x: each buffered row's kernel rows (any row where the mask
        // has no bit), then the scatter.
        const int64_t r0 = i0 * g.s - g.p, nr = (ni - 1) * g.s + span + 1;
        const int64_t rlo = std::max<int64_t>(0, -r0), rhi = std::min(nr, g.H - r0);
        int64_t* const u_of = buf.u_of.data();
        tile_taps(u_of, R, ni, span, g.d, 0, -g.s, -1);
        for (int64_t rr = rlo; rr < rhi; ++rr) {
          buf.mask[rr] = 0;
          for (int64_t n = 0; n < kFB; ++n) {
            const int64_t u = u_of[rr * kRows + n];
            buf.mask[rr] |= int64_t(u >= 0) << n;
            buf.wrow[rr * kFB + n] = std::max<int64_t>(0, u) * g.K * PL + n * Wv;
          }
        }
        scatter_block<A, vec>(buf.gxs.data() + off * g.s * Lrow, XR * Lrow, Lrow, buf.wb.data(),
                              PL, yt, Wv, SR * Wv, Cg, g.K, voff.data(), buf.wrow.data(),
                              buf.mask.data(), rlo, rhi);
      }
      for (int64_t k = 0; k < KK; ++k) {
        A* srow = sums + (grp * KK + k) * Cr;
        for (int64_t r = 0; r < Cr; ++r)
          for (int64_t l = 0; l < V; ++l) srow[r] += buf.gsv[(k * Cp + r) * V + l];
        for (int64_t l = 0; l < V; ++l) sums[g.G * KK * Cr + grp * KK + k] += buf.gbv[k * V + l];
      }
      // The strip's input rows; an odd strip shares its first span + 1 - s
      // rows with the strip before and those from h_a + SR * s on with the
      // one after (even strips, which wrote first).
      const bool odd = st % 2, last = st + 1 == plan.nstrips;
      const int64_t next = last ? g.H : std::min(g.H, h_a + SR * g.s);
      for (int64_t c = 0; c < Cg; ++c) {
        A* plane = gx + (b * g.C + c0 + c) * g.H * g.W;
        for (int64_t rr = std::max<int64_t>(0, -h_a); rr < reach && h_a + rr < g.H; ++rr) {
          const bool add = odd && (rr < span + 1 - g.s || (!last && rr >= SR * g.s));
          flush_row(plane + (h_a + rr) * g.W, buf.gxs.data() + (c * XR + rr) * Lrow, phases, g.W,
                    add, uncovered);
        }
        // Rows between this strip's reach and the next strip's first row.
        const int64_t gap = std::max<int64_t>(0, h_a + reach);
        if (gap < next) std::fill(plane + gap * g.W, plane + next * g.W, A(0));
      }
    }
    for (int64_t r = 0; r < Cr; ++r)
      for (int64_t n = 0; n < nrows; ++n)
        for (int64_t j = 0; j < g.Wo; ++j)
          gz[((b * Cr + r) * g.Ho + i_a + n) * g.Wo + j] =
              static_cast<T>(buf.gzs[r * GZ + n * Wv + j]);
  };

  for (int64_t parity = 0; parity < 2; ++parity)
    at::parallel_for(0, plan.nslots, 1, [&](int64_t begin, int64_t end) {
      Buffers buf{std::vector<A>(Cg * XR * Lrow), std::vector<A>(Cg4 * SR * Wv, A(0)),
                  std::vector<A>(Cp * GZ, A(0)), std::vector<A>(KKp * PL),
                  std::vector<A>(KKp * PL, A(0)), std::vector<A>(Cg4 * XR * Lrow),
                  std::vector<A>(Cp * GZ), std::vector<A>(KKp * Cp * V), std::vector<A>(KKp * V),
                  std::vector<int64_t>(R * kRows), std::vector<int64_t>(R),
                  std::vector<int64_t>(R * kFB)};
      for (int64_t slot = begin; slot < end; ++slot)
        for (int64_t t = slot * ntasks / plan.nslots; t < (slot + 1) * ntasks / plan.nslots; ++t)
          if (t % plan.nstrips % 2 == parity)
            strip(t / plan.nstrips, t % plan.nstrips, partial + slot * part, buf);
    });
}
