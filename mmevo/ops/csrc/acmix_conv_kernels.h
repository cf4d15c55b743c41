// The kernels of ACmix's conv path (acmix_conv.cpp), for one instruction set.
//
// Included by acmix_conv.cpp inside a namespace per `#pragma GCC target`,
// after evolution_kernels.h (round_up, store_lanes), like
// fused_attention_kernels.h. No #include here on purpose.
//
// The convolution (MixShape): x (B, H, W, J, G) dense, i.e. a channels-last
// (B, J * G, H, W) map whose group g holds the J channels j * G + g (the
// groups interleave); weight (G * O, J, k, k), output channel g * O + h of
// group g; zero padding p. out (B, G * O, Ho, Wo) is NCHW, the input
// gradient has x's layout.
//
// Vectors run along the groups: a pixel's J * G channels are J vectors of
// G lanes, so every tap is J vector loads and the group's O outputs O FMAs
// per load. oneDNN runs grouped convolutions of such small groups (16
// groups of 12 -> 4 channels in ACmix's stage 1) a group at a time, at a
// third to half of the FMA rate these reach. Where a pixel's channels are
// whole vectors of the accumulation type A (G a multiple of the lanes, no
// conversion), the kernels read the maps in place and clip the taps at the
// edges; otherwise a task copies the rows its windows read into a
// zero-padded buffer in A (lanes past G zero, G padded to Gp). The
// register tiles (kMixPx pixels x kMixOut outputs, and their transposes)
// fill the register file.

constexpr int64_t kMixPx = kVecBytes == 64 ? 4 : 2;   // pixels of a register tile
constexpr int64_t kMixOut = 4;                        // outputs of a forward tile
constexpr int64_t kMixIn = 6;                         // inputs of an input-gradient tile
constexpr int64_t kMixInW = kVecBytes == 64 ? 3 : 2;  // inputs of a weight-gradient tile
constexpr int64_t kMixRows = 4;                       // output rows of a weight-gradient task

// dst (k rows of Wp pixels of Jr x Gp) = the input rows i*s - p + u of image
// b, pixel xp of a row read from input column xp - p; zeros outside the map,
// past channel J and past lane G.
template <typename T, typename A>
void mix_load_rows(A* __restrict__ dst, const T* __restrict__ x, const MixShape& a, int64_t b,
                   int64_t i, int64_t Wp, int64_t Jr, int64_t Gp) {
  const int64_t pix = Jr * Gp, JG = a.J * a.G;
  for (int64_t u = 0; u < a.k; ++u) {
    const int64_t y = i * a.s - a.p + u;
    if (y < 0 || y >= a.H) {
      std::fill(dst, dst + Wp * pix, A(0));
      dst += Wp * pix;
      continue;
    }
    const T* row = x + (b * a.H + y) * a.W * JG;
    for (int64_t xp = 0; xp < Wp; ++xp, dst += pix) {
      const int64_t ix = xp - a.p;
      if (ix < 0 || ix >= a.W) {
        std::fill(dst, dst + pix, A(0));
      } else if (std::is_same_v<T, A> && Jr == a.J && Gp == a.G) {
        std::memcpy(dst, row + ix * JG, pix * sizeof(A));
      } else {
        const T* px = row + ix * JG;
        for (int64_t j = 0; j < Jr; ++j)
          for (int64_t g = 0; g < Gp; ++g)
            dst[j * Gp + g] = j < a.J && g < a.G ? static_cast<A>(px[j * a.G + g]) : A(0);
      }
    }
  }
}

// w (G * O, J, k, k) as vectors of V groups: pack[gc][u][v][m][n][lane] with
// (m, n) = (h, j) if h_major else (j, h), padded with zeros to M x N.
template <typename T, typename A>
std::vector<A> mix_pack_weights(const T* w, const MixShape& a, int64_t V, bool h_major,
                                int64_t M, int64_t N) {
  const int64_t KK = a.k * a.k;
  std::vector<A> pack(ceil_div(a.G, V) * KK * M * N * V, A(0));
  for (int64_t g = 0; g < a.G; ++g)
    for (int64_t h = 0; h < a.O; ++h)
      for (int64_t j = 0; j < a.J; ++j)
        for (int64_t uv = 0; uv < KK; ++uv) {
          const int64_t mn = h_major ? h * N + j : j * N + h;
          pack[(((g / V) * KK + uv) * M * N + mn) * V + g % V] =
              static_cast<A>(w[((g * a.O + h) * a.J + j) * KK + uv]);
        }
  return pack;
}

