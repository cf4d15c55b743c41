// mmevo::fused_local_attention and its backward: local self-attention (the
// window correlation of query and key, plus an optional relative key
// embedding and logit bias, a softmax over each K x K window, and the
// aggregation of value with it) in one pass over the taps, with an online
// softmax per pixel, so the (B, G, K, K, H_out, W_out) logits and weights
// are never written; the forward also returns each pixel's log-sum-exp.
// The backward recomputes the logits tap by tap (flash-attention style):
//   P = exp(logit - lse), dP = sum_c' grad_out * value, D = sum_c' grad_out
//   * out, dlogit = P * (dP - D), and from them the gradients of query, key
//   (scattered), value (scattered), rel_embed and rel_bias.
//
// The operators are defined here (a fragment of the mmevo library) with their
// CPU kernels (fused_attention_kernels.h); Python
// (mmevo/ops/fused_attention.py) checks the arguments first with the
// messages users see, and adds the fake kernels, autograd and the other
// backends. The checks below guard C++ callers.
//
// The kernels read every input through its strides, so channels-last
// inputs run in place: a train step at B8, C64, 56x56 takes 1.1x its NCHW
// time, where contiguous copies of the inputs would add 4 ms each (8 of
// them per step, 0.4x).
#include "evolution.h"
#include "fused_checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mmevo {

// A checked attention geometry: query (B, C, Ho, Wo), key (B, C, H, W),
// value (B, Cv, H, W), G dividing C and Cv, B >= 1; each map may also be a
// grouped view, (B, G, C / G, H, W), of any strides.
struct AttnShape {
  int64_t B, C, Cv, H, W, G, K, Ho, Wo, s, p, d;
  bool reflect;
};

// Strides (elements) of a map read as (B, G, C / G, H, W): g steps a group,
// c a channel within it.
struct GroupStrides {
  int64_t b, g, c, h, w;
};

// The map index that position pos of a padded axis of `size` reads: itself
// inside the map; outside, -1 (zeros) or the numpy-style reflection,
// folded as often as needed (the edge is not repeated, as reflect.py).
inline int64_t source_index(int64_t pos, int64_t size, bool reflect) {
  if (pos >= 0 && pos < size) return pos;
  if (!reflect) return -1;
  if (size == 1) return 0;
  const int64_t period = 2 * (size - 1);
  int64_t r = pos % period;
  if (r < 0) r += period;
  return r >= size ? period - r : r;
}

#define MMEVO_UNIT_KERNELS "fused_attention_kernels.h"
#include "isa_kernels.h"

