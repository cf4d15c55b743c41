// The three window primitives of the evolution ops, for one instruction set.
//
// Included several times by evolution.cpp, each time inside its own namespace
// under a different `#pragma GCC target`, so one portable binary runs the
// widest vector loops the CPU has. No #include here on purpose: headers must
// not be compiled for the target.
//
// Layouts (all contiguous, NCHW): x (B, C, H, W); w (B, G, K, K, Ho, Wo);
// y / grad_y / query (B, C, Ho, Wo). Zero padding only: reflect padding is
// turned into an explicit padded input before the kernels run.
//
// kVecBytes (the vector width) is defined by the includer for each target.
//
// Scheme: each task owns whole output rows (deterministic, no atomics, any
// thread count gives the same bits). It first copies the input rows it needs
// into zero-padded, stride-deinterleaved buffers in the accumulation type, so
// that every window tap becomes a contiguous, always-valid slice; the hot loop
// (tap_dot) then runs over the contiguous column axis, keeps the sums over the
// taps in registers and shares each loaded operand between up to four
// outputs (channels sharing a kernel row, or taps sharing a query row).

// One block of tap_dot: NK outputs x NV vectors of columns. Each a[t] vector
// is loaded once for the NK outputs, and NK x NV (x 2 tap parities when NK is
// 1) independent accumulator chains hide the FMA latency. GCC vector
// extensions compile to the widest registers of the namespace's target.
template <typename A, int NV, int NK, int VB = kVecBytes>
inline void tap_block(A* out, int64_t os, int64_t j, const A* const* a,
                      const A* const* b, const int64_t* koff, int64_t nt,
                      bool accumulate) {
  constexpr int64_t V = VB / sizeof(A);
  constexpr int NP = NK == 1 ? 2 : 1;
  typedef A vec __attribute__((vector_size(VB)));
  vec s[NP][NK][NV];
  for (int q = 0; q < NP; ++q)
    for (int k = 0; k < NK; ++k)
      for (int v = 0; v < NV; ++v) {
        if (accumulate && q == 0) std::memcpy(&s[q][k][v], out + k * os + j + v * V, VB);
        else s[q][k][v] = vec{};
      }
  int64_t off[NK];
  for (int k = 0; k < NK; ++k) off[k] = koff[k] + j;
  int64_t t = 0;
  for (; t + NP <= nt; t += NP)
    for (int q = 0; q < NP; ++q) {
      const A* pa = a[t + q] + j;
      const A* pb = b[t + q];
      for (int v = 0; v < NV; ++v) {
        vec x;
        std::memcpy(&x, pa + v * V, VB);
        for (int k = 0; k < NK; ++k) {
          vec y;
          std::memcpy(&y, pb + off[k] + v * V, VB);
          s[q][k][v] += x * y;
        }
      }
    }
  for (; t < nt; ++t)
    for (int v = 0; v < NV; ++v) {
      vec x;
      std::memcpy(&x, a[t] + j + v * V, VB);
      for (int k = 0; k < NK; ++k) {
        vec y;
        std::memcpy(&y, b[t] + off[k] + v * V, VB);
        s[0][k][v] += x * y;
      }
    }
  for (int k = 0; k < NK; ++k)
    for (int v = 0; v < NV; ++v) {
      vec r = s[0][k][v];
      if (NP == 2) r += s[NP - 1][k][v];
      std::memcpy(out + k * os + j + v * V, &r, VB);
    }
}

template <typename A, int NK>
inline void tap_rows(A* out, int64_t os, int64_t n, const A* const* a,
                     const A* const* b, const int64_t* koff, int64_t nt,
                     bool accumulate) {
  constexpr int64_t V = kVecBytes / sizeof(A);
  for (int64_t j = 0; j < n; j += 4 * V) {
    if (kVecBytes >= 32 && n - j <= V / 2) {  // short rows: half-width vectors
      tap_block<A, 1, NK, kVecBytes / 2>(out, os, j, a, b, koff, nt, accumulate);
      break;
    }
    switch (std::min<int64_t>(4, (n - j + V - 1) / V)) {
      case 4: tap_block<A, 4, NK>(out, os, j, a, b, koff, nt, accumulate); break;
      case 3: tap_block<A, 3, NK>(out, os, j, a, b, koff, nt, accumulate); break;
      case 2: tap_block<A, 2, NK>(out, os, j, a, b, koff, nt, accumulate); break;
      default: tap_block<A, 1, NK>(out, os, j, a, b, koff, nt, accumulate);
    }
  }
}

