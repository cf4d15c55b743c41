// The batch norm kernels, for one instruction set.
//
// Included by batch_norm.cpp inside a namespace per `#pragma GCC target`
// (isa_kernels.h), like the other kernel headers. No #include here on
// purpose.

// Elements summed in T before each partial sum goes into a double: T's
// vectors at full width, and in float32 a relative error of ~1e-6 at most.
constexpr int64_t kBnChunk = 1024;
// Vector accumulators per sum: one would wait on the add's latency.
constexpr int64_t kBnAcc = 4;

// sum_k f(p[k]) over k < n, in T within chunks of kBnChunk and in double
// across them; f takes T and T's vectors.
template <typename T, typename F>
inline double bn_sum(const T* __restrict__ p, int64_t n, F f) {
  typedef T vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(T);
  double sum = 0;
  for (int64_t k0 = 0; k0 < n; k0 += kBnChunk) {
    const int64_t k1 = std::min(n, k0 + kBnChunk);
    vec acc[kBnAcc] = {};
    int64_t k = k0;
    for (; k + kBnAcc * V <= k1; k += kBnAcc * V)
      for (int64_t a = 0; a < kBnAcc; ++a) acc[a] += f(load_v<T, vec>(p + k + a * V));
    for (; k + V <= k1; k += V) acc[0] += f(load_v<T, vec>(p + k));
    T part = 0;
    for (; k < k1; ++k) part += f(p[k]);
    for (int64_t a = 1; a < kBnAcc; ++a) acc[0] += acc[a];
    for (int64_t j = 0; j < V; ++j) part += acc[0][j];
    sum += part;
  }
  return sum;
}

// A per-plane (one value) or per-element (an array) term of bn_apply.
template <typename T>
inline T bn_at(T v, int64_t) {
  return v;
}
template <typename T>
inline T bn_at(const T* v, int64_t k) {
  return v[k];
}

// q = (p - m) * s + t (plus rp if non-null; then max(q, 0) if relu) over n
// elements; m, s and t each one value (P = T) or one per element (const T*).
// q may be p (in place): each element is read before it is written, and the
// simd loops need no __restrict__ to vectorise.
template <typename T, typename P>
inline void bn_apply(const T* p, const T* rp, T* q, P m, P s, P t, bool relu, int64_t n) {
#define MMEVO_BN_Y(k) ((p[k] - bn_at(m, k)) * bn_at(s, k) + bn_at(t, k))
  if (rp && relu) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) q[k] = std::max(MMEVO_BN_Y(k) + rp[k], T(0));
  } else if (rp) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) q[k] = MMEVO_BN_Y(k) + rp[k];
  } else if (relu) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) q[k] = std::max(MMEVO_BN_Y(k), T(0));
  } else {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) q[k] = MMEVO_BN_Y(k);
  }
#undef MMEVO_BN_Y
}

// y = batch_norm(x) in training (plus res, an NCHW map like x, if
// non-null; then max(y, 0) if relu), and each channel's mean and
// 1 / sqrt(var + eps), for an NCHW x (B planes of HW per
// channel, plane stride C * HW); the running statistics (either null)
// updated as nn.BatchNorm2d does, with the unbiased variance. Task: whole
// channels. A channel's mean, then its biased variance as the mean square
// of x - mean, are summed in two passes (the second, and the pass that
// writes y, from the cache), so the variance has no cancellation.
template <typename T>
void bn_train_forward(const T* __restrict__ x, const T* w, const T* b,
                      const T* __restrict__ res, T* __restrict__ y, T* mean_out, T* invstd_out,
                      T* rmean, T* rvar, double momentum, double eps, bool relu, int64_t B,
                      int64_t C, int64_t HW) {
  const int64_t n = B * HW;
  at::parallel_for(0, C, grain_for(3 * n), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < B; ++i)
        sum += bn_sum(x + (i * C + c) * HW, HW, [](auto v) { return v; });
      const double mean = sum / n;
      const T m = static_cast<T>(mean);
      double sq = 0;
      for (int64_t i = 0; i < B; ++i)
        sq += bn_sum(x + (i * C + c) * HW, HW, [m](auto v) { return (v - m) * (v - m); });
      const double var = sq / n, invstd = 1 / std::sqrt(var + eps);
      const double scale = (w ? static_cast<double>(w[c]) : 1.0) * invstd;
      const T s = static_cast<T>(scale);
      // y = (x - m) * s + t: x - m is exact where x is near the mean, so y
      // does not lose x * s's digits to t, as x * s + (b - mean * s) would.
      const T t = static_cast<T>((b ? static_cast<double>(b[c]) : 0.0) - (mean - m) * scale);
      for (int64_t i = 0; i < B; ++i) {
        const int64_t at = (i * C + c) * HW;
        bn_apply(x + at, res ? res + at : nullptr, y + at, m, s, t, relu, HW);
      }
      mean_out[c] = static_cast<T>(mean);
      invstd_out[c] = static_cast<T>(invstd);
      if (rmean) rmean[c] = static_cast<T>(momentum * mean + (1 - momentum) * rmean[c]);
      if (rvar)
        rvar[c] = static_cast<T>(momentum * var * n / (n - 1) + (1 - momentum) * rvar[c]);
    }
  });
}