// acc[q][h] += the taps (u, v), u = us[0..nu), v in [v0, v1), of NPX output
// pixels: input pixel (u, q * s + v) at xr[u] + (q * s + v) * pix, its J
// vectors Gp apart; the weights of tap (u, v) at w + (u * k + v) * wu.
template <int NPX, typename A, typename vec>
__attribute__((always_inline)) inline void mix_forward_tile(
    vec (&acc)[NPX][kMixOut], const A* const* xr, const int64_t* us, int64_t nu, int64_t v0,
    int64_t v1, const A* w, int64_t wu, const MixShape& a, int64_t pix, int64_t Gp,
    int64_t O4) {
  constexpr int64_t V = sizeof(vec) / sizeof(A);
  const int64_t xs = a.s * pix;
  for (int64_t n = 0; n < nu; ++n)
    for (int64_t v = v0; v < v1; ++v) {
      const A* xp = xr[n] + v * pix;
      const A* wr = w + (us[n] * a.k + v) * wu;
      for (int64_t j = 0; j < a.J; ++j, xp += Gp, wr += O4 * V) {
        vec wv[kMixOut];
#pragma GCC unroll 4
        for (int h = 0; h < kMixOut; ++h) std::memcpy(&wv[h], wr + h * V, sizeof(vec));
#pragma GCC unroll 4
        for (int q = 0; q < NPX; ++q) {
          vec xv;
          std::memcpy(&xv, xp + q * xs, sizeof(vec));
#pragma GCC unroll 4
          for (int h = 0; h < kMixOut; ++h) acc[q][h] += wv[h] * xv;
        }
      }
    }
}

