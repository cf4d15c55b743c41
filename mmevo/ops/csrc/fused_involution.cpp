// mmevo::fused_involution and its backward: the involution of x with the
// kernel W = span(z) = S z + bias (a 1x1 convolution of the reduced map z),
// computed tile by tile in cache and never written (fused_involution_kernels.h).
//
// The operators are defined here (a fragment of the mmevo library) with their
// CPU kernels; Python (mmevo/ops/fused_involution.py) checks the arguments
// first with the messages users see, and adds the fake kernels, autograd and
// the other backends. The checks below guard C++ callers. Geometries whose
// tile buffers would not be bounded by the maps (tiled_fits: very large
// strides or dilations) run the unfused composition instead: W by a matmul,
// then the mmevo window operators.
#include "evolution.h"
#include "fused_checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mmevo {

#define MMEVO_UNIT_KERNELS "fused_involution_kernels.h"
#include "isa_kernels.h"

namespace {

using fused::check_floating;
using fused::checked_out;
using fused::isa_level;
using fused::kInt64Max;

// Every relation of the arguments (those of mmevo/ops/fused_involution.py);
// returns the geometry, with p = d * (K - 1) / 2.
Geometry check_args(const at::Tensor& input, const at::Tensor& z, const at::Tensor& weight,
                    const std::optional<at::Tensor>& bias, int64_t K, int64_t s, int64_t d,
                    int64_t G) {
  TORCH_CHECK_VALUE(input.dim() == 4, "input must be (B, C, H, W), got ", input.sizes());
  TORCH_CHECK_VALUE(z.dim() == 4, "z must be (B, C_r, H_out, W_out), got ", z.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1,
                    "span_weight must be (G*K*K, C_r, 1, 1), got ", weight.sizes());
  check_floating("input", input, "input", input);
  check_floating("z", z, "input", input);
  check_floating("span_weight", weight, "input", input);
  if (bias) check_floating("span_bias", *bias, "input", input);
  TORCH_CHECK_VALUE(K >= 1 && K % 2 == 1, "kernel_size must be odd and >= 1, got ", K);
  TORCH_CHECK_VALUE(s >= 1, "stride must be >= 1, got ", s);
  TORCH_CHECK_VALUE(d >= 1, "dilation must be >= 1, got ", d);
  TORCH_CHECK_VALUE(G >= 1, "groups must be >= 1, got ", G);
  TORCH_CHECK_VALUE(K == 1 || d <= kInt64Max / (K - 1), "dilation=", d, " with kernel_size=", K,
                    ": the window span (kernel_size - 1) * dilation does not fit in int64");
  const int64_t B = input.size(0), C = input.size(1), Cr = z.size(1);
  TORCH_CHECK_VALUE(C % G == 0, "input channels (", C, ") must be divisible by groups=", G);
  int64_t rows = 0;
  TORCH_CHECK_VALUE(K <= 3037000499 && !__builtin_mul_overflow(K * K, G, &rows),
                    "groups=", G, " with kernel_size=", K,
                    ": span_weight's G*K*K rows do not fit in int64");
  TORCH_CHECK_VALUE(weight.size(0) == rows && weight.size(1) == Cr,
                    "span_weight must be (G*K*K, C_r, 1, 1) = (", rows, ", ", Cr,
                    ", 1, 1) for groups=", G, ", kernel_size=", K, " and z with C_r=", Cr,
                    " channels, got ", weight.sizes());
  if (bias)
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == rows,
                      "span_bias must be (G*K*K,) = (", rows, ",), got ", bias->sizes());
  const int64_t p = d * (K - 1) / 2;
  // the padding is no argument here: name what it comes from
  TORCH_CHECK_VALUE(std::max(input.size(2), input.size(3)) <= kInt64Max - 2 * p, "dilation=", d,
                    " with kernel_size=", K, " pads the input by ", p,
                    " (\"same\"), and input ", input.size(2), " x ", input.size(3),
                    " plus twice that does not fit in int64");
  const int64_t Ho = checked_out("input height", input.size(2), K, s, p, d);
  const int64_t Wo = checked_out("input width", input.size(3), K, s, p, d);
  TORCH_CHECK_VALUE(z.size(0) == B && z.size(2) == Ho && z.size(3) == Wo,
                    "z must be (B, C_r, H_out, W_out) = (", B, ", ", Cr, ", ", Ho, ", ", Wo,
                    ") for input ", input.sizes(), ", got ", z.sizes());
  return Geometry{B, C, input.size(2), input.size(3), G, K, Ho, Wo, s, p, d};
}

