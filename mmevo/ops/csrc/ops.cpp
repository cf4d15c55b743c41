// The mmevo operators, registered with the dispatcher (TORCH_LIBRARY), so
// that libtorch programs (an AOTInductor runner, say) reach them with
// torch.ops.load_library / dlopen and no Python. Each one validates all
// of its arguments (the messages of mmevo/ops/checks.py), answers empty
// batches and maps without channels, and computes both padding modes:
//
// * the tiled kernels (evolution.cpp) when their buffers are bounded by the
//   maps (tiled_fits), reflect padding made explicit first when the padded
//   map is not much larger than the map;
// * otherwise a direct formulation: one strided slice (zeros) or gather of
//   reflected indices (reflect) per window tap, over the outputs that tap
//   reaches, so memory and time follow the input and output sizes, not the
//   stride, dilation or padding.
//
// Python (mmevo/ops/library.py) adds the fake kernels, autograd, the CUDA
// and fallback backends, and selects this CPU kernel or another backend.
#include "evolution.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

namespace mmevo {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Python's repr of a shape: (2, 3) or (5,).
std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << (sizes.size() == 1 ? ",)" : ")");
  return out.str();
}

std::string dtype_str(at::ScalarType t) {
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

void check_dims(const char* name, const at::Tensor& t, int64_t ndim, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == ndim, name, " must be ", layout, ", got ", shape_str(t.sizes()));
}

void check_dtype(const char* name, const at::Tensor& t) {
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kDouble || st == at::kFloat || st == at::kBFloat16 || st == at::kHalf,
                   name, " must be a floating point tensor (float64, float32, bfloat16 or "
                   "float16), got ", dtype_str(st));
}

void check_pair(const char* name_a, const at::Tensor& a, const char* name_b, const at::Tensor& b) {
  check_dtype(name_a, a);
  check_dtype(name_b, b);
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), name_a, " and ", name_b,
                   " must have the same dtype, got ", dtype_str(a.scalar_type()), " and ",
                   dtype_str(b.scalar_type()));
  TORCH_CHECK_VALUE(a.device() == b.device(), name_a, " and ", name_b,
                    " must be on the same device, got ", a.device(), " and ", b.device());
}

void check_at_least(const char* name, int64_t value, int64_t minimum) {
  TORCH_CHECK_VALUE(value >= minimum, name, " must be >= ", minimum, ", got ", value);
}

// Checks the window arguments; returns whether the padding mode is reflect.
bool check_window(int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
                  std::string_view padding_mode) {
  check_at_least("kernel_size", kernel_size, 1);
  check_at_least("stride", stride, 1);
  check_at_least("dilation", dilation, 1);
  TORCH_CHECK_VALUE(padding_mode == "zeros" || padding_mode == "reflect",
                    "padding_mode must be one of ('zeros', 'reflect'), got '", padding_mode,
                    "'");
  TORCH_CHECK_VALUE(kernel_size == 1 || dilation <= kInt64Max / (kernel_size - 1),
                    "dilation=", dilation, " with kernel_size=", kernel_size,
                    ": the window span (kernel_size - 1) * dilation does not fit in int64");
  check_at_least("padding", padding, 0);
  return padding_mode == "reflect";
}

// The output size along a map dimension of ``size`` (``name``: "input
// height", ...), every intermediate representable in int64.
int64_t out_size(const char* name, int64_t size, int64_t K, int64_t s, int64_t p, int64_t d) {
  check_at_least(name, size, 1);
  TORCH_CHECK_VALUE(p <= (kInt64Max - size) / 2, "padding=", p, " with ", name, " ", size, ": ",
                    name, " + 2 * padding does not fit in int64");
  const int64_t room = size + 2 * p - (K - 1) * d;
  TORCH_CHECK_VALUE(room >= 1, name, " of ", size, " is too small for kernel_size=", K,
                    ", dilation=", d, ", padding=", p, ": output would be empty");
  return (room - 1) / s + 1;
}

void check_groups(const char* map, int64_t C, int64_t G, const at::Tensor& kernel) {
  TORCH_CHECK_VALUE(G >= 1 && C % G == 0, map, " channels (", C,
                    ") must be divisible by the kernel groups G=", G, "; kernel ",
                    shape_str(kernel.sizes()));
}