// out[k*os + j] (+)= sum_t a[t][j] * b[t][koff[k] + j] for k < nk, j < n:
// the only hot loop (nk outputs sharing the a operand: channels sharing a
// kernel row, or taps sharing a query row). It works in whole vectors, so it
// reads and writes up to 16 elements past n: every buffer it touches has
// kSlack spare elements (zero-initialised), and os leaves room for the overhang.
template <typename A>
inline void tap_dot(A* out, int64_t os, int64_t nk, int64_t n, const A* const* a,
                    const A* const* b, const int64_t* koff, int64_t nt,
                    bool accumulate) {
  int64_t k = 0;
  for (; k + 4 <= nk; k += 4)
    tap_rows<A, 4>(out + k * os, os, n, a, b, koff + k, nt, accumulate);
  switch (nk - k) {
    case 3: tap_rows<A, 3>(out + k * os, os, n, a, b, koff + k, nt, accumulate); break;
    case 2: tap_rows<A, 2>(out + k * os, os, n, a, b, koff + k, nt, accumulate); break;
    case 1: tap_rows<A, 1>(out + k * os, os, n, a, b, koff + k, nt, accumulate); break;
    default: break;
  }
}

// Row stride of tap_dot outputs: whole vectors of the widest target.
inline int64_t padded_row(int64_t n) { return (n + 15) / 16 * 16; }

// Ask for the n elements at p ahead of use: the kernel rows of one task lie
// in K*K different planes, more streams than the hardware prefetcher follows,
// so each task prefetches the rows the next task (next output row) reads.
template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t k = 0; k < n * static_cast<int64_t>(sizeof(T)); k += 64) __builtin_prefetch(c + k);
}

// Copy x[row, m*s + ph - p] for m < L into dst[ph*L + m] (zero outside the
// map): the window taps of one input row, split by stride phase.
template <typename T, typename A>
inline void load_phases(A* __restrict__ dst, const T* __restrict__ xrow, int64_t W,
                        int64_t L, int64_t s, int64_t p) {
  for (int64_t ph = 0; ph < s; ++ph) {
    A* d = dst + ph * L;
    const int64_t lo = std::min(L, std::max<int64_t>(0, ceil_div(p - ph, s)));
    const int64_t hi = std::max(lo, std::min(L, ceil_div(W + p - ph, s)));
    const T* src = xrow + lo * s + ph - p;
    std::fill(d, d + lo, A(0));
    if (s == 1) {
      for (int64_t m = 0; m < hi - lo; ++m) d[lo + m] = static_cast<A>(src[m]);
    } else {
      for (int64_t m = 0; m < hi - lo; ++m) d[lo + m] = static_cast<A>(src[m * s]);
    }
    std::fill(d + hi, d + L, A(0));
  }
}