at::ScalarType acc_type(const at::Tensor& t) {
  return at::isReducedFloatingType(t.scalar_type()) ? at::kFloat : t.scalar_type();
}

// The unfused composition (the geometries the tiled kernels do not take):
// W = span(z), (B, G, K, K, Ho, Wo).
at::Tensor span(const at::Tensor& z, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, const Geometry& g) {
  const int64_t Cr = z.size(1);
  auto w = at::matmul(weight.reshape({g.G * g.K * g.K, Cr}), z.reshape({g.B, Cr, g.Ho * g.Wo}));
  if (bias) w = w + bias->view({-1, 1});
  return w.view({g.B, g.G, g.K, g.K, g.Ho, g.Wo});
}

template <typename Fn>
c10::TypedOperatorHandle<Fn> mmevo_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

// Channels-last output maps of fewer pixels take the kernel map from one
// matmul: there the per-row kernels of the fused kernel stream all of S
// once per row (RedNet-50's stage 4, 7², G*K*K = 1568: 1.26x the time of
// the matmul and the aggregation at B1; 14²: 0.94x, 56²: 0.80x;
// benchmark_ops.py --inference, docs/benchmarks.md).
constexpr int64_t kNhwcMinFusedPixels = 14 * 14;

at::Tensor fused_involution_cpu(const at::Tensor& input, const at::Tensor& z,
                                const at::Tensor& span_weight,
                                const std::optional<at::Tensor>& span_bias, int64_t kernel_size,
                                int64_t stride, int64_t dilation, int64_t groups) {
  const BelowAutocast below_autocast;
  const Geometry g =
      check_args(input, z, span_weight, span_bias, kernel_size, stride, dilation, groups);
  TORCH_CHECK_VALUE(input.device().is_cpu(), "fused_involution's C++ kernel runs CPU tensors, got ",
                    input.device());
  const bool nhwc = strictly_channels_last(input);
  const auto layout = nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (g.B == 0 || g.C == 0)
    return at::zeros({g.B, g.C, g.Ho, g.Wo}, input.options().memory_format(layout));
  static const auto aggregate = mmevo_op<at::Tensor(
      const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, c10::string_view)>(
      "mmevo::evolution_aggregate");
  if (!tiled_fits(g)) {
    return aggregate.call(input.contiguous(), span(z, span_weight, span_bias, g).contiguous(),
                          g.s, g.p, g.d, "zeros")
        .contiguous(layout);
  }
  const auto S = span_weight.contiguous();
  const auto b = span_bias ? span_bias->contiguous() : at::Tensor();
  const int64_t Cr = z.size(1);
  if (nhwc && g.Ho * g.Wo < kNhwcMinFusedPixels) {
    // The kernel map by one matmul, pixel-major as a channels-last span
    // convolution leaves it, then the channels-last aggregation.
    const auto z2 = z.permute({0, 2, 3, 1}).reshape({-1, Cr});
    const auto S2 = S.view({g.G * g.K * g.K, Cr}).t();
    const auto w = b.defined() ? at::addmm(b, z2, S2) : at::mm(z2, S2);
    return aggregate.call(
        input, w.view({g.B, g.Ho, g.Wo, g.G, g.K, g.K}).permute({0, 3, 4, 5, 1, 2}), g.s,
        g.p, g.d, "zeros");
  }
  if (nhwc) {
    // In place: x and y channels-last, z in any layout (Inductor's
    // convolutions leave both channels-last).
    auto y = at::empty({g.B, g.C, g.Ho, g.Wo}, input.options().memory_format(layout));
    const auto zs = z.strides();
    const int64_t zst[4] = {zs[0], zs[1], zs[2], zs[3]};
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(),
                                    "fused_involution_nhwc", [&] {
      const scalar_t* bp = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
      MMEVO_ISA_CALL(fused_forward_nhwc<scalar_t>(input.data_ptr<scalar_t>(),
                                                  z.data_ptr<scalar_t>(), zst,
                                                  S.data_ptr<scalar_t>(), bp,
                                                  y.data_ptr<scalar_t>(), g, Cr));
    });
    return y;
  }
  const auto x = input.contiguous(), zc = z.contiguous();
  auto y = at::empty({g.B, g.C, g.Ho, g.Wo}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_involution",
                                  [&] {
    const scalar_t* bp = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
    MMEVO_ISA_CALL(fused_forward<scalar_t>(x.data_ptr<scalar_t>(), zc.data_ptr<scalar_t>(),
                                             S.data_ptr<scalar_t>(), bp,
                                             y.data_ptr<scalar_t>(), g, Cr));
  });
  return y;
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The unfused backward: W and its gradient written, for the geometries
// fused_involution_cpu also composes.
Grads composed_backward(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& z,
                        const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        const Geometry& g) {
  static const auto transpose =
      mmevo_op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
                          int64_t, int64_t, c10::string_view)>(
          "mmevo::evolution_aggregate_transpose");
  static const auto correlation =
      mmevo_op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
                          int64_t, int64_t, c10::string_view)>("mmevo::local_correlation");
  const auto w = span(z, weight, bias, g).contiguous();
  const int64_t Cr = z.size(1), rows = g.G * g.K * g.K, P = g.Ho * g.Wo;
  auto gx = transpose.call(gy, w, g.H, g.W, g.s, g.p, g.d, "zeros");
  const auto acc = acc_type(gy);
  const auto dw = correlation.call(gy, x, g.G, g.K, g.s, g.p, g.d, "zeros")
                      .reshape({g.B, rows, P})
                      .to(acc);
  const auto z3 = z.reshape({g.B, Cr, P}).to(acc);
  auto gw = at::bmm(dw, z3.transpose(1, 2)).sum(0).view({rows, Cr, 1, 1});
  auto gb = dw.sum({0, 2});
  auto gz = at::matmul(weight.reshape({rows, Cr}).to(acc).t(), dw).view({g.B, Cr, g.Ho, g.Wo});
  const auto st = gy.scalar_type();
  return {gx, gz.to(st), gw.to(st), gb.to(st)};
}

