// CPU kernels of mmevo.ops: aggregation, its transpose and local correlation.
//
// Python validates every argument (mmevo/ops/evolution.py), turns reflect
// padding into an explicit padded input (mmevo/ops/library.py) and makes the
// tensors contiguous (mmevo/ops/cpp_backend.py), so the kernels here only see
// contiguous NCHW tensors and zero padding. The checks below are a last guard
// against misuse of the private entry points.
#include <torch/extension.h>

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

// bf16 / fp16 accumulate in fp32; fp32 and fp64 in their own type.
template <typename T> struct Acc { using type = T; };
template <> struct Acc<c10::BFloat16> { using type = float; };
template <> struct Acc<c10::Half> { using type = float; };

struct Geometry {
  int64_t B, C, H, W, G, K, Ho, Wo, s, p, d;
};

// Tasks per parallel chunk: at least ~32K FMAs each, so that small maps (and
// gradcheck-sized ones) run inline instead of paying for a parallel region.
inline int64_t grain_for(int64_t fmas_per_task) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, fmas_per_task));
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define MMEVO_X86_DISPATCH 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
namespace avx512 {
constexpr int kVecBytes = 64;
#include "evolution_kernels.h"
}  // namespace avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
constexpr int kVecBytes = 32;
#include "evolution_kernels.h"
}  // namespace avx2
#pragma GCC pop_options
#endif
namespace base {
constexpr int kVecBytes = 16;
#include "evolution_kernels.h"
}  // namespace base

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

void check_inputs(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "mmevo._ext.", op,
              ": CPU tensors expected");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "mmevo._ext.", op,
              ": contiguous tensors expected");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "mmevo._ext.", op, ": dtypes differ");
  TORCH_CHECK(a.dim() == 4, "mmevo._ext.", op, ": 4-D feature map expected, got ", a.sizes());
}

// The window geometry of an input x (B, C, H, W), with every relation the
// kernels rely on checked: they divide by C / G and by the channel block
// (so C >= 1), and read H x W maps through Ho x Wo windows.
Geometry make_geometry(const char* op, const at::Tensor& x, int64_t G, int64_t K, int64_t s,
                       int64_t p, int64_t d) {
  TORCH_CHECK(G >= 1 && K >= 1 && s >= 1 && d >= 1 && p >= 0, "mmevo._ext.", op,
              ": bad window arguments: groups=", G, ", kernel_size=", K, ", stride=", s,
              ", padding=", p, ", dilation=", d);
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(C >= 1, "mmevo._ext.", op, ": input of ", x.sizes(),
              " has no channels (the Python entry, mmevo.ops, handles C = 0)");
  TORCH_CHECK(C % G == 0, "mmevo._ext.", op, ": channels (", C,
              ") must be divisible by groups (", G, ")");
  TORCH_CHECK(H >= 1 && W >= 1, "mmevo._ext.", op, ": empty input map ", x.sizes());
  const int64_t Ho = (H + 2 * p - d * (K - 1) - 1) / s + 1;
  const int64_t Wo = (W + 2 * p - d * (K - 1) - 1) / s + 1;
  TORCH_CHECK(H + 2 * p - d * (K - 1) >= 1 && W + 2 * p - d * (K - 1) >= 1, "mmevo._ext.", op,
              ": input map ", H, "x", W, " is too small for kernel_size=", K, ", padding=", p,
              ", dilation=", d);
  return Geometry{B, C, H, W, G, K, Ho, Wo, s, p, d};
}

// A (B, C, Ho, Wo) map at the output positions of g: y, grad_y or query.
void check_out_map(const char* op, const char* name, const at::Tensor& t, const Geometry& g) {
  TORCH_CHECK(t.size(0) == g.B && t.size(1) == g.C && t.size(2) == g.Ho && t.size(3) == g.Wo,
              "mmevo._ext.", op, ": ", name, " must be (B, C, H_out, W_out) = [", g.B, ", ",
              g.C, ", ", g.Ho, ", ", g.Wo, "] for an input of [", g.B, ", ", g.C, ", ", g.H,
              ", ", g.W, "], stride=", g.s, ", padding=", g.p, ", dilation=", g.d, ", got ",
              t.sizes());
}