// Y[b, c, i, :] = sum_{u, v} w[b, g, u, v, i, :] * x[b, c, i*s-p+u*d, :*s-p+v*d].
template <typename T>
void aggregate_forward(const T* __restrict__ x, const T* __restrict__ w,
                       T* __restrict__ y, const Geometry& g) {
  using A = typename Acc<T>::type;
  const int64_t Cg = g.C / g.G, CB = std::min<int64_t>(Cg, kChannelBlock);
  const int64_t nCB = (Cg + CB - 1) / CB, KK = g.K * g.K;
  const int64_t L = g.Wo + (g.K - 1) * g.d / g.s;  // phase length of a row
  const int64_t rowbuf = g.s * L;                    // one input row, all phases
  const T* w_end = w + g.B * g.G * g.K * g.K * g.Ho * g.Wo;
  const int64_t grain = grain_for(CB * KK * g.Wo);
  at::parallel_for(0, g.B * g.G * nCB * g.Ho, grain, [&](int64_t begin, int64_t end) {
    const int64_t Wp = padded_row(g.Wo);
    std::vector<A> xb(CB * g.K * rowbuf + kSlack), wb(KK * g.Wo + kSlack), yb(CB * Wp + kSlack);
    std::vector<const A*> ta(KK), tb(KK);
    std::vector<int64_t> koff(CB);
    for (int64_t cc = 0; cc < CB; ++cc) koff[cc] = cc * g.K * rowbuf;  // channel stride in xb
    std::vector<int64_t> toff(KK);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t % g.Ho, cb = (t / g.Ho) % nCB, grp = (t / g.Ho / nCB) % g.G;
      const int64_t b = t / g.Ho / nCB / g.G;
      const int64_t c0 = grp * Cg + cb * CB, nc = std::min(CB, Cg - cb * CB);
      // Taps whose row is inside the map; the others only meet zero padding.
      int64_t nt = 0;
      const int64_t next_row = (i + 1) * g.s - g.p + (g.K - 1) * g.d;
      if (i + 1 < g.Ho && next_row >= 0 && next_row < g.H)
        for (int64_t cc = 0; cc < nc; ++cc)
          prefetch_row(x + ((b * g.C + c0 + cc) * g.H + next_row) * g.W, g.W);
      for (int64_t u = 0; u < g.K; ++u) {
        const int64_t row = i * g.s - g.p + u * g.d;
        if (row < 0 || row >= g.H) continue;
        for (int64_t cc = 0; cc < nc; ++cc)
          load_phases(xb.data() + (cc * g.K + u) * rowbuf,
                      x + ((b * g.C + c0 + cc) * g.H + row) * g.W, g.W, L, g.s, g.p);
        for (int64_t v = 0; v < g.K; ++v, ++nt) {
          const T* wr = w + ((((b * g.G + grp) * g.K + u) * g.K + v) * g.Ho + i) * g.Wo;
          if (i + 1 < g.Ho) prefetch_row(wr + g.Wo, g.Wo);
          if constexpr (std::is_same_v<T, A>) {
            // Read the kernel in place unless tap_dot's overhang leaves the tensor.
            if (wr + g.Wo + kSlack <= w_end) {
              ta[nt] = wr;
              toff[nt] = u * rowbuf + (v * g.d) % g.s * L + (v * g.d) / g.s;
              continue;
            }
          }
          A* wd = wb.data() + (u * g.K + v) * g.Wo;
          for (int64_t j = 0; j < g.Wo; ++j) wd[j] = static_cast<A>(wr[j]);
          ta[nt] = wd;
          toff[nt] = u * rowbuf + (v * g.d) % g.s * L + (v * g.d) / g.s;
        }
      }
      for (int64_t k = 0; k < nt; ++k) tb[k] = xb.data() + toff[k];
      tap_dot(yb.data(), Wp, nc, g.Wo, ta.data(), tb.data(), koff.data(), nt, false);
      for (int64_t cc = 0; cc < nc; ++cc) {
        T* yr = y + ((b * g.C + c0 + cc) * g.Ho + i) * g.Wo;
        for (int64_t j = 0; j < g.Wo; ++j) yr[j] = static_cast<T>(yb[cc * Wp + j]);
      }
    }
  });
}

