// mmevo::batch_norm_train: the forward of a training nn.BatchNorm2d on an
// NCHW float32 / float64 map, for the CPU fast paths of the backbones
// (mmevo/layers/fastpath.py, batch_norm). ATen's CPU kernel takes 3.2x
// this one's time for a (4, 256, 56, 56) map on one thread: this one reads
// each channel once from memory and twice more from the cache
// (batch_norm_kernels.h). Its outputs are native_batch_norm's (y,
// save_mean, save_invstd); mmevo::batch_norm_train_backward gives the
// gradients the same way. With a residual, y is the batch norm plus it;
// with relu, y is the ReLU of that, and the backward takes y as
// relu_output: no add or ReLU pass over the map, and the masked gradient
// written (for the residual) or not at all.
//
// mmevo::batch_norm_eval is the forward of an nn.BatchNorm2d in eval mode
// (by its running statistics), on an NCHW or a channels-last map, with the
// same residual and relu in its one pass: the fast paths' inference, where
// ATen runs the norm, the add and the ReLU as three passes over the map.
// mmevo::batch_norm_eval_ writes it over its input, for the blocks' own
// temporaries: no second map to allocate (and fault in) per BN. Neither has
// a backward: the fast paths call them only where nothing is
// differentiated.
//
// Kernels of the fast path, not public operators: no fake kernel and no
// other backend; it runs in eager mode only. The checks guard C++ callers.
#include "evolution.h"
#include "fused_checks.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mmevo {

#define MMEVO_UNIT_KERNELS "batch_norm_kernels.h"
#include "isa_kernels.h"