// out[b, g*O + h, i, ox] = sum_{u, v, j} w[g*O + h, j, u, v] * x[b, i*s-p+u, ox*s-p+v, j, g].
// Task: one output row; its outputs are gathered in a row buffer (pixel,
// output, group) and written to the NCHW rows at the end. Where x's pixels
// are whole vectors in A (Gp = G, no conversion), the taps read x in place:
// tiles of kMixPx pixels inside the map, one pixel at a time with its taps
// clipped at the edges, the rows outside skipped. Otherwise the window rows
// are copied into a zero-padded buffer first (mix_load_rows).
template <typename T>
void mix_forward(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                 const MixShape& a) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Gp = round_up(a.G, V), nGC = Gp / V, O4 = round_up(a.O, kMixOut);
  const int64_t KK = a.k * a.k, Wo4 = round_up(a.Wo, kMixPx), pix = a.J * Gp;
  const bool direct = std::is_same_v<T, A> && Gp == a.G;
  const int64_t Wp = direct ? 0 : (Wo4 - 1) * a.s + a.k, wu = a.J * O4 * V;
  // Output pixels whose every tap is inside the row: [in0, in1).
  const int64_t in0 = std::min(a.Wo, ceil_div(a.p, a.s));
  const int64_t in1 = a.W - 1 + a.p - (a.k - 1) < 0
                          ? in0
                          : std::max(in0, std::min(a.Wo, (a.W - 1 + a.p - (a.k - 1)) / a.s + 1));
  const std::vector<A> wt = mix_pack_weights<T, A>(w, a, V, false, a.J, O4);
  const int64_t grain = grain_for(a.Wo * KK * a.J * a.O * a.G);
  at::parallel_for(0, a.B * a.Ho, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> rows(a.k * Wp * pix), orow(Wo4 * O4 * Gp);
    std::vector<const A*> base(a.k), xr(a.k);
    std::vector<int64_t> us(a.k);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / a.Ho, i = t % a.Ho;
      int64_t nu = 0;
      for (int64_t u = 0; u < a.k; ++u) {
        const int64_t y = i * a.s - a.p + u;
        if (!direct) {
          us[nu] = u;
          base[nu++] = rows.data() + u * Wp * pix + a.p * pix;  // column 0
        } else if (y >= 0 && y < a.H) {
          us[nu] = u;
          base[nu++] = reinterpret_cast<const A*>(x) + (b * a.H + y) * a.W * pix;
        }
      }
      if (!direct) mix_load_rows(rows.data(), x, a, b, i, Wp, a.J, Gp);
      // NPX pixels from o0, taps [v0, v1), into the row buffer.
      auto tile = [&]<int NPX>(int64_t o0, int64_t gc, int64_t v0, int64_t v1) {
        for (int64_t n = 0; n < nu; ++n) xr[n] = base[n] + (o0 * a.s - a.p) * pix + gc * V;
        for (int64_t hb = 0; hb < O4; hb += kMixOut) {
          vec acc[NPX][kMixOut] = {};
          mix_forward_tile<NPX, A, vec>(acc, xr.data(), us.data(), nu, v0, v1,
                                        wt.data() + gc * KK * wu + hb * V, wu, a, pix, Gp, O4);
          for (int q = 0; q < NPX; ++q)
            for (int h = 0; h < kMixOut; ++h)
              std::memcpy(orow.data() + ((o0 + q) * O4 + hb + h) * Gp + gc * V, &acc[q][h],
                          sizeof(vec));
        }
      };
      for (int64_t gc = 0; gc < nGC; ++gc) {
        if (!direct) {
          for (int64_t o0 = 0; o0 < a.Wo; o0 += kMixPx)
            tile.template operator()<kMixPx>(o0, gc, 0, a.k);
          continue;
        }
        int64_t o = 0;
        while (o < a.Wo) {
          if (o >= in0 && o + kMixPx <= in1) {
            tile.template operator()<kMixPx>(o, gc, 0, a.k);
            o += kMixPx;
          } else {
            const int64_t c = o * a.s - a.p;  // the input column of tap 0
            tile.template operator()<1>(o, gc, std::max<int64_t>(0, -c),
                                        std::min(a.k, a.W - c));
            o += 1;
          }
        }
      }
      for (int64_t g = 0; g < a.G; ++g)
        for (int64_t h = 0; h < a.O; ++h) {
          T* dst = out + ((b * a.G * a.O + g * a.O + h) * a.Ho + i) * a.Wo;
          const A* src = orow.data() + h * Gp + g;
          for (int64_t ox = 0; ox < a.Wo; ++ox) dst[ox] = static_cast<T>(src[ox * O4 * Gp]);
        }
    }
  });
}

