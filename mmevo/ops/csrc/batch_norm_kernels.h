// The batch norm kernel, for one instruction set.
//
// Included by batch_norm.cpp inside a namespace per `#pragma GCC target`
// (isa_kernels.h), like the other kernel headers. No #include here on
// purpose.

// Elements summed in T before each partial sum goes into a double: T's
// vectors at full width, and in float32 a relative error of ~1e-6 at most.
constexpr int64_t kBnChunk = 1024;

// sum_k f(p[k]) over k < n, in T within chunks of kBnChunk and in double
// across them.
template <typename T, typename F>
inline double bn_sum(const T* __restrict__ p, int64_t n, F f) {
  double sum = 0;
  for (int64_t k0 = 0; k0 < n; k0 += kBnChunk) {
    const int64_t k1 = std::min(n, k0 + kBnChunk);
    T part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t k = k0; k < k1; ++k) part += f(p[k]);
    sum += part;
  }
  return sum;
}

// y = batch_norm(x) in training, and each channel's mean and 1 / sqrt(var +
// eps), for an NCHW x (B planes of HW per channel, plane stride C * HW);
// the running statistics (either null) updated as nn.BatchNorm2d does, with
// the unbiased variance. Task: whole channels. A channel's mean, then its
// biased variance as the mean square of x - mean, are summed in two passes
// (the second, and the pass that writes y, from the cache), so the variance
// has no cancellation.
template <typename T>
void bn_train_forward(const T* __restrict__ x, const T* w, const T* b, T* __restrict__ y,
                      T* mean_out, T* invstd_out, T* rmean, T* rvar, double momentum,
                      double eps, int64_t B, int64_t C, int64_t HW) {
  const int64_t n = B * HW;
  at::parallel_for(0, C, grain_for(3 * n), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < B; ++i)
        sum += bn_sum(x + (i * C + c) * HW, HW, [](T v) { return v; });
      const double mean = sum / n;
      const T m = static_cast<T>(mean);
      double sq = 0;
      for (int64_t i = 0; i < B; ++i)
        sq += bn_sum(x + (i * C + c) * HW, HW, [m](T v) { return (v - m) * (v - m); });
      const double var = sq / n, invstd = 1 / std::sqrt(var + eps);
      const double scale = (w ? static_cast<double>(w[c]) : 1.0) * invstd;
      const T s = static_cast<T>(scale);
      const T t = static_cast<T>((b ? static_cast<double>(b[c]) : 0.0) - mean * scale);
      for (int64_t i = 0; i < B; ++i) {
        const T* p = x + (i * C + c) * HW;
        T* q = y + (i * C + c) * HW;
#pragma omp simd
        for (int64_t k = 0; k < HW; ++k) q[k] = p[k] * s + t;
      }
      mean_out[c] = static_cast<T>(mean);
      invstd_out[c] = static_cast<T>(invstd);
      if (rmean) rmean[c] = static_cast<T>(momentum * mean + (1 - momentum) * rmean[c]);
      if (rvar)
        rvar[c] = static_cast<T>(momentum * var * n / (n - 1) + (1 - momentum) * rvar[c]);
    }
  });
}

// The gradients of bn_train_forward's y (dy, NCHW like x): gx = dy * k1 +
// x * k2 + k3 per channel, gw = sum(dy * (x - mean)) * invstd, gb =
// sum(dy); gx, gw, gb null where not wanted. Task: whole channels, the sums
// read dy and x once from memory, gx's pass from the cache.
template <typename T>
void bn_train_backward(const T* __restrict__ dy, const T* __restrict__ x, const T* w,
                       const T* mean_in, const T* invstd_in, T* __restrict__ gx, T* gw, T* gb,
                       int64_t B, int64_t C, int64_t HW) {
  const int64_t n = B * HW;
  at::parallel_for(0, C, grain_for(4 * n), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T m = mean_in[c];
      double sdy = 0, sdx = 0;
      for (int64_t i = 0; i < B; ++i) {
        const T* g = dy + (i * C + c) * HW;
        const T* p = x + (i * C + c) * HW;
        for (int64_t k0 = 0; k0 < HW; k0 += kBnChunk) {
          const int64_t k1 = std::min(HW, k0 + kBnChunk);
          T a = 0, d = 0;
#pragma omp simd reduction(+ : a, d)
          for (int64_t k = k0; k < k1; ++k) {
            a += g[k];
            d += g[k] * (p[k] - m);
          }
          sdy += a;
          sdx += d;
        }
      }
      const double invstd = invstd_in[c], wc = w ? static_cast<double>(w[c]) : 1.0;
      if (gw) gw[c] = static_cast<T>(sdx * invstd);
      if (gb) gb[c] = static_cast<T>(sdy);
      if (!gx) continue;
      const double k1 = invstd * wc, k2 = -k1 * invstd * invstd * sdx / n;
      const T a = static_cast<T>(k1), b = static_cast<T>(k2);
      const T e = static_cast<T>(-k1 * sdy / n - static_cast<double>(m) * k2);
      for (int64_t i = 0; i < B; ++i) {
        const T* g = dy + (i * C + c) * HW;
        const T* p = x + (i * C + c) * HW;
        T* q = gx + (i * C + c) * HW;
#pragma omp simd
        for (int64_t k = 0; k < HW; ++k) q[k] = g[k] * a + p[k] * b + e;
      }
    }
  });
}
