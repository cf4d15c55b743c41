// mmevo::acmix_conv and its backward: the grouped convolution of ACmix's
// conv path (mmevo/layers/acmix.py, its CPU fast path), many small groups
// (16 to 128 groups of 12 -> 4 channels in ACmix-ResNet-50), on the layer's
// channels-last q/k/v buffer read in place, where group g holds the J
// channels j * G + g (one head channel of each q, k and v head):
//
//   out[b, g*O + h, i, o] = sum_{j, u, v} weight[g*O + h, j, u, v]
//                           * input[b, j*G + g, i*s - p + u, o*s - p + v]
//
// that is conv2d(input's channels taken in (g, j) order, weight, stride=s,
// padding=p, groups=G). The kernels (acmix_conv_kernels.h) run vectors
// along the groups. out is NCHW, the input gradient channels-last, the
// buffer's layout.
//
// A kernel of the layer, not a public operator: no fake kernel and no other
// backend; the layer calls it in eager mode only and runs the stock graph
// wherever it is traced. The checks guard C++ callers.
#include "evolution.h"
#include "fused_checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mmevo {

// A checked geometry: input (B, J * G, H, W), weight (G * O, J, k, k),
// output (B, G * O, Ho, Wo) >= 1 x 1, stride s, zero padding p.
struct MixShape {
  int64_t B, H, W, J, G, O, k, s, p, Ho, Wo;
};

#define MMEVO_UNIT_KERNELS "acmix_conv_kernels.h"
#include "isa_kernels.h"

namespace {

using fused::check_floating;
using fused::checked_out;

MixShape check_args(const at::Tensor& input, const at::Tensor& weight, int64_t G, int64_t s,
                    int64_t p) {
  TORCH_CHECK_VALUE(input.dim() == 4, "input must be (B, J * G, H, W), got ", input.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 4 && weight.size(2) == weight.size(3),
                    "weight must be (G * O, J, k, k), got ", weight.sizes());
  check_floating("input", input, "input", input);
  check_floating("weight", weight, "input", input);
  TORCH_CHECK_VALUE(input.device().is_cpu(), "acmix_conv's C++ kernel runs CPU tensors, got ",
                    input.device());
  TORCH_CHECK_VALUE(G >= 1, "groups must be >= 1, got ", G);
  TORCH_CHECK_VALUE(s >= 1, "stride must be >= 1, got ", s);
  TORCH_CHECK_VALUE(p >= 0, "padding must be >= 0, got ", p);
  const int64_t J = weight.size(1), k = weight.size(2);
  TORCH_CHECK_VALUE(J >= 1 && k >= 1 && weight.size(0) >= G && weight.size(0) % G == 0,
                    "weight must be (G * O, J, k, k) with G = groups = ", G, ", got ",
                    weight.sizes());
  TORCH_CHECK_VALUE(input.size(1) == J * G, "input must have J * G = ", J * G,
                    " channels for weight ", weight.sizes(), " and groups=", G, ", got ",
                    input.sizes());
  const int64_t Ho = checked_out("input height", input.size(2), k, s, p, 1);
  const int64_t Wo = checked_out("input width", input.size(3), k, s, p, 1);
  return MixShape{input.size(0), input.size(2), input.size(3), J, G, weight.size(0) / G, k, s, p,
                  Ho, Wo};
}

at::Tensor acmix_conv_cpu(const at::Tensor& input, const at::Tensor& weight, int64_t groups,
                          int64_t stride, int64_t padding) {
  const MixShape a = check_args(input, weight, groups, stride, padding);
  auto out = at::empty({a.B, a.G * a.O, a.Ho, a.Wo}, input.options());
  if (a.B == 0) return out;
  const auto x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "acmix_conv", [&] {
    MMEVO_ISA_CALL(mix_forward<scalar_t>(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                         out.data_ptr<scalar_t>(), a));
  });
  return out;
}