// grad_x = At(grad_y, w), as a gather: input pixel (h, col) collects every
// (u, v, i, j) with i*s-p+u*d = h and j*s-p+v*d = col. For a column phase
// ph = (col + p) mod s the taps with (v*d) mod s = ph contribute
// w[.., i, m - (v*d)/s] * grad_y[.., i, m - (v*d)/s] at m = (col + p) / s.
template <typename T>
void aggregate_transpose(const T* __restrict__ gy, const T* __restrict__ w,
                         T* __restrict__ gx, const Geometry& g) {
  using A = typename Acc<T>::type;
  const int64_t Cg = g.C / g.G, CB = std::min<int64_t>(Cg, kChannelBlock);
  const int64_t nCB = (Cg + CB - 1) / CB, KK = g.K * g.K;
  const int64_t M = (g.K - 1) * g.d / g.s;  // left margin: the largest shift
  const int64_t nm = (g.W - 1 + g.p) / g.s + 1;  // positions m per phase
  const int64_t L = M + std::max(g.Wo, nm);
  const int64_t grain = grain_for(CB * KK * g.W / (g.s * g.s));
  at::parallel_for(0, g.B * g.G * nCB * g.H, grain, [&](int64_t begin, int64_t end) {
    const int64_t Mp = padded_row(nm), Wp = padded_row(g.W);
    std::vector<A> wb(KK * L + kSlack), gb(CB * g.K * L + kSlack), mb(CB * Mp + kSlack),
        xr(CB * Wp + kSlack);
    std::vector<const A*> ta(KK), tb(KK);
    std::vector<int64_t> us, koff(CB);
    for (int64_t cc = 0; cc < CB; ++cc) koff[cc] = cc * g.K * L;  // channel stride in gb
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t % g.H, cb = (t / g.H) % nCB, grp = (t / g.H / nCB) % g.G;
      const int64_t b = t / g.H / nCB / g.G;
      const int64_t c0 = grp * Cg + cb * CB, nc = std::min(CB, Cg - cb * CB);
      // Rows u of the window that land on h. Only [M, M + Wo) of a buffer row
      // is ever written, so the zero margins stay zero across tasks.
      us.clear();
      for (int64_t u = 0; u < g.K; ++u) {
        const int64_t r = h + g.p - u * g.d;
        if (r < 0 || r % g.s || r / g.s >= g.Ho) continue;
        const int64_t i = r / g.s;
        us.push_back(u);
        for (int64_t v = 0; v < g.K; ++v) {
          const T* wr = w + ((((b * g.G + grp) * g.K + u) * g.K + v) * g.Ho + i) * g.Wo;
          if (i + 1 < g.Ho) prefetch_row(wr + g.Wo, g.Wo);
          A* wd = wb.data() + (u * g.K + v) * L + M;
          for (int64_t j = 0; j < g.Wo; ++j) wd[j] = static_cast<A>(wr[j]);
        }
        for (int64_t cc = 0; cc < nc; ++cc) {
          const T* gr = gy + ((b * g.C + c0 + cc) * g.Ho + i) * g.Wo;
          if (i + 1 < g.Ho) prefetch_row(gr + g.Wo, g.Wo);
          A* gd = gb.data() + (cc * g.K + u) * L + M;
          for (int64_t j = 0; j < g.Wo; ++j) gd[j] = static_cast<A>(gr[j]);
        }
      }
      if (g.s > 1 || us.empty()) std::fill(xr.begin(), xr.end(), A(0));
      for (int64_t ph = 0; ph < g.s; ++ph) {
        // m covers every column of this phase: col = m*s + ph - p in [0, W).
        const int64_t mlo = std::max<int64_t>(0, ceil_div(g.p - ph, g.s));
        const int64_t mhi = std::min(nm, ceil_div(g.W + g.p - ph, g.s));
        if (mlo >= mhi) continue;
        int64_t nt = 0;
        for (int64_t u : us)
          for (int64_t v = 0; v < g.K; ++v) {
            if ((v * g.d) % g.s != ph) continue;
            const int64_t off = M - (v * g.d) / g.s + mlo;
            ta[nt] = wb.data() + (u * g.K + v) * L + off;
            tb[nt++] = gb.data() + u * L + off;
          }
        if (nt == 0) continue;
        A* dst = xr.data() + mlo * g.s + ph - g.p;
        if (g.s == 1) {  // the columns of the single phase are contiguous
          tap_dot(dst, Wp, nc, mhi - mlo, ta.data(), tb.data(), koff.data(), nt, false);
          continue;
        }
        tap_dot(mb.data(), Mp, nc, mhi - mlo, ta.data(), tb.data(), koff.data(), nt, false);
        for (int64_t cc = 0; cc < nc; ++cc)
          for (int64_t m = 0; m < mhi - mlo; ++m) dst[cc * Wp + m * g.s] = mb[cc * Mp + m];
      }
      for (int64_t cc = 0; cc < nc; ++cc) {
        T* xo = gx + ((b * g.C + c0 + cc) * g.H + h) * g.W;
        for (int64_t j = 0; j < g.W; ++j) xo[j] = static_cast<T>(xr[cc * Wp + j]);
      }
    }
  });
}

