// The kernel headers compiled once per instruction set, shared by the CPU
// translation units (evolution.cpp, fused_involution.cpp,
// fused_attention.cpp): the accumulation type and parallel grain the kernels
// expect to find, then evolution_kernels.h and the unit's own kernel header
// (MMEVO_UNIT_KERNELS, a quoted file name, if defined) in the namespaces
// avx512 and avx2 (GCC on x86) and base. Every unit compiles them with the
// same targets, so the units share their instances.
//
// Include it once per unit, inside namespace mmevo, after <ATen/ATen.h>,
// <c10/util/BFloat16.h>, <c10/util/Half.h>, <algorithm>, <cstring>,
// <type_traits> and <utility>.
#pragma once

// bf16 / fp16 accumulate in fp32; fp32 and fp64 in their own type.
template <typename T> struct Acc { using type = T; };
template <> struct Acc<c10::BFloat16> { using type = float; };
template <> struct Acc<c10::Half> { using type = float; };

// Tasks per parallel chunk: at least ~32K FMAs each, so that small maps (and
// gradcheck-sized ones) run inline instead of paying for a parallel region.
inline int64_t grain_for(int64_t fmas_per_task) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, fmas_per_task));
}

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define MMEVO_X86_DISPATCH 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
namespace avx512 {
constexpr int kVecBytes = 64;
#include "evolution_kernels.h"
#ifdef MMEVO_UNIT_KERNELS
#include MMEVO_UNIT_KERNELS
#endif
}  // namespace avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
constexpr int kVecBytes = 32;
#include "evolution_kernels.h"
#ifdef MMEVO_UNIT_KERNELS
#include MMEVO_UNIT_KERNELS
#endif
}  // namespace avx2
#pragma GCC pop_options
#endif
namespace base {
constexpr int kVecBytes = 16;
#include "evolution_kernels.h"
#ifdef MMEVO_UNIT_KERNELS
#include MMEVO_UNIT_KERNELS
#endif
}  // namespace base

// ns_call (a call of a kernel, unqualified) in the namespace of the
// instruction set fused::isa_level() selected (fused_checks.h).
#ifdef MMEVO_X86_DISPATCH
#define MMEVO_ISA_CALL(ns_call)                      \
  (fused::isa_level() == 2   ? avx512::ns_call       \
   : fused::isa_level() == 1 ? avx2::ns_call : base::ns_call)
// For a kernel vectorised along the output columns, of rows of row_bytes
// in the accumulation type: rows of at most 32 bytes take the AVX2 build,
// whose vectors they fill twice as well (a 7-wide map fills 7 of 8 lanes,
// not 7 of 16).
#define MMEVO_ISA_CALL_ROWS(ns_call, row_bytes) \
  (fused::isa_level() == 2 && (row_bytes) <= 32 ? avx2::ns_call : MMEVO_ISA_CALL(ns_call))
#else
#define MMEVO_ISA_CALL(ns_call) base::ns_call
#define MMEVO_ISA_CALL_ROWS(ns_call, row_bytes) base::ns_call
#endif
