// AVX-512 (F/BW/VL/DQ) + F16C path (this file alone is compiled with those flags).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/x86_support.hpp"
#include "cpu/attn_kernel.hpp"

namespace ikv {
namespace {

struct O {
    using V = __m512;
    static constexpr uint32_t W = 16;
    static constexpr uint32_t kValueChunks = 4;  // accumulator chunks per value pass
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float a) { return _mm512_set1_ps(a); }
    static V load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static float hsum(V a) { return _mm512_reduce_add_ps(a); }
    static float hmax(V a) { return _mm512_reduce_max_ps(a); }
    static void hsum4(const V *a, float *out, size_t stride) {
        // 256-bit halves added (a0|a1, a2|a3), then 128-bit quarters, so each
        // 128-bit lane j holds 4 partial sums of a[j]; then sum within lanes.
        const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
        const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
        __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
        y = _mm512_add_ps(y, _mm512_permute_ps(y, 0x4E));
        y = _mm512_add_ps(y, _mm512_permute_ps(y, 0xB1));
        float t[16];
        _mm512_storeu_ps(t, y);
        for (int j = 0; j < 4; ++j) out[j * stride] = t[4 * j];
    }
    static V min(V a, V b) { return _mm512_min_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static V pow2(V n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    static V zero_below(V x, float lo, V y) {
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lo), _CMP_GE_OQ), y);
    }
    using FlushDenormals = x86::FlushDenormals;
    static void prefetch(const void *p) { x86::prefetch(p); }
    static V f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }
    static V bf16(const uint8_t *p) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    static V e4m3_div256(const uint8_t *p) {
        // E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: same value times 2^-8.
        // Sign-extended to 16 bits and shifted left 7, the sign lands in bit 15 and
        // (for negatives) a stray copy in bit 14, which the mask clears.
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(short(0xBFFF))));
    }
    static V i8(const uint8_t *p) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
    }
    static V u4(const uint8_t *p) {
        // each byte to two lanes, then lane 2j keeps the low nibble, 2j+1 the high one
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p));
        const __m512i x = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        const __m512i s = _mm512_set4_epi32(4, 0, 4, 0);  // lanes (0, 4, 0, 4, ...)
        return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(x, s), _mm512_set1_epi32(0xF)));
    }
};

#include "cpu/attn_impl.hpp"
#include "cpu/quest_impl.hpp"

}  // namespace

const CpuKernels &cpu_kernels_avx512() {
    static const CpuKernels k{"avx512", attend_chunk, quest_bounds, attend_chunks};
    return k;
}

}  // namespace ikv