namespace {

// t is a (C,) contiguous CPU tensor of input's dtype, or absent.
void check_channels(const char* name, const std::optional<at::Tensor>& t,
                    const at::Tensor& input) {
  if (!t.has_value() || !t->defined()) return;
  TORCH_CHECK_TYPE(t->scalar_type() == input.scalar_type(), name,
                   " must have input's dtype ", input.scalar_type(), ", got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->device().is_cpu(), name, " must be a CPU tensor, got ", t->device());
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == input.size(1) && t->is_contiguous(), name,
                    " must be a contiguous (C,) = (", input.size(1), ",) tensor, got ",
                    t->sizes());
}

// input is a contiguous NCHW (or, where channels_last is allowed, a
// channels-last) float32 / float64 CPU tensor.
void check_input(const at::Tensor& input, bool channels_last = false) {
  TORCH_CHECK_VALUE(input.dim() == 4 &&
                        (input.is_contiguous() ||
                         (channels_last && input.is_contiguous(at::MemoryFormat::ChannelsLast))),
                    "input must be a contiguous (NCHW) ", channels_last ? "or channels-last " : "",
                    "(B, C, H, W) tensor, got ", input.sizes(), " with strides ",
                    input.strides());
  TORCH_CHECK_TYPE(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble,
                   "input must be float32 or float64, got ", input.scalar_type());
  TORCH_CHECK_VALUE(input.device().is_cpu(), "the batch norm kernels run CPU tensors, got ",
                    input.device());
}

// name is a contiguous NCHW tensor of input's shape and dtype.
void check_like_input(const char* name, const at::Tensor& t, const at::Tensor& input) {
  TORCH_CHECK_VALUE(t.sizes() == input.sizes() && t.is_contiguous(), name,
                    " must be a contiguous (NCHW) tensor of input's shape ", input.sizes(),
                    ", got ", t.sizes(), " with strides ", t.strides());
  TORCH_CHECK_TYPE(t.scalar_type() == input.scalar_type(), name, " must have input's dtype ",
                   input.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
}

template <typename T>
T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
T* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? data_or_null<T>(*t) : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_train_cpu(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, double momentum, double eps, bool relu,
    const std::optional<at::Tensor>& residual) {
  check_input(input);
  check_channels("weight", weight, input);
  check_channels("bias", bias, input);
  check_channels("running_mean", running_mean, input);
  check_channels("running_var", running_var, input);
  const int64_t B = input.size(0), C = input.size(1), HW = input.size(2) * input.size(3);
  TORCH_CHECK_VALUE(B * HW > 1, "input must have more than one value per channel in training, "
                    "got ", input.sizes());
  TORCH_CHECK_VALUE(eps > 0, "eps must be > 0, got ", eps);
  if (residual.has_value() && residual->defined()) check_like_input("residual", *residual, input);
  auto out = at::empty_like(input);
  auto mean = at::empty({C}, input.options()), invstd = at::empty({C}, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "batch_norm_train", [&] {
    MMEVO_ISA_CALL(bn_train_forward<scalar_t>(
        input.data_ptr<scalar_t>(), data_or_null<scalar_t>(weight),
        data_or_null<scalar_t>(bias), data_or_null<scalar_t>(residual),
        out.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(), invstd.data_ptr<scalar_t>(),
        data_or_null<scalar_t>(running_mean),
        data_or_null<scalar_t>(running_var), momentum, eps, relu, B, C, HW));
  });
  return {out, mean, invstd};
}

// Runs batch_norm_eval of input into out (input itself, or a tensor like
// it): the kernel is elementwise, so in place reads each value before
// writing it.
void batch_norm_eval_into(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                          const at::Tensor& running_var, double eps, bool relu,
                          const std::optional<at::Tensor>& residual, const at::Tensor& out) {
  check_input(input, /*channels_last=*/true);
  const bool nhwc = !input.is_contiguous();  // NCHW where it is both
  const auto layout = nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  check_channels("weight", weight, input);
  check_channels("bias", bias, input);
  check_channels("running_mean", std::optional<at::Tensor>(running_mean), input);
  check_channels("running_var", std::optional<at::Tensor>(running_var), input);
  TORCH_CHECK_VALUE(eps > 0, "eps must be > 0, got ", eps);
  if (residual.has_value() && residual->defined()) {
    const auto& r = *residual;
    TORCH_CHECK_VALUE(r.sizes() == input.sizes() && r.is_contiguous(layout),
                      "residual must be a ", nhwc ? "channels-last" : "contiguous (NCHW)",
                      " tensor of input's shape ", input.sizes(), " and layout, got ", r.sizes(),
                      " with strides ", r.strides());
    TORCH_CHECK_TYPE(r.scalar_type() == input.scalar_type(), "residual must have input's dtype ",
                     input.scalar_type(), ", got ", r.scalar_type());
    TORCH_CHECK_VALUE(r.device().is_cpu(), "residual must be a CPU tensor, got ", r.device());
  }
  const int64_t B = input.size(0), C = input.size(1), HW = input.size(2) * input.size(3);
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "batch_norm_eval", [&] {
    MMEVO_ISA_CALL(bn_eval_forward<scalar_t>(
        input.data_ptr<scalar_t>(), data_or_null<scalar_t>(weight),
        data_or_null<scalar_t>(bias), running_mean.data_ptr<scalar_t>(),
        running_var.data_ptr<scalar_t>(), data_or_null<scalar_t>(residual),
        out.data_ptr<scalar_t>(), eps, relu, nhwc, B, C, HW));
  });
}

at::Tensor batch_norm_eval_cpu(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias,
                               const at::Tensor& running_mean, const at::Tensor& running_var,
                               double eps, bool relu, const std::optional<at::Tensor>& residual) {
  auto out = at::empty_like(input);  // in its layout (strides kept)
  batch_norm_eval_into(input, weight, bias, running_mean, running_var, eps, relu, residual, out);
  return out;
}

at::Tensor& batch_norm_eval_inplace_cpu(at::Tensor& input, const std::optional<at::Tensor>& weight,
                                        const std::optional<at::Tensor>& bias,
                                        const at::Tensor& running_mean,
                                        const at::Tensor& running_var, double eps, bool relu,
                                        const std::optional<at::Tensor>& residual) {
  batch_norm_eval_into(input, weight, bias, running_mean, running_var, eps, relu, residual, input);
  return input;
}

// The gradients of batch_norm_train's out for the wanted of (input, weight,
// bias), from its input, weight, mean and invstd; the others undefined.
// With relu_output (the out of a batch_norm_train with relu), grad is the
// gradient of that out, taken where it is > 0, and with masked_grad that
// masked gradient (a residual's) is the fourth result.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_train_backward_cpu(
    const at::Tensor& grad, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& invstd, std::array<bool, 3> output_mask,
    const std::optional<at::Tensor>& relu_output, bool masked_grad) {
  check_input(input);
  check_like_input("grad", grad, input);
  const bool with_relu = relu_output.has_value() && relu_output->defined();
  if (with_relu) check_like_input("relu_output", *relu_output, input);
  TORCH_CHECK_VALUE(with_relu || !masked_grad, "masked_grad wanted without a relu_output");
  check_channels("weight", weight, input);
  check_channels("mean", std::optional<at::Tensor>(mean), input);
  check_channels("invstd", std::optional<at::Tensor>(invstd), input);
  const bool with_w = weight.has_value() && weight->defined();
  TORCH_CHECK_VALUE(with_w || !output_mask[1], "weight's gradient wanted without a weight");
  const int64_t B = input.size(0), C = input.size(1), HW = input.size(2) * input.size(3);
  at::Tensor gx, gw, gb, go;
  if (masked_grad) go = at::empty_like(input);
  if (output_mask[0]) gx = at::empty_like(input);
  if (output_mask[1]) gw = at::empty({C}, input.options());
  if (output_mask[2]) gb = at::empty({C}, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "batch_norm_train_backward", [&] {
    MMEVO_ISA_CALL(bn_train_backward<scalar_t>(
        grad.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(),
        data_or_null<scalar_t>(relu_output), data_or_null<scalar_t>(weight),
        mean.data_ptr<scalar_t>(), invstd.data_ptr<scalar_t>(),
        data_or_null<scalar_t>(gx), data_or_null<scalar_t>(gw), data_or_null<scalar_t>(gb),
        data_or_null<scalar_t>(go), B, C, HW));
  });
  return {gx, gw, gb, go};
}

}  // namespace
}  // namespace mmevo