// The gradients of input (channels-last, as the input) and weight; an
// undefined tensor for one output_mask leaves out.
std::tuple<at::Tensor, at::Tensor> acmix_conv_backward_cpu(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, int64_t groups,
    int64_t stride, int64_t padding, std::array<bool, 2> output_mask) {
  const MixShape a = check_args(input, weight, groups, stride, padding);
  check_floating("grad", grad, "input", input);
  TORCH_CHECK_VALUE(grad.dim() == 4 && grad.size(0) == a.B && grad.size(1) == a.G * a.O &&
                        grad.size(2) == a.Ho && grad.size(3) == a.Wo,
                    "grad must be (B, G * O, H_out, W_out) = (", a.B, ", ", a.G * a.O, ", ",
                    a.Ho, ", ", a.Wo, "), got ", grad.sizes());
  at::Tensor gx, gw;
  if (output_mask[0])
    gx = at::empty({a.B, a.J * a.G, a.H, a.W},
                   input.options().memory_format(at::MemoryFormat::ChannelsLast));
  // The kernel writes every weight's gradient; an empty batch gives zeros.
  if (output_mask[1])
    gw = a.B == 0 ? at::zeros(weight.sizes(), weight.options())
                  : at::empty(weight.sizes(), weight.options());
  if (a.B == 0 || !(output_mask[0] || output_mask[1])) return {gx, gw};
  // (B, Ho, Wo, O, G): each output pixel's gradient with the groups inner.
  const auto gt = grad.reshape({a.B, a.G, a.O, a.Ho, a.Wo}).permute({0, 3, 4, 2, 1}).contiguous();
  const auto x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(),
                                  "acmix_conv_backward", [&] {
    if (output_mask[0])
      MMEVO_ISA_CALL(mix_backward_input<scalar_t>(gt.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                                  gx.data_ptr<scalar_t>(), a));
    if (output_mask[1])
      MMEVO_ISA_CALL(mix_backward_weight<scalar_t>(gt.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                                   gw.data_ptr<scalar_t>(), a));
  });
  return {gx, gw};
}

// grad (B, H, W, 3, C), the gradient of ACmix's q/k/v buffer, += the
// gradients of the attention's query (at stride s), key and value, (B, C,
// Ho, Wo), (B, C, H, W), (B, C, H, W) (any views of those shapes), in place:
// a transposing add of each (add_heads), which TensorIterator's strided
// add_ runs in 1.5-1.8x the time of a scalar one (ACmix-ResNet-50's 56x56
// and 28x28 layers, B4, one thread).
void acmix_add_heads_cpu(const at::Tensor& grad, const at::Tensor& g_query,
                         const at::Tensor& g_key, const at::Tensor& g_value, int64_t stride) {
  TORCH_CHECK_VALUE(stride >= 1, "stride must be >= 1, got ", stride);
  TORCH_CHECK_VALUE(g_key.dim() == 4, "g_key must be (B, C, H, W), got ", g_key.sizes());
  const int64_t B = g_key.size(0), C = g_key.size(1), H = g_key.size(2), W = g_key.size(3);
  const int64_t Ho = (H - 1) / stride + 1, Wo = (W - 1) / stride + 1;
  TORCH_CHECK_VALUE(grad.dim() == 5 && grad.size(0) == B && grad.size(1) == H &&
                        grad.size(2) == W && grad.size(3) == 3 && grad.size(4) == C &&
                        grad.is_contiguous(),
                    "grad must be a contiguous (B, H, W, 3, C) = (", B, ", ", H, ", ", W,
                    ", 3, ", C, "), got ", grad.sizes());
  TORCH_CHECK_VALUE(g_value.sizes() == g_key.sizes(), "g_value must be ", g_key.sizes(),
                    ", got ", g_value.sizes());
  TORCH_CHECK_VALUE(g_query.dim() == 4 && g_query.size(0) == B && g_query.size(1) == C &&
                        g_query.size(2) == Ho && g_query.size(3) == Wo,
                    "g_query must be (", B, ", ", C, ", ", Ho, ", ", Wo, "), got ",
                    g_query.sizes());
  check_floating("g_query", g_query, "grad", grad);
  check_floating("g_key", g_key, "grad", grad);
  check_floating("g_value", g_value, "grad", grad);
  TORCH_CHECK_VALUE(grad.device().is_cpu(), "acmix_add_heads_'s C++ kernel runs CPU tensors, got ",
                    grad.device());
  if (grad.numel() == 0) return;
  const auto q = g_query.contiguous(), k = g_key.contiguous(), v = g_value.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(),
                                  "acmix_add_heads_", [&] {
    const scalar_t* src[3] = {q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                              v.data_ptr<scalar_t>()};
    MMEVO_ISA_CALL(add_heads<scalar_t>(grad.data_ptr<scalar_t>(), src, B, C, H, W, stride));
  });
}

}  // namespace
}  // namespace mmevo

TORCH_LIBRARY_FRAGMENT(mmevo, m) {
  m.def("acmix_conv(Tensor input, Tensor weight, int groups, int stride, int padding) -> Tensor");
  m.def("acmix_conv_backward(Tensor grad, Tensor input, Tensor weight, int groups, int stride, "
        "int padding, bool[2] output_mask) -> (Tensor, Tensor)");
  m.def("acmix_add_heads_(Tensor(a!) grad, Tensor g_query, Tensor g_key, Tensor g_value, "
        "int stride) -> ()");
}

TORCH_LIBRARY_IMPL(mmevo, CPU, m) {
  m.impl("acmix_conv", &mmevo::acmix_conv_cpu);
  m.impl("acmix_conv_backward", &mmevo::acmix_conv_backward_cpu);
  m.impl("acmix_add_heads_", &mmevo::acmix_add_heads_cpu);
}