// K of a 6-D kernel map, the same in both window dims.
int64_t kernel_size_of(const at::Tensor& kernel) {
  TORCH_CHECK_VALUE(kernel.size(2) == kernel.size(3),
                    "kernel must be (B, G, K, K, H_out, W_out) with the same K in both window "
                    "dims, got ", shape_str(kernel.sizes()));
  return kernel.size(2);
}

void check_shape(const char* name, const at::Tensor& t, at::IntArrayRef expected,
                 const char* layout, const std::string& context) {
  TORCH_CHECK_VALUE(t.sizes() == expected, name, " must be ", layout, " = ", shape_str(expected),
                    " for ", context, ", got ", shape_str(t.sizes()));
}

at::ScalarType acc_type(const at::Tensor& t) {
  return at::isReducedFloatingType(t.scalar_type()) ? at::kFloat : t.scalar_type();
}

// numpy-style reflection (the edge is not repeated) of positions ``pos``
// into [0, size), folded as often as needed.
at::Tensor reflect_positions(at::Tensor pos, int64_t size) {
  if (size == 1) return at::zeros_like(pos);
  const int64_t period = 2 * (size - 1);
  pos = pos.remainder(period);
  return at::where(pos >= size, period - pos, pos);
}

at::Tensor reflect_index(int64_t size, int64_t padding) {
  return reflect_positions(at::arange(-padding, size + padding, at::kLong), size);
}

// Whether a padded map is small enough to be materialised: within a few
// times the map (or 64K pixels).
bool padded_fits(int64_t H, int64_t W, int64_t p) {
  return double(H + 2 * p) * double(W + 2 * p) <=
         std::max(double(1 << 16), 4.0 * double(H) * double(W));
}

at::Tensor reflect_pad(const at::Tensor& x, int64_t p) {
  const int64_t H = x.size(2), W = x.size(3);
  if (p < H && p < W) return at::reflection_pad2d(x, {p, p, p, p});  // aten's is exact here
  return x.index_select(2, reflect_index(H, p)).index_select(3, reflect_index(W, p));
}

// Transpose of reflect_pad: each padded position added to its source, in
// fp32 at least when the padding reflects repeatedly (a pixel of a small
// map then receives up to (1 + 2p)^2 terms).
at::Tensor reflect_fold(const at::Tensor& gxp, int64_t p, int64_t H, int64_t W) {
  if (p < H && p < W)
    return at::reflection_pad2d_backward(gxp, at::empty({gxp.size(0), gxp.size(1), H, W},
                                                        gxp.options()), {p, p, p, p});
  const auto g = gxp.to(acc_type(gxp));
  auto rows = at::zeros({g.size(0), g.size(1), H, g.size(3)}, g.options());
  rows.index_add_(2, reflect_index(H, p), g);
  auto out = at::zeros({g.size(0), g.size(1), H, W}, g.options());
  return out.index_add_(3, reflect_index(W, p), rows).to(gxp.scalar_type());
}

// The outputs [lo, lo + n) of one map dimension that one window tap (at
// offset o = u*d - p from i*s) reaches, and how to read the input under
// them: zero padding, the outputs whose tap lies inside the map, as the
// strided slice from ``first``; reflect, every output, through ``index``.
struct Tap {
  int64_t lo, n, first, s;
  at::Tensor index;

  Tap(int64_t size, int64_t out, int64_t s_, int64_t o, bool reflect) : s(s_) {
    if (reflect) {
      lo = 0, n = out, first = 0;
      index = reflect_positions(at::arange(out, at::kLong) * s + o, size);
      return;
    }
    // i*s + o in [0, size); o >= -p and o <= span - p keep these in int64.
    lo = o >= 0 ? 0 : ceil_div(-o, s);
    const int64_t hi = size - 1 - o < 0 ? -1 : std::min(out - 1, (size - 1 - o) / s);
    n = std::max<int64_t>(0, hi - lo + 1);
    first = n ? lo * s + o : 0;
  }

  at::Tensor outputs(const at::Tensor& t, int64_t dim) const { return t.narrow(dim, lo, n); }

  at::Tensor inputs(const at::Tensor& t, int64_t dim) const {
    if (index.defined()) return t.index_select(dim, index);
    // One output takes any step: a stride past the map (a huge one would
    // overflow the view's stride) reads as step 1.
    return t.slice(dim, first, first + (n - 1) * s + 1, n > 1 ? s : 1);
  }
};

