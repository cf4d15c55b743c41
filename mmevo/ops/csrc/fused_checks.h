// What the fused operators' translation units (fused_involution.cpp,
// fused_attention.cpp) share outside their kernels: the instruction set
// evolution.cpp selected, and the argument checks for C++ callers.
#pragma once

#include "evolution.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <string>

namespace mmevo {
namespace fused {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// 2: AVX-512, 1: AVX2, 0: the base build (MMEVO_CPU_ISA included).
inline int isa_level() {
  static const int level = [] {
    const std::string name = isa_name();
    return name == "avx512" ? 2 : name == "avx2" ? 1 : 0;
  }();
  return level;
}

// t is a floating tensor of the dtype and device of the reference argument.
inline void check_floating(const char* name, const at::Tensor& t, const char* ref_name,
                           const at::Tensor& ref) {
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kDouble || st == at::kFloat || st == at::kBFloat16 ||
                       st == at::kHalf,
                   name, " must be a floating point tensor (float64, float32, bfloat16 or "
                   "float16), got ", st);
  TORCH_CHECK_TYPE(st == ref.scalar_type(), ref_name, " and ", name,
                   " must have the same dtype, got ", ref.scalar_type(), " and ", st);
  TORCH_CHECK_VALUE(t.device() == ref.device(), ref_name, " and ", name,
                    " must be on the same device, got ", ref.device(), " and ", t.device());
}

// The output length of a window over size (padding p each side), >= 1.
inline int64_t checked_out(const char* name, int64_t size, int64_t K, int64_t s, int64_t p,
                           int64_t d) {
  TORCH_CHECK_VALUE(size >= 1, name, " must be >= 1, got ", size);
  TORCH_CHECK_VALUE(p <= (kInt64Max - size) / 2, "padding=", p, " with ", name, " ", size,
                    ": ", name, " + 2 * padding does not fit in int64");
  const int64_t room = size + 2 * p - (K - 1) * d;
  TORCH_CHECK_VALUE(room >= 1, name, " of ", size, " is too small for kernel_size=", K,
                    ", dilation=", d, ", padding=", p, ": output would be empty");
  return (room - 1) / s + 1;
}

}  // namespace fused
}  // namespace mmevo