// gx[b, y, xx, j, g] = sum_{u, v, h} w[g*O + h, j, u, v] * gt[b, i, ox, h, g]
// over the (i, ox) with i*s-p+u = y and ox*s-p+v = xx; gt (B, Ho, Wo, O, G)
// is the output gradient in group-inner order. Task: one input row. Its
// columns are taken by phase, xx = ph + n*s: those of a phase meet the
// output columns ox = n + (ph + p - v) / s through the taps v with
// ph + p - v a multiple of s, so a tile of kMixPx of them reads a
// contiguous run of the gradient row, which is copied zero-padded.
template <typename T>
void mix_backward_input(const T* __restrict__ gt, const T* __restrict__ w, T* __restrict__ gx,
                        const MixShape& a) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Gp = round_up(a.G, V), nGC = Gp / V, JX = round_up(a.J, kMixIn);
  const int64_t KK = a.k * a.k, zpix = a.O * Gp;
  // Buffer pixel m holds output column m - pad: pad covers the most
  // negative offset, the length the last tile and the largest offset.
  const int64_t pad = ceil_div(a.k - 1, a.s);
  const int64_t Wz = round_up(ceil_div(a.W, a.s), kMixPx) + 2 * pad + (a.p + a.s) / a.s + 1;
  // Per phase, the taps v that meet an output column and their offsets.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> taps(a.s);
  for (int64_t ph = 0; ph < a.s; ++ph)
    for (int64_t v = 0; v < a.k; ++v) {
      const int64_t d = ph + a.p - v;
      if ((d % a.s + a.s) % a.s == 0) taps[ph].emplace_back(v, d / a.s + pad);
    }
  const std::vector<A> wb = mix_pack_weights<T, A>(w, a, V, true, a.O, JX);
  const int64_t grain = grain_for(a.W * KK * a.J * a.O * a.G / (a.s * a.s));
  at::parallel_for(0, a.B * a.H, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> z(a.k * Wz * zpix);
    std::vector<int64_t> us;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / a.H, y = t % a.H;
      us.clear();
      for (int64_t u = 0; u < a.k; ++u) {
        const int64_t r = y + a.p - u;
        if (r < 0 || r % a.s != 0 || r / a.s >= a.Ho) continue;
        us.push_back(u);
        A* dst = z.data() + u * Wz * zpix;
        const T* row = gt + (b * a.Ho + r / a.s) * a.Wo * a.O * a.G;
        for (int64_t m = 0; m < Wz; ++m, dst += zpix) {
          const int64_t c = m - pad;
          if (c < 0 || c >= a.Wo) {
            std::fill(dst, dst + zpix, A(0));
            continue;
          }
          const T* px = row + c * a.O * a.G;
          for (int64_t h = 0; h < a.O; ++h)
            for (int64_t g = 0; g < Gp; ++g)
              dst[h * Gp + g] = g < a.G ? static_cast<A>(px[h * a.G + g]) : A(0);
        }
      }
      T* out_row = gx + (b * a.H + y) * a.W * a.J * a.G;
      for (int64_t gc = 0; gc < nGC; ++gc) {
        const int64_t lanes = std::min(V, a.G - gc * V);
        for (int64_t ph = 0; ph < std::min(a.s, a.W); ++ph) {
          const int64_t nx = ceil_div(a.W - ph, a.s);
          for (int64_t n0 = 0; n0 < nx; n0 += kMixPx)
            for (int64_t jb = 0; jb < a.J; jb += kMixIn) {
              vec acc[kMixPx][kMixIn] = {};
              for (const int64_t u : us)
                for (const auto& [v, off] : taps[ph]) {
                  const A* zr = z.data() + (u * Wz + off + n0) * zpix + gc * V;
                  const A* wr = wb.data() + ((gc * KK + u * a.k + v) * a.O * JX + jb) * V;
                  for (int64_t h = 0; h < a.O; ++h, zr += Gp, wr += JX * V) {
                    vec gv[kMixPx];
#pragma GCC unroll 4
                    for (int q = 0; q < kMixPx; ++q)
                      std::memcpy(&gv[q], zr + q * zpix, sizeof(vec));
#pragma GCC unroll 6
                    for (int jj = 0; jj < kMixIn; ++jj) {
                      vec wv;
                      std::memcpy(&wv, wr + jj * V, sizeof(vec));
#pragma GCC unroll 4
                      for (int q = 0; q < kMixPx; ++q) acc[q][jj] += wv * gv[q];
                    }
                  }
                }
              for (int64_t q = 0; q < std::min(kMixPx, nx - n0); ++q)
                for (int64_t jj = 0; jj < std::min(kMixIn, a.J - jb); ++jj)
                  store_lanes<T, A>(
                      out_row + ((ph + (n0 + q) * a.s) * a.J + jb + jj) * a.G + gc * V,
                      acc[q][jj], lanes);
            }
        }
      }
    }
  });
}