// Y = A(x, w) directly: x (B, C, H, W), w (B, G, K, K, Ho, Wo).
at::Tensor direct_aggregate(const at::Tensor& x, const at::Tensor& w, const Geometry& g,
                            bool reflect) {
  const auto acc = acc_type(x);
  const auto x5 = x.to(acc).reshape({g.B, g.G, g.C / g.G, g.H, g.W});
  const auto wa = w.to(acc);
  auto out = at::zeros({g.B, g.G, g.C / g.G, g.Ho, g.Wo}, x5.options());
  for (int64_t u = 0; u < g.K; ++u) {
    const Tap r(g.H, g.Ho, g.s, u * g.d - g.p, reflect);
    if (!r.n) continue;
    const auto rows = r.inputs(x5, 3);
    for (int64_t v = 0; v < g.K; ++v) {
      const Tap c(g.W, g.Wo, g.s, v * g.d - g.p, reflect);
      if (!c.n) continue;
      const auto tap = c.outputs(r.outputs(wa.select(2, u).select(2, v), 2), 3);
      c.outputs(r.outputs(out, 3), 4).addcmul_(c.inputs(rows, 4), tap.unsqueeze(2));
    }
  }
  return out.view({g.B, g.C, g.Ho, g.Wo}).to(x.scalar_type());
}

// grad_x = At(gy, w) directly, as the scatter of each tap's products.
at::Tensor direct_transpose(const at::Tensor& gy, const at::Tensor& w, const Geometry& g,
                            bool reflect) {
  const auto acc = acc_type(gy);
  const auto g5 = gy.to(acc).reshape({g.B, g.G, g.C / g.G, g.Ho, g.Wo});
  const auto wa = w.to(acc);
  auto gx = at::zeros({g.B, g.G, g.C / g.G, g.H, g.W}, g5.options());
  for (int64_t u = 0; u < g.K; ++u) {
    const Tap r(g.H, g.Ho, g.s, u * g.d - g.p, reflect);
    if (!r.n) continue;
    for (int64_t v = 0; v < g.K; ++v) {
      const Tap c(g.W, g.Wo, g.s, v * g.d - g.p, reflect);
      if (!c.n) continue;
      const auto tap = c.outputs(r.outputs(wa.select(2, u).select(2, v), 2), 3).unsqueeze(2);
      const auto part = c.outputs(r.outputs(g5, 3), 4) * tap;
      if (!reflect) {
        c.inputs(r.inputs(gx, 3), 4).add_(part);
        continue;
      }
      auto rows = at::zeros({g.B, g.G, g.C / g.G, g.H, c.n}, part.options());
      rows.index_add_(3, r.index, part);
      gx.index_add_(4, c.index, rows);
    }
  }
  return gx.view({g.B, g.C, g.H, g.W}).to(gy.scalar_type());
}

// Corr(q, x) directly: q (B, C, Ho, Wo), x (B, C, H, W).
at::Tensor direct_correlate(const at::Tensor& q, const at::Tensor& x, const Geometry& g,
                            bool reflect, bool softmax) {
  const auto acc = acc_type(q);
  const auto q5 = q.to(acc).reshape({g.B, g.G, g.C / g.G, g.Ho, g.Wo});
  const auto x5 = x.to(acc).reshape({g.B, g.G, g.C / g.G, g.H, g.W});
  auto out = at::zeros({g.B, g.G, g.K, g.K, g.Ho, g.Wo}, q5.options());
  for (int64_t u = 0; u < g.K; ++u) {
    const Tap r(g.H, g.Ho, g.s, u * g.d - g.p, reflect);
    if (!r.n) continue;
    const auto rows = r.inputs(x5, 3);
    for (int64_t v = 0; v < g.K; ++v) {
      const Tap c(g.W, g.Wo, g.s, v * g.d - g.p, reflect);
      if (!c.n) continue;
      const auto products = c.outputs(r.outputs(q5, 3), 4) * c.inputs(rows, 4);
      c.outputs(r.outputs(out.select(2, u).select(2, v), 2), 3).copy_(products.sum(2));
    }
  }
  if (softmax) out = out.flatten(2, 3).softmax(2).view_as(out);
  return out.to(q.scalar_type());
}