void check_kernel(const char* op, const at::Tensor& w, const Geometry& g) {
  TORCH_CHECK(w.dim() == 6 && w.size(0) == g.B && w.size(1) == g.G && w.size(2) == g.K &&
                  w.size(3) == g.K && w.size(4) == g.Ho && w.size(5) == g.Wo,
              "mmevo._ext.", op, ": kernel must be (B, G, K, K, H_out, W_out) = [", g.B, ", ",
              g.G, ", ", g.K, ", ", g.K, ", ", g.Ho, ", ", g.Wo, "] for an input of [", g.B,
              ", ", g.C, ", ", g.H, ", ", g.W, "], stride=", g.s, ", padding=", g.p,
              ", dilation=", g.d, ", got ", w.sizes());
}

// The kernel's groups and window size, once it is known to be 6-D.
std::pair<int64_t, int64_t> kernel_groups_size(const char* op, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 6, "mmevo._ext.", op,
              ": kernel must be 6-D (B, G, K, K, H_out, W_out), got ", w.sizes());
  return {w.size(1), w.size(2)};
}

// y = A(x, w): (B, C, H, W), (B, G, K, K, Ho, Wo) -> (B, C, Ho, Wo).
at::Tensor aggregate_forward(const at::Tensor& x, const at::Tensor& w, int64_t s, int64_t p,
                             int64_t d) {
  constexpr const char* op = "aggregate_forward";
  check_inputs(op, x, w);
  const auto [G, K] = kernel_groups_size(op, w);
  const Geometry g = make_geometry(op, x, G, K, s, p, d);
  check_kernel(op, w, g);
  auto y = at::empty({g.B, g.C, g.Ho, g.Wo}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "aggregate", [&] {
    MMEVO_CALL(aggregate_forward, scalar_t, x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
               y.data_ptr<scalar_t>(), g);
  });
  return y;
}

// grad_x = At(gy, w): the transpose of A in x, for an input of H x W.
at::Tensor aggregate_transpose(const at::Tensor& gy, const at::Tensor& w, int64_t H, int64_t W,
                               int64_t s, int64_t p, int64_t d) {
  constexpr const char* op = "aggregate_transpose";
  check_inputs(op, gy, w);
  const auto [G, K] = kernel_groups_size(op, w);
  TORCH_CHECK(H >= 1 && W >= 1, "mmevo._ext.", op, ": input size must be >= 1, got ", H, "x",
              W);
  auto gx = at::empty({gy.size(0), gy.size(1), H, W}, gy.options());
  const Geometry g = make_geometry(op, gx, G, K, s, p, d);
  check_out_map(op, "grad_y", gy, g);
  check_kernel(op, w, g);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gy.scalar_type(), "aggregate_t", [&] {
    MMEVO_CALL(aggregate_transpose, scalar_t, gy.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
               gx.data_ptr<scalar_t>(), g);
  });
  return gx;
}

// out = Corr(q, x): (B, C, Ho, Wo), (B, C, H, W) -> (B, G, K, K, Ho, Wo);
// with softmax, normalised over each pixel's K x K window.
at::Tensor correlate(const at::Tensor& q, const at::Tensor& x, int64_t G, int64_t K, int64_t s,
                     int64_t p, int64_t d, bool softmax) {
  constexpr const char* op = "correlate";
  check_inputs(op, q, x);
  TORCH_CHECK(x.dim() == 4, "mmevo._ext.", op, ": 4-D key expected, got ", x.sizes());
  const Geometry g = make_geometry(op, x, G, K, s, p, d);
  check_out_map(op, "query", q, g);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("aggregate_forward", &mmevo::aggregate_forward, "y = A(x, w)");
  m.def("aggregate_transpose", &mmevo::aggregate_transpose, "grad_x = At(grad_y, w)");
  m.def("correlate", &mmevo::correlate, "out = Corr(q, x), softmax over the window if asked");
  m.def("isa", &mmevo::isa_name, "instruction set the kernels dispatch to");
}