// gw[g*O + h, j, u, v] = sum_{b, i, ox} gt[b, i, ox, h, g] * x[b, i*s-p+u, ox*s-p+v, j, g].
// Task: kMixRows (or more) output rows of one image, summed into its own slot of
// `partial` (nGC * k * k * JW * O4 * V each, zero on entry); the slots are
// added in task order at the end, so the sum is the same for any thread
// count.
template <typename T>
void mix_backward_weight(const T* __restrict__ gt, const T* __restrict__ x, T* __restrict__ gw,
                         const MixShape& a) {
  using A = typename Acc<T>::type;
  typedef A vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(A);
  const int64_t Gp = round_up(a.G, V), nGC = Gp / V, O4 = round_up(a.O, kMixOut);
  const int64_t JW = round_up(a.J, kMixInW), KK = a.k * a.k;
  // x and gt read in place where their pixels are whole tiles in A, as in
  // mix_forward (each tap over the output columns it reaches inside the map).
  const bool direct = std::is_same_v<T, A> && Gp == a.G && JW == a.J && O4 == a.O;
  const int64_t Wp = direct ? 0 : (a.Wo - 1) * a.s + a.k;
  const int64_t pix = JW * Gp, xs = a.s * pix, gpix = O4 * Gp;
  // Tasks of kMixRows rows, or more where the batch is large: at most ~256
  // slots (7 MiB at ACmix-ResNet-50's widest), whatever B.
  const int64_t nRB = std::min(ceil_div(a.Ho, kMixRows), std::max<int64_t>(1, 256 / a.B));
  const int64_t per = ceil_div(a.Ho, nRB), slot = nGC * KK * JW * O4 * V;
  // Uninitialised: each task zeroes its own slot, in parallel and into its
  // cache (a serial zero fill of 1.8 MiB was a fifth of the 7² gradient).
  const std::unique_ptr<A[]> partial(new A[a.B * nRB * slot]);
  const int64_t grain = grain_for(per * a.Wo * KK * a.J * a.O * a.G);
  at::parallel_for(0, a.B * nRB, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> rows(a.k * Wp * pix), grow(direct ? 0 : a.Wo * gpix);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / nRB, i0 = t % nRB * per;
      A* sum = partial.get() + t * slot;
      std::fill(sum, sum + slot, A(0));
      for (int64_t i = i0; i < std::min(a.Ho, i0 + per); ++i) {
        const T* src = gt + (b * a.Ho + i) * a.Wo * a.O * a.G;
        if (!direct) {
          mix_load_rows(rows.data(), x, a, b, i, Wp, JW, Gp);
          for (int64_t ox = 0; ox < a.Wo; ++ox)
            for (int64_t h = 0; h < O4; ++h)
              for (int64_t g = 0; g < Gp; ++g)
                grow[(ox * O4 + h) * Gp + g] =
                    h < a.O && g < a.G ? static_cast<A>(src[(ox * a.O + h) * a.G + g]) : A(0);
        }
        const A* g0 = direct ? reinterpret_cast<const A*>(src) : grow.data();
        for (int64_t gc = 0; gc < nGC; ++gc)
          for (int64_t uv = 0; uv < KK; ++uv) {
            const int64_t u = uv / a.k, v = uv % a.k, y = i * a.s - a.p + u;
            // The output columns whose tap (u, v) reads inside the map.
            int64_t lo = 0, hi = a.Wo;
            const A* x0 = rows.data() + (u * Wp + v) * pix;
            if (direct) {
              if (y < 0 || y >= a.H) continue;
              const int64_t last = a.W - 1 + a.p - v;
              lo = std::min(a.Wo, std::max<int64_t>(0, ceil_div(a.p - v, a.s)));
              hi = last < 0 ? lo : std::max(lo, std::min(a.Wo, last / a.s + 1));
              x0 = reinterpret_cast<const A*>(x) + ((b * a.H + y) * a.W + lo * a.s + v - a.p) * pix;
            }
            for (int64_t jb = 0; jb < JW; jb += kMixInW)
              for (int64_t hb = 0; hb < O4; hb += kMixOut) {
                vec acc[kMixInW][kMixOut] = {};
                const A* xr = x0 + jb * Gp + gc * V;
                const A* gr = g0 + lo * gpix + hb * Gp + gc * V;
                for (int64_t ox = lo; ox < hi; ++ox, xr += xs, gr += gpix) {
                  vec gv[kMixOut];
#pragma GCC unroll 4
                  for (int h = 0; h < kMixOut; ++h) std::memcpy(&gv[h], gr + h * Gp, sizeof(vec));
#pragma GCC unroll 3
                  for (int jj = 0; jj < kMixInW; ++jj) {
                    vec xv;
                    std::memcpy(&xv, xr + jj * Gp, sizeof(vec));
#pragma GCC unroll 4
                    for (int h = 0; h < kMixOut; ++h) acc[jj][h] += xv * gv[h];
                  }
                }
                A* dst = sum + (((gc * KK + uv) * JW + jb) * O4 + hb) * V;
                for (int jj = 0; jj < kMixInW; ++jj)
                  for (int h = 0; h < kMixOut; ++h) {
                    vec s;
                    std::memcpy(&s, dst + (jj * O4 + h) * V, sizeof(vec));
                    s += acc[jj][h];
                    std::memcpy(dst + (jj * O4 + h) * V, &s, sizeof(vec));
                  }
              }
          }
      }
    }
  });
  // One parallel region: the slots' sum of one (vector of groups, tap)
  // at a time, then the weights it completes, written in w's layout.
  const int64_t unit = JW * O4 * V;
  at::parallel_for(0, nGC * KK, std::max<int64_t>(1, 2048 / unit), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      A* dst = partial.get() + n * unit;
      for (int64_t t = 1; t < a.B * nRB; ++t) {
        const A* src = dst + t * slot;
        for (int64_t e = 0; e < unit; ++e) dst[e] += src[e];
      }
      const int64_t gc = n / KK, uv = n % KK;
      for (int64_t j = 0; j < a.J; ++j)
        for (int64_t h = 0; h < a.O; ++h)
          for (int64_t g = gc * V; g < std::min(a.G, gc * V + V); ++g)
            gw[((g * a.O + h) * a.J + j) * KK + uv] =
                static_cast<T>(dst[(j * O4 + h) * V + g - gc * V]);
    }
  });
}