Geometry padded(Geometry g) {
  g.H += 2 * g.p, g.W += 2 * g.p, g.p = 0;
  return g;
}

at::Tensor aggregate_cpu(const at::Tensor& input, const at::Tensor& kernel, int64_t stride,
                         int64_t padding, int64_t dilation, c10::string_view padding_mode) {
  const BelowAutocast below_autocast;
  check_dims("input", input, 4, "(B, C, H, W)");
  check_dims("kernel", kernel, 6, "(B, G, K, K, H_out, W_out)");
  check_pair("input", input, "kernel", kernel);
  const int64_t K = kernel_size_of(kernel);
  const bool reflect = check_window(K, stride, padding, dilation, padding_mode) && padding;
  const int64_t B = input.size(0), C = input.size(1), G = kernel.size(1);
  check_groups("input", C, G, kernel);
  const int64_t Ho = out_size("input height", input.size(2), K, stride, padding, dilation);
  const int64_t Wo = out_size("input width", input.size(3), K, stride, padding, dilation);
  check_shape("kernel", kernel, {B, G, K, K, Ho, Wo}, "(B, G, K, K, H_out, W_out)",
              "input " + shape_str(input.sizes()));
  const bool nhwc = strictly_channels_last(input);
  const auto layout = nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (B == 0 || C == 0) return at::zeros({B, C, Ho, Wo}, input.options().memory_format(layout));
  Geometry g{B, C, input.size(2), input.size(3), G, K, Ho, Wo, stride, padding, dilation};
  // A channels-last input (as Inductor's convolutions leave it) is read in
  // place, and so is the kernel map of a channels-last span convolution.
  if (nhwc && !reflect) return nhwc_aggregate(input, kernel, g);
  const auto w = kernel.contiguous();
  at::Tensor y;
  if (reflect && padded_fits(g.H, g.W, g.p)) {
    const auto xp = reflect_pad(input.contiguous(), g.p);
    g = padded(g);
    y = tiled_fits(g) ? tiled_aggregate(xp, w, g) : direct_aggregate(xp, w, g, false);
  } else if (!reflect && tiled_fits(g)) {
    y = tiled_aggregate(input.contiguous(), w, g);
  } else {
    y = direct_aggregate(input, w, g, reflect);
  }
  return y.contiguous(layout);
}

at::Tensor transpose_cpu(const at::Tensor& grad, const at::Tensor& kernel, int64_t height,
                         int64_t width, int64_t stride, int64_t padding, int64_t dilation,
                         c10::string_view padding_mode) {
  const BelowAutocast below_autocast;
  check_dims("grad", grad, 4, "(B, C, H_out, W_out)");
  check_dims("kernel", kernel, 6, "(B, G, K, K, H_out, W_out)");
  check_pair("grad", grad, "kernel", kernel);
  const int64_t K = kernel_size_of(kernel);
  const bool reflect = check_window(K, stride, padding, dilation, padding_mode) && padding;
  const int64_t B = grad.size(0), C = grad.size(1), G = kernel.size(1);
  check_groups("grad", C, G, kernel);
  const int64_t Ho = out_size("height", height, K, stride, padding, dilation);
  const int64_t Wo = out_size("width", width, K, stride, padding, dilation);
  std::ostringstream size;
  size << "height=" << height << ", width=" << width;
  check_shape("grad", grad, {B, C, Ho, Wo}, "(B, C, H_out, W_out)", size.str());
  check_shape("kernel", kernel, {B, G, K, K, Ho, Wo}, "(B, G, K, K, H_out, W_out)",
              "grad " + shape_str(grad.sizes()));
  if (B == 0 || C == 0) return at::zeros({B, C, height, width}, grad.options());
  Geometry g{B, C, height, width, G, K, Ho, Wo, stride, padding, dilation};
  const auto gy = grad.contiguous();
  const auto w = kernel.contiguous();
  if (reflect && padded_fits(g.H, g.W, g.p)) {
    const Geometry gp = padded(g);
    const auto gxp = tiled_fits(gp) ? tiled_transpose(gy, w, gp) : direct_transpose(gy, w, gp, false);
    return reflect_fold(gxp, g.p, g.H, g.W);
  }
  if (!reflect && tiled_fits(g)) return tiled_transpose(gy, w, g);
  return direct_transpose(gy, w, g, reflect);
}