// y = batch_norm(x) in inference, by the running statistics: (x - rm) * s +
// b with s = w / sqrt(rv + eps) (plus res, a map of x's layout, if
// non-null; then max(y, 0) if relu). NCHW x: a task is an (image,
// channel) plane, so that a batch of one still splits; channels-last x
// (nhwc): a pixel's C channels, by arrays of the per-channel terms. y may
// be x.
template <typename T>
void bn_eval_forward(const T* x, const T* w, const T* b, const T* rmean, const T* rvar,
                     const T* res, T* y, double eps, bool relu, bool nhwc, int64_t B, int64_t C,
                     int64_t HW) {
  std::vector<T> m(rmean, rmean + C), s(C), t(C);
  for (int64_t c = 0; c < C; ++c) {
    const double invstd = 1 / std::sqrt(static_cast<double>(rvar[c]) + eps);
    s[c] = static_cast<T>((w ? static_cast<double>(w[c]) : 1.0) * invstd);
    t[c] = b ? b[c] : T(0);
  }
  const int64_t tasks = nhwc ? B * HW : B * C, n = nhwc ? C : HW;
  at::parallel_for(0, tasks, grain_for(n), [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const T* p = x + task * n;
      const T* rp = res ? res + task * n : nullptr;
      if (nhwc) {
        const T *mc = m.data(), *sc = s.data(), *tc = t.data();  // const: bn_at's arrays
        bn_apply(p, rp, y + task * n, mc, sc, tc, relu, n);
      } else {
        const int64_t c = task % C;
        bn_apply(p, rp, y + task * n, m[c], s[c], t[c], relu, n);
      }
    }
  });
}

// sum(g), sum(g * (x - m)) and sum(x - m) over one plane of n elements,
// where g is dy, or (r non-null) dy where r > 0 and 0 elsewhere; in T
// within chunks of kBnChunk, added to the doubles sdy, sdx and sxm; g
// written to go if non-null.
template <typename T>
inline void bn_grad_sums(const T* __restrict__ dy, const T* __restrict__ x,
                         const T* __restrict__ r, T* __restrict__ go, T m, int64_t n,
                         double& sdy, double& sdx, double& sxm) {
  typedef T vec __attribute__((vector_size(kVecBytes)));
  constexpr int64_t V = kVecBytes / sizeof(T);
  const vec zero = {};
  for (int64_t k0 = 0; k0 < n; k0 += kBnChunk) {
    const int64_t k1 = std::min(n, k0 + kBnChunk);
    vec a[kBnAcc] = {}, d[kBnAcc] = {}, e[kBnAcc] = {};
    // One vector at offset at into accumulator j.
    auto step = [&](int64_t at, int64_t j) {
      vec g = load_v<T, vec>(dy + at);
      if (r) g = load_v<T, vec>(r + at) > zero ? g : zero;
      if (go) store_v<T, vec>(go + at, g);
      const vec xm = load_v<T, vec>(x + at) - m;
      a[j] += g;
      d[j] += g * xm;
      e[j] += xm;
    };
    int64_t k = k0;
    for (; k + kBnAcc * V <= k1; k += kBnAcc * V)
      for (int64_t j = 0; j < kBnAcc; ++j) step(k + j * V, j);
    // Single vectors before the scalar tail: a 7² plane is 3 of them.
    for (; k + V <= k1; k += V) step(k, 0);
    T sa = 0, sd = 0, se = 0;
    for (; k < k1; ++k) {
      const T g = r && !(r[k] > 0) ? T(0) : dy[k];
      if (go) go[k] = g;
      sa += g;
      sd += g * (x[k] - m);
      se += x[k] - m;
    }
    for (int64_t j = 1; j < kBnAcc; ++j) {
      a[0] += a[j];
      d[0] += d[j];
      e[0] += e[j];
    }
    for (int64_t j = 0; j < V; ++j) {
      sa += a[0][j];
      sd += d[0][j];
      se += e[0][j];
    }
    sdy += sa;
    sdx += sd;
    sxm += se;
  }
}