TORCH_LIBRARY_FRAGMENT(mmevo, m) {
  m.def("batch_norm_train(Tensor input, Tensor? weight, Tensor? bias, "
        "Tensor(a!)? running_mean, Tensor(b!)? running_var, float momentum, float eps, "
        "bool relu=False, Tensor? residual=None) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_eval(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, "
        "Tensor running_var, float eps, bool relu=False, Tensor? residual=None) -> Tensor");
  m.def("batch_norm_eval_(Tensor(a!) input, Tensor? weight, Tensor? bias, Tensor running_mean, "
        "Tensor running_var, float eps, bool relu=False, Tensor? residual=None) -> Tensor(a!)");
  m.def("batch_norm_train_backward(Tensor grad, Tensor input, Tensor? weight, Tensor mean, "
        "Tensor invstd, bool[3] output_mask, Tensor? relu_output=None, bool masked_grad=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmevo, CPU, m) {
  m.impl("batch_norm_train", &mmevo::batch_norm_train_cpu);
  m.impl("batch_norm_eval", &mmevo::batch_norm_eval_cpu);
  m.impl("batch_norm_eval_", &mmevo::batch_norm_eval_inplace_cpu);
  m.impl("batch_norm_train_backward", &mmevo::batch_norm_train_backward_cpu);
}

// The in-place kernel bumps its input's version, so that autograd refuses a
// saved tensor it overwrote, and refuses an input that requires grad.
TORCH_LIBRARY_IMPL(mmevo, ADInplaceOrView, m) {
  m.impl("batch_norm_eval_", torch::autograd::autogradNotImplementedInplaceOrViewFallback());
}

TORCH_LIBRARY_IMPL(mmevo, Autograd, m) {
  m.impl("batch_norm_eval_", torch::autograd::autogradNotImplementedFallback());
}