at::Tensor correlate_cpu(const at::Tensor& query, const at::Tensor& key, int64_t groups,
                         int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
                         c10::string_view padding_mode, bool softmax) {
  const BelowAutocast below_autocast;
  check_dims("query", query, 4, "(B, C, H_out, W_out)");
  check_dims("key", key, 4, "(B, C, H, W)");
  check_pair("query", query, "key", key);
  check_at_least("groups", groups, 1);
  const bool reflect =
      check_window(kernel_size, stride, padding, dilation, padding_mode) && padding;
  const int64_t B = key.size(0), C = key.size(1), K = kernel_size;
  TORCH_CHECK_VALUE(C % groups == 0, "key channels (", C, ") must be divisible by groups=",
                    groups);
  const int64_t Ho = out_size("key height", key.size(2), K, stride, padding, dilation);
  const int64_t Wo = out_size("key width", key.size(3), K, stride, padding, dilation);
  check_shape("query", query, {B, C, Ho, Wo}, "(B, C, H_out, W_out)",
              "key " + shape_str(key.sizes()));
  if (B == 0 || C == 0)  // sums over no channels: 0, a uniform softmax
    return at::full({B, groups, K, K, Ho, Wo}, softmax ? 1.0 / double(K * K) : 0.0,
                    query.options());
  Geometry g{B, C, key.size(2), key.size(3), groups, K, Ho, Wo, stride, padding, dilation};
  const auto q = query.contiguous();
  if (reflect && padded_fits(g.H, g.W, g.p)) {
    const auto xp = reflect_pad(key.contiguous(), g.p);
    g = padded(g);
    return tiled_fits(g) ? tiled_correlate(q, xp, g, softmax)
                         : direct_correlate(q, xp, g, false, softmax);
  }
  if (!reflect && tiled_fits(g)) return tiled_correlate(q, key.contiguous(), g, softmax);
  return direct_correlate(q, key, g, reflect, softmax);
}

at::Tensor correlation_cpu(const at::Tensor& query, const at::Tensor& key, int64_t groups,
                           int64_t kernel_size, int64_t stride, int64_t padding,
                           int64_t dilation, c10::string_view padding_mode) {
  return correlate_cpu(query, key, groups, kernel_size, stride, padding, dilation, padding_mode,
                       false);
}

at::Tensor attention_weights_cpu(const at::Tensor& query, const at::Tensor& key, int64_t groups,
                                 int64_t kernel_size, int64_t stride, int64_t padding,
                                 int64_t dilation, c10::string_view padding_mode) {
  return correlate_cpu(query, key, groups, kernel_size, stride, padding, dilation, padding_mode,
                       true);
}

}  // namespace
}  // namespace mmevo

// One schema per operator, here; Python registers its kernels, fake
// kernels and autograd on these (or defines the same schemas itself when
// the extension is not built).
TORCH_LIBRARY(mmevo, m) {
  m.set_python_module("mmevo.ops.library");
  // flexible_layout: Inductor passes the input and kernel in the layout it
  // chose (channels-last after its convolutions), not copied back to NCHW.
  m.def("evolution_aggregate(Tensor input, Tensor kernel, int stride, int padding, "
        "int dilation, str padding_mode) -> Tensor",
        {at::Tag::flexible_layout});
  m.def("local_correlation(Tensor query, Tensor key, int groups, int kernel_size, "
        "int stride, int padding, int dilation, str padding_mode) -> Tensor");
  m.def("local_attention_weights(Tensor query, Tensor key, int groups, int kernel_size, "
        "int stride, int padding, int dilation, str padding_mode) -> Tensor");
  m.def("evolution_aggregate_transpose(Tensor grad, Tensor kernel, int height, int width, "
        "int stride, int padding, int dilation, str padding_mode) -> Tensor");
  m.def("cpu_isa() -> str", &mmevo::isa_name);
}

TORCH_LIBRARY_IMPL(mmevo, CPU, m) {
  m.impl("evolution_aggregate", &mmevo::aggregate_cpu);
  m.impl("local_correlation", &mmevo::correlation_cpu);
  m.impl("local_attention_weights", &mmevo::attention_weights_cpu);
  m.impl("evolution_aggregate_transpose", &mmevo::transpose_cpu);
}
