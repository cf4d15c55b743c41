// Shared by the two translation units of the extension: the tiled kernels
// (evolution.cpp) and the operators that validate and dispatch to them
// (ops.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <string>

namespace mmevo {

// Held by a CPU kernel that calls ATen operators (reflection padding,
// matmuls): under autocast they would run in autocast's dtype for them
// (reflection_pad2d in fp32) instead of the kernel's.
struct BelowAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

// A checked window geometry: input (B, C, H, W) with B, C, H, W >= 1, G
// groups dividing C, a K x K window of stride s, zero padding p and
// dilation d whose output is Ho x Wo >= 1, and every size (H + 2p,
// (K - 1) * d) representable in int64.
struct Geometry {
  int64_t B, C, H, W, G, K, Ho, Wo, s, p, d;
};

inline int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

// Whether the tiled kernels' per-task buffers, which span every input row
// and column phase a tile's windows reach (zero padding included), stay
// within a small multiple of the input map; if not (very large strides,
// dilations or paddings), the direct formulation of ops.cpp runs instead.
bool tiled_fits(const Geometry& g);

// The tiled kernels: contiguous CPU tensors of one floating dtype, zero
// padding, g checked (see Geometry); the outputs are allocated here.
at::Tensor tiled_aggregate(const at::Tensor& x, const at::Tensor& w, const Geometry& g);
at::Tensor tiled_transpose(const at::Tensor& gy, const at::Tensor& w, const Geometry& g);
at::Tensor tiled_correlate(const at::Tensor& q, const at::Tensor& x, const Geometry& g,
                           bool softmax);

// The aggregation of a channels-last x (dense NHWC strides) with a kernel
// of any strides, zero padding, g checked; y is channels-last.
at::Tensor nhwc_aggregate(const at::Tensor& x, const at::Tensor& w, const Geometry& g);

// Whether t (B, C, H, W) is channels-last and not also contiguous: the
// aggregation's output then is channels-last too (its fake kernel says so).
inline bool strictly_channels_last(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

// The instruction set the tiled kernels run: "avx512", "avx2" or "base".
std::string isa_name();

}  // namespace mmevo