namespace {

using fused::check_floating;
using fused::checked_out;
using fused::kInt64Max;

// The (B, C, H, W) of a map given as such or grouped, (B, G, C / G, H, W).
std::array<int64_t, 4> flat_sizes(const char* name, const at::Tensor& t, int64_t G,
                                  const char* form, const char* grouped) {
  TORCH_CHECK_VALUE(t.dim() == 4 || (t.dim() == 5 && t.size(1) == G), name, " must be ", form,
                    " or ", grouped, " with G = groups = ", G, ", got ", t.sizes());
  if (t.dim() == 4) return {t.size(0), t.size(1), t.size(2), t.size(3)};
  return {t.size(0), t.size(1) * t.size(2), t.size(3), t.size(4)};
}

// Every relation of the arguments (those of mmevo/ops/fused_attention.py).
AttnShape check_args(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& rel_embed,
                     const std::optional<at::Tensor>& rel_bias, int64_t G, int64_t K,
                     int64_t s, int64_t p, int64_t d, c10::string_view mode) {
  TORCH_CHECK_VALUE(G >= 1, "groups must be >= 1, got ", G);
  const auto qs =
      flat_sizes("query", query, G, "(B, C, H_out, W_out)", "(B, G, C / G, H_out, W_out)");
  const auto ks = flat_sizes("key", key, G, "(B, C, H, W)", "(B, G, C / G, H, W)");
  const auto vs = flat_sizes("value", value, G, "(B, C_v, H, W)", "(B, G, C_v / G, H, W)");
  check_floating("query", query, "query", query);
  check_floating("key", key, "query", query);
  check_floating("value", value, "query", query);
  if (rel_embed) check_floating("rel_embed", *rel_embed, "query", query);
  if (rel_bias) check_floating("rel_bias", *rel_bias, "query", query);
  TORCH_CHECK_VALUE(K >= 1, "kernel_size must be >= 1, got ", K);
  TORCH_CHECK_VALUE(s >= 1, "stride must be >= 1, got ", s);
  TORCH_CHECK_VALUE(d >= 1, "dilation must be >= 1, got ", d);
  TORCH_CHECK_VALUE(p >= 0, "padding must be >= 0, got ", p);
  TORCH_CHECK_VALUE(mode == "zeros" || mode == "reflect",
                    "padding_mode must be one of ('zeros', 'reflect'), got '", mode, "'");
  TORCH_CHECK_VALUE(K == 1 || d <= kInt64Max / (K - 1), "dilation=", d, " with kernel_size=", K,
                    ": the window span (kernel_size - 1) * dilation does not fit in int64");
  TORCH_CHECK_VALUE(K <= 3037000499, "kernel_size=", K, ": K * K does not fit in int64");
  const int64_t B = ks[0], C = ks[1], Cv = vs[1];
  TORCH_CHECK_VALUE(C % G == 0, "key channels (", C, ") must be divisible by groups=", G);
  TORCH_CHECK_VALUE(Cv % G == 0, "value channels (", Cv, ") must be divisible by groups=", G);
  TORCH_CHECK_VALUE(vs[0] == B && vs[2] == ks[2] && vs[3] == ks[3],
                    "value must be (B, C_v, H, W) with the B, H, W of key ", key.sizes(),
                    ", got ", value.sizes());
  const int64_t Ho = checked_out("key height", ks[2], K, s, p, d);
  const int64_t Wo = checked_out("key width", ks[3], K, s, p, d);
  TORCH_CHECK_VALUE(qs[0] == B && qs[1] == C && qs[2] == Ho && qs[3] == Wo,
                    "query must be (B, C, H_out, W_out) = (", B, ", ", C, ", ", Ho, ", ", Wo,
                    ") for key ", key.sizes(), ", got ", query.sizes());
  if (rel_embed)
    TORCH_CHECK_VALUE(rel_embed->dim() == 3 && rel_embed->size(0) == C &&
                          rel_embed->size(1) == K && rel_embed->size(2) == K,
                      "rel_embed must be (C, K, K) = (", C, ", ", K, ", ", K, "), got ",
                      rel_embed->sizes());
  if (rel_bias)
    TORCH_CHECK_VALUE(rel_bias->dim() == 3 && rel_bias->size(0) == G &&
                          rel_bias->size(1) == K && rel_bias->size(2) == K,
                      "rel_bias must be (G, K, K) = (", G, ", ", K, ", ", K, "), got ",
                      rel_bias->sizes());
  return AttnShape{B, C, Cv, ks[2], ks[3], G, K, Ho, Wo, s, p, d,
                   mode == "reflect" && p > 0};
}

at::ScalarType acc_type(const at::Tensor& t) {
  return at::isReducedFloatingType(t.scalar_type()) ? at::kFloat : t.scalar_type();
}

GroupStrides strides(const at::Tensor& t, int64_t G) {
  if (t.dim() == 5) return {t.stride(0), t.stride(1), t.stride(2), t.stride(3), t.stride(4)};
  return {t.stride(0), t.size(1) / G * t.stride(1), t.stride(1), t.stride(2), t.stride(3)};
}

// The layout of out: value's, as the aggregation's output follows its input
// (contiguous for a grouped value).
at::MemoryFormat out_layout(const at::Tensor& value) {
  return value.dim() == 4 && strictly_channels_last(value) ? at::MemoryFormat::ChannelsLast
                                                           : at::MemoryFormat::Contiguous;
}

std::tuple<at::Tensor, at::Tensor> fused_local_attention_cpu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& rel_embed, const std::optional<at::Tensor>& rel_bias,
    int64_t groups, int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
    c10::string_view padding_mode) {
  const AttnShape a = check_args(query, key, value, rel_embed, rel_bias, groups, kernel_size,
                                 stride, padding, dilation, padding_mode);
  TORCH_CHECK_VALUE(query.device().is_cpu(),
                    "fused_local_attention's C++ kernel runs CPU tensors, got ", query.device());
  auto out = at::empty({a.B, a.Cv, a.Ho, a.Wo}, value.options().memory_format(out_layout(value)));
  auto lse = at::empty({a.B, a.G, a.Ho, a.Wo}, query.options().dtype(acc_type(query)));
  if (a.B == 0) return {out, lse};
  // C == 0 and Cv == 0 need nothing apart: the sums over no channels are 0.
  const auto r = rel_embed ? rel_embed->contiguous() : at::Tensor();
  const auto bias = rel_bias ? rel_bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(),
                                  "fused_local_attention", [&] {
    using A = at::opmath_type<scalar_t>;
    MMEVO_ISA_CALL_ROWS(attention_forward<scalar_t>(
        query.data_ptr<scalar_t>(), strides(query, a.G), key.data_ptr<scalar_t>(),
        strides(key, a.G), value.data_ptr<scalar_t>(), strides(value, a.G),
        r.defined() ? r.data_ptr<scalar_t>() : nullptr,
        bias.defined() ? bias.data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
        strides(out, a.G), lse.data_ptr<A>(), a), a.Wo * sizeof(A));
  });
  return {out, lse};
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// grad_rel_embed / grad_rel_bias of an absent rel_embed / rel_bias: a
// zero-size tensor (shape (0,)).
Grads fused_local_attention_backward_cpu(
    const at::Tensor& grad, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& rel_embed,
    const std::optional<at::Tensor>& rel_bias, int64_t groups, int64_t kernel_size,
    int64_t stride, int64_t padding, int64_t dilation, c10::string_view padding_mode) {
  const AttnShape a = check_args(query, key, value, rel_embed, rel_bias, groups, kernel_size,
                                 stride, padding, dilation, padding_mode);
  TORCH_CHECK_VALUE(query.device().is_cpu(),
                    "fused_local_attention_backward's C++ kernel runs CPU tensors, got ",
                    query.device());
  check_floating("grad", grad, "query", query);
  check_floating("out", out, "query", query);
  for (const auto* t : {&grad, &out})
    TORCH_CHECK_VALUE(t->dim() == 4 && t->size(0) == a.B && t->size(1) == a.Cv &&
                          t->size(2) == a.Ho && t->size(3) == a.Wo,
                      t == &grad ? "grad" : "out", " must be (B, C_v, H_out, W_out) = (", a.B,
                      ", ", a.Cv, ", ", a.Ho, ", ", a.Wo, "), got ", t->sizes());
  TORCH_CHECK_TYPE(lse.scalar_type() == acc_type(query), "lse must be ",
                   acc_type(query), " for ", query.scalar_type(), " inputs, got ",
                   lse.scalar_type());
  TORCH_CHECK_VALUE(lse.dim() == 4 && lse.size(0) == a.B && lse.size(1) == a.G &&
                        lse.size(2) == a.Ho && lse.size(3) == a.Wo &&
                        lse.device() == query.device(),
                    "lse must be (B, G, H_out, W_out) = (", a.B, ", ", a.G, ", ", a.Ho, ", ",
                    a.Wo, ") on ", query.device(), ", got ", lse.sizes(), " on ", lse.device());
  const int64_t KK = a.K * a.K;
  const auto opts = query.options();
  auto gq = at::empty({a.B, a.C, a.Ho, a.Wo}, opts);
  const auto acc = opts.dtype(acc_type(query));
  auto gk = at::zeros({a.B, a.C, a.H, a.W}, acc);
  auto gv = at::zeros({a.B, a.Cv, a.H, a.W}, acc);
  const int64_t part = a.C / a.G * KK + KK;
  auto partial = at::zeros({a.B, a.G, part}, acc);
  const auto r = rel_embed ? rel_embed->contiguous() : at::Tensor();
  const auto bias = rel_bias ? rel_bias->contiguous() : at::Tensor();
  const auto l = lse.contiguous();
  if (a.B > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(),
                                    "fused_local_attention_backward", [&] {
      using A = at::opmath_type<scalar_t>;
      MMEVO_ISA_CALL_ROWS(attention_backward<scalar_t>(
          grad.data_ptr<scalar_t>(), strides(grad, a.G), out.data_ptr<scalar_t>(),
          strides(out, a.G), l.data_ptr<A>(), query.data_ptr<scalar_t>(), strides(query, a.G),
          key.data_ptr<scalar_t>(), strides(key, a.G), value.data_ptr<scalar_t>(),
          strides(value, a.G),
          r.defined() ? r.data_ptr<scalar_t>() : nullptr,
          bias.defined() ? bias.data_ptr<scalar_t>() : nullptr, gq.data_ptr<scalar_t>(),
          gk.data_ptr<A>(), gv.data_ptr<A>(), partial.data_ptr<A>(), a), a.Wo * sizeof(A));
    });
  }
  // The batch's partial sums in their order (deterministic).
  auto sums = at::zeros({a.G, part}, acc);
  for (int64_t b = 0; b < a.B; ++b) sums.add_(partial[b]);
  const auto st = query.scalar_type();
  // Contiguous, as the fake kernel says (narrow leaves views).
  auto gr = rel_embed
                ? sums.narrow(1, 0, part - KK).reshape({a.C, a.K, a.K}).to(st).contiguous()
                : at::empty({0}, opts);
  auto gb = rel_bias
                ? sums.narrow(1, part - KK, KK).reshape({a.G, a.K, a.K}).to(st).contiguous()
                : at::empty({0}, opts);
  // In the shapes of the inputs (grouped or not), as the fake kernel says.
  return {gq.view(query.sizes()), gk.to(st).view(key.sizes()), gv.to(st).view(value.sizes()), gr,
          gb};
}

}  // namespace
}  // namespace mmevo

TORCH_LIBRARY_FRAGMENT(mmevo, m) {
  m.set_python_module("mmevo.ops.fused_attention");
  m.def("fused_local_attention(Tensor query, Tensor key, Tensor value, Tensor? rel_embed, "
        "Tensor? rel_bias, int groups, int kernel_size, int stride, int padding, int dilation, "
        "str padding_mode) -> (Tensor, Tensor)");
  m.def("fused_local_attention_backward(Tensor grad, Tensor out, Tensor lse, Tensor query, "
        "Tensor key, Tensor value, Tensor? rel_embed, Tensor? rel_bias, int groups, "
        "int kernel_size, int stride, int padding, int dilation, str padding_mode) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmevo, CPU, m) {
  m.impl("fused_local_attention", &mmevo::fused_local_attention_cpu);
  m.impl("fused_local_attention_backward", &mmevo::fused_local_attention_backward_cpu);
}