// Runs the backward kernel of the selected instruction set; returns the
// runs' partial sums (nslots, G*K*K * Cr + G*K*K).
template <typename T>
at::Tensor backward_kernel(const at::Tensor& gy, const at::Tensor& x, const at::Tensor& z,
                           const at::Tensor& S, const at::Tensor& b, at::Tensor& gx,
                           at::Tensor& gz, const Geometry& g) {
  using A = at::opmath_type<T>;
  const int64_t Cr = z.size(1), rows = g.G * g.K * g.K;
  const T* bp = b.defined() ? b.data_ptr<T>() : nullptr;
  at::Tensor partial;
  const auto run = [&](const auto& plan, auto kernel) {
    partial = at::zeros({plan.nslots, rows * (Cr + 1)}, gx.options());
    kernel(gy.data_ptr<T>(), x.data_ptr<T>(), z.data_ptr<T>(), S.data_ptr<T>(), bp,
           gx.data_ptr<A>(), gz.data_ptr<T>(), partial.data_ptr<A>(), g, Cr, plan);
  };
#ifdef MMEVO_X86_DISPATCH
  if (isa_level() == 2) run(avx512::FusedPlan(g, Cr), avx512::fused_backward<T>);
  else if (isa_level() == 1) run(avx2::FusedPlan(g, Cr), avx2::fused_backward<T>);
  else run(base::FusedPlan(g, Cr), base::fused_backward<T>);
#else
  run(base::FusedPlan(g, Cr), base::fused_backward<T>);
#endif
  return partial;
}

