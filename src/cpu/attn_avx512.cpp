// AVX-512 (F/BW/VL/DQ) + F16C path (this file alone is compiled with those flags).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

struct O {
    using V = __m512;
    static constexpr uint32_t W = 16;
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float a) { return _mm512_set1_ps(a); }
    static V load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static float hsum(V a) { return _mm512_reduce_add_ps(a); }
    static V min(V a, V b) { return _mm512_min_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static V pow2(V n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    static V zero_below(V x, float lo, V y) {
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
    }
    // GCC 12 drops __builtin_prefetch inside these kernels; the asm stays.
    static void prefetch(const void *p) { __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char *>(p))); }
    static V f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }
    static V bf16(const uint8_t *p) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    static V e4m3_div256(const uint8_t *p) {
        // E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: same value times 2^-8.
        const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                          _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7));
        return _mm512_cvtph_ps(h);
    }
    static V i8(const uint8_t *p) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
    }
    static V u4(const uint8_t *p) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p));
        const __m128i m = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    }
};

#include "cpu/attn_impl.hpp"

}  // namespace

const CpuKernels &cpu_kernels_avx512() {
    static const CpuKernels k{"avx512", attend_chunk};
    return k;
}

}  // namespace ikv
