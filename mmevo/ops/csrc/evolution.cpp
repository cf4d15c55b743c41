// The tiled CPU kernels of mmevo's operators: aggregation, its transpose
// and local correlation, for contiguous NCHW tensors and zero padding; and
// the aggregation of channels-last tensors.
// ops.cpp validates every argument, makes reflect padding explicit and
// registers the operators (TORCH_LIBRARY).
#include "evolution.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace mmevo {

#include "isa_kernels.h"

enum class Isa { kBase, kAvx2, kAvx512 };

Isa detect_isa() {
  Isa best = Isa::kBase;
#ifdef MMEVO_X86_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    best = Isa::kAvx512;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    best = Isa::kAvx2;
#endif
  // MMEVO_CPU_ISA=avx2|base selects a narrower instruction set than the CPU
  // has, so the tests can run every kernel variant on one machine; a wider
  // one than the CPU supports is never taken.
  const char* want = std::getenv("MMEVO_CPU_ISA");
  if (want && std::strcmp(want, "base") == 0) return Isa::kBase;
  if (want && std::strcmp(want, "avx2") == 0 && best == Isa::kAvx512) return Isa::kAvx2;
  return best;
}

const Isa kIsa = detect_isa();

#ifdef MMEVO_X86_DISPATCH
#define MMEVO_CALL(fn, T, ...)                                         \
  (kIsa == Isa::kAvx512 ? avx512::fn<T>(__VA_ARGS__)                   \
   : kIsa == Isa::kAvx2 ? avx2::fn<T>(__VA_ARGS__) : base::fn<T>(__VA_ARGS__))
#else
#define MMEVO_CALL(fn, T, ...) base::fn<T>(__VA_ARGS__)
#endif

bool tiled_fits(const Geometry& g) {
  // The widest tiles of any instruction set (evolution_kernels.h): 12 rows
  // (a correlation task), 16 lanes.
  constexpr int64_t kMaxRows = 12, kMaxV = 16, kLarge = int64_t{1} << 30;
  const int64_t span = (g.K - 1) * g.d;
  if (g.s > 64 || span > kLarge || g.p > kLarge || g.H > kLarge || g.W > kLarge) return false;
  // Rows x columns of a forward / correlation buffer and of a transpose one.
  const double rows = (kMaxRows - 1) * g.s + span + 1;
  const double cols = g.s * (g.Wo + kMaxV + span / g.s);
  const double t_rows = (kMaxRows + span) / g.s + 2;
  const double t_cols = ceil_div(g.W, g.s) + kMaxV + span / g.s + (g.s + g.p) / g.s + 1;
  const double budget = std::max(double(1 << 16), 4.0 * (g.H + kMaxRows) * (g.W + kMaxV));
  return rows * cols <= budget && t_rows * t_cols <= budget;
}

at::Tensor tiled_aggregate(const at::Tensor& x, const at::Tensor& w, const Geometry& g) {
  auto y = at::empty({g.B, g.C, g.Ho, g.Wo}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "aggregate", [&] {
    MMEVO_CALL(aggregate_forward, scalar_t, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
               y.data_ptr<scalar_t>(), g);
  });
  return y;
}

at::Tensor nhwc_aggregate(const at::Tensor& x, const at::Tensor& w, const Geometry& g) {
  const auto nhwc = x.options().memory_format(at::MemoryFormat::ChannelsLast);
  auto y = at::empty({g.B, g.C, g.Ho, g.Wo}, nhwc);
  const auto st = w.strides();
  const int64_t ws[6] = {st[0], st[1], st[2], st[3], st[4], st[5]};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "aggregate_nhwc", [&] {
    MMEVO_CALL(aggregate_forward_nhwc, scalar_t, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
               ws, y.data_ptr<scalar_t>(), g);
  });
  return y;
}

at::Tensor tiled_transpose(const at::Tensor& gy, const at::Tensor& w, const Geometry& g) {
  auto gx = at::empty({g.B, g.C, g.H, g.W}, gy.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gy.scalar_type(), "aggregate_t", [&] {
    MMEVO_CALL(aggregate_transpose, scalar_t, gy.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
               gx.data_ptr<scalar_t>(), g);
  });
  return gx;
}

at::Tensor tiled_correlate(const at::Tensor& q, const at::Tensor& x, const Geometry& g,
                           bool softmax) {
  auto out = at::empty({g.B, g.G, g.K, g.K, g.Ho, g.Wo}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "correlate", [&] {
    MMEVO_CALL(correlate, scalar_t, q.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
               out.data_ptr<scalar_t>(), g, softmax);
  });
  return out;
}

std::string isa_name() {
  return kIsa == Isa::kAvx512 ? "avx512" : kIsa == Isa::kAvx2 ? "avx2" : "base";
}

}  // namespace mmevo
