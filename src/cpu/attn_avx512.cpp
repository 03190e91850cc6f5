// AVX-512 (F/BW/VL/DQ) + F16C path (this file alone is compiled with those
// flags). attn_avx512_vnni.cpp compiles it once more with VNNI under another
// name (IKV_AVX512_KERNELS), for the integer INT8 values of avx512_ops.hpp.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized and -Wuninitialized
// on their own _mm512_undefined_* placeholders (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/x86_support.hpp"
#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

#include "cpu/avx512_ops.hpp"

#include "cpu/attn_impl.hpp"
#include "cpu/quest_impl.hpp"

}  // namespace

#ifndef IKV_AVX512_KERNELS
#define IKV_AVX512_KERNELS cpu_kernels_avx512
#endif
const CpuKernels &IKV_AVX512_KERNELS() {
    static const CpuKernels k{"avx512", attend_chunk, quest_bounds, attend_chunks};
    return k;
}

}  // namespace ikv