Grads fused_involution_backward_cpu(const at::Tensor& grad, const at::Tensor& input,
                                    const at::Tensor& z, const at::Tensor& span_weight,
                                    const std::optional<at::Tensor>& span_bias,
                                    int64_t kernel_size, int64_t stride, int64_t dilation,
                                    int64_t groups) {
  const BelowAutocast below_autocast;
  const Geometry g =
      check_args(input, z, span_weight, span_bias, kernel_size, stride, dilation, groups);
  TORCH_CHECK_VALUE(input.device().is_cpu(),
                    "fused_involution_backward's C++ kernel runs CPU tensors, got ",
                    input.device());
  check_floating("grad", grad, "input", input);
  TORCH_CHECK_VALUE(grad.dim() == 4 && grad.size(0) == g.B && grad.size(1) == g.C &&
                        grad.size(2) == g.Ho && grad.size(3) == g.Wo,
                    "grad must be (B, C, H_out, W_out) = (", g.B, ", ", g.C, ", ", g.Ho, ", ",
                    g.Wo, "), got ", grad.sizes());
  const int64_t Cr = z.size(1), rows = g.G * g.K * g.K;
  if (g.B == 0 || g.C == 0)
    return {at::zeros_like(input, at::MemoryFormat::Contiguous),
            at::zeros_like(z, at::MemoryFormat::Contiguous),
            at::zeros({rows, Cr, 1, 1}, span_weight.options()),
            at::zeros({rows}, span_weight.options())};
  const auto gy = grad.contiguous(), x = input.contiguous(), zc = z.contiguous();
  const auto S = span_weight.contiguous();
  const auto b = span_bias ? span_bias->contiguous() : at::Tensor();
  if (!tiled_fits(g)) return composed_backward(gy, x, zc, S, span_bias, g);
  const auto acc = acc_type(x);
  auto gx = at::empty({g.B, g.C, g.H, g.W}, x.options().dtype(acc));
  auto gz = at::empty({g.B, Cr, g.Ho, g.Wo}, x.options());
  at::Tensor partial;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(),
                                  "fused_involution_backward", [&] {
    partial = backward_kernel<scalar_t>(gy, x, zc, S, b, gx, gz, g);
  });
  // The runs' partial sums in their order (not a tree whose shape could
  // follow the thread count).
  auto sums = partial[0].clone();
  for (int64_t i = 1; i < partial.size(0); ++i) sums.add_(partial[i]);
  const auto st = x.scalar_type();
  auto gw = sums.narrow(0, 0, rows * Cr).view({rows, Cr, 1, 1}).to(st);
  auto gb = sums.narrow(0, rows * Cr, rows).to(st);
  return {gx.to(st), gz, gw, gb};
}

}  // namespace
}  // namespace mmevo

TORCH_LIBRARY_FRAGMENT(mmevo, m) {
  m.set_python_module("mmevo.ops.fused_involution");
  // flexible_layout: Inductor passes x and z in the layout its convolutions
  // left them (channels-last), which the CPU kernel reads in place.
  m.def("fused_involution(Tensor input, Tensor z, Tensor span_weight, Tensor? span_bias, "
        "int kernel_size, int stride, int dilation, int groups) -> Tensor",
        {at::Tag::flexible_layout});
  m.def("fused_involution_backward(Tensor grad, Tensor input, Tensor z, Tensor span_weight, "
        "Tensor? span_bias, int kernel_size, int stride, int dilation, int groups) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmevo, CPU, m) {
  m.impl("fused_involution", &mmevo::fused_involution_cpu);
  m.impl("fused_involution_backward", &mmevo::fused_involution_backward_cpu);
}