// out[b, g, u, v, i, :] = sum_{c in g} q[b, c, i, :] * x[b, c, i*s-p+u*d, :*s-p+v*d]:
// one task per (b, g, u) and block of output rows, so that it writes K output
// planes row after row (a few long streams, not K*K short ones); the K taps of
// the row share each query row, and the channel sums stay in registers.
template <typename T>
void correlate(const T* __restrict__ q, const T* __restrict__ x,
               T* __restrict__ out, const Geometry& g) {
  using A = typename Acc<T>::type;
  const int64_t Cg = g.C / g.G, CB = std::min<int64_t>(Cg, kChannelBlock);
  const int64_t L = g.Wo + (g.K - 1) * g.d / g.s, rowbuf = g.s * L;
  const int64_t Wa = padded_row(g.Wo);  // tap_dot's overhang stays in its row
  constexpr int64_t kRows = 8;           // output rows per task
  const int64_t nIB = (g.Ho + kRows - 1) / kRows;
  const int64_t grain = grain_for(kRows * Cg * g.K * g.Wo);
  at::parallel_for(0, g.B * g.G * g.K * nIB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> xb(CB * rowbuf + kSlack), qb(CB * g.Wo + kSlack), acc(g.K * Wa + kSlack);
    std::vector<const A*> ta(CB), tb(CB);
    std::vector<int64_t> koff(g.K);  // tap v's offset in a phase-split row
    for (int64_t v = 0; v < g.K; ++v) koff[v] = (v * g.d) % g.s * L + (v * g.d) / g.s;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ib = t % nIB, u = (t / nIB) % g.K, bg = t / nIB / g.K;
      const int64_t grp = bg % g.G, b = bg / g.G;
      T* oplane = out + (bg * g.K + u) * g.K * g.Ho * g.Wo;  // out[b, g, u, 0]
      for (int64_t i = ib * kRows; i < std::min(g.Ho, (ib + 1) * kRows); ++i) {
        const int64_t row = i * g.s - g.p + u * g.d;
        const bool inside = row >= 0 && row < g.H;
        if (!inside) std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t c0 = grp * Cg; inside && c0 < (grp + 1) * Cg; c0 += CB) {
          const int64_t nc = std::min(CB, (grp + 1) * Cg - c0);
          for (int64_t cc = 0; cc < nc; ++cc) {
            const T* qr = q + ((b * g.C + c0 + cc) * g.Ho + i) * g.Wo;
            for (int64_t j = 0; j < g.Wo; ++j) qb[cc * g.Wo + j] = static_cast<A>(qr[j]);
            ta[cc] = qb.data() + cc * g.Wo;
            const T* xr = x + ((b * g.C + c0 + cc) * g.H + row) * g.W;
            if (row + g.s < g.H) prefetch_row(xr + g.s * g.W, g.W);
            load_phases(xb.data() + cc * rowbuf, xr, g.W, L, g.s, g.p);
            tb[cc] = xb.data() + cc * rowbuf;
          }
          tap_dot(acc.data(), Wa, g.K, g.Wo, ta.data(), tb.data(), koff.data(), nc,
                  c0 != grp * Cg);
        }
        for (int64_t v = 0; v < g.K; ++v) {
          T* orow = oplane + (v * g.Ho + i) * g.Wo;
          const A* ar = acc.data() + v * Wa;
          for (int64_t j = 0; j < g.Wo; ++j) orow[j] = static_cast<T>(ar[j]);
        }
      }
    }
  });
}