// The gradients of bn_train_forward's y (dy, NCHW like x): with g = dy, or
// (r, the forward's y after its ReLU, non-null) dy where r > 0 and 0
// elsewhere, gx = g * k1 + (x - m) * k2 + k3 per channel, gw = sum(g * (x -
// mean)) * invstd, gb = sum(g); gx, gw, gb null where not wanted, and g
// written to go (with r) if non-null. Task: whole channels, the sums read
// dy, x (and r) once from memory, gx's pass from the cache.
template <typename T>
void bn_train_backward(const T* __restrict__ dy, const T* __restrict__ x,
                       const T* __restrict__ r, const T* w, const T* mean_in,
                       const T* invstd_in, T* __restrict__ gx, T* gw, T* gb,
                       T* __restrict__ go, int64_t B, int64_t C, int64_t HW) {
  const int64_t n = B * HW;
  at::parallel_for(0, C, grain_for(4 * n), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T m = mean_in[c];
      double sdy = 0, sdx = 0, sxm = 0;
      for (int64_t i = 0; i < B; ++i) {
        const int64_t o = (i * C + c) * HW;
        bn_grad_sums(dy + o, x + o, r ? r + o : nullptr, go ? go + o : nullptr, m, HW, sdy, sdx,
                     sxm);
      }
      // The saved mean m is the batch mean rounded to T; delta = mean - m
      // puts the rounding back (sum(g * (x - mean)) = sdx - delta * sdy),
      // where it would cost gw digits in sum(g) * ulp(mean) / spread.
      const double delta = sxm / n;
      sdx -= delta * sdy;
      const double invstd = invstd_in[c], wc = w ? static_cast<double>(w[c]) : 1.0;
      if (gw) gw[c] = static_cast<T>(sdx * invstd);
      if (gb) gb[c] = static_cast<T>(sdy);
      if (!gx) continue;
      // gx = g * k1 + (x - mean) * k2 - k1 * mean(g), with x - mean as
      // (x - m) - delta.
      const double k1 = invstd * wc, k2 = -k1 * invstd * invstd * sdx / n;
      const T a = static_cast<T>(k1), b = static_cast<T>(k2);
      const T e = static_cast<T>(-k1 * sdy / n - delta * k2);
      for (int64_t i = 0; i < B; ++i) {
        const int64_t o = (i * C + c) * HW;
        const T* g = go ? go + o : dy + o;  // g itself, from the cache
        const T* p = x + o;
        T* q = gx + o;
        if (r && !go) {
          const T* rr = r + o;
#pragma omp simd
          for (int64_t k = 0; k < HW; ++k)
            q[k] = (rr[k] > 0 ? g[k] : T(0)) * a + (p[k] - m) * b + e;
        } else {
#pragma omp simd
          for (int64_t k = 0; k < HW; ++k) q[k] = g[k] * a + (p[k] - m) * b + e;
        }
      }
    }
  });
}