// d[x * dx + c] += s[c * plane + x] over whole tiles of V channels by V
// pixels (c < nct, x < nt), transposed in registers; float and double.
template <typename T>
inline void add_head_tiles(T* __restrict__ d, const T* __restrict__ s, int64_t plane,
                           int64_t dx, int64_t nt, int64_t nct) {
  typedef T vec __attribute__((vector_size(kVecBytes)));
  constexpr int V = kVecBytes / sizeof(T);
  for (int64_t x0 = 0; x0 < nt; x0 += V)
    for (int64_t c0 = 0; c0 < nct; c0 += V) {
      vec v[V];
      for (int k = 0; k < V; ++k) v[k] = load_v<T, vec>(s + (c0 + k) * plane + x0);
      transpose(v);
      for (int j = 0; j < V; ++j) add_v<T, vec>(d + (x0 + j) * dx + c0, v[j]);
    }
}

// grad (B, H, W, 3, C), contiguous, += the gradients of the attention's
// query (B, C, Ho, Wo) at every stride-th pixel, key and value (B, C, H,
// W), all contiguous (src[0..2]): a transposing add, in tiles of V
// channels by V pixels (add_head_tiles), the channels and pixels past them
// one at a time. Each element gets one add: the same bits either way.
// Over ACmix-ResNet-50's 16 layers (B4) the tiles took 0.69x the time of
// adding each element alone with one thread, 0.49x with two. Task: one (b,
// y) row of the map.
template <typename T>
void add_heads(T* __restrict__ g, const T* const* src, int64_t B, int64_t C, int64_t H,
               int64_t W, int64_t stride) {
  constexpr int64_t V = kVecBytes / sizeof(T);
  constexpr bool kTiles = std::is_floating_point_v<T>;  // not bf16 / fp16
  const int64_t Ho = (H - 1) / stride + 1, Wo = (W - 1) / stride + 1, C3 = 3 * C;
  const int64_t nct = kTiles ? C / V * V : 0;
  at::parallel_for(0, B * H, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, C3 * W)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / H, y = t % H;
      T* row = g + t * W * C3;
      for (int64_t part = 0; part < 3; ++part) {
        if (part == 0 && y % stride != 0) continue;
        // The query's rows and columns are every stride-th of the map's.
        const int64_t n = part == 0 ? Wo : W, step = part == 0 ? stride : 1;
        const int64_t rows = part == 0 ? Ho : H, r = part == 0 ? y / stride : y;
        const T* s = src[part] + (b * C * rows + r) * n;
        const int64_t plane = rows * n, nt = kTiles ? n / V * V : 0;
        T* d0 = row + part * C;
        if constexpr (kTiles) add_head_tiles<T>(d0, s, plane, step * C3, nt, nct);
        for (int64_t x = 0; x < n; ++x) {
          T* d = d0 + x * step * C3;
          for (int64_t c = x < nt ? nct : 0; c < C; ++c) d[c] += s[c * plane + x];
        }
      }
    }
  });
}
